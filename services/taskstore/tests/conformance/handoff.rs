//! Hand-off: a task created while a worker of its agent waits here, caught
//! up and with room, is created claimed and goes straight to that worker.
//!
//! Each test first has the worker claim a task queued before its stream
//! opened, with room to spare: a claim that took less than its room, with no
//! create racing it, found the queue empty, so the stream is caught up
//! before that task even reaches the test.

use std::time::Duration;

use chorus_runtime::{
    error::{ErrorCode, ServiceError as _},
    testing::given_up_after,
};

use chorus_taskstore::{
    domain::{EventKind, TaskState},
    error::TaskStoreError,
};
use tokio_stream::StreamExt as _;

use crate::{
    awaits::replicas,
    harness::{Harness, conformance, new_task},
    workers::{claim_request, fails_when_its_lease_runs_out, final_state, next_claim},
};

conformance!(
    a_waiting_worker_gets_a_new_task_at_once,
    a_new_task_never_overtakes_a_queued_one,
    a_handed_off_lease_expires_like_a_claimed_one,
    a_repeated_create_hands_nothing_off,
    a_create_whose_caller_goes_away_still_reaches_the_worker,
    tasks_another_replica_queued_go_first_as_room_frees,
    a_newer_stream_of_the_worker_replaces_the_older_and_keeps_its_capacity,
);

async fn a_waiting_worker_gets_a_new_task_at_once(h: Harness) {
    let primer = h.task("ns", "echo", "primer").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, Duration::from_secs(30), 0));
    assert_eq!(next_claim(&mut claims).await.task.id, primer.id);

    let before = chorus_taskstore::domain::now_micros();
    let task = h.task("ns", "echo", "straight through").await;
    assert_eq!(task.status.state, TaskState::Working, "created claimed");
    assert_eq!(task.attempt, 1);
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, task.id);
    assert_eq!(claimed.task.status.state, TaskState::Working);
    assert_eq!(claimed.task.history[0].joined_text(), "straight through");
    assert!(claimed.lease_expires_at >= before + 30_000_000, "the worker's own lease");

    let stored = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((stored.status.state, stored.attempt), (TaskState::Working, 1));
    let mut events = h.store.watch_task("ns", &task.id, None).await.unwrap();
    let created = events.next().await.unwrap().unwrap();
    let working = events.next().await.unwrap().unwrap();
    assert_eq!((created.kind, created.status.state), (EventKind::Created, TaskState::Submitted));
    assert_eq!((working.kind, working.status.state), (EventKind::StatusChanged, TaskState::Working));
    assert!(created.cursor < working.cursor);

    let stolen = h.store.complete_task("ns", &task.id, "stolen", None, Vec::new()).await.unwrap_err();
    assert!(matches!(stolen, TaskStoreError::LeaseLost { .. }), "{stolen}");
    let done = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    assert_eq!(final_state(&h.store, &task.id).await.status.state, TaskState::Completed);
}

async fn a_new_task_never_overtakes_a_queued_one(h: Harness) {
    h.task("ns", "echo", "primer").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, Duration::from_secs(30), 0));
    let primer = next_claim(&mut claims).await;
    let a = h.task("ns", "echo", "a").await;
    assert_eq!(a.status.state, TaskState::Working, "room for one more");
    let a = next_claim(&mut claims).await;
    let b = h.task("ns", "echo", "b").await;
    let c = h.task("ns", "echo", "c").await;
    assert_eq!((b.status.state, c.status.state), (TaskState::Submitted, TaskState::Submitted), "at capacity");
    let early = tokio::time::timeout(Duration::from_millis(300), claims.next()).await;
    assert!(early.is_err(), "a worker at capacity gets no third task");

    h.store.complete_task("ns", &a.task.id, &a.lease_id, None, Vec::new()).await.unwrap();
    let next = next_claim(&mut claims).await;
    assert_eq!(next.task.id, b.id, "the queue first");
    h.store.complete_task("ns", &primer.task.id, &primer.lease_id, None, Vec::new()).await.unwrap();
    let last = next_claim(&mut claims).await;
    assert_eq!(last.task.id, c.id);
    // The claim of c filled the room: whether more waits is unknown until
    // the next read, so a new task still queues rather than jump ahead.
    let d = h.task("ns", "echo", "d").await;
    assert_eq!(d.status.state, TaskState::Submitted);
    h.store.complete_task("ns", &next.task.id, &next.lease_id, None, Vec::new()).await.unwrap();
    assert_eq!(next_claim(&mut claims).await.task.id, d.id);
}

async fn a_handed_off_lease_expires_like_a_claimed_one(h: Harness) {
    h.task("ns", "echo", "primer").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, Duration::from_millis(300), 0));
    next_claim(&mut claims).await;
    let task = h.task("ns", "echo", "abandoned").await;
    assert_eq!(task.status.state, TaskState::Working);
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, task.id);
    fails_when_its_lease_runs_out(&h.store, &claimed).await;
}

async fn a_repeated_create_hands_nothing_off(h: Harness) {
    h.task("ns", "echo", "primer").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 3, Duration::from_secs(30), 0));
    next_claim(&mut claims).await;
    let new = new_task("ns", "echo", "once");
    let first = h.store.create_task(new.clone()).await.unwrap();
    assert_eq!(first.status.state, TaskState::Working);
    let again = h.store.create_task(new).await.unwrap();
    assert_eq!(again.id, first.id, "the first create's task");
    assert_eq!(next_claim(&mut claims).await.task.id, first.id);
    // The repeat's unused offer gave its slot back: one more fits.
    let last = h.task("ns", "echo", "fits").await;
    assert_eq!(last.status.state, TaskState::Working);
    assert_eq!(next_claim(&mut claims).await.task.id, last.id);
    let over = h.task("ns", "echo", "over capacity").await;
    assert_eq!(over.status.state, TaskState::Submitted);
    let early = tokio::time::timeout(Duration::from_millis(300), claims.next()).await;
    assert!(early.is_err(), "only the first create's task went to the worker");
}

async fn a_create_whose_caller_goes_away_still_reaches_the_worker(h: Harness) {
    h.task("ns", "echo", "primer").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 100, Duration::from_secs(30), 0));
    next_claim(&mut claims).await;
    // Each create is given up at a later point of its work, and then made
    // again with the same first message, which returns the task the given-up
    // one left, if it left one.
    let mut created = std::collections::BTreeSet::new();
    for waits in 0..40 {
        let new = new_task("ns", "echo", &format!("given up after {waits} waits"));
        given_up_after(h.store.create_task(new.clone()), waits).await;
        created.insert(h.store.create_task(new).await.unwrap().id);
    }
    let mut delivered = std::collections::BTreeSet::new();
    while delivered.len() < created.len() {
        let claimed = tokio::time::timeout(Duration::from_secs(5), claims.next()).await;
        let Ok(Some(Ok(claimed))) = claimed else {
            let lost: Vec<_> = created.difference(&delivered).collect();
            panic!("tasks created but never given to the waiting worker: {lost:?}");
        };
        delivered.insert(claimed.task.id);
    }
    assert_eq!(delivered, created);
}

/// Tasks another replica queued reach a worker here, oldest first, as soon
/// as it has room, and a task created here later is not handed over ahead
/// of them. Both replicas poll every 60 s: only wake-ups pass.
async fn tasks_another_replica_queued_go_first_as_room_frees(h: Harness) {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (here, there) = replicas(&h, &shutdown);
    let mut claims = here.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    // The stream's first read finds the queue empty: it is caught up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = there.create_task(new_task("ns", "echo", "first")).await.unwrap();
    let second = there.create_task(new_task("ns", "echo", "second")).await.unwrap();
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, first.id);
    here.complete_task("ns", &first.id, &claimed.lease_id, None, Vec::new()).await.unwrap();

    let later = here.create_task(new_task("ns", "echo", "later")).await.unwrap();
    assert_eq!(later.status.state, TaskState::Submitted, "queued behind the other replica's task, not handed over");
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, second.id, "the other replica's task, first and at once");
    here.complete_task("ns", &second.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    assert_eq!(next_claim(&mut claims).await.task.id, later.id);
    shutdown.cancel();
}

/// A worker that reconnects before its old stream is seen closed (or opens a
/// second by mistake) has one stream for the agent: the newer. The older
/// ends ABORTED, saying why, and takes no hand-off: two streams each
/// counting their own leases would together hold twice the capacity.
async fn a_newer_stream_of_the_worker_replaces_the_older_and_keeps_its_capacity(h: Harness) {
    let primer = h.task("ns", "echo", "primer").await;
    let lease = Duration::from_secs(30);
    let mut older = h.store.claim_stream(claim_request("echo", "w1", 2, lease, 0));
    let first = next_claim(&mut older).await;
    assert_eq!(first.task.id, primer.id);
    let mut newer = h.store.claim_stream(claim_request("echo", "w1", 2, lease, 0));
    let ended = tokio::time::timeout(Duration::from_secs(10), older.next()).await.expect("the older stream ends");
    let error = ended.expect("with an error").unwrap_err();
    assert!(matches!(error, TaskStoreError::StreamReplaced { .. }), "{error}");
    assert_eq!(error.error_code(), ErrorCode::Aborted);
    assert!(older.next().await.is_none(), "and nothing after it");

    // The worker holds the primer: of two new tasks it takes one, whether
    // handed over or claimed.
    let second = h.task("ns", "echo", "second").await;
    let third = h.task("ns", "echo", "third").await;
    let taken = next_claim(&mut newer).await;
    assert!([&second.id, &third.id].contains(&&taken.task.id));
    let beyond = tokio::time::timeout(Duration::from_millis(500), newer.next()).await;
    assert!(beyond.is_err(), "past its capacity: {beyond:?}");
    h.store.complete_task("ns", &primer.id, &first.lease_id, None, Vec::new()).await.unwrap();
    let last = next_claim(&mut newer).await;
    assert!([&second.id, &third.id].contains(&&last.task.id) && last.task.id != taken.task.id);
}
