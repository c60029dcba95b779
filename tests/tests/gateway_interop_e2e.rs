//! The gateway's other faces: the gRPC binding (`lf.a2a.v1.A2AService`,
//! called with the official `a2a-pb` client on the same port as HTTP) and
//! A2A 0.3 callers, who send no `A2A-Version` and get 0.3 shapes back.

use a2a_pb::proto::{self as pb, send_message_response::Payload, stream_response::Payload as Event};
use chorus_tests::{
    DEADLINE, Sandbox,
    a2a::{A2a, assert_grpc_error, assert_rpc_error, events, grpc_request, json, unique},
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tonic::Code;

fn pb_message(message_id: &str, text: &str) -> pb::Message {
    pb::Message {
        message_id: message_id.to_owned(),
        role: pb::Role::User.into(),
        parts: vec![pb::Part { content: Some(pb::part::Content::Text(text.to_owned())), ..pb::Part::default() }],
        ..pb::Message::default()
    }
}

fn send(tenant: &str, message: pb::Message) -> tonic::Request<pb::SendMessageRequest> {
    grpc_request(pb::SendMessageRequest {
        tenant: tenant.to_owned(),
        message: Some(message),
        ..pb::SendMessageRequest::default()
    })
}

fn parts_text(parts: &[pb::Part]) -> &str {
    match parts.first().and_then(|part| part.content.as_ref()) {
        Some(pb::part::Content::Text(text)) => text,
        other => panic!("no text part: {other:?}"),
    }
}

fn pb_state(task: &pb::Task) -> pb::TaskState {
    task.status.as_ref().map_or(pb::TaskState::Unspecified, |status| status.state())
}

fn status_message(task: &pb::Task) -> &str {
    parts_text(task.status.as_ref().and_then(|status| status.message.as_ref()).map_or(&[], |message| &message.parts))
}

fn task_of(response: pb::SendMessageResponse) -> pb::Task {
    match response.payload {
        Some(Payload::Task(task)) => task,
        other => panic!("SendMessage answered no task: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_binding_sends_gets_streams_and_routes_by_tenant() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let mut client = A2a::grpc(&server).await;

    let sent = client.send_message(send("", pb_message("g-1", "over grpc"))).await.expect("SendMessage");
    let task = task_of(sent.into_inner());
    assert_eq!(pb_state(&task), pb::TaskState::Completed, "the default agent (echo) answered: {task:#?}");
    let [artifact] = task.artifacts.as_slice() else { panic!("one artifact: {task:#?}") };
    assert_eq!((artifact.name.as_str(), parts_text(&artifact.parts)), ("echo", "over grpc"));
    let get = pb::GetTaskRequest { id: task.id.clone(), history_length: Some(0), ..pb::GetTaskRequest::default() };
    let read = client.get_task(grpc_request(get)).await.expect("GetTask").into_inner();
    assert_eq!((read.id.as_str(), pb_state(&read)), (task.id.as_str(), pb::TaskState::Completed));
    assert!(read.history.is_empty(), "history_length 0: {read:#?}");
    assert_eq!(read.artifacts, task.artifacts);

    // The tenant `default/tck` (from the tck card's gRPC interface) reaches
    // the tck agent; no tenant reaches the default agent.
    let id = unique("tck-complete-task");
    let tck =
        task_of(client.send_message(send("default/tck", pb_message(&id, "who?"))).await.expect("tck").into_inner());
    assert_eq!((pb_state(&tck), status_message(&tck)), (pb::TaskState::Completed, "Hello from TCK"));
    let echo = task_of(client.send_message(send("", pb_message(&id, "who?"))).await.expect("echo").into_inner());
    assert_eq!((pb_state(&echo), status_message(&echo)), (pb::TaskState::Completed, "who?"));
    assert_eq!(echo.artifacts[0].name, "echo");
    let plain = task_of(client.send_message(send("default", pb_message(&id, "ns"))).await.expect("ns").into_inner());
    assert_eq!(status_message(&plain), "ns", "a tenant naming only the namespace reaches the default agent");

    let stream = client.send_streaming_message(send("default/tck", pb_message(&unique("tck-stream-001"), "go")));
    let mut stream = stream.await.expect("SendStreamingMessage").into_inner();
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(DEADLINE, stream.message()).await;
        match next.unwrap_or_else(|_| panic!("the stream stalled after {seen:#?}")) {
            Ok(Some(event)) => seen.push(event.payload.expect("a payload")),
            Ok(None) => break,
            Err(status) => panic!("the stream failed after {seen:#?}: {status:?}"),
        }
    }
    let described: Vec<String> = seen
        .iter()
        .map(|event| match event {
            Event::Task(task) => format!("task {:?}", pb_state(task)),
            Event::StatusUpdate(update) => format!("status {:?}", update.status.as_ref().map(|s| s.state())),
            Event::ArtifactUpdate(update) => {
                format!("artifact {}", parts_text(update.artifact.as_ref().map_or(&[], |artifact| &artifact.parts)))
            }
            Event::Message(_) => "message".to_owned(),
        })
        .collect();
    assert_eq!(
        described,
        ["task Submitted", "status Some(Working)", "artifact Stream hello from TCK", "status Some(Completed)"]
    );

    // The default agent's tasks: the tck agent's two are not among them.
    let list = pb::ListTasksRequest { tenant: "default".to_owned(), ..pb::ListTasksRequest::default() };
    let page = client.list_tasks(grpc_request(list)).await.expect("ListTasks").into_inner();
    assert_eq!(page.total_size, 3, "{page:#?}");
    let list = pb::ListTasksRequest { tenant: "default/tck".to_owned(), ..pb::ListTasksRequest::default() };
    let page = client.list_tasks(grpc_request(list)).await.expect("ListTasks").into_inner();
    assert_eq!(page.total_size, 2, "{page:#?}");
    let nobody = client.send_message(send("default/nobody", pb_message("g-2", "anyone?"))).await;
    assert_grpc_error(nobody, Code::NotFound, "AGENT_NOT_FOUND");
    let cancel = pb::CancelTaskRequest { id: task.id.clone(), ..pb::CancelTaskRequest::default() };
    let done = client.cancel_task(grpc_request(cancel)).await;
    assert_grpc_error(done, Code::FailedPrecondition, "TASK_NOT_CANCELABLE");
}

/// POST `body` to `agent`'s JSON-RPC endpoint as a 0.3 client does: no `A2A-Version`.
fn legacy(a2a: &A2a, agent: &str, body: &Value) -> reqwest::RequestBuilder {
    a2a.http().post(format!("{}/a2a/{agent}", a2a.base())).json(body)
}

fn legacy_message(message_id: &str, text: &str) -> Value {
    json!({ "kind": "message", "messageId": message_id, "role": "user", "parts": [{ "kind": "text", "text": text }] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_a2a_version_speaks_0_3() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let a2a = A2a::new(&server);

    let send = json!({ "jsonrpc": "2.0", "id": 1, "method": "message/send",
        "params": { "message": legacy_message("legacy-1", "hello legacy") } });
    let (status, answer) = json(legacy(&a2a, "echo", &send)).await;
    assert_eq!(status, StatusCode::OK, "{answer:#}");
    let task = &answer["result"];
    assert_eq!((&task["kind"], &task["status"]["state"]), (&json!("task"), &json!("completed")), "{answer:#}");
    assert_eq!(task["artifacts"][0]["name"], "echo");
    assert_eq!(task["artifacts"][0]["parts"], json!([{ "kind": "text", "text": "hello legacy" }]));
    assert_eq!(task["status"]["message"]["kind"], "message");
    let history = task["history"].as_array().unwrap_or_else(|| panic!("no history: {answer:#}"));
    let roles: Vec<(&Value, &Value)> = history.iter().map(|message| (&message["kind"], &message["role"])).collect();
    assert_eq!(roles, [(&json!("message"), &json!("user")), (&json!("message"), &json!("agent"))]);
    let id = task["id"].clone();

    let get = json!({ "jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": { "id": id, "historyLength": 1 } });
    let (_, read) = json(legacy(&a2a, "echo", &get)).await;
    assert_eq!((&read["result"]["kind"], &read["result"]["status"]["state"]), (&json!("task"), &json!("completed")));
    assert_eq!(read["result"]["history"].as_array().map(Vec::len), Some(1), "{read:#}");
    let (_, explicit) = json(legacy(&a2a, "echo", &get).header("A2A-Version", "0.3")).await;
    assert_eq!(explicit["result"], read["result"], "A2A-Version: 0.3 is the same as none");
    let missing = json!({ "jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": { "id": "no-such-task" } });
    let (_, missing) = json(legacy(&a2a, "echo", &missing)).await;
    assert_rpc_error(&missing["error"], -32001, "TASK_NOT_FOUND");

    // 1.0 method names are understood without the header, and answer in 1.0.
    let modern = json!({ "jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": { "id": id } });
    let (_, modern) = json(legacy(&a2a, "echo", &modern)).await;
    assert_eq!(modern["result"]["status"]["state"], "TASK_STATE_COMPLETED", "{modern:#}");
    assert!(modern["result"].get("kind").is_none(), "{modern:#}");

    let stream = json!({ "jsonrpc": "2.0", "id": 5, "method": "message/stream",
        "params": { "message": legacy_message(&unique("tck-stream-001"), "stream it") } });
    let streamed = events(legacy(&a2a, "tck", &stream)).await;
    let results: Vec<&Value> = streamed.iter().map(|event| &event["result"]).collect();
    let kinds: Vec<&Value> = results.iter().map(|result| &result["kind"]).collect();
    assert_eq!(kinds, ["task", "status-update", "artifact-update", "status-update"], "{streamed:#?}");
    assert_eq!((&results[1]["status"]["state"], &results[1]["final"]), (&json!("working"), &json!(false)));
    assert_eq!(results[2]["artifact"]["parts"][0]["kind"], "text");
    assert_eq!((&results[3]["status"]["state"], &results[3]["final"]), (&json!("completed"), &json!(true)));
    assert!(streamed.iter().all(|event| event["id"] == 5), "{streamed:#?}");
}
