//! A2A edges a conformance kit seldom walks, over the real `chorus dev`: the
//! version and parameters of its own in a REST query, proto3's empty
//! strings, media types with parameters, and the history a stream's first
//! task carries.

use chorus_tests::{
    Sandbox,
    a2a::{A2a, assert_rest_error, assert_rpc_error, events, json, message, state, unique},
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_query_may_name_the_version_and_carry_parameters_of_its_own() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let a2a = A2a::new(&server);
    let task = a2a.send("echo", message("q-1", "listed")).await;

    for query in ["A2A-Version=1.0", "a2a-version=1%2E0&cache=123", "pageSize=1&future=yes"] {
        let (status, page) = json(a2a.rest(Method::GET, "echo", &format!("tasks?{query}"))).await;
        assert_eq!((status, &page["tasks"][0]["id"]), (StatusCode::OK, &task["id"]), "{query}: {page:#}");
    }
    // Without the header, the query's version is the request's: this binding
    // serves 1.0, and refuses 0.3 there as in the header.
    let id = task["id"].as_str().unwrap_or_default();
    let plain = |query: &str| a2a.http().get(format!("{}/a2a/echo/rest/tasks/{id}?{query}", a2a.base()));
    let (status, read) = json(plain("A2A-Version=1.0")).await;
    assert_eq!((status, &read["id"]), (StatusCode::OK, &task["id"]), "{read:#}");
    for query in ["A2A-Version=0.3", "a2a-version=0%2E3", "A2A-Version=2.0"] {
        let (status, body) = json(plain(query)).await;
        assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "VERSION_NOT_SUPPORTED");
    }
}

fn part(text: &str, media_type: &str) -> Value {
    json!({ "text": text, "mediaType": media_type, "filename": "" })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_strings_are_unset_and_media_types_match_whatever_their_parameters() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let a2a = A2a::new(&server);

    // An a2a-sdk client sends proto3 defaults as "": no task to continue,
    // no context, no media type.
    let defaults = json!({ "messageId": "e-1", "role": "ROLE_USER", "taskId": "", "contextId": "",
        "parts": [part("plain", "")] });
    let task = a2a.send("echo", defaults).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");
    assert!(task["contextId"].as_str().is_some_and(|context| !context.is_empty()), "a new context: {task:#}");

    for media_type in ["text/plain; charset=utf-8", "Text/Plain", "application/json;charset=UTF-8"] {
        let typed = json!({ "messageId": unique("t"), "role": "ROLE_USER", "parts": [part("typed", media_type)] });
        assert_eq!(state(&a2a.send("echo", typed).await), "TASK_STATE_COMPLETED", "{media_type}");
    }
    let image = json!({ "messageId": "i-1", "role": "ROLE_USER", "parts": [part("png?", "image/png")] });
    let refused = a2a.call_error("echo", "SendMessage", json!({ "message": image })).await;
    assert_rpc_error(&refused, -32005, "CONTENT_TYPE_NOT_SUPPORTED");
}

fn first_task(events: &[Value]) -> &Value {
    let task = &events.first().unwrap_or_else(|| panic!("an empty stream"))["result"]["task"];
    assert!(task.is_object(), "the stream starts with the task: {events:#?}");
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_starts_with_as_much_history_as_asked() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);

    let none = json!({ "message": message(&unique("tck-stream-001"), "go"), "configuration": { "historyLength": 0 } });
    let streamed = events(a2a.rpc("tck", "SendStreamingMessage", none)).await;
    assert!(first_task(&streamed).get("history").is_none(), "historyLength 0: {streamed:#?}");

    let waiting = a2a.send("tck", message(&unique("tck-input-required"), "which table?")).await;
    assert_eq!(state(&waiting), "TASK_STATE_INPUT_REQUIRED");
    let mut answer = message("answer-1", "the blue one");
    answer["taskId"] = waiting["id"].clone();
    let latest = json!({ "message": answer, "configuration": { "historyLength": 1 } });
    let streamed = events(a2a.rpc("tck", "SendStreamingMessage", latest)).await;
    let history = first_task(&streamed)["history"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&Value> = history.iter().map(|message| &message["messageId"]).collect();
    assert_eq!(ids, [&json!("answer-1")], "historyLength 1 keeps the latest message: {streamed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_config_sent_with_a_message_is_read_back_by_the_task_id_as_0_3_clients_do() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true").start().await;
    let a2a = A2a::new(&server);
    // A 0.3 client (no A2A-Version) registers its webhook with the message,
    // then reads it back the 0.3 way: by the task's id alone.
    let v03 = |body: Value| a2a.http().post(format!("{}/a2a/echo", a2a.base())).json(&body);
    let send = json!({ "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {
        "configuration": { "blocking": true, "pushNotificationConfig": { "url": "http://127.0.0.1:9/hook" } },
        "message": { "kind": "message", "messageId": unique("v03"), "role": "user",
            "parts": [{ "kind": "text", "text": "tell me" }] } } });
    let (_, sent) = json(v03(send)).await;
    let task_id = sent["result"]["id"].clone();
    assert!(task_id.is_string(), "{sent:#}");
    let get = json!({ "jsonrpc": "2.0", "id": 2, "method": "tasks/pushNotificationConfig/get",
        "params": { "id": task_id } });
    let (_, read) = json(v03(get)).await;
    assert_eq!(read["result"]["pushNotificationConfig"]["url"], "http://127.0.0.1:9/hook", "{read:#}");
    assert_eq!(read["result"]["pushNotificationConfig"]["id"], task_id, "{read:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_is_carried_out_and_not_answered() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let a2a = A2a::new(&server);
    // JSON-RPC 2.0 §4.1: a request without an id wants no answer, not even
    // an error.
    let notify = |method: &str, params: Value| {
        let body = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        a2a.rpc_body("echo", &body).send()
    };
    let sent = notify("SendMessage", json!({ "message": message(&unique("n"), "fire and forget") })).await;
    let sent = sent.expect("an answer");
    assert_eq!(sent.status(), StatusCode::NO_CONTENT);
    assert_eq!(sent.text().await.expect("body"), "");
    assert_eq!(a2a.task_count().await, 1, "the notification was carried out");
    let failed = notify("GetTask", json!({ "id": "01a20e17-efb3-7144-a5b3-4e3c0228e429" })).await.expect("an answer");
    assert_eq!(failed.status(), StatusCode::NO_CONTENT);
    // Nor is one whose method or params are wrong: a request object still.
    for (method, params) in [("Bogus", json!({})), ("GetTask", json!(5))] {
        let refused = notify(method, params).await.expect("an answer");
        assert_eq!(refused.status(), StatusCode::NO_CONTENT, "{method}");
    }
    // What is no request object is answered, its id unknown (null).
    let (_, answer) = json(a2a.rpc_body("echo", &json!({ "method": "GetTask" }))).await;
    assert_rpc_error(&answer["error"], -32600, "INVALID_REQUEST");
    // With an id, even null, a request is answered.
    let body = json!({ "jsonrpc": "2.0", "id": null, "method": "GetTask", "params": { "id": "nope" } });
    let (status, answer) = json(a2a.rpc_body("echo", &body)).await;
    assert_eq!(status, StatusCode::OK, "{answer:#}");
    assert_rpc_error(&answer["error"], -32001, "TASK_NOT_FOUND");
}
