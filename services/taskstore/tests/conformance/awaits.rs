//! `AwaitTask`: a wait that ends when the task finishes answers with the task
//! exactly as a read would, whether this store finished it (and answers
//! from what that write returned) or another replica did.

use std::{sync::Arc, time::Duration};

use chorus_runtime::wakeup::Wakeups;
use chorus_taskstore::{
    TaskStore,
    domain::{StatusUpdate, Task, TaskState},
    error::TaskStoreError,
    repository::sql::SqlTaskRepository,
};
use tokio_util::sync::CancellationToken;

use crate::{
    harness::{Harness, agent_message, conformance, new_task, test_config, text_artifact},
    subtasks::{root_on, subtask},
    wakeups::slow_poll_config,
    workers::{claim_request, next_claim},
};

conformance!(
    start = crate::awaits::start;
    an_await_wakes_with_the_completed_task_as_a_read_gives_it,
    an_await_after_the_task_finished_answers_at_once,
    an_await_answers_with_the_canceled_task,
    an_await_sees_a_task_another_replica_finished,
    an_await_sees_an_interruption_before_it_began,
    an_await_sees_an_interruption_while_it_waits,
    an_await_of_a_task_created_here_sees_what_another_replica_did_before_it,
    an_await_of_a_task_created_here_wakes_when_another_replica_finishes_it,
    an_await_after_a_retried_create_sees_the_first_create_s_task_as_it_is,
    a_blocking_spawn_here_wakes_when_another_replica_finishes_the_child,
    a_retried_blocking_spawn_sees_the_first_spawn_s_child_as_it_is,
    an_await_cut_short_by_shutdown_says_so_rather_than_timed_out,
);

const LONG: Duration = Duration::from_secs(30);
/// Far below the 60 s poll: only a wake-up ends a wait this soon.
const WOKEN_WITHIN: Duration = Duration::from_secs(10);

async fn start(database: chorus_runtime::testing::TestDatabase) -> Harness {
    Harness::start_with(database, slow_poll_config()).await
}

/// The task as the database has it, with `history_length` of its history.
async fn read(h: &Harness, id: &str, history_length: Option<u32>) -> Task {
    h.store.get_task("ns", id, history_length).await.unwrap()
}

async fn an_await_wakes_with_the_completed_task_as_a_read_gives_it(h: Harness) {
    let task = h.task("ns", "echo", "question").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, LONG, 0));
    let claimed = next_claim(&mut claims).await;
    let store = h.store.clone();
    let id = task.id.clone();
    let waiting = tokio::spawn(async move { store.await_task("ns", &id, Some(1), LONG).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "a working task holds the await");
    let artifact = text_artifact("answer", "forty-two");
    h.store
        .complete_task("ns", &task.id, &claimed.lease_id, Some(agent_message("done")), vec![artifact.clone()])
        .await
        .unwrap();
    let (awaited, timed_out) =
        tokio::time::timeout(WOKEN_WITHIN, waiting).await.expect("woken by the completion").unwrap().unwrap();
    assert!(!timed_out);
    assert_eq!(awaited.status.state, TaskState::Completed);
    assert_eq!(awaited.artifacts, [artifact]);
    assert_eq!(awaited, read(&h, &task.id, Some(1)).await);
    let (whole, _) = h.store.await_task("ns", &task.id, None, LONG).await.unwrap();
    assert_eq!(whole.history.len(), 2);
    assert_eq!(whole, read(&h, &task.id, None).await);
}

async fn an_await_after_the_task_finished_answers_at_once(h: Harness) {
    let task = h.task("ns", "echo", "question").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, LONG, 0));
    let claimed = next_claim(&mut claims).await;
    h.store.fail_task("ns", &task.id, &claimed.lease_id, "crashed", None).await.unwrap();
    for window in [None, Some(0), Some(1), Some(5)] {
        let (awaited, timed_out) = h.store.await_task("ns", &task.id, window, LONG).await.unwrap();
        assert!(!timed_out);
        assert_eq!(awaited.status.state, TaskState::Failed);
        assert_eq!(awaited, read(&h, &task.id, window).await, "history window {window:?}");
    }
}

async fn an_await_answers_with_the_canceled_task(h: Harness) {
    let task = h.task("ns", "echo", "question").await;
    let store = h.store.clone();
    let id = task.id.clone();
    let waiting = tokio::spawn(async move { store.await_task("ns", &id, None, LONG).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.store.cancel_task("ns", &task.id, Some("no longer needed".into())).await.unwrap();
    let (awaited, _) =
        tokio::time::timeout(WOKEN_WITHIN, waiting).await.expect("woken by the cancel").unwrap().unwrap();
    assert_eq!(awaited.status.state, TaskState::Canceled);
    assert_eq!(awaited, read(&h, &task.id, None).await);
}

/// This store finishes the task; a second one on the same database, which
/// never sees the completion, reads it (its poll stands for the wake-ups
/// PostgreSQL would carry between processes).
async fn an_await_sees_a_task_another_replica_finished(h: Harness) {
    let shutdown = CancellationToken::new();
    let replica =
        TaskStore::new(Arc::new(SqlTaskRepository::new(h.db.clone())), Wakeups::new(), test_config(), shutdown.clone());
    let task = h.task("ns", "echo", "question").await;
    let id = task.id.clone();
    let waiting = tokio::spawn(async move { replica.await_task("ns", &id, None, LONG).await });
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, LONG, 0));
    let claimed = next_claim(&mut claims).await;
    h.store.complete_task("ns", &task.id, &claimed.lease_id, Some(agent_message("done")), Vec::new()).await.unwrap();
    let (awaited, timed_out) =
        tokio::time::timeout(WOKEN_WITHIN, waiting).await.expect("found by the poll").unwrap().unwrap();
    assert!(!timed_out);
    assert_eq!(awaited.status.state, TaskState::Completed);
    assert_eq!(awaited, read(&h, &task.id, None).await);
    shutdown.cancel();
}

/// A wait the store's shutdown ends is UNAVAILABLE (call again), not a
/// `timed_out` answer claiming the timeout passed.
async fn an_await_cut_short_by_shutdown_says_so_rather_than_timed_out(h: Harness) {
    let shutdown = CancellationToken::new();
    let replica =
        TaskStore::new(Arc::new(SqlTaskRepository::new(h.db.clone())), Wakeups::new(), test_config(), shutdown.clone());
    let task = h.task("ns", "echo", "nobody works on this").await;
    let id = task.id.clone();
    let waiting = tokio::spawn(async move { replica.await_task("ns", &id, None, LONG).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    shutdown.cancel();
    let outcome = tokio::time::timeout(WOKEN_WITHIN, waiting).await.expect("ended by the shutdown").unwrap();
    assert!(matches!(outcome, Err(TaskStoreError::ShuttingDown)), "{outcome:?}");
}

/// The worker asks for input.
fn input_required(lease_id: &str) -> StatusUpdate {
    StatusUpdate {
        state: TaskState::InputRequired,
        message: Some(agent_message("which one?")),
        lease_id: Some(lease_id.to_owned()),
    }
}

/// A task interrupted before anyone awaits it: the await answers at once,
/// not after the (60 s) poll.
async fn an_await_sees_an_interruption_before_it_began(h: Harness) {
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, LONG, 0));
    let task = h.task("ns", "echo", "question").await;
    let claimed = next_claim(&mut claims).await;
    h.store.update_status("ns", &task.id, input_required(&claimed.lease_id)).await.unwrap();
    let (awaited, timed_out) = tokio::time::timeout(WOKEN_WITHIN, h.store.await_task("ns", &task.id, None, LONG))
        .await
        .expect("answered at once")
        .unwrap();
    assert!(!timed_out);
    assert_eq!(awaited.status.state, TaskState::InputRequired);
    assert_eq!(awaited, read(&h, &task.id, None).await);
}

/// A task awaited at once, then interrupted: the wait ends.
async fn an_await_sees_an_interruption_while_it_waits(h: Harness) {
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, LONG, 0));
    let task = h.task("ns", "echo", "question").await;
    let store = h.store.clone();
    let id = task.id.clone();
    let waiting = tokio::spawn(async move { store.await_task("ns", &id, Some(1), LONG).await });
    let claimed = next_claim(&mut claims).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "a working task holds the await");
    h.store.update_status("ns", &task.id, input_required(&claimed.lease_id)).await.unwrap();
    let (awaited, timed_out) =
        tokio::time::timeout(WOKEN_WITHIN, waiting).await.expect("woken by the interruption").unwrap().unwrap();
    assert!(!timed_out);
    assert_eq!(awaited.status.state, TaskState::InputRequired);
    assert_eq!(awaited, read(&h, &task.id, Some(1)).await);
}

/// Two replicas on the harness's database whose signals reach each other
/// (one `Wakeups`, standing in for the bridge between processes), both
/// polling every 60 s: only a signal, or a read, ends an await early.
pub(crate) fn replicas(h: &Harness, shutdown: &CancellationToken) -> (TaskStore, TaskStore) {
    let wakeups = Wakeups::new();
    let replica = || {
        let repository = Arc::new(SqlTaskRepository::new(h.db.clone()));
        TaskStore::new(repository, wakeups.clone(), slow_poll_config(), shutdown.clone())
    };
    (replica(), replica())
}

/// `there` claims the next task of `echo` and completes it.
async fn complete_there(there: &TaskStore) -> String {
    complete_next(there, "echo").await
}

/// `there` claims the next task of `agent` and completes it.
async fn complete_next(there: &TaskStore, agent: &str) -> String {
    let mut claims = there.claim_stream(claim_request(agent, "w2", 1, LONG, 0));
    let claimed = next_claim(&mut claims).await;
    there.complete_task("ns", &claimed.task.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    claimed.task.id
}

/// An await's answer (task, timed out), which must be task `id` completed,
/// as a read gives it.
async fn assert_completed(h: &Harness, (awaited, timed_out): (Task, bool), id: &str) {
    assert!(!timed_out);
    assert_eq!(awaited.status.state, TaskState::Completed);
    assert_eq!(awaited, read(h, id, None).await);
}

/// Awaits task `id` here, which must answer at once (not after the 60 s
/// poll) with the task completed.
async fn awaited_at_once(h: &Harness, here: &TaskStore, id: &str) {
    let answer = tokio::time::timeout(WOKEN_WITHIN, here.await_task("ns", id, None, LONG)).await;
    assert_completed(h, answer.expect("answered at once, not after the 60 s poll").unwrap(), id).await;
}

/// A task created here and finished by another replica before anyone here
/// awaits it: the await reads it at once, though nothing here changed it.
async fn an_await_of_a_task_created_here_sees_what_another_replica_did_before_it(h: Harness) {
    let shutdown = CancellationToken::new();
    let (here, there) = replicas(&h, &shutdown);
    let task = here.create_task(new_task("ns", "echo", "question")).await.unwrap();
    assert_eq!(complete_there(&there).await, task.id);
    awaited_at_once(&h, &here, &task.id).await;
    shutdown.cancel();
}

/// A task created here and awaited at once (no read: nothing has changed
/// it), then finished by another replica: its signal ends the wait.
async fn an_await_of_a_task_created_here_wakes_when_another_replica_finishes_it(h: Harness) {
    let shutdown = CancellationToken::new();
    let (here, there) = replicas(&h, &shutdown);
    let task = here.create_task(new_task("ns", "echo", "question")).await.unwrap();
    let waiting = {
        let (here, id) = (here.clone(), task.id.clone());
        tokio::spawn(async move { here.await_task("ns", &id, None, LONG).await })
    };
    assert_eq!(finish_there_while(&h, &there, "echo", waiting).await, task.id);
    shutdown.cancel();
}

/// Lets `there` finish the next task of `agent` once `waiting` (a wait
/// here) has begun; `waiting` must answer with that task completed, and
/// woken by the completion. The task's id.
async fn finish_there_while(
    h: &Harness,
    there: &TaskStore,
    agent: &str,
    waiting: tokio::task::JoinHandle<chorus_taskstore::error::Result<(Task, bool)>>,
) -> String {
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "a submitted task holds the wait");
    let id = complete_next(there, agent).await;
    let answer = tokio::time::timeout(WOKEN_WITHIN, waiting).await.expect("woken by the completion").unwrap();
    assert_completed(h, answer.unwrap(), &id).await;
    id
}

/// A create retried after its task finished elsewhere answers with that
/// task, which an await then reads rather than waits on.
async fn an_await_after_a_retried_create_sees_the_first_create_s_task_as_it_is(h: Harness) {
    let shutdown = CancellationToken::new();
    let (here, there) = replicas(&h, &shutdown);
    let new = new_task("ns", "echo", "question");
    let first = here.create_task(new.clone()).await.unwrap();
    assert_eq!(complete_there(&there).await, first.id);
    let again = here.create_task(new).await.unwrap();
    assert_eq!(again.id, first.id, "the retry answers with the first create's task");
    awaited_at_once(&h, &here, &again.id).await;
    shutdown.cancel();
}

/// A blocking spawn here (no read: nothing has changed the child), whose
/// child another replica finishes: its signal ends the wait.
async fn a_blocking_spawn_here_wakes_when_another_replica_finishes_the_child(h: Harness) {
    let shutdown = CancellationToken::new();
    let (here, there) = replicas(&h, &shutdown);
    let parent = root_on(&here).await;
    let spawning = {
        let (here, parent_id) = (here.clone(), parent.id.clone());
        tokio::spawn(async move { here.spawn_subtask(subtask(&parent_id, "coder", "abc"), true, Some(LONG)).await })
    };
    let child_id = finish_there_while(&h, &there, "coder", spawning).await;
    assert_ne!(child_id, parent.id);
    shutdown.cancel();
}

/// A blocking spawn retried after the first spawn's child finished elsewhere
/// answers with that child at once.
async fn a_retried_blocking_spawn_sees_the_first_spawn_s_child_as_it_is(h: Harness) {
    let shutdown = CancellationToken::new();
    let (here, there) = replicas(&h, &shutdown);
    let parent = root_on(&here).await;
    let spawn = subtask(&parent.id, "coder", "abc");
    let (first, _) = here.spawn_subtask(spawn.clone(), false, None).await.unwrap();
    assert_eq!(complete_next(&there, "coder").await, first.id);
    let answer = tokio::time::timeout(WOKEN_WITHIN, here.spawn_subtask(spawn, true, Some(LONG))).await;
    assert_completed(&h, answer.expect("answered at once, not after the 60 s poll").unwrap(), &first.id).await;
    shutdown.cancel();
}
