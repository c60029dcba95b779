//! A worker started again under its old id: its previous run's leases end
//! at once, and nobody else's. A task store started again leaves the leases
//! that ran out while it was down a lease length to be renewed.

use std::time::Duration;

use chorus_taskstore::{
    TaskStoreConfig,
    domain::{Task, TaskState, now_micros},
    error::TaskStoreError,
};

use crate::{
    harness::{Harness, conformance, test_config},
    workers::{claim_request, next_claim},
};

conformance!(
    a_new_run_of_a_worker_requeues_what_its_previous_run_held,
    a_new_run_fails_the_tasks_whose_retries_are_spent,
    a_new_run_leaves_other_workers_and_agents_alone,
);

/// On a store whose reaper runs once, at its start: the test expires leases itself.
mod downtime {
    use super::no_lease_runs_out_within_a_lease_length_of_the_reapers_start;

    crate::harness::conformance!(
        start = crate::restarts::start_without_reaping;
        no_lease_runs_out_within_a_lease_length_of_the_reapers_start,
    );
}

async fn start_without_reaping(database: chorus_runtime::testing::TestDatabase) -> Harness {
    Harness::start_with(database, TaskStoreConfig { reaper_interval_ms: 3_600_000, ..test_config() }).await
}

/// Long enough that no lease in these tests runs out on its own.
const LEASE: Duration = Duration::from_secs(60);

fn status_text(task: &Task) -> String {
    task.status.message.as_ref().map(|message| message.joined_text()).unwrap_or_default()
}

async fn a_new_run_of_a_worker_requeues_what_its_previous_run_held(h: Harness) {
    let first = h.task("ns", "echo", "first").await;
    let second = h.task("ns", "echo", "second").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "pod-0", 2, LEASE, 1));
    let held = [next_claim(&mut claims).await, next_claim(&mut claims).await];
    drop(claims);

    assert_eq!(h.store.start_worker_run("ns", "pod-0", "echo").await.unwrap(), 2);
    for task in [&first, &second] {
        let requeued = h.store.get_task("ns", &task.id, None).await.unwrap();
        assert_eq!(requeued.status.state, TaskState::Submitted);
        assert_eq!(status_text(&requeued), "worker restarted; requeued after attempt 1 of 2");
    }
    let stale = h.store.complete_task("ns", &first.id, &held[0].lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(stale, TaskStoreError::LeaseLost { .. }), "the previous run writes nothing more: {stale}");

    let mut claims = h.store.claim_stream(claim_request("echo", "pod-0", 2, LEASE, 1));
    let again = [next_claim(&mut claims).await, next_claim(&mut claims).await];
    // Requeued together, the two are equally old: either may come first.
    let mut ids: Vec<&str> = again.iter().map(|claimed| claimed.task.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = [first.id.as_str(), second.id.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected, "the new run has room for both at once");
    assert!(again.iter().all(|claimed| claimed.task.attempt == 2));
    assert_eq!(h.store.start_worker_run("ns", "pod-0", "other").await.unwrap(), 0, "nothing of another agent");
}

async fn a_new_run_fails_the_tasks_whose_retries_are_spent(h: Harness) {
    let task = h.task("ns", "echo", "once").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "pod-0", 1, LEASE, 0));
    next_claim(&mut claims).await;
    drop(claims);
    assert_eq!(h.store.start_worker_run("ns", "pod-0", "echo").await.unwrap(), 1);
    let failed = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((failed.status.state, status_text(&failed)), (TaskState::Failed, "worker restarted".to_owned()));
}

async fn a_new_run_leaves_other_workers_and_agents_alone(h: Harness) {
    let theirs = h.task("ns", "echo", "theirs").await;
    let other_agent = h.task("ns", "review", "review me").await;
    let elsewhere = h.task("other-ns", "echo", "elsewhere").await;
    let mut pod1 = h.store.claim_stream(claim_request("echo", "pod-1", 1, LEASE, 1));
    assert_eq!(next_claim(&mut pod1).await.task.id, theirs.id);
    let mut reviews = h.store.claim_stream(claim_request("review", "pod-0", 1, LEASE, 1));
    assert_eq!(next_claim(&mut reviews).await.task.id, other_agent.id);
    let mut request = claim_request("echo", "pod-0", 1, LEASE, 1);
    request.namespace = "other-ns".into();
    let mut other_namespace = h.store.claim_stream(request);
    assert_eq!(next_claim(&mut other_namespace).await.task.id, elsewhere.id);

    assert_eq!(h.store.start_worker_run("ns", "pod-0", "echo").await.unwrap(), 0);
    for (namespace, task) in [("ns", &theirs), ("ns", &other_agent), ("other-ns", &elsewhere)] {
        let kept = h.store.get_task(namespace, &task.id, None).await.unwrap();
        assert_eq!((kept.status.state, kept.attempt), (TaskState::Working, 1), "{}", task.id);
    }
}

async fn no_lease_runs_out_within_a_lease_length_of_the_reapers_start(h: Harness) {
    let lease = Duration::from_millis(200);
    let length = i64::try_from(lease.as_micros()).unwrap();
    let task = h.task("ns", "echo", "long job").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "pod-0", 1, lease, 1));
    let claimed = next_claim(&mut claims).await;
    // The repository is told the time: the reaper started 1 ms after the
    // lease ran out, and looks 2 ms after that.
    let expired_at = claimed.lease_expires_at;
    assert!(expired_at > now_micros(), "the lease runs");
    let restarted_after = h.repository.expire_leases(expired_at + 3_000, expired_at + 1_000, 10).await.unwrap();
    assert!(restarted_after.is_empty(), "it ran out while no reaper ran: its worker may still renew it");
    let waiting = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((waiting.status.state, waiting.attempt), (TaskState::Working, 1));
    let later = h.repository.expire_leases(expired_at + 1_000 + length, expired_at + 1_000, 10).await.unwrap();
    assert_eq!(later.len(), 1, "a lease length after the start, its worker did not come back");
    assert!(later[0].requeued);

    let claimed = next_claim(&mut claims).await;
    assert_eq!((claimed.task.id.as_str(), claimed.task.attempt), (task.id.as_str(), 2), "requeued, claimed again");
    // One that runs out just after the start was live when the task store
    // stopped: its worker could not renew it then, and gets as long.
    let expired_at = claimed.lease_expires_at;
    let just_after = h.repository.expire_leases(expired_at + 2_000, expired_at - 1_000, 10).await.unwrap();
    assert!(just_after.is_empty(), "it ran out within a lease length of the start: {just_after:?}");
    let long_after = h.repository.expire_leases(expired_at + 1, expired_at - 1 - length, 10);
    assert_eq!(long_after.await.unwrap().len(), 1, "it ran out a lease length after the start: expired at once");
}
