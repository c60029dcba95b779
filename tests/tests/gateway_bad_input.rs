//! Bad input against the gateway of a running `chorus dev`, on all three
//! bindings: each request gets the A2A error a caller can act on, creates
//! nothing, and the server keeps serving.

use a2a_pb::proto as pb;
use chorus_tests::{
    Sandbox, Server,
    a2a::{
        A2a, assert_grpc_error, assert_rest_error, assert_rpc_error, grpc_request, json, message, rpc_error,
        rpc_request, state, unique,
    },
};
use reqwest::{Method, StatusCode, header::CONTENT_TYPE};
use serde_json::{Value, json};
use tonic::{Code, metadata::MetadataValue};

/// A body limit small enough to pass in a test.
const MAX_BODY_BYTES: usize = 4096;

async fn dev_server(sandbox: &Sandbox) -> Server {
    let limit = MAX_BODY_BYTES.to_string();
    sandbox.dev().no_agents().env("CHORUS_GATEWAY__MAX_BODY_BYTES", limit).start().await
}

/// After a refused request: the server still answers a valid one, and the
/// default namespace still holds `tasks` tasks.
async fn still_serving(a2a: &A2a, tasks: u64) {
    assert_eq!(a2a.task_count().await, tasks, "a refused request created no task");
}

/// Whether a JSON-RPC error's message names `field` (as a word: `id` is
/// not named by "invalid").
fn names(error: &Value, field: &str) -> bool {
    let text = error["message"].as_str().unwrap_or_default();
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    text.match_indices(field)
        .any(|(at, _)| !is_word(text[..at].chars().next_back()) && !is_word(text[at + field.len()..].chars().next()))
}

#[track_caller]
fn assert_names(error: &Value, field: &str) {
    assert!(names(error, field), "the error names `{field}`: {error:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_rpc_gets_its_json_rpc_error() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let endpoint = format!("{}/a2a/tck", a2a.base());
    let raw = |body: &str| {
        let request = a2a.http().post(&endpoint).header("A2A-Version", "1.0");
        request.header(CONTENT_TYPE, "application/json").body(body.to_owned())
    };

    let error = rpc_error(raw(r#"{"jsonrpc": "2.0", "id": 1, "method": "GetTask""#)).await;
    assert_rpc_error(&error, -32700, "PARSE_ERROR");
    still_serving(&a2a, 0).await;
    let envelopes = [
        json!([{ "jsonrpc": "2.0", "id": 1, "method": "ListTasks" }]),
        json!("ListTasks"),
        json!({ "id": 1, "method": "ListTasks" }),
        json!({ "jsonrpc": "1.0", "id": 1, "method": "ListTasks" }),
        json!({ "jsonrpc": "2.0", "id": 1, "method": 42 }),
        json!({ "jsonrpc": "2.0", "id": 1 }),
        json!({ "jsonrpc": "2.0", "id": { "not": "an id" }, "method": "ListTasks" }),
    ];
    for envelope in envelopes {
        let error = rpc_error(raw(&envelope.to_string())).await;
        assert_rpc_error(&error, -32600, "INVALID_REQUEST");
        still_serving(&a2a, 0).await;
    }
    for method in ["NoSuchMethod", "message/send", "sendMessage"] {
        let error = a2a.call_error("tck", method, json!({})).await;
        assert_rpc_error(&error, -32601, "METHOD_NOT_FOUND");
        assert_names(&error, method);
        still_serving(&a2a, 0).await;
    }

    let valid = || message(&unique("tck-complete-task"), "hello");
    let mut parts_a_string = valid();
    parts_a_string["parts"] = json!("hello");
    let mut no_message_id = valid();
    no_message_id.as_object_mut().expect("an object").remove("messageId");
    let mut empty_message_id = valid();
    empty_message_id["messageId"] = json!("");
    let mut no_parts = valid();
    no_parts["parts"] = json!([]);
    let mut no_role = valid();
    no_role.as_object_mut().expect("an object").remove("role");
    let error = a2a.call_error("tck", "SendMessage", json!({ "message": parts_a_string })).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    still_serving(&a2a, 0).await;
    let cases = [
        (json!({ "message": no_message_id }), "messageId"),
        (json!({ "message": empty_message_id }), "messageId"),
        (json!({ "message": no_parts }), "parts"),
        (json!({ "message": no_role.clone() }), "role"),
        (json!({}), "message"),
    ];
    for (params, field) in cases {
        let error = a2a.call_error("tck", "SendMessage", params.clone()).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
        assert_names(&error, field);
        still_serving(&a2a, 0).await;
    }
    // ProtoJSON writers leave default values out: an omitted list is empty and
    // an omitted enum unspecified, and the message is judged as such.
    let mut omitted_parts = valid();
    omitted_parts.as_object_mut().expect("an object").remove("parts");
    let said = |error: &Value| error["message"].as_str().unwrap_or_default().to_owned();
    let error = a2a.call_error("tck", "SendMessage", json!({ "message": omitted_parts })).await;
    assert!(said(&error).contains("message.parts must not be empty"), "{error:#}");
    let error = a2a.call_error("tck", "SendMessage", json!({ "message": no_role })).await;
    assert!(said(&error).contains("message.role must be ROLE_USER or ROLE_AGENT"), "{error:#}");
    let error =
        rpc_error(a2a.rpc_body("tck", &json!({ "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": [1] })));
    assert_rpc_error(&error.await, -32602, "INVALID_PARAMS");

    let body = rpc_request("SendMessage", json!({ "message": valid() })).to_string();
    let wrong_type = a2a.http().post(&endpoint).header("A2A-Version", "1.0").header(CONTENT_TYPE, "text/plain");
    assert_rpc_error(&rpc_error(wrong_type.body(body)).await, -32005, "CONTENT_TYPE_NOT_SUPPORTED");
    let mut image = valid();
    image["parts"] = json!([{ "raw": "iVBORw0KGgo=", "mediaType": "image/png" }]);
    let error = a2a.call_error("tck", "SendMessage", json!({ "message": image })).await;
    assert_rpc_error(&error, -32005, "CONTENT_TYPE_NOT_SUPPORTED");
    assert_names(&error, "image/png");
    still_serving(&a2a, 0).await;

    let task = a2a.send("tck", valid()).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "a valid request still works: {task:#}");
    still_serving(&a2a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_body_is_refused_with_413() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let big = "x".repeat(MAX_BODY_BYTES * 2);

    let request = a2a.rpc("tck", "SendMessage", json!({ "message": message(&unique("tck-complete-task"), &big) }));
    let (status, body) = json(request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body:#}");
    assert_eq!((&body["jsonrpc"], body.get("result")), (&json!("2.0"), None), "a JSON-RPC error body: {body:#}");
    assert_eq!(body["error"]["data"][0]["reason"], "PAYLOAD_TOO_LARGE", "{body:#}");
    let rest = a2a.rest(Method::POST, "tck", "message:send");
    let (status, body) = json(rest.json(&json!({ "message": message(&unique("tck-complete-task"), &big) }))).await;
    assert_rest_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE");
    // Far larger ones, still on their way when the limit is passed, get it
    // too, every time (not a broken pipe).
    let huge = "x".repeat(8 * 1024 * 1024);
    for _ in 0..5 {
        let (status, _) = json(a2a.rpc("tck", "SendMessage", json!({ "message": message("huge", &huge) }))).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }
    still_serving(&a2a, 0).await;
    let fits = a2a.send("tck", message(&unique("tck-complete-task"), &"x".repeat(MAX_BODY_BYTES / 2))).await;
    assert_eq!(state(&fits), "TASK_STATE_COMPLETED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_task_ids_are_not_found_on_every_binding() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let id = "no-such-task";

    let calls = [
        ("GetTask", json!({ "id": id })),
        ("CancelTask", json!({ "id": id })),
        ("SubscribeToTask", json!({ "id": id })),
        ("CreateTaskPushNotificationConfig", json!({ "taskId": id, "url": "https://example.com/hook" })),
        ("GetTaskPushNotificationConfig", json!({ "taskId": id, "id": "c1" })),
        ("ListTaskPushNotificationConfigs", json!({ "taskId": id })),
        ("DeleteTaskPushNotificationConfig", json!({ "taskId": id, "id": "c1" })),
        (
            "SendMessage",
            json!({ "message": { "taskId": id, "messageId": "m", "role": "ROLE_USER", "parts": [{ "text": "?" }] } }),
        ),
    ];
    for (method, params) in calls {
        let error = a2a.call_error("tck", method, params).await;
        assert_rpc_error(&error, -32001, "TASK_NOT_FOUND");
    }
    let paths = [
        (Method::GET, format!("tasks/{id}")),
        (Method::POST, format!("tasks/{id}:cancel")),
        (Method::GET, format!("tasks/{id}:subscribe")),
        (Method::POST, format!("tasks/{id}:subscribe")),
        (Method::GET, format!("tasks/{id}/pushNotificationConfigs")),
        (Method::GET, format!("tasks/{id}/pushNotificationConfigs/c1")),
        (Method::DELETE, format!("tasks/{id}/pushNotificationConfigs/c1")),
    ];
    for (method, path) in paths {
        let (status, body) = json(a2a.rest(method.clone(), "tck", &path)).await;
        assert_rest_error(status, &body, StatusCode::NOT_FOUND, "TASK_NOT_FOUND");
    }
    // An error is of the binding's media type, as a result is (spec §11.1).
    let response = a2a.rest(Method::GET, "tck", &format!("tasks/{id}")).send().await.expect("an answer");
    assert_eq!(response.headers()[CONTENT_TYPE], "application/a2a+json");

    let mut client = A2a::grpc(&server).await;
    let get = pb::GetTaskRequest { id: id.to_owned(), ..pb::GetTaskRequest::default() };
    assert_grpc_error(client.get_task(grpc_request(get)).await, Code::NotFound, "TASK_NOT_FOUND");
    let cancel = pb::CancelTaskRequest { id: id.to_owned(), ..pb::CancelTaskRequest::default() };
    assert_grpc_error(client.cancel_task(grpc_request(cancel)).await, Code::NotFound, "TASK_NOT_FOUND");
    let subscribe = pb::SubscribeToTaskRequest { id: id.to_owned(), ..pb::SubscribeToTaskRequest::default() };
    let subscribed = client.subscribe_to_task(grpc_request(subscribe)).await.map(|_| ());
    assert_grpc_error(subscribed, Code::NotFound, "TASK_NOT_FOUND");
    let list = pb::ListTaskPushNotificationConfigsRequest { task_id: id.to_owned(), ..Default::default() };
    let listed = client.list_task_push_notification_configs(grpc_request(list)).await;
    assert_grpc_error(listed, Code::NotFound, "TASK_NOT_FOUND");
    still_serving(&a2a, 0).await;

    // A task that exists, without the config asked for: the error says which is missing.
    let task = a2a.send("tck", message(&unique("tck-complete-task"), "hello")).await;
    let error =
        a2a.call_error("tck", "GetTaskPushNotificationConfig", json!({ "taskId": task["id"], "id": "c1" })).await;
    assert_rpc_error(&error, -32001, "TASK_NOT_FOUND");
    let expected = format!("push notification config c1 of task {} not found", task["id"].as_str().unwrap_or_default());
    assert_eq!(error["message"], expected, "{error:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_errors_have_the_aip_193_shape() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);

    for (method, path) in [(Method::GET, "no/such/path/here"), (Method::PUT, "tasks/x"), (Method::GET, "message:send")]
    {
        let (status, body) = json(a2a.rest(method, "tck", path)).await;
        assert_rest_error(status, &body, StatusCode::NOT_FOUND, "METHOD_NOT_FOUND");
        assert_eq!(body["error"]["status"], "NOT_FOUND", "the status agrees with 404: {body:#}");
    }
    let send = a2a.rest(Method::POST, "tck", "message:send").header(CONTENT_TYPE, "application/a2a+json");
    let (status, body) = json(send.body(r#"{"message": {"messageId": "#)).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "PARSE_ERROR");
    let send = a2a.rest(Method::POST, "tck", "message:send");
    let (status, body) = json(send.json(&json!({ "message": { "messageId": "m", "parts": "text" } }))).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    let send = a2a.rest(Method::POST, "tck", "message:send").header(CONTENT_TYPE, "text/plain").body("hello");
    let (status, body) = json(send).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "CONTENT_TYPE_NOT_SUPPORTED");
    let (status, body) = json(a2a.rest(Method::GET, "tck", "tasks?pageSize=many")).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    still_serving(&a2a, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_param_of_the_wrong_type_is_named() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let mut parts_a_string = message(&unique("tck-complete-task"), "hello");
    parts_a_string["parts"] = json!("hello");
    let mut bad_role = message(&unique("tck-complete-task"), "hello");
    bad_role["role"] = json!("ROLE_OVERLORD");
    let history_a_word = json!({ "message": message(&unique("tck-complete-task"), "hello"),
        "configuration": { "historyLength": "all" } });
    let cases = [
        ("SendMessage", json!({ "message": parts_a_string }), "parts"),
        ("SendMessage", history_a_word, "historyLength"),
        ("SendMessage", json!({ "message": bad_role }), "role"),
        ("GetTask", json!({ "id": 42 }), "id"),
        ("ListTasks", json!({ "pageSize": "ten" }), "pageSize"),
    ];
    let mut unnamed = Vec::new();
    for (method, params, field) in cases {
        let error = a2a.call_error("tck", method, params).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
        if !names(&error, field) {
            unnamed.push(format!("{method} with a bad {field}: {}", error["message"]));
        }
        still_serving(&a2a, 0).await;
    }
    assert!(unnamed.is_empty(), "errors that do not name their field:\n{}", unnamed.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_is_not_in_the_catalog_serves_nothing() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let task = a2a.send("tck", message(&unique("tck-complete-task"), "hello")).await;

    let error = a2a.call_error("nobody", "SendMessage", json!({ "message": message("m", "anyone?") })).await;
    assert_eq!(error["data"][0]["reason"], "AGENT_NOT_FOUND", "{error:#}");
    let send = a2a.rest(Method::POST, "nobody", "message:send").json(&json!({ "message": message("m", "?") }));
    let (status, body) = json(send).await;
    assert_rest_error(status, &body, StatusCode::NOT_FOUND, "AGENT_NOT_FOUND");

    // Reads through an unknown agent's URL are refused as well.
    let mut served = Vec::new();
    let id = task["id"].as_str().unwrap_or_default();
    for path in ["tasks".to_owned(), format!("tasks/{id}")] {
        let (status, body) = json(a2a.rest(Method::GET, "nobody", &path)).await;
        if status != StatusCode::NOT_FOUND || body["error"]["details"][0]["reason"] != "AGENT_NOT_FOUND" {
            served.push(format!("GET /a2a/nobody/rest/{path}: HTTP {status}"));
        }
    }
    for (method, params) in [("GetTask", json!({ "id": id })), ("ListTasks", json!({}))] {
        let (_, body) = json(a2a.rpc("nobody", method, params)).await;
        if body["error"]["data"][0]["reason"] != "AGENT_NOT_FOUND" {
            served.push(format!(
                "{method} on /a2a/nobody: {}",
                if body.get("result").is_some() { "a result" } else { "another error" }
            ));
        }
    }
    assert!(served.is_empty(), "an unknown agent's URL served:\n{}", served.join("\n"));
    still_serving(&a2a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_version_is_refused_on_every_binding() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let send = || json!({ "message": message(&unique("tck-complete-task"), "from the future") });

    let future = |path: &str| a2a.http().post(format!("{}/a2a/tck{path}", a2a.base())).header("A2A-Version", "99.0");
    let request = future("").json(&rpc_request("SendMessage", send()));
    let error = rpc_error(request).await;
    assert_rpc_error(&error, -32009, "VERSION_NOT_SUPPORTED");
    assert!(error["message"].as_str().unwrap_or_default().ends_with("speaks 1.0 and 0.3"), "{error:#}");
    let (status, body) = json(future("/rest/message:send").json(&send())).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "VERSION_NOT_SUPPORTED");
    let older = a2a.http().post(format!("{}/a2a/tck/rest/message:send", a2a.base())).header("A2A-Version", "0.3");
    let (status, body) = json(older.json(&send())).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "VERSION_NOT_SUPPORTED");
    let said = body["error"]["message"].as_str().unwrap_or_default();
    assert!(said.ends_with("this binding speaks 1.0"), "HTTP+JSON does not speak 0.3: {body:#}");
    let by_query = a2a.http().get(format!("{}/a2a/tck/rest/tasks?A2A-Version=99.0", a2a.base()));
    let (status, body) = json(by_query).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "VERSION_NOT_SUPPORTED");

    let mut client = A2a::grpc(&server).await;
    let message = pb::Message {
        message_id: unique("tck-complete-task"),
        role: pb::Role::User.into(),
        parts: vec![pb::Part { content: Some(pb::part::Content::Text("hi".to_owned())), ..pb::Part::default() }],
        ..pb::Message::default()
    };
    let mut request =
        tonic::Request::new(pb::SendMessageRequest { message: Some(message), ..pb::SendMessageRequest::default() });
    request.metadata_mut().insert("a2a-version", MetadataValue::from_static("99.0"));
    assert_grpc_error(client.send_message(request).await, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
    still_serving(&a2a, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_sizes_and_history_lengths_out_of_range_are_invalid() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let task = a2a.send("tck", message(&unique("tck-complete-task"), "one")).await;
    let id = task["id"].as_str().expect("a task id").to_owned();

    for params in [json!({ "pageSize": 0 }), json!({ "pageSize": 101 }), json!({ "historyLength": -1 })] {
        let error = a2a.call_error("tck", "ListTasks", params.clone()).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    }
    for query in ["pageSize=0", "pageSize=101", "historyLength=-1"] {
        let (status, body) = json(a2a.rest(Method::GET, "tck", &format!("tasks?{query}"))).await;
        assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    }
    let error = a2a.call_error("tck", "GetTask", json!({ "id": id, "historyLength": -1 })).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    assert_names(&error, "historyLength");
    let (status, body) = json(a2a.rest(Method::GET, "tck", &format!("tasks/{id}?historyLength=-1"))).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    let mut client = A2a::grpc(&server).await;
    let get = pb::GetTaskRequest { id: id.clone(), history_length: Some(-1), ..pb::GetTaskRequest::default() };
    assert_grpc_error(client.get_task(grpc_request(get)).await, Code::InvalidArgument, "INVALID_PARAMS");
    let list = pb::ListTasksRequest { page_size: Some(101), ..pb::ListTasksRequest::default() };
    assert_grpc_error(client.list_tasks(grpc_request(list)).await, Code::InvalidArgument, "INVALID_PARAMS");
    let send =
        json!({ "message": message(&unique("tck-complete-task"), "two"), "configuration": { "historyLength": -1 } });
    let error = a2a.call_error("tck", "SendMessage", send).await;
    assert_rpc_error(&error, -32602, "INVALID_PARAMS");
    still_serving(&a2a, 1).await;

    let empty = pb::SendMessageRequest::default();
    let sent = client.send_message(grpc_request(empty)).await;
    assert_grpc_error(sent, Code::InvalidArgument, "INVALID_PARAMS");
    still_serving(&a2a, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_binding_refuses_what_json_rpc_refuses() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let mut client = A2a::grpc(&server).await;

    let empty_part = pb::Message {
        message_id: unique("tck-complete-task"),
        role: pb::Role::User.into(),
        parts: vec![pb::Part::default()],
        ..pb::Message::default()
    };
    let send = pb::SendMessageRequest { message: Some(empty_part), ..pb::SendMessageRequest::default() };
    assert_grpc_error(client.send_message(grpc_request(send)).await, Code::InvalidArgument, "INVALID_PARAMS");
    let nothing = client.send_message(grpc_request(pb::SendMessageRequest::default())).await;
    assert_eq!(nothing.as_ref().map_err(tonic::Status::message).err(), Some("message is required"), "{nothing:?}");
    for page_size in [0, -5] {
        let list = pb::ListTasksRequest { page_size: Some(page_size), ..pb::ListTasksRequest::default() };
        assert_grpc_error(client.list_tasks(grpc_request(list)).await, Code::InvalidArgument, "INVALID_PARAMS");
    }
    let list = pb::ListTasksRequest { status: 99, ..pb::ListTasksRequest::default() };
    assert_grpc_error(client.list_tasks(grpc_request(list)).await, Code::InvalidArgument, "INVALID_PARAMS");
    let get = pb::GetTaskRequest { tenant: "default/nope".into(), id: "x".into(), ..pb::GetTaskRequest::default() };
    assert_grpc_error(client.get_task(grpc_request(get)).await, Code::NotFound, "AGENT_NOT_FOUND");
    still_serving(&a2a, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_request_timeout_gets_an_answer_its_binding_reads() {
    // A task store that takes connections and never answers.
    let (address, _held) = chorus_tests::a2a::silent_address().await;
    let silent = format!("http://{address}");
    let sandbox = Sandbox::new();
    let server = sandbox
        .serve("gateway", "")
        .env("CHORUS_GATEWAY__TASKSTORE_URL", &silent)
        .env("CHORUS_SERVER__REQUEST_TIMEOUT_MS", "1000")
        .env("CHORUS_GATEWAY__BLOCKING_TIMEOUT_MS", "500")
        .start()
        .await;
    let a2a = A2a::new(&server);

    // HTTP callers get 504 and a body they read, not a gRPC status in
    // trailers of an empty 200.
    let get = json!({ "id": "01a20e17-efb3-7144-a5b3-4e3c0228e429" });
    let (status, body) = json(a2a.rpc("tck", "GetTask", get)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body:#}");
    assert_eq!(body["error"]["status"], "DEADLINE_EXCEEDED", "{body:#}");
    let (status, body) = json(a2a.rest(Method::GET, "tck", "tasks/01a20e17-efb3-7144-a5b3-4e3c0228e429")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body:#}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("server.request_timeout_ms"), "{body:#}");

    // gRPC callers get the status tonic's own timeout gives.
    let mut client = A2a::grpc(&server).await;
    let get = pb::GetTaskRequest { id: "01a20e17-efb3-7144-a5b3-4e3c0228e429".into(), ..Default::default() };
    let error = client.get_task(grpc_request(get)).await.expect_err("timed out");
    assert_eq!(error.code(), Code::Cancelled, "{error:?}");
    assert!(error.message().starts_with("no answer within 1000 ms (server.request_timeout_ms)"), "{error:?}");
    // Its log, written to a pipe, holds no colour codes.
    let log = server.output();
    assert!(log.contains("A2A gateway mounted") && !log.contains('\u{1b}'), "{log}");

    // A blocking send the request timeout would cut is refused at start-up.
    let refused = tokio::process::Command::new(chorus_tests::server::chorus_bin())
        .args(["serve", "gateway", "--listen", "127.0.0.1:0"])
        .current_dir(sandbox.path())
        .env("CHORUS_GATEWAY__TASKSTORE_URL", &silent)
        .env("CHORUS_SERVER__REQUEST_TIMEOUT_MS", "1000")
        .env("CHORUS_GATEWAY__BLOCKING_TIMEOUT_MS", "1000")
        .output()
        .await
        .expect("run chorus");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("gateway.blocking_timeout_ms (1000) must be shorter than server.request_timeout_ms"),
        "{stderr}"
    );
    // Where logs are JSON, so is the error that stops the process.
    let refused = tokio::process::Command::new(chorus_tests::server::chorus_bin())
        .args(["serve", "gateway", "--listen", "127.0.0.1:0"])
        .current_dir(sandbox.path())
        .env("CHORUS_GATEWAY__TASKSTORE_URL", "127.0.0.1:7800")
        .env("CHORUS_TELEMETRY__LOG_FORMAT", "json")
        .output()
        .await
        .expect("run chorus");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let last: Value = serde_json::from_str(stderr.lines().last().unwrap_or_default()).expect("a JSON line");
    assert_eq!((&last["level"], &last["message"]), (&json!("ERROR"), &json!("chorus stopped")), "{stderr}");
    assert!(last["error"].as_str().is_some_and(|error| error.contains("must start with http://")), "{stderr}");
    // Settings no process could work with stop it before it starts, each named.
    let refused = tokio::process::Command::new(chorus_tests::server::chorus_bin())
        .args(["serve", "hub", "--listen", "127.0.0.1:0"])
        .current_dir(sandbox.path())
        .env("CHORUS_SERVER__REQUEST_TIMEOUT_MS", "0")
        .env("CHORUS_HUB__DEFAULT_TTL_MS", "9000000")
        .env("CHORUS_HUB__MAX_TTL_MS", "1000")
        .output()
        .await
        .expect("run chorus");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    for said in ["server.request_timeout_ms must be more than 0", "hub.default_ttl_ms (9000000) must be at most"] {
        assert!(stderr.contains(said), "{said}: {stderr}");
    }
}
