//! Bad input against a running `chorus dev`: each request gets a clear
//! error, changes nothing, and the server keeps serving.

use chorus_proto::taskstore::{
    AddMessageRequest, ClaimTasksRequest, CreateTaskRequest, FailTaskRequest, GetTaskRequest, ListTasksRequest,
    ReleaseTaskRequest, Role, Task, TaskState, UpdateStatusRequest, WatchTaskRequest, WatchTasksRequest, part::Content,
};
use chorus_tests::{
    Sandbox, Server,
    status::{assert_invalid, assert_reason},
    tasks::{Client, create_request, create_task, get_task, text_message},
};
use prost::{Message as _, bytes::BufMut as _};
use prost_types::{Struct, Value, value::Kind};
use tonic::{
    Code, Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    codegen::http::uri::PathAndQuery,
};

const NS: &str = "e2e";
const MAX_MESSAGE_BYTES: usize = 64 * 1024;

async fn dev_server(sandbox: &Sandbox) -> Server {
    let max = MAX_MESSAGE_BYTES.to_string();
    sandbox.dev().no_agents().env("CHORUS_SERVER__MAX_MESSAGE_BYTES", max).start().await
}

async fn task_count(client: &mut Client) -> u32 {
    let request = ListTasksRequest { namespace: NS.to_owned(), ..ListTasksRequest::default() };
    client.list_tasks(request).await.expect("list tasks").into_inner().total_size
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_invalid_fields_are_named() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.task_store().await;
    let valid = || create_request(NS, "reverser", "hello");

    let no_namespace = CreateTaskRequest { namespace: String::new(), ..valid() };
    assert_invalid(client.create_task(no_namespace).await, "namespace");
    let bad_namespace = CreateTaskRequest { namespace: "Not A Namespace".to_owned(), ..valid() };
    assert_invalid(client.create_task(bad_namespace).await, "namespace");
    let no_agent = CreateTaskRequest { agent_id: String::new(), ..valid() };
    assert_invalid(client.create_task(no_agent).await, "agent_id");
    let no_message = CreateTaskRequest { message: None, ..valid() };
    assert_invalid(client.create_task(no_message).await, "message");
    let mut no_parts = valid();
    no_parts.message.as_mut().expect("a message").parts.clear();
    assert_invalid(client.create_task(no_parts).await, "message.parts");
    for role in [Role::Unspecified as i32, 42] {
        let mut unknown_role = valid();
        unknown_role.message.as_mut().expect("a message").role = role;
        assert_invalid(client.create_task(unknown_role).await, "message.role");
    }
    let nan = Value { kind: Some(Kind::NumberValue(f64::NAN)) };
    let metadata = Struct { fields: [("score".to_owned(), nan)].into_iter().collect() };
    let not_a_number = CreateTaskRequest { metadata: Some(metadata), ..valid() };
    assert_invalid(client.create_task(not_a_number).await, "metadata.score");
    let two_days = prost_types::Duration { seconds: 2 * 24 * 3600, nanos: 0 };
    let fail = |retry_after| chorus_proto::taskstore::FailTaskRequest {
        namespace: NS.to_owned(),
        task_id: "t-1".to_owned(),
        lease_id: "l-1".to_owned(),
        retry: true,
        retry_after: Some(retry_after),
        ..Default::default()
    };
    assert_invalid(client.fail_task(fail(two_days)).await, "retry_after");
    let backwards = prost_types::Duration { seconds: -1, nanos: 0 };
    assert_invalid(client.fail_task(fail(backwards)).await, "retry_after");

    assert_eq!(task_count(&mut client).await, 0, "no refused request created a task");
    server.assert_serving().await;
}

/// A message names no other task than the one it is for, a url part holds a
/// URL, a pause is asked for only with a retry, and a worker's capacity and
/// retries are bounded: each refused, naming the field, with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_that_would_be_misread_are_refused() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.task_store().await;
    let mut for_another = create_request(NS, "reverser", "hello");
    for_another.message.as_mut().expect("a message").task_id = "t-other".to_owned();
    assert_invalid(client.create_task(for_another).await, "message.task_id");
    let mut two_contexts = create_request(NS, "reverser", "hello");
    two_contexts.context_id = "ctx-a".to_owned();
    two_contexts.message.as_mut().expect("a message").context_id = "ctx-b".to_owned();
    assert_invalid(client.create_task(two_contexts).await, "message.context_id");
    let mut relative = create_request(NS, "reverser", "hello");
    relative.message.as_mut().expect("a message").parts[0].content = Some(Content::Url("report.pdf".to_owned()));
    assert_invalid(client.create_task(relative).await, "message.parts[0].url");
    let mut script = create_request(NS, "reverser", "hello");
    script.message.as_mut().expect("a message").parts[0].content = Some(Content::Url("JavaScript:alert(1)".to_owned()));
    assert_invalid(client.create_task(script).await, "message.parts[0].url");
    let mut from_agent = create_request(NS, "reverser", "hello");
    from_agent.message.as_mut().expect("a message").role = Role::Agent.into();
    assert_invalid(client.create_task(from_agent).await, "message.role");

    let task = create_task(&mut client, NS, "reverser", "hello").await;
    let mut message = text_message(Role::User, "more");
    message.task_id = "t-other".to_owned();
    let add = AddMessageRequest {
        namespace: NS.to_owned(),
        task_id: task.id.clone(),
        message: Some(message.clone()),
        ..Default::default()
    };
    assert_invalid(client.add_message(add.clone()).await, "message.task_id");
    message.task_id.clone_from(&task.id);
    message.context_id = "ctx-other".to_owned();
    let elsewhere = AddMessageRequest { message: Some(message.clone()), ..add.clone() };
    let refused = client.add_message(elsewhere).await.expect_err("a message of another context");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let named = assert_reason(&refused, "taskstore.chorus.dev", "CONTEXT_MISMATCH");
    assert_eq!(named.get("context_id"), Some(&task.context_id));
    message.context_id.clone_from(&task.context_id);
    let added = client.add_message(AddMessageRequest { message: Some(message), ..add }).await.expect("its own id");
    assert_eq!(added.into_inner().history.len(), 2);

    let pause = Some(prost_types::Duration { seconds: 5, nanos: 0 });
    let failing = FailTaskRequest {
        namespace: NS.to_owned(),
        task_id: task.id.clone(),
        lease_id: "l-1".to_owned(),
        retry_after: pause,
        ..Default::default()
    };
    assert_invalid(client.fail_task(failing).await, "retry_after");
    let two_days = Some(prost_types::Duration { seconds: 2 * 24 * 3600, nanos: 0 });
    let release = ReleaseTaskRequest {
        namespace: NS.to_owned(),
        task_id: task.id.clone(),
        lease_id: "l-1".to_owned(),
        retry_after: two_days,
        ..Default::default()
    };
    assert_invalid(client.release_task(release.clone()).await, "retry_after");
    let others_first = ReleaseTaskRequest { retry_after: None, others_first: true, ..release };
    assert_invalid(client.release_task(others_first).await, "others_first");
    let claim = |capacity, max_retries| ClaimTasksRequest {
        namespace: NS.to_owned(),
        agent_id: "reverser".to_owned(),
        worker_id: "w-1".to_owned(),
        capacity,
        max_retries,
        ..Default::default()
    };
    assert_invalid(client.claim_tasks(claim(10_001, 0)).await.map(|_| ()), "capacity");
    assert_invalid(client.claim_tasks(claim(1, 1_001)).await.map(|_| ()), "max_retries");

    let after = get_task(&mut client, NS, &task.id).await;
    assert_eq!((after.status.expect("a status").state(), after.history.len()), (TaskState::Submitted, 2));
    assert_eq!(task_count(&mut client).await, 1, "no refused request created a task");
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_task_ids_are_not_found() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.task_store().await;

    let get = GetTaskRequest { namespace: NS.to_owned(), id: "no-such-task".to_owned(), history_length: None };
    let status = client.get_task(get).await.expect_err("unknown task");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("no-such-task"), "{status:?}");
    let update = UpdateStatusRequest {
        namespace: NS.to_owned(),
        task_id: "no-such-task".to_owned(),
        state: TaskState::Working.into(),
        ..UpdateStatusRequest::default()
    };
    assert_eq!(client.update_status(update).await.expect_err("unknown task").code(), Code::NotFound);
    let watch = WatchTaskRequest { namespace: NS.to_owned(), task_id: "no-such-task".to_owned(), ..Default::default() };
    assert_eq!(client.watch_task(watch).await.expect_err("unknown task").code(), Code::NotFound);
    server.assert_serving().await;
}

async fn move_to(client: &mut Client, task: &Task, state: TaskState) -> Result<Task, Status> {
    let request = UpdateStatusRequest {
        namespace: NS.to_owned(),
        task_id: task.id.clone(),
        state: state.into(),
        message: Some(text_message(Role::Agent, &format!("now {state:?}"))),
        ..UpdateStatusRequest::default()
    };
    client.update_status(request).await.map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn illegal_transitions_fail_and_change_nothing() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.task_store().await;
    // The test runs the task itself, writing without a lease.
    let request = CreateTaskRequest { run_by_creator: true, ..create_request(NS, "reverser", "hello") };
    let task = client.create_task(request).await.expect("create").into_inner();
    move_to(&mut client, &task, TaskState::Working).await.expect("submitted -> working is legal");
    // A task a worker runs takes its agent's writes only under a claim's lease.
    let queued = create_task(&mut client, NS, "reverser", "for a worker").await;
    let snapshot = get_task(&mut client, NS, &queued.id).await;
    let status = move_to(&mut client, &queued, TaskState::Working).await.expect_err("no lease");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let info = tonic_types::StatusExt::get_details_error_info(&status).expect("the reason, for programs");
    assert_eq!(info.reason, "LEASE_REQUIRED", "{status:?}");
    assert_eq!(get_task(&mut client, NS, &queued.id).await, snapshot, "still queued for a worker");

    let cases = [
        (TaskState::Submitted, TaskState::Working, "ILLEGAL_TRANSITION"),
        (TaskState::Working, TaskState::Completed, "TASK_FINISHED"),
    ];
    for (illegal, before, reason) in cases {
        if before == TaskState::Completed {
            move_to(&mut client, &task, TaskState::Completed).await.expect("working -> completed is legal");
        }
        let snapshot = get_task(&mut client, NS, &task.id).await;
        let status = move_to(&mut client, &task, illegal).await.expect_err("an illegal transition");
        assert_eq!(status.code(), Code::FailedPrecondition, "{before:?} -> {illegal:?}: {status:?}");
        let info = tonic_types::StatusExt::get_details_error_info(&status).expect("the reason, for programs");
        assert_eq!((info.reason.as_str(), info.domain.as_str()), (reason, "taskstore.chorus.dev"), "{status:?}");
        assert_eq!(info.metadata["task_id"], task.id);
        assert_eq!(get_task(&mut client, NS, &task.id).await, snapshot, "{before:?} -> {illegal:?} changed the task");
    }
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_refused_and_the_server_keeps_serving() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.task_store().await;

    let huge = "x".repeat(100 * 1024);
    let status = client.create_task(create_request(NS, "reverser", &huge)).await.expect_err("too large");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let limit = format!("at most {MAX_MESSAGE_BYTES} (server.max_message_bytes)");
    assert!(status.message().contains(&limit), "the message states the limit and its setting: {status:?}");
    assert!(chorus_runtime::server::refused_for_size(&status), "told from other exhaustion: {status:?}");

    assert_eq!(task_count(&mut client).await, 0);
    // So is an A2A request past it, with the binding's own error: the
    // gateway's limit is at most the message limit, and no other answers first.
    let a2a = chorus_tests::a2a::A2a::new(&server);
    let send = serde_json::json!({ "message": chorus_tests::a2a::message("big", &huge) });
    let (status, body) = chorus_tests::a2a::json(a2a.rpc("echo", "SendMessage", send)).await;
    assert_eq!(status, reqwest::StatusCode::PAYLOAD_TOO_LARGE, "{body:#}");
    assert_eq!(body["error"]["data"][0]["reason"], "PAYLOAD_TOO_LARGE", "{body:#}");
    create_task(&mut client, NS, "reverser", "small enough").await;
    server.assert_serving().await;
}

/// Sends pre-encoded request bytes and decodes a `Task`.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Task;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Task;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Task>, Status> {
        Task::decode(src).map(Some).map_err(|error| Status::internal(error.to_string()))
    }
}

async fn create_raw(server: &Server, bytes: Vec<u8>) -> Result<Task, Status> {
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.expect("channel ready");
    let path = PathAndQuery::from_static("/chorus.taskstore.v1.TaskStore/CreateTask");
    grpc.unary(tonic::Request::new(bytes), path, RawCodec).await.map(tonic::Response::into_inner)
}

/// Sends a CreateTask whose namespace is not UTF-8 (after checking that the
/// same bytes unpatched are accepted), and returns the refusal.
async fn create_with_non_utf8_namespace(server: &Server) -> Status {
    let marker = "zzzzzzzz";
    let encoded = CreateTaskRequest { namespace: marker.to_owned(), ..create_request(NS, "reverser", "hi") };
    let encoded = encoded.encode_to_vec();
    let accepted = create_raw(server, encoded.clone()).await.expect("the request as encoded is accepted");
    assert_eq!(accepted.namespace, marker);

    let at = encoded.windows(marker.len()).position(|window| window == marker.as_bytes()).expect("the namespace");
    let mut patched = encoded;
    patched[at..at + marker.len()].fill(0xFF);
    create_raw(server, patched).await.expect_err("a namespace that is not UTF-8 must be refused")
}

/// A request that does not decode is the caller's mistake (`proto/src/codec.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_that_is_not_utf8_is_invalid_argument() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let status = create_with_non_utf8_namespace(&server).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("namespace") && status.message().contains("UTF-8"), "{status:?}");
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_page_tokens_and_cursors_are_invalid_argument() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.task_store().await;
    let task = create_task(&mut client, NS, "reverser", "hello").await;

    for token in ["garbage", "123~", "~abc", "1.5"] {
        let list = ListTasksRequest { namespace: NS.to_owned(), page_token: token.to_owned(), ..Default::default() };
        assert_invalid(client.list_tasks(list).await, "page_token");
    }
    for cursor in ["garbage", "-1.5", "1.x", "12"] {
        let watch = WatchTaskRequest {
            namespace: NS.to_owned(),
            task_id: task.id.clone(),
            after_cursor: cursor.to_owned(),
            snapshot: false,
        };
        assert_invalid(client.watch_task(watch).await, "after_cursor");
        let watch =
            WatchTasksRequest { namespace: NS.to_owned(), after_cursor: cursor.to_owned(), ..Default::default() };
        assert_invalid(client.watch_tasks(watch).await, "after_cursor");
    }
    let both = WatchTaskRequest {
        namespace: NS.to_owned(),
        task_id: task.id.clone(),
        after_cursor: "1.1".to_owned(),
        snapshot: true,
    };
    assert_invalid(client.watch_task(both).await, "snapshot");
    server.assert_serving().await;
}
