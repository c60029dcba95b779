//! The JSON-RPC 2.0 binding (spec §9): `POST /a2a/{agent}`, 1.0 method
//! names, and the 0.3 names and shapes when the request asks for 0.3.

use axum::{
    body::Body,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, Uri},
    response::{IntoResponse, Response},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::{
    auth::Principal,
    compat,
    error::{GatewayError, Result},
    http::{self, Version},
    protojson::to_value,
    service::{self, Gateway},
};

/// A parsed call: its id, what it asks, in which version.
struct Call {
    id: Value,
    /// Sent without an id: the caller wants no answer (JSON-RPC 2.0 §4.1).
    notification: bool,
    principal: Principal,
    method: &'static str,
    params: Value,
    version: Version,
}

/// The 1.0 methods.
const METHODS: &[&str] = &[
    "SendMessage",
    "SendStreamingMessage",
    "GetTask",
    "ListTasks",
    "CancelTask",
    "SubscribeToTask",
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
    "GetExtendedAgentCard",
];

pub(crate) async fn handle(
    State(gateway): State<Gateway>,
    Path(agent): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = match parse(&gateway, &uri, &headers, body).await {
        Ok(call) => call,
        Err(Refused { id, error, notification }) => {
            count(&gateway, "unknown", Err(&error));
            if notification {
                // Not answered, not even with an error (JSON-RPC 2.0 §4.1).
                return StatusCode::NO_CONTENT.into_response();
            }
            return error_response(&id, &error);
        }
    };
    let id = call.id.clone();
    let (notification, method) = (call.notification, call.method);
    let reply = dispatch(&gateway, &agent, call).await;
    count(&gateway, method, reply.as_ref().map(|_| ()));
    if notification {
        // Done, and not answered: not even an error (JSON-RPC 2.0 §4.1).
        return StatusCode::NO_CONTENT.into_response();
    }
    match reply {
        Ok(Reply::Value(result)) => axum::Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response(),
        Ok(Reply::Stream(response)) => response,
        Err(error) => error_response(&id, &error),
    }
}

enum Reply {
    Value(Value),
    Stream(Response),
}

/// A request that cannot be carried out: the error to answer with, and
/// whether it is a notification (a JSON-RPC request without an id), which
/// is not answered at all. One that is not a request object is answered
/// with `id: null`: whether it was a notification cannot be told.
struct Refused {
    id: Value,
    error: GatewayError,
    notification: bool,
}

async fn parse(gateway: &Gateway, uri: &Uri, headers: &HeaderMap, body: Body) -> std::result::Result<Call, Refused> {
    let fail = |error| Refused { id: Value::Null, error, notification: false };
    let principal = match http::authenticate(gateway, headers) {
        Ok(principal) => principal,
        // Refused with the request's id, when its body shows one: an answer
        // names the request it answers.
        Err(error) => {
            let id = http::read_body(gateway, body).await.map_or(Value::Null, |body| request_id(&body));
            return Err(Refused { id, error, notification: false });
        }
    };
    let body = http::read_body(gateway, body).await.map_err(fail)?;
    if !http::is_json(headers) {
        return Err(fail(GatewayError::ContentTypeNotSupported("a JSON-RPC request is application/json".to_owned())));
    }
    let request: Value = serde_json::from_slice(&body)
        .map_err(|error| fail(GatewayError::Parse(format!("the body is not JSON: {error}"))))?;
    let Value::Object(mut request) = request else {
        return Err(fail(GatewayError::InvalidRequest("a JSON-RPC request is an object".to_owned())));
    };
    let notification = !request.contains_key("id");
    let id = match request.remove("id") {
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id,
        Some(_) => return Err(fail(GatewayError::InvalidRequest("id must be a string, a number or null".to_owned()))),
        None => Value::Null,
    };
    // Until it shows a request object, whether it was a notification cannot
    // be told; from then on, a notification's errors go unanswered.
    let answered = |error, notification| Refused { id: id.clone(), error, notification };
    let invalid = |message: &str| answered(GatewayError::InvalidRequest(message.to_owned()), false);
    if request.get("jsonrpc") != Some(&json!("2.0")) {
        return Err(invalid("jsonrpc must be \"2.0\""));
    }
    let Some(Value::String(method)) = request.remove("method") else {
        return Err(invalid("method must be a string"));
    };
    let refused = |error| answered(error, notification);
    let params = match request.remove("params") {
        None | Some(Value::Null) => json!({}),
        Some(params @ Value::Object(_)) => params,
        Some(_) => return Err(refused(GatewayError::InvalidParams("params must be an object".to_owned()))),
    };
    let version = http::version(headers, uri.query(), http::SPEAKS_1_0_AND_0_3).map_err(refused)?;
    let v1_method = METHODS.iter().copied().find(|known| *known == method);
    let (method, params, version) = match (v1_method, version) {
        (Some(method), _) => (method, params, Version::V1),
        (None, Version::V03) => {
            let method =
                compat::method_v1(&method).ok_or_else(|| refused(GatewayError::MethodNotFound(method.clone())))?;
            let params =
                compat::params_to_v1(method, params).map_err(|error| refused(GatewayError::InvalidParams(error)))?;
            (method, params, Version::V03)
        }
        (None, Version::V1) => return Err(refused(GatewayError::MethodNotFound(method))),
    };
    Ok(Call { id, notification, principal, method, params, version })
}

/// The id of the JSON-RPC request `body` holds, if it is a valid one; null
/// otherwise.
fn request_id(body: &[u8]) -> Value {
    let request: Option<Value> = serde_json::from_slice(body).ok();
    let id = request.as_ref().and_then(|request| request.get("id"));
    id.filter(|id| id.is_string() || id.is_number()).cloned().unwrap_or(Value::Null)
}

/// Counts a call by its method (one of [`METHODS`], or `unknown` when it
/// could not be read) and outcome: JSON-RPC errors travel in HTTP 200s, so
/// the HTTP metrics do not tell them.
fn count(gateway: &Gateway, method: &str, outcome: std::result::Result<(), &GatewayError>) {
    let outcome = outcome.map_or_else(GatewayError::reason, |()| "ok");
    gateway.metrics().a2a_jsonrpc_calls.with([method, outcome]).inc();
}

fn params<T: DeserializeOwned>(params: Value) -> Result<T> {
    crate::protojson::parse(params, "params")
}

fn tenant(params: &Value) -> &str {
    params.get("tenant").and_then(Value::as_str).unwrap_or_default()
}

async fn dispatch(gateway: &Gateway, agent: &str, call: Call) -> Result<Reply> {
    let scope = gateway.auth().scope(&call.principal, tenant(&call.params))?;
    let agent = gateway.agent(Some(agent), &scope)?;
    let version = call.version;
    let method = call.method;
    let result = match method {
        "SendMessage" | "SendStreamingMessage" => {
            let request: a2a::SendMessageRequest = params(call.params)?;
            if method == "SendMessage" {
                to_value(gateway.send(&scope, agent, request).await?)
            } else {
                let events = gateway.send_streaming(&scope, agent, request).await?;
                return Ok(Reply::Stream(stream(gateway, call.id, version, events)));
            }
        }
        "SubscribeToTask" => {
            let request: a2a::SubscribeToTaskRequest = params(call.params)?;
            let events = gateway.subscribe(&scope, agent, &request.id).await?;
            return Ok(Reply::Stream(stream(gateway, call.id, version, events)));
        }
        "GetTask" => {
            let request: a2a::GetTaskRequest = params(call.params)?;
            let history_length = service::history_length(request.history_length)?;
            to_value(gateway.get_task(&scope, agent, &request.id, history_length).await?)
        }
        "ListTasks" => to_value(gateway.list_tasks(&scope, agent, params(call.params)?).await?),
        "CancelTask" => {
            let request: a2a::CancelTaskRequest = params(call.params)?;
            to_value(gateway.cancel_task(&scope, agent, &request.id).await?)
        }
        "CreateTaskPushNotificationConfig" => {
            to_value(gateway.create_push_config(&scope, agent, params(call.params)?).await?)
        }
        "GetTaskPushNotificationConfig" => {
            let request: a2a::GetTaskPushNotificationConfigRequest = params(call.params)?;
            to_value(gateway.get_push_config(&scope, agent, &request.task_id, &request.id).await?)
        }
        "ListTaskPushNotificationConfigs" => {
            let request: a2a::ListTaskPushNotificationConfigsRequest = params(call.params)?;
            let page_token = request.page_token.as_deref();
            let (configs, next) =
                gateway.list_push_configs(&scope, agent, &request.task_id, request.page_size, page_token).await?;
            json!({ "configs": configs, "nextPageToken": next })
        }
        "DeleteTaskPushNotificationConfig" => {
            let request: a2a::DeleteTaskPushNotificationConfigRequest = params(call.params)?;
            gateway.delete_push_config(&scope, agent, &request.task_id, &request.id).await?;
            json!({})
        }
        "GetExtendedAgentCard" => to_value(gateway.extended_card(&scope, &agent.id)?),
        other => return Err(GatewayError::MethodNotFound(other.to_owned())),
    };
    Ok(Reply::Value(match version {
        Version::V1 => result,
        Version::V03 => compat::result_to_v03(method, result),
    }))
}

fn stream(gateway: &Gateway, id: Value, version: Version, events: crate::service::EventStream) -> Response {
    http::sse(gateway, events, move |event| match event {
        Ok(event) => {
            let event = to_value(event);
            let result = match version {
                Version::V1 => event,
                Version::V03 => compat::stream_event_to_v03(event),
            };
            json!({ "jsonrpc": "2.0", "id": id, "result": result })
        }
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error.jsonrpc_error() }),
    })
}

fn error_response(id: &Value, error: &GatewayError) -> Response {
    // JSON-RPC errors travel in a 200, except those refused before the
    // call is read at all.
    let status = match error.http_status() {
        status @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::PAYLOAD_TOO_LARGE) => status,
        _ => StatusCode::OK,
    };
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": error.jsonrpc_error() });
    http::challenged((status, axum::Json(body)).into_response(), error)
}
