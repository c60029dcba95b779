//! Workers: claims under leases, capacity, renewal, expiry, retries.

use std::time::Duration;

use chorus_runtime::error::{ErrorCode, ServiceError as _};
use chorus_taskstore::{
    TaskStore,
    domain::{
        Artifact, ClaimEvent, ClaimRequest, Claimed, NewSubtask, Part, StatusUpdate, Task, TaskEvent, TaskState,
        now_micros,
    },
    error::TaskStoreError,
};
use tokio_stream::StreamExt as _;

use crate::harness::{Harness, agent_message, conformance, user_message};

conformance!(
    a_worker_claims_and_completes_a_task,
    capacity_bounds_the_leases_a_worker_holds,
    capacity_counts_the_tasks_of_the_streams_agent_only,
    only_the_lease_holder_may_write,
    a_worker_whose_lease_ended_can_neither_spawn_nor_add_messages,
    the_lease_holder_may_reject_a_task_it_works_on_or_waits_on,
    an_expired_lease_fails_the_task,
    an_expired_lease_requeues_while_retries_last,
    renewal_keeps_a_lease_and_reports_cancellation,
    a_stream_that_asked_is_told_at_once_of_its_canceled_tasks,
    a_task_renewed_past_its_first_lease_is_still_announced_when_canceled,
    a_plain_renewal_extends_by_the_length_granted,
    leases_out_of_bounds_are_refused_naming_the_bounds,
    a_worker_may_ask_for_a_retry,
    a_claim_no_worker_received_is_released,
    claims_left_on_a_stream_its_worker_closed_go_back_to_the_queue,
    the_queue_depth_counts_the_tasks_waiting_for_a_worker,
);

pub(crate) fn claim_request(
    agent: &str,
    worker: &str,
    capacity: u32,
    lease: Duration,
    max_retries: u32,
) -> ClaimRequest {
    ClaimRequest {
        namespace: "ns".into(),
        agent_id: agent.into(),
        worker_id: worker.into(),
        capacity,
        lease,
        max_retries,
    }
}

pub(crate) async fn next_claim(
    claims: &mut (impl tokio_stream::Stream<Item = Result<Claimed, TaskStoreError>> + Unpin),
) -> Claimed {
    tokio::time::timeout(Duration::from_secs(10), claims.next())
        .await
        .expect("a claim arrives in time")
        .expect("the claim stream is open")
        .expect("the claim succeeds")
}

/// Waits, event-driven, until the task reaches a final state.
pub(crate) async fn final_state(store: &TaskStore, task_id: &str) -> Task {
    let mut events = store.watch_task("ns", task_id, None).await.unwrap();
    let last: Option<TaskEvent> = tokio::time::timeout(Duration::from_secs(15), async {
        let mut last = None;
        while let Some(event) = events.next().await {
            last = Some(event.unwrap());
        }
        last
    })
    .await
    .expect("the task finishes in time");
    assert!(last.is_some_and(|event| event.status.state.is_terminal()));
    store.get_task("ns", task_id, None).await.unwrap()
}

/// Completes the claimed task with the answer "pong" and `artifact`.
pub(crate) async fn complete_with_pong(h: &Harness, claimed: &Claimed, artifact: &Artifact) -> Task {
    let answer = Some(agent_message("pong"));
    let done = h.store.complete_task("ns", &claimed.task.id, &claimed.lease_id, answer, vec![artifact.clone()]);
    let done = done.await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    done
}

async fn a_worker_claims_and_completes_a_task(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, task.id);
    assert_eq!(claimed.task.status.state, TaskState::Working);
    assert_eq!(claimed.task.attempt, 1);
    assert_eq!(claimed.task.history[0].joined_text(), "ping");
    let artifact = Artifact {
        artifact_id: "out".into(),
        name: Some("echo".into()),
        description: None,
        parts: vec![Part::text("ping")],
        metadata: None,
        extensions: Vec::new(),
    };
    let done = complete_with_pong(&h, &claimed, &artifact).await;
    assert_eq!(done.artifacts, vec![artifact]);
    assert_eq!(done.history.last().unwrap().joined_text(), "pong");
    let twice = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(twice, TaskStoreError::TaskFinished { .. }), "{twice}");
    let renewed = h.store.renew_lease("ns", &task.id, &claimed.lease_id, None).await.unwrap_err();
    assert!(matches!(renewed, TaskStoreError::TaskFinished { .. }), "a finished task, not a lost lease: {renewed}");
}

async fn capacity_bounds_the_leases_a_worker_holds(h: Harness) {
    for index in 0..3 {
        h.task("ns", "echo", &format!("job {index}")).await;
    }
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, Duration::from_secs(30), 0));
    let first = next_claim(&mut claims).await;
    let second = next_claim(&mut claims).await;
    assert_eq!(first.task.history[0].joined_text(), "job 0", "oldest first");
    let early = tokio::time::timeout(Duration::from_millis(400), claims.next()).await;
    assert!(early.is_err(), "a worker at capacity gets no third task");
    h.store.complete_task("ns", &first.task.id, &first.lease_id, None, Vec::new()).await.unwrap();
    let third = next_claim(&mut claims).await;
    assert_eq!(third.task.history[0].joined_text(), "job 2");
    assert_ne!(third.task.id, second.task.id);
}

/// One process serving two agents under one worker id has room for each.
async fn capacity_counts_the_tasks_of_the_streams_agent_only(h: Harness) {
    h.task("ns", "writer", "draft").await;
    let mut writer = h.store.claim_stream(claim_request("writer", "w1", 1, Duration::from_secs(30), 0));
    let drafting = next_claim(&mut writer).await;
    let review = h.task("ns", "reviewer", "review").await;
    let mut reviewer = h.store.claim_stream(claim_request("reviewer", "w1", 1, Duration::from_secs(30), 0));
    let reviewing = next_claim(&mut reviewer).await;
    assert_eq!(reviewing.task.id, review.id, "the writer's task does not fill the reviewer's room");
    let leases = h.repository.worker_leases("ns", "w1", "writer").await.unwrap();
    assert_eq!(leases.active, vec![(drafting.task.id.clone(), drafting.lease_expires_at)], "the writer's only");
    h.task("ns", "writer", "second draft").await;
    let early = tokio::time::timeout(Duration::from_millis(400), writer.next()).await;
    assert!(early.is_err(), "the writer's stream is still at its capacity");
}

async fn only_the_lease_holder_may_write(h: Harness) {
    let task = h.task("ns", "echo", "x").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let update = |lease_id: Option<&str>| StatusUpdate {
        state: TaskState::Working,
        message: Some(agent_message("progress")),
        lease_id: lease_id.map(str::to_owned),
    };
    let error = h.store.update_status("ns", &task.id, update(None)).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::LeaseRequired { .. }), "{error}");
    let users = StatusUpdate { message: Some(user_message("progress?")), ..update(Some(&claimed.lease_id)) };
    let error = h.store.update_status("ns", &task.id, users).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::InvalidArgument, "a status message is the agent's: {error}");
    let error = h.store.update_status("ns", &task.id, update(Some("stolen"))).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::LeaseLost { .. }), "{error}");
    let error = h.store.complete_task("ns", &task.id, "stolen", None, Vec::new()).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::LeaseLost { .. }), "{error}");
    let progressed = h.store.update_status("ns", &task.id, update(Some(&claimed.lease_id))).await.unwrap();
    assert_eq!(progressed.status.message.unwrap().joined_text(), "progress");
}

/// Spawns and agent messages are fenced by the task's lease, as every other
/// write of a worker: once the task went back to the queue and on to another
/// worker, the first one's spawn makes no duplicate child and its message
/// stays out of the history, whether it names its old lease or none.
async fn a_worker_whose_lease_ended_can_neither_spawn_nor_add_messages(h: Harness) {
    let task = h.task("ns", "echo", "plan a trip").await;
    let mut slow = h.store.claim_stream(claim_request("echo", "slow", 1, Duration::from_secs(30), 1));
    let stale = next_claim(&mut slow).await;
    h.store.fail_task("ns", &task.id, &stale.lease_id, "went quiet", Some(Duration::ZERO)).await.unwrap();
    drop(slow);
    let mut quick = h.store.claim_stream(claim_request("echo", "quick", 1, Duration::from_secs(30), 1));
    let current = next_claim(&mut quick).await;
    assert_eq!(current.task.id, task.id);

    let spawn_under = |lease_id: &str| NewSubtask {
        lease_id: Some(lease_id.to_owned()),
        ..crate::subtasks::subtask(&task.id, "booker", &format!("book it ({lease_id})"))
    };
    let late = h.store.spawn_subtask(spawn_under(&stale.lease_id), false, None).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::LeaseLost { .. }), "{late}");
    let late = h.store.add_message("ns", &task.id, agent_message("stale"), Some(&stale.lease_id)).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::LeaseLost { .. }), "{late}");
    // Naming no lease does not pass the fence: a leased task takes the
    // agent's words and spawns only from its lease holder.
    let unnamed = NewSubtask { lease_id: None, ..spawn_under("none") };
    let late = h.store.spawn_subtask(unnamed, false, None).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::LeaseRequired { .. }), "{late}");
    let late = h.store.add_message("ns", &task.id, agent_message("stale"), None).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::LeaseRequired { .. }), "{late}");
    assert!(h.repository.children("ns", &task.id, &[]).await.unwrap().is_empty(), "no child spawned");
    let follow_up = h.store.add_message("ns", &task.id, user_message("also this"), None).await.unwrap();
    assert_eq!(follow_up.history.last().unwrap().joined_text(), "also this", "a client's follow-up needs no lease");

    h.store.spawn_subtask(spawn_under(&current.lease_id), false, None).await.unwrap();
    let added = h.store.add_message("ns", &task.id, agent_message("fresh"), Some(&current.lease_id)).await.unwrap();
    let texts: Vec<String> = added.history.iter().map(|message| message.joined_text()).collect();
    assert!(texts.contains(&"fresh".to_owned()) && !texts.contains(&"stale".to_owned()), "{texts:?}");
    assert_eq!(h.repository.children("ns", &task.id, &[]).await.unwrap().len(), 1);
}

/// A2A lets an agent reject a task once it has found it can't or won't
/// proceed: from `working`, and from `input-required` (still leased to the
/// worker that asked).
async fn the_lease_holder_may_reject_a_task_it_works_on_or_waits_on(h: Harness) {
    h.task("ns", "echo", "do something dubious").await;
    h.task("ns", "echo", "do something vague").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, Duration::from_secs(30), 0));
    let working = next_claim(&mut claims).await;
    let waiting = next_claim(&mut claims).await;
    let update = |state: TaskState, text: &str, lease_id: &str| StatusUpdate {
        state,
        message: Some(agent_message(text)),
        lease_id: Some(lease_id.to_owned()),
    };
    let asked = update(TaskState::InputRequired, "which one?", &waiting.lease_id);
    h.store.update_status("ns", &waiting.task.id, asked).await.unwrap();

    let stolen = update(TaskState::Rejected, "no", "stolen");
    let error = h.store.update_status("ns", &working.task.id, stolen).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::LeaseLost { .. }), "only the lease holder rejects: {error}");
    for (claimed, reason) in [(&working, "I won't do that"), (&waiting, "no answer I can use")] {
        let rejected = update(TaskState::Rejected, reason, &claimed.lease_id);
        let rejected = h.store.update_status("ns", &claimed.task.id, rejected).await.unwrap();
        assert_eq!(rejected.status.state, TaskState::Rejected);
        assert_eq!(rejected.status.message.unwrap().joined_text(), reason);
        assert_eq!(final_state(&h.store, &claimed.task.id).await.status.state, TaskState::Rejected);
    }
}

async fn an_expired_lease_fails_the_task(h: Harness) {
    let task = h.task("ns", "echo", "hang").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_millis(300), 0));
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, task.id);
    fails_when_its_lease_runs_out(&h.store, &claimed).await;
}

/// Waits for the task of `claimed`, never renewed, to fail for its lease,
/// and checks that its late worker cannot complete it.
pub(crate) async fn fails_when_its_lease_runs_out(store: &TaskStore, claimed: &Claimed) {
    let task_id = &claimed.task.id;
    let failed = final_state(store, task_id).await;
    assert_eq!(failed.status.state, TaskState::Failed);
    assert_eq!(failed.status.message.unwrap().joined_text(), "worker lease expired");
    let late = store.complete_task("ns", task_id, &claimed.lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::TaskFinished { .. }), "a late worker cannot complete: {late}");
}

async fn an_expired_lease_requeues_while_retries_last(h: Harness) {
    let task = h.task("ns", "echo", "flaky").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_millis(300), 1));
    let first = next_claim(&mut claims).await;
    assert_eq!(first.task.attempt, 1);
    let second = next_claim(&mut claims).await;
    assert_eq!(second.task.id, task.id, "the expired task comes back");
    assert_eq!(second.task.attempt, 2);
    assert_ne!(second.lease_id, first.lease_id);
    let requeue_note = second.task.history.iter().any(|message| message.joined_text().contains("requeued"));
    assert!(requeue_note, "the history says why the task came back");
    let stale = h.store.complete_task("ns", &task.id, &first.lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(stale, TaskStoreError::LeaseLost { .. }), "{stale}");
    let failed = final_state(&h.store, &task.id).await;
    assert_eq!(failed.status.state, TaskState::Failed, "retries are exhausted after the second expiry");
}

async fn renewal_keeps_a_lease_and_reports_cancellation(h: Harness) {
    let task = h.task("ns", "echo", "long").await;
    // Renewed at a third of the lease, which outlives the loop three times
    // over: margin for a loaded machine.
    let lease = Duration::from_millis(900);
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, lease, 0));
    let claimed = next_claim(&mut claims).await;
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let renewal = h.store.renew_lease("ns", &task.id, &claimed.lease_id, Some(lease)).await.unwrap();
        assert!(!renewal.canceled);
    }
    assert_eq!(h.store.get_task("ns", &task.id, Some(0)).await.unwrap().status.state, TaskState::Working);
    h.store.cancel_task("ns", &task.id, None).await.unwrap();
    let renewal = h.store.renew_lease("ns", &task.id, &claimed.lease_id, Some(lease)).await.unwrap();
    assert!(renewal.canceled, "the worker learns of the cancellation");
    let error = h.store.renew_lease("ns", &task.id, "stolen", Some(lease)).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::LeaseLost { .. }), "only the last lease holder hears of it: {error}");
}

/// The lease ends about `length` after `before`, at least: what a renewal
/// made then for that length gives.
fn assert_lease_of(renewal_end: i64, before: i64, length: Duration, what: &str) {
    let length = i64::try_from(length.as_micros()).unwrap();
    let slack = 5_000_000;
    assert!(
        renewal_end >= before + length && renewal_end < before + length + slack,
        "{what}: the lease ends {} µs after the renewal, not about {length}",
        renewal_end - before
    );
}

/// A renewal that names no length renews for as long as the lease was
/// granted, by a claim, a hand-off, or the last renewal that named one (the
/// server's default is 2 s here).
async fn a_plain_renewal_extends_by_the_length_granted(h: Harness) {
    let queued = h.task("ns", "echo", "queued").await;
    let granted = Duration::from_secs(20);
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, granted, 0));
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, queued.id);
    let before = now_micros();
    let renewal = h.store.renew_lease("ns", &queued.id, &claimed.lease_id, None).await.unwrap();
    assert_lease_of(renewal.lease_expires_at, before, granted, "a claimed task");

    let task = h.task("ns", "echo", "handed off").await;
    assert_eq!(task.status.state, TaskState::Working, "created claimed");
    let handed = next_claim(&mut claims).await;
    assert_eq!(handed.task.id, task.id);
    let before = now_micros();
    let renewal = h.store.renew_lease("ns", &handed.task.id, &handed.lease_id, None).await.unwrap();
    assert_lease_of(renewal.lease_expires_at, before, granted, "a handed-off task");

    let shorter = Duration::from_secs(7);
    h.store.renew_lease("ns", &queued.id, &claimed.lease_id, Some(shorter)).await.unwrap();
    let before = now_micros();
    let renewal = h.store.renew_lease("ns", &queued.id, &claimed.lease_id, Some(Duration::ZERO)).await.unwrap();
    assert_lease_of(renewal.lease_expires_at, before, shorter, "after a renewal that named a length");
}

pub(crate) async fn next_claim_event(
    events: &mut (impl tokio_stream::Stream<Item = Result<ClaimEvent, TaskStoreError>> + Unpin),
) -> ClaimEvent {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event arrives in time")
        .expect("the claim stream is open")
        .expect("the claim stream works")
}

/// A cancel reaches the worker on its claim stream, not at its next renewal
/// (30 s away here); the canceled task's room goes to the next task at once.
/// Tasks that end otherwise are not announced.
async fn a_stream_that_asked_is_told_at_once_of_its_canceled_tasks(h: Harness) {
    let first = h.task("ns", "echo", "one").await;
    let request = claim_request("echo", "w1", 1, Duration::from_secs(30), 0);
    let mut events = Box::pin(h.store.claim_stream_with_cancellations(request));
    let ClaimEvent::Claimed(claimed) = next_claim_event(&mut events).await else { panic!("a task first") };
    assert_eq!(claimed.task.id, first.id);
    let second = h.task("ns", "echo", "two").await;
    h.store.cancel_task("ns", &first.id, None).await.unwrap();

    let (mut canceled, mut handed) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        match next_claim_event(&mut events).await {
            ClaimEvent::Canceled(task_id) => canceled.push(task_id),
            ClaimEvent::Claimed(claimed) => handed.push(claimed),
        }
    }
    assert_eq!(canceled, std::slice::from_ref(&first.id), "told of the cancel");
    let [next] = handed.as_slice() else { panic!("the next task: {handed:?}") };
    assert_eq!(next.task.id, second.id, "the canceled task's room is free at once");

    h.store.complete_task("ns", &second.id, &next.lease_id, None, Vec::new()).await.unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(400), events.next()).await;
    assert!(quiet.is_err(), "a completed task is not announced: {quiet:?}");
}

/// The stream knows its tasks beyond the lease they were handed out with.
async fn a_task_renewed_past_its_first_lease_is_still_announced_when_canceled(h: Harness) {
    let task = h.task("ns", "echo", "long").await;
    let lease = Duration::from_millis(600);
    let mut events = Box::pin(h.store.claim_stream_with_cancellations(claim_request("echo", "w1", 1, lease, 0)));
    let ClaimEvent::Claimed(claimed) = next_claim_event(&mut events).await else { panic!("a task first") };
    for _ in 0..5 {
        tokio::time::sleep(lease / 3).await;
        h.store.renew_lease("ns", &task.id, &claimed.lease_id, None).await.unwrap();
    }
    h.store.cancel_task("ns", &task.id, None).await.unwrap();
    let ClaimEvent::Canceled(canceled) = next_claim_event(&mut events).await else { panic!("a notice") };
    assert_eq!(canceled, task.id);
}

/// A lease under 100 ms reaches its worker expired; one over the configured
/// maximum is not granted. Neither is shortened or lengthened quietly.
async fn leases_out_of_bounds_are_refused_naming_the_bounds(h: Harness) {
    let task = h.task("ns", "echo", "x").await;
    let max = Duration::from_secs(3600);
    for lease in [Duration::from_millis(1), Duration::from_millis(99), max + Duration::from_millis(1)] {
        let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, lease, 0));
        let refused = tokio::time::timeout(Duration::from_secs(10), claims.next()).await.unwrap().unwrap();
        let error = refused.expect_err("an out-of-bounds lease is refused");
        assert_eq!(error.error_code(), ErrorCode::InvalidArgument, "{error}");
        let text = error.to_string();
        assert!(text.contains("lease") && text.contains("100 ms") && text.contains("3600000 ms"), "{text}");
        assert!(claims.next().await.is_none(), "the stream ends");
    }
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_millis(100), 0));
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, task.id, "100 ms is enough");
    let error = h.store.renew_lease("ns", &task.id, &claimed.lease_id, Some(max * 2)).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::InvalidArgument, "{error}");
    let error = h.store.renew_lease("ns", &task.id, &claimed.lease_id, Some(Duration::from_millis(5))).await;
    assert_eq!(error.unwrap_err().error_code(), ErrorCode::InvalidArgument);
    h.store.renew_lease("ns", &task.id, &claimed.lease_id, Some(max)).await.unwrap();
}

async fn a_worker_may_ask_for_a_retry(h: Harness) {
    let task = h.task("ns", "echo", "retry me").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 1));
    let first = next_claim(&mut claims).await;
    let requeued =
        h.store.fail_task("ns", &task.id, &first.lease_id, "upstream timeout", Some(Duration::ZERO)).await.unwrap();
    assert_eq!(requeued.status.state, TaskState::Submitted);
    let second = next_claim(&mut claims).await;
    let failed =
        h.store.fail_task("ns", &task.id, &second.lease_id, "upstream timeout", Some(Duration::ZERO)).await.unwrap();
    assert_eq!(failed.status.state, TaskState::Failed);
    assert_eq!(failed.status.message.unwrap().joined_text(), "upstream timeout");
}

async fn a_claim_no_worker_received_is_released(h: Harness) {
    let task = h.task("ns", "racer", "lost in transit").await;
    let request = claim_request("racer", "gone", 1, Duration::from_secs(60), 0);
    let leases = h.repository.worker_leases("ns", "gone", "racer").await.unwrap();
    assert!(leases.ready && leases.active.is_empty(), "{leases:?}");
    let claimed = h.repository.claim_tasks(&request, 1).await.unwrap();
    let [claimed] = claimed.as_slice() else { panic!("one claim: {claimed:?}") };
    let leases = h.repository.worker_leases("ns", "gone", "racer").await.unwrap();
    assert_eq!(leases.active, vec![(task.id.clone(), claimed.lease_expires_at)]);
    assert!(!leases.ready, "nothing else to claim");
    assert_eq!(claimed.task.id, task.id);
    let lease = claimed.lease_id.as_str();
    assert!(!h.repository.release_claim("other-ns", &task.id, lease).await.unwrap(), "namespaces stay apart");
    assert!(!h.repository.release_claim("ns", "another-task", lease).await.unwrap(), "only the task named");
    assert!(h.repository.release_claim("ns", &task.id, lease).await.unwrap());
    let released = h.store.get_task("ns", &task.id, Some(0)).await.unwrap();
    assert_eq!(released.status.state, TaskState::Submitted, "claimable again");
    assert_eq!(released.attempt, 0, "the claim that never arrived does not count");
    let old_lease = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new()).await;
    assert!(old_lease.is_err(), "the released lease writes nothing");
    let mut claims = h.store.claim_stream(claim_request("racer", "next", 1, Duration::from_secs(60), 0));
    let next = next_claim(&mut claims).await;
    assert_eq!(next.task.id, task.id, "another worker gets it");
    assert_eq!(next.task.attempt, 1);
    assert!(!h.repository.release_claim("ns", &task.id, lease).await.unwrap(), "only the claim's own tasks");
}

async fn the_queue_depth_counts_the_tasks_waiting_for_a_worker(h: Harness) {
    assert_eq!(h.repository.queue_depth().await.unwrap(), (0, None), "nothing waits");
    let first = h.task("ns", "echo", "first").await;
    h.task("other-ns", "review", "second").await;
    assert_eq!(h.repository.queue_depth().await.unwrap(), (2, Some(first.created_at)), "every namespace and agent");
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    assert_eq!(next_claim(&mut claims).await.task.id, first.id);
    let (queued, oldest) = h.repository.queue_depth().await.unwrap();
    assert_eq!(queued, 1, "a claimed task waits no more");
    assert!(oldest.is_some_and(|oldest| oldest >= first.created_at));
}

/// A stream closed (or dropped) with claims still on it that its worker
/// never read gives them back at once: they do not sit leased to a worker
/// that does not know them until the lease runs out.
async fn claims_left_on_a_stream_its_worker_closed_go_back_to_the_queue(h: Harness) {
    let first = h.task("ns", "racer", "one").await;
    let second = h.task("ns", "racer", "two").await;
    let mut claims = h.store.claim_stream(claim_request("racer", "closing", 2, Duration::from_secs(600), 0));
    let received = next_claim(&mut claims).await;
    let unread = if received.task.id == first.id { &second } else { &first };
    // The other claim is made, and waits on the stream, unread.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.store.get_task("ns", &unread.id, Some(0)).await.unwrap().status.state != TaskState::Working {
        assert!(tokio::time::Instant::now() < deadline, "the second task was never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(claims);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let task = h.store.get_task("ns", &unread.id, Some(0)).await.unwrap();
        if task.status.state == TaskState::Submitted {
            assert_eq!(task.attempt, 0, "a claim that never arrived does not count");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the unread claim is still held: {:?}", task.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kept = h.store.get_task("ns", &received.task.id, Some(0)).await.unwrap();
    assert_eq!(kept.status.state, TaskState::Working, "the task the worker read stays its own");
}
