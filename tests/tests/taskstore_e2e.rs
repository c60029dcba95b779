//! The task store end to end: the real `chorus` binary, real worker
//! processes, real sockets, SQLite and PostgreSQL.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use chorus_proto::taskstore::{
    AckInboxRequest, AddMessageRequest, AppendArtifactRequest, Artifact, AwaitTaskRequest, ClaimTasksRequest,
    CreateTaskRequest, ListTasksRequest, NotifyOwnerRequest, Owner, ReadInboxRequest, Role, SpawnSubtaskRequest,
    TaskState, UpdateStatusRequest, WatchTasksRequest, inbox_message, owner, task_event,
};
use chorus_runtime::testing::PostgresDatabase;
use chorus_tests::{
    DEADLINE, Mode, Sandbox, ServerBuilder,
    status::assert_invalid,
    tasks::{
        Client, TaskWatch, create_request, create_task, event_state, event_text, get_task, is_status, state,
        status_text, text_message, text_of,
    },
    test_worker,
};
use tokio::time::Instant;

const NS: &str = "e2e";
/// Short timings, so that lease expiry shows within a test. (A 1 s lease,
/// renewed every 333 ms, was seen to lapse on a loaded 2-core machine.)
const LEASE: Duration = Duration::from_secs(2);

/// `chorus dev --no-agents` that looks for expired leases every 100 ms.
fn dev_with_fast_reaper(sandbox: &Sandbox) -> ServerBuilder {
    sandbox.dev().no_agents().env("CHORUS_TASKSTORE__REAPER_INTERVAL_MS", "100")
}

fn reversed(text: &str) -> String {
    text.chars().rev().collect()
}

fn kinds(events: &[chorus_proto::taskstore::TaskEvent]) -> Vec<task_event::Kind> {
    events.iter().map(|event| event.kind()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_completes_a_task_created_over_grpc() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let worker = test_worker!(sandbox, server.url()).agent("reverser").namespace(NS).start().await;
    let mut client = server.task_store().await;

    let task = create_task(&mut client, NS, "reverser", "hello chorus").await;
    // Queued, or, once the worker's stream has found the queue empty, handed
    // straight to it (created claimed): the events are the same either way.
    assert!(matches!(state(&task), TaskState::Submitted | TaskState::Working), "{task:#?}");
    let events = TaskWatch::open(&mut client, NS, &task.id, "").await.until_end().await;

    use task_event::Kind::{ArtifactUpdated, Created, StatusChanged};
    assert_eq!(kinds(&events), [Created, StatusChanged, ArtifactUpdated, StatusChanged], "{events:#?}");
    assert_eq!(event_state(&events[1]), TaskState::Working);
    assert_eq!(event_state(&events[3]), TaskState::Completed);
    let done = get_task(&mut client, NS, &task.id).await;
    assert_eq!(state(&done), TaskState::Completed);
    assert_eq!(status_text(&done), "surohc olleh");
    assert_eq!(done.attempt, 1);
    let history: Vec<String> = done.history.iter().map(|message| text_of(Some(message))).collect();
    assert_eq!(history, ["hello chorus", "surohc olleh"]);
    let [artifact] = done.artifacts.as_slice() else { panic!("one artifact expected: {:#?}", done.artifacts) };
    assert_eq!(artifact.name, worker.worker_id(), "the artifact names the worker that did the work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn await_task_answers_when_the_task_settles_or_the_timeout_passes() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut client = server.task_store().await;
    let task = create_task(&mut client, NS, "reverser", "hello chorus").await;
    let request = |timeout: Duration, history_length: Option<u32>| AwaitTaskRequest {
        namespace: NS.to_owned(),
        id: task.id.clone(),
        history_length,
        timeout: Some(timeout.try_into().unwrap()),
    };

    let waited = client.await_task(request(Duration::from_millis(300), None)).await.unwrap().into_inner();
    assert!(waited.timed_out, "no worker yet: {waited:#?}");
    assert_eq!(state(waited.task.as_ref().unwrap()), TaskState::Submitted);

    let pending = tokio::spawn({
        let mut client = client.clone();
        let request = request(DEADLINE, Some(1));
        async move { client.await_task(request).await }
    });
    let _worker = test_worker!(sandbox, server.url()).agent("reverser").namespace(NS).start().await;
    let settled = pending.await.unwrap().unwrap().into_inner();
    assert!(!settled.timed_out);
    let done = settled.task.unwrap();
    assert_eq!(state(&done), TaskState::Completed);
    let history: Vec<String> = done.history.iter().map(|message| text_of(Some(message))).collect();
    assert_eq!(history, ["surohc olleh"], "the last message only, as asked");
    assert_eq!(done.artifacts.len(), 1);

    let too_long = client.await_task(request(Duration::from_secs(7200), None)).await.unwrap_err();
    assert_eq!(too_long.code(), tonic::Code::InvalidArgument, "{too_long:?}");
    let mut unknown = request(Duration::from_secs(1), None);
    unknown.id = "no-such-task".to_owned();
    let unknown = client.await_task(unknown).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_echo_agent_of_chorus_dev_answers() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let mut client = server.task_store().await;

    let task = create_task(&mut client, "default", "echo", "is anybody there?").await;
    let events = TaskWatch::open(&mut client, "default", &task.id, "").await.until_end().await;

    assert!(events.last().is_some_and(|event| is_status(event, TaskState::Completed)), "{events:#?}");
    let done = get_task(&mut client, "default", &task.id).await;
    assert_eq!(status_text(&done), "is anybody there?");
    let names: Vec<&str> = done.artifacts.iter().map(|artifact| artifact.name.as_str()).collect();
    assert_eq!(names, ["echo"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_echo_agent_verb_works_for_a_remote_task_store() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let _agent = sandbox.echo_agent(server.url(), NS);
    let mut client = server.task_store().await;

    let task = create_task(&mut client, NS, "echo", "over the wire").await;
    let events = TaskWatch::open(&mut client, NS, &task.id, "").await.until_end().await;

    assert!(events.last().is_some_and(|event| is_status(event, TaskState::Completed)), "{events:#?}");
    assert_eq!(status_text(&get_task(&mut client, NS, &task.id).await), "over the wire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_s_task_fails_once_its_lease_expires() {
    let sandbox = Sandbox::new();
    let server = dev_with_fast_reaper(&sandbox).start().await;
    let worker = test_worker!(sandbox, server.url()).mode(Mode::Hang).agent("sleeper").namespace(NS).lease(LEASE);
    let worker = worker.start().await;
    let mut client = server.task_store().await;

    let task = create_task(&mut client, NS, "sleeper", "take your time").await;
    let mut watch = TaskWatch::open(&mut client, NS, &task.id, "").await;
    watch.until_status(TaskState::Working).await;
    // The live worker renews its lease: the task outlives its lease length.
    watch.assert_quiet(LEASE * 2).await;

    worker.kill().await;
    let killed = Instant::now();
    let failed = watch.until_status(TaskState::Failed).await;
    // The worker's lease (not the server's 30 s default) decides when.
    assert!(killed.elapsed() < LEASE + Duration::from_secs(10), "failed {:?} after the kill", killed.elapsed());
    assert_eq!(event_text(&failed), "worker lease expired");
    assert!(watch.next().await.is_none(), "the watch ends with the task");
    let task = get_task(&mut client, NS, &task.id).await;
    assert_eq!((state(&task), task.attempt), (TaskState::Failed, 1));
    assert_eq!(status_text(&task), "worker lease expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_retry_left_a_killed_worker_s_task_is_requeued_and_completed_by_another() {
    let sandbox = Sandbox::new();
    let server = dev_with_fast_reaper(&sandbox).start().await;
    let hanging = test_worker!(sandbox, server.url()).mode(Mode::Hang).agent("flaky").namespace(NS);
    let hanging = hanging.lease(LEASE).max_retries(1).start().await;
    let mut client = server.task_store().await;

    let task = create_task(&mut client, NS, "flaky", "second time lucky").await;
    let mut watch = TaskWatch::open(&mut client, NS, &task.id, "").await;
    watch.until_status(TaskState::Working).await;
    hanging.kill().await;
    let requeued = watch.until_status(TaskState::Submitted).await;
    let reason = event_text(&requeued);
    assert!(reason.starts_with("worker lease expired; requeued"), "{reason}");

    let second = test_worker!(sandbox, server.url()).agent("flaky").namespace(NS).start().await;
    watch.until_status(TaskState::Working).await;
    watch.until_status(TaskState::Completed).await;
    let task = get_task(&mut client, NS, &task.id).await;
    assert_eq!((state(&task), task.attempt), (TaskState::Completed, 2));
    assert_eq!(status_text(&task), reversed("second time lucky"));
    let names: Vec<&str> = task.artifacts.iter().map(|artifact| artifact.name.as_str()).collect();
    assert_eq!(names, [second.worker_id()]);
}

/// Writes a parent task (working, with an artifact and an added message) and
/// a child whose status note and completion wait in the parent's inbox. The
/// test runs the parent itself, without a lease; a worker runs the child.
async fn write_a_task_tree(client: &mut Client) -> (String, String) {
    let parent = CreateTaskRequest { run_by_creator: true, ..create_request(NS, "planner", "plan the trip") };
    let parent = client.create_task(parent).await.expect("create the parent").into_inner();
    let working = UpdateStatusRequest {
        namespace: NS.to_owned(),
        task_id: parent.id.clone(),
        state: TaskState::Working.into(),
        ..UpdateStatusRequest::default()
    };
    client.update_status(working).await.expect("parent working");
    let artifact = Artifact {
        artifact_id: "itinerary".to_owned(),
        name: "itinerary".to_owned(),
        parts: text_message(Role::Agent, "day 1: Lisbon").parts,
        ..Artifact::default()
    };
    let append = AppendArtifactRequest {
        namespace: NS.to_owned(),
        task_id: parent.id.clone(),
        artifact: Some(artifact),
        brief: true,
        ..Default::default()
    };
    let brief = client.append_artifact(append).await.expect("artifact").into_inner();
    assert_eq!((state(&brief), brief.artifacts.len(), brief.history.len()), (TaskState::Working, 0, 0), "brief");
    let message = AddMessageRequest {
        namespace: NS.to_owned(),
        task_id: parent.id.clone(),
        message: Some(text_message(Role::User, "and then Porto")),
        lease_id: String::new(),
        brief: false,
    };
    let whole = client.add_message(message).await.expect("message").into_inner();
    assert_eq!((whole.artifacts.len(), whole.history.len()), (1, 2), "the whole task");

    let spawn = SpawnSubtaskRequest {
        namespace: NS.to_owned(),
        parent_task_id: parent.id.clone(),
        agent_id: "booker".to_owned(),
        message: Some(text_message(Role::User, "book the hotels")),
        ..SpawnSubtaskRequest::default()
    };
    let child = client.spawn_subtask(spawn).await.expect("spawn").into_inner().task.expect("child");
    let claim = ClaimTasksRequest {
        namespace: NS.to_owned(),
        agent_id: "booker".to_owned(),
        worker_id: "booker-worker".to_owned(),
        ..ClaimTasksRequest::default()
    };
    let mut claims = client.claim_tasks(claim).await.expect("ClaimTasks").into_inner();
    let claimed = claims.message().await.expect("the claim stream").expect("the child claimed");
    assert_eq!(claimed.task.map(|task| task.id), Some(child.id.clone()));
    let note = NotifyOwnerRequest {
        namespace: NS.to_owned(),
        task_id: child.id.clone(),
        kind: inbox_message::Kind::Status.into(),
        message: Some(text_message(Role::Agent, "halfway there")),
        lease_id: claimed.lease_id.clone(),
    };
    client.notify_owner(note).await.expect("notify owner");
    let done = UpdateStatusRequest {
        namespace: NS.to_owned(),
        task_id: child.id.clone(),
        state: TaskState::Completed.into(),
        message: Some(text_message(Role::Agent, "booked")),
        lease_id: claimed.lease_id,
        brief: false,
    };
    client.update_status(done).await.expect("child completed");
    (parent.id, child.id)
}

fn inbox_of(parent_id: &str, peek: bool) -> ReadInboxRequest {
    ReadInboxRequest {
        namespace: NS.to_owned(),
        owner: Some(Owner { kind: owner::Kind::Worker.into(), id: parent_id.to_owned() }),
        peek,
        ..ReadInboxRequest::default()
    }
}

/// A read with an ack deadline holds what it returned across a restart,
/// until acknowledged; bad reads and acknowledgements are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_read_held_until_acknowledged_outlives_a_restart() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut client = server.task_store().await;
    let (parent_id, _) = write_a_task_tree(&mut client).await;
    let minute = prost_types::Duration { seconds: 60, nanos: 0 };
    let held = ReadInboxRequest { ack_deadline: Some(minute), ..inbox_of(&parent_id, false) };
    let read = client.read_inbox(held).await.expect("held read").into_inner().messages;
    assert_eq!(read.len(), 2, "{read:?}");

    assert!(server.stop().await.success());
    let server = sandbox.dev().no_agents().start().await;
    let mut client = server.task_store().await;
    let again = client.read_inbox(inbox_of(&parent_id, false)).await.expect("read").into_inner().messages;
    assert!(again.is_empty(), "the held messages wait for their acknowledgement: {again:?}");
    let ack = |message_ids: Vec<String>| AckInboxRequest {
        namespace: NS.to_owned(),
        owner: inbox_of(&parent_id, false).owner,
        message_ids,
    };
    let ids: Vec<String> = read.iter().map(|message| message.id.clone()).collect();
    let acked = client.ack_inbox(ack(ids.clone())).await.expect("ack").into_inner().acknowledged;
    assert_eq!(acked, 2);
    assert_eq!(client.ack_inbox(ack(ids)).await.expect("ack again").into_inner().acknowledged, 0);

    assert_invalid(client.ack_inbox(ack(Vec::new())).await, "message_ids");
    assert_invalid(client.ack_inbox(ack(vec!["first".to_owned()])).await, "message_ids[0]");
    let peek_held = ReadInboxRequest { ack_deadline: Some(minute), ..inbox_of(&parent_id, true) };
    assert_invalid(client.read_inbox(peek_held).await, "ack_deadline");
    let never =
        ReadInboxRequest { ack_deadline: Some(prost_types::Duration::default()), ..inbox_of(&parent_id, false) };
    assert_invalid(client.read_inbox(never).await, "ack_deadline");
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_dev_restarted_on_its_data_dir_keeps_everything() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut client = server.task_store().await;
    let (parent_id, child_id) = write_a_task_tree(&mut client).await;
    let parent = get_task(&mut client, NS, &parent_id).await;
    let child = get_task(&mut client, NS, &child_id).await;
    let inbox = client.read_inbox(inbox_of(&parent_id, true)).await.expect("peek inbox").into_inner().messages;
    let mut watch = TaskWatch::open(&mut client, NS, &parent_id, "").await;
    watch.until("the added message", |event| event.kind() == task_event::Kind::MessageAdded).await;
    let events = watch.seen().to_vec();
    drop(watch);

    let exit = server.stop().await;
    assert!(exit.success(), "chorus dev should exit cleanly on SIGTERM: {exit}");
    let server = sandbox.dev().no_agents().start().await;
    let mut client = server.task_store().await;

    assert_eq!(get_task(&mut client, NS, &parent_id).await, parent, "the parent task, history and artifacts");
    assert_eq!(get_task(&mut client, NS, &child_id).await, child, "the child task");
    let listed = ListTasksRequest { namespace: NS.to_owned(), ..ListTasksRequest::default() };
    let listed = client.list_tasks(listed).await.expect("list").into_inner();
    assert_eq!(listed.total_size, 2);
    let read = client.read_inbox(inbox_of(&parent_id, false)).await.expect("read inbox").into_inner().messages;
    assert_eq!(read, inbox, "the inbox still holds the child's note and completion");
    let kinds: Vec<_> = read.iter().map(|message| message.kind()).collect();
    assert_eq!(kinds, [inbox_message::Kind::Status, inbox_message::Kind::Completion]);

    // A watch resumes from a cursor handed out before the restart.
    let mut watch = TaskWatch::open(&mut client, NS, &parent_id, &events[0].cursor).await;
    for before in &events[1..] {
        assert_eq!(watch.next().await.as_ref(), Some(before), "events replay after the restart");
    }
    let complete = UpdateStatusRequest {
        namespace: NS.to_owned(),
        task_id: parent_id.clone(),
        state: TaskState::Completed.into(),
        ..UpdateStatusRequest::default()
    };
    client.update_status(complete).await.expect("complete the parent");
    watch.until_status(TaskState::Completed).await;
    assert!(watch.next().await.is_none(), "the watch ends with the task");
}

/// Reads `WatchTasks` from the beginning until every task in `ids` has
/// completed; returns how many completions each task had.
async fn completions(client: &mut Client, agent_id: &str, ids: &BTreeSet<String>) -> BTreeMap<String, usize> {
    let request = WatchTasksRequest {
        namespace: NS.to_owned(),
        agent_id: agent_id.to_owned(),
        from_beginning: true,
        ..WatchTasksRequest::default()
    };
    let mut stream = client.watch_tasks(request).await.expect("watch tasks").into_inner();
    let mut counts = BTreeMap::new();
    let deadline = Instant::now() + DEADLINE;
    while ids.iter().any(|id| !counts.contains_key(id)) {
        let next = tokio::time::timeout_at(deadline, stream.message()).await;
        let event = match next {
            Ok(Ok(Some(event))) => event,
            other => panic!("waiting for {} completions, got {counts:?} and then {other:?}", ids.len()),
        };
        if is_status(&event, TaskState::Completed) {
            *counts.entry(event.task_id).or_insert(0) += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_taskstore_on_postgres_runs_a_task() {
    let Some(database) = PostgresDatabase::create_or_skip().await else { return };
    let sandbox = Sandbox::new();
    let server = sandbox.serve_taskstore(database.url()).start().await;
    let worker = test_worker!(sandbox, server.url()).agent("reverser").namespace(NS).start().await;
    let mut client = server.task_store().await;

    let task = create_task(&mut client, NS, "reverser", "postgres").await;
    let events = TaskWatch::open(&mut client, NS, &task.id, "").await.until_end().await;

    assert!(events.last().is_some_and(|event| is_status(event, TaskState::Completed)), "{events:#?}");
    let done = get_task(&mut client, NS, &task.id).await;
    assert_eq!(status_text(&done), "sergtsop");
    assert_eq!(done.artifacts[0].name, worker.worker_id());
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(database.url()).await.expect("connect");
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT application_name FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(database.name())
    .fetch_all(&mut admin)
    .await
    .expect("sessions");
    assert_eq!(names, ["chorus-taskstore"], "pg_stat_activity tells whose each connection is");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_postgres_share_the_work_and_complete_each_task_once() {
    let Some(database) = PostgresDatabase::create_or_skip().await else { return };
    let sandbox = Sandbox::new();
    // Started together: both migrate the same fresh database.
    let (a, b) = tokio::join!(
        sandbox.serve_taskstore(database.url()).name("replica A").start(),
        sandbox.serve_taskstore(database.url()).name("replica B").start(),
    );
    let (mut on_a, mut on_b) = (a.task_store().await, b.task_store().await);

    // Work created on A reaches a worker connected only to B.
    let worker_b = test_worker!(sandbox, b.url()).agent("reverser").namespace(NS).start().await;
    let mut ids = BTreeSet::new();
    for n in 0..5 {
        ids.insert(create_task(&mut on_a, NS, "reverser", &format!("from A {n}")).await.id);
    }
    let counts = completions(&mut on_b, "reverser", &ids).await;
    assert!(counts.values().all(|&count| count == 1), "{counts:?}");
    for id in &ids {
        let task = get_task(&mut on_a, NS, id).await;
        let names: Vec<&str> = task.artifacts.iter().map(|artifact| artifact.name.as_str()).collect();
        assert_eq!(names, [worker_b.worker_id()], "task {id} was done by the worker on B");
    }

    // With a worker on each replica and tasks created on both, each task is
    // claimed once and completed once.
    let worker_a = test_worker!(sandbox, a.url()).agent("reverser").namespace(NS).start().await;
    for n in 0..20 {
        let client = if n % 2 == 0 { &mut on_a } else { &mut on_b };
        ids.insert(create_task(client, NS, "reverser", &format!("shared {n}")).await.id);
    }
    let counts = completions(&mut on_a, "reverser", &ids).await;
    assert_eq!(counts.len(), ids.len());
    assert!(counts.values().all(|&count| count == 1), "{counts:?}");
    let workers = [worker_a.worker_id(), worker_b.worker_id()];
    for id in &ids {
        let task = get_task(&mut on_b, NS, id).await;
        assert_eq!((state(&task), task.attempt), (TaskState::Completed, 1), "task {id}");
        let [artifact] = task.artifacts.as_slice() else { panic!("task {id}: {:#?}", task.artifacts) };
        assert!(workers.contains(&artifact.name.as_str()), "task {id} done by {}", artifact.name);
    }
}

/// The agents of `chorus dev` keep their worker ids: a task one held when
/// the process was killed is requeued as it starts again, and taken up at
/// once, not failed when its lease runs out (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_dev_killed_while_its_agent_works_does_the_task_again_as_it_restarts() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let address = server.address();
    let mut client = server.task_store().await;
    // The reviewer asks whether to publish, and holds the task meanwhile.
    let task = create_task(&mut client, "default", "reviewer", "Review this: fn main() {}").await;
    let mut watch = TaskWatch::open(&mut client, "default", &task.id, "").await;
    let asked = watch.until_status(TaskState::InputRequired).await;
    drop(watch);
    server.kill().await;

    let server = sandbox.dev().listen(address).start().await;
    let restarted = Instant::now();
    let mut client = server.task_store().await;
    let mut watch = TaskWatch::open(&mut client, "default", &task.id, &asked.cursor).await;
    watch.until_status(TaskState::Submitted).await;
    watch.until_status(TaskState::InputRequired).await;
    assert!(restarted.elapsed() < Duration::from_secs(20), "asked again {:?} after the restart", restarted.elapsed());
    let again = get_task(&mut client, "default", &task.id).await;
    assert_eq!((state(&again), again.attempt), (TaskState::InputRequired, 2), "{again:?}");
    let note = again.history.iter().any(|message| text_of(Some(message)).contains("worker restarted; requeued"));
    assert!(note, "the history says why it came back: {again:?}");
}
