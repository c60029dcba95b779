//! Waiting readers are woken by commits, not by polling: with a poll interval
//! far longer than the deadlines here, only a wake-up can pass these tests.

use std::time::Duration;

use chorus_taskstore::TaskStoreConfig;
use tokio_stream::StreamExt as _;

use crate::{
    harness::{Harness, conformance, test_config},
    workers::{claim_request, next_claim},
};

conformance!(
    start = crate::wakeups::start;
    a_worker_at_capacity_gets_the_next_task_as_soon_as_one_finishes,
    a_waiting_worker_gets_a_new_task_at_once,
);

pub(crate) fn slow_poll_config() -> TaskStoreConfig {
    TaskStoreConfig { poll_interval_ms: 60_000, ..test_config() }
}

async fn a_worker_at_capacity_gets_the_next_task_as_soon_as_one_finishes(h: Harness) {
    let first = h.task("ns", "echo", "first").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, first.id);
    let second = h.task("ns", "echo", "second").await;
    let early = tokio::time::timeout(Duration::from_millis(300), claims.next()).await;
    assert!(early.is_err(), "a worker at capacity gets nothing more");
    h.store.complete_task("ns", &first.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), claims.next()).await;
    let next = next.expect("woken by the completion, not the 60 s poll").unwrap().unwrap();
    assert_eq!(next.task.id, second.id);
}

async fn a_waiting_worker_gets_a_new_task_at_once(h: Harness) {
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 2, Duration::from_secs(30), 0));
    let nothing = tokio::time::timeout(Duration::from_millis(200), claims.next()).await;
    assert!(nothing.is_err());
    let task = h.task("ns", "echo", "new").await;
    let next = tokio::time::timeout(Duration::from_secs(10), claims.next()).await;
    assert_eq!(next.expect("woken by the create").unwrap().unwrap().task.id, task.id);
}

async fn start(database: chorus_runtime::testing::TestDatabase) -> Harness {
    Harness::start_with(database, slow_poll_config()).await
}
