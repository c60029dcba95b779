//! The HTTP+JSON binding (spec §11) under `/a2a/{agent}/rest`, with the
//! optional `/{tenant}` prefix. Errors are `google.rpc.Status` JSON (AIP-193)
//! with the HTTP status of spec 1.0.1.

use std::collections::HashMap;

use axum::{
    body::Body,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::{
    error::{GatewayError, Result},
    http::{self, Version},
    protojson::to_value,
    service::Gateway,
};

/// What a REST path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Operation {
    Send,
    Stream,
    ListTasks,
    GetTask(String),
    CancelTask(String),
    Subscribe(String),
    CreatePushConfig(String),
    ListPushConfigs(String),
    GetPushConfig(String, String),
    DeletePushConfig(String, String),
    ExtendedCard,
}

pub(crate) async fn handle(
    State(gateway): State<Gateway>,
    Path((agent, path)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match serve(&gateway, &agent, &path, &method, &uri, &headers, body).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

/// The error body and status of spec 1.0.1 §11.6.
pub(crate) fn error_response(error: &GatewayError) -> Response {
    http::challenged(a2a_json(error.http_status(), error.rest_body()), error)
}

/// A response of the HTTP+JSON binding: `application/a2a+json` (spec §11.1),
/// an error's as well as a result's.
fn a2a_json(status: StatusCode, body: Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/a2a+json"));
    response
}

async fn serve(
    gateway: &Gateway,
    agent: &str,
    path: &str,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let principal = http::authenticate(gateway, headers)?;
    let query = http::query(uri.query());
    // This binding is 1.0's: a request that names no version is served as
    // 1.0, one that asks for 0.3 (in the header or the query) is refused.
    if let Some(requested) = http::requested_version(headers, &query, http::SPEAKS_1_0)?
        && http::parse_version(requested.trim(), http::SPEAKS_1_0)? == Version::V03
    {
        return Err(GatewayError::VersionNotSupported(requested, http::SPEAKS_1_0));
    }
    let (path_tenant, operation) = route(method, path)?;
    let body = http::read_body(gateway, body).await?;
    let json_body = || -> Result<Value> {
        if !http::is_json(headers) {
            return Err(GatewayError::ContentTypeNotSupported("the body must be application/a2a+json".to_owned()));
        }
        if body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&body).map_err(|error| GatewayError::Parse(format!("the body is not JSON: {error}")))
    };
    let json = match operation {
        Operation::Send | Operation::Stream | Operation::CreatePushConfig(_) => json_body()?,
        // A cancel or subscribe body holds the request message, its tenant included.
        Operation::CancelTask(_) | Operation::Subscribe(_) if !body.is_empty() => json_body()?,
        _ => Value::Null,
    };
    let named = [json.get("tenant").and_then(Value::as_str), query.get("tenant").map(String::as_str)];
    let scope = gateway.auth().scope(&principal, &tenant_of(path_tenant, named)?)?;
    let agent = gateway.agent(Some(agent), &scope)?;
    let result = match operation {
        Operation::Send | Operation::Stream => {
            let request: a2a::SendMessageRequest = from_json(json)?;
            if operation == Operation::Send {
                to_value(gateway.send(&scope, agent, request).await?)
            } else {
                let events = gateway.send_streaming(&scope, agent, request).await?;
                return Ok(stream(gateway, events));
            }
        }
        Operation::Subscribe(id) => return Ok(stream(gateway, gateway.subscribe(&scope, agent, &id).await?)),
        Operation::GetTask(id) => {
            let history_length = number(&query, "historyLength")?;
            to_value(gateway.get_task(&scope, agent, &id, history_length).await?)
        }
        Operation::ListTasks => to_value(gateway.list_tasks(&scope, agent, list_request(&query)?).await?),
        Operation::CancelTask(id) => to_value(gateway.cancel_task(&scope, agent, &id).await?),
        Operation::CreatePushConfig(task_id) => {
            let mut config: a2a::TaskPushNotificationConfig = from_json(json)?;
            config.task_id = task_id;
            to_value(gateway.create_push_config(&scope, agent, config).await?)
        }
        Operation::ListPushConfigs(task_id) => {
            let page_token = query.get("pageToken").map(String::as_str);
            let (configs, next) =
                gateway.list_push_configs(&scope, agent, &task_id, number(&query, "pageSize")?, page_token).await?;
            json!({ "configs": configs, "nextPageToken": next })
        }
        Operation::GetPushConfig(task_id, id) => to_value(gateway.get_push_config(&scope, agent, &task_id, &id).await?),
        Operation::DeletePushConfig(task_id, id) => {
            gateway.delete_push_config(&scope, agent, &task_id, &id).await?;
            json!({})
        }
        Operation::ExtendedCard => to_value(gateway.extended_card(&scope, &agent.id)?),
    };
    Ok(a2a_json(StatusCode::OK, result))
}

/// The tenant a request acts in: its path's, else the one its body or query
/// names (the request message's `tenant` field, as JSON-RPC takes it). A
/// request naming two different tenants is refused.
fn tenant_of(path: String, named: [Option<&str>; 2]) -> Result<String> {
    let mut tenant = path;
    for named in named.into_iter().flatten().filter(|named| !named.is_empty()) {
        if tenant.is_empty() {
            named.clone_into(&mut tenant);
        } else if named != tenant {
            return Err(GatewayError::InvalidParams(format!("the request names tenants {tenant:?} and {named:?}")));
        }
    }
    Ok(tenant)
}

/// The tenant (empty when the path has none) and the operation of `path`.
fn route(method: &Method, path: &str) -> Result<(String, Operation)> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let is_operation =
        |segment: &str| segment == "tasks" || segment == "extendedAgentCard" || segment.starts_with("message:");
    let (tenant, segments) = match segments.split_first() {
        Some((first, rest)) if !is_operation(first) && !rest.is_empty() => ((*first).to_owned(), rest),
        _ => (String::new(), segments.as_slice()),
    };
    let not_found = || GatewayError::MethodNotFound(format!("{method} /{path}"));
    let operation = match (method.as_str(), segments) {
        ("POST", ["message:send"]) => Operation::Send,
        ("POST", ["message:stream"]) => Operation::Stream,
        ("GET", ["tasks"]) => Operation::ListTasks,
        ("GET", ["extendedAgentCard"]) => Operation::ExtendedCard,
        ("POST", ["tasks", id]) if id.ends_with(":cancel") => Operation::CancelTask(action_target(id, ":cancel")),
        ("GET" | "POST", ["tasks", id]) if id.ends_with(":subscribe") => {
            Operation::Subscribe(action_target(id, ":subscribe"))
        }
        ("GET", ["tasks", id]) => Operation::GetTask((*id).to_owned()),
        ("POST", ["tasks", id, "pushNotificationConfigs"]) => Operation::CreatePushConfig((*id).to_owned()),
        ("GET", ["tasks", id, "pushNotificationConfigs"]) => Operation::ListPushConfigs((*id).to_owned()),
        ("GET", ["tasks", id, "pushNotificationConfigs", config]) => {
            Operation::GetPushConfig((*id).to_owned(), (*config).to_owned())
        }
        ("DELETE", ["tasks", id, "pushNotificationConfigs", config]) => {
            Operation::DeletePushConfig((*id).to_owned(), (*config).to_owned())
        }
        _ => return Err(not_found()),
    };
    Ok((tenant, operation))
}

fn action_target(segment: &str, action: &str) -> String {
    segment.strip_suffix(action).unwrap_or(segment).to_owned()
}

fn number<T: std::str::FromStr>(query: &HashMap<String, String>, name: &str) -> Result<Option<T>> {
    query
        .get(name)
        .map(|value| {
            value.parse().map_err(|_| GatewayError::InvalidParams(format!("{name} must be a non-negative integer")))
        })
        .transpose()
}

/// `GET /tasks` query parameters as a ListTasks request.
fn list_request(query: &HashMap<String, String>) -> Result<a2a::ListTasksRequest> {
    let mut request = serde_json::Map::new();
    for (name, value) in query {
        let value = match name.as_str() {
            "pageSize" | "historyLength" => json!(
                value
                    .parse::<i64>()
                    .map_err(|_| { GatewayError::InvalidParams(format!("{name} must be an integer")) })?
            ),
            "includeArtifacts" => match value.as_str() {
                "true" => json!(true),
                "false" => json!(false),
                _ => return Err(GatewayError::InvalidParams(format!("{name} must be true or false, not {value:?}"))),
            },
            "contextId" | "status" | "pageToken" | "statusTimestampAfter" | "tenant" => json!(value),
            // Others (`A2A-Version`, a newer field, a cache buster) are not
            // the request's: ignored, as unknown fields are (spec §5.7).
            _ => continue,
        };
        request.insert(name.clone(), value);
    }
    from_json(Value::Object(request))
}

fn from_json<T: DeserializeOwned>(value: Value) -> Result<T> {
    crate::protojson::parse(value, "request")
}

fn stream(gateway: &Gateway, events: crate::service::EventStream) -> Response {
    http::sse(gateway, events, |event| match event {
        Ok(event) => to_value(event),
        Err(error) => error.rest_body(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_with_and_without_a_tenant() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(route(&post, "message:send").expect("send"), (String::new(), Operation::Send));
        assert_eq!(route(&post, "team-a/message:stream").expect("tenant"), ("team-a".to_owned(), Operation::Stream));
        assert_eq!(route(&get, "tasks/t1").expect("get"), (String::new(), Operation::GetTask("t1".into())));
        assert_eq!(route(&post, "tasks/t1:cancel").expect("cancel").1, Operation::CancelTask("t1".into()));
        assert_eq!(route(&get, "tasks/t1:subscribe").expect("subscribe").1, Operation::Subscribe("t1".into()));
        assert_eq!(route(&post, "tasks/t1:subscribe").expect("subscribe").1, Operation::Subscribe("t1".into()));
        assert_eq!(
            route(&Method::DELETE, "ns/tasks/t1/pushNotificationConfigs/c1").expect("delete"),
            ("ns".to_owned(), Operation::DeletePushConfig("t1".into(), "c1".into()))
        );
        assert!(matches!(route(&Method::PUT, "tasks/t1"), Err(GatewayError::MethodNotFound(_))));
        assert!(matches!(route(&get, "nothing/here/at/all"), Err(GatewayError::MethodNotFound(_))));
    }

    #[test]
    fn list_queries_are_typed() {
        let request = list_request(&http::query(Some("pageSize=5&status=TASK_STATE_WORKING&contextId=a%20b")))
            .expect("a list request");
        assert_eq!(request.page_size, Some(5));
        assert_eq!(request.status, Some(a2a::TaskState::Working));
        assert_eq!(request.context_id.as_deref(), Some("a b"));
        assert!(list_request(&http::query(Some("pageSize=x"))).is_err());
        let unknown = list_request(&http::query(Some("A2A-Version=1.0&bogus=1&pageSize=2"))).expect("unknown ignored");
        assert_eq!(unknown.page_size, Some(2));
        let with = list_request(&http::query(Some("includeArtifacts=true"))).expect("a flag");
        assert_eq!(with.include_artifacts, Some(true));
        for unclear in ["1", "yes", "TRUE", ""] {
            let error = list_request(&http::query(Some(&format!("includeArtifacts={unclear}"))));
            assert!(matches!(error, Err(GatewayError::InvalidParams(_))), "{unclear:?} is not read as false");
        }
    }
}
