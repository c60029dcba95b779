//! A worker hands a task back: it goes back to the queue, its attempt not
//! counted, for any worker of its agent; or fails it to be retried later.

use std::time::Duration;

use chorus_taskstore::{
    domain::{ClaimRequest, Claimed, HandBack, StatusUpdate, TaskState},
    error::TaskStoreError,
};

use crate::{
    harness::{Harness, agent_message, conformance},
    workers::{claim_request, next_claim},
};

conformance!(
    a_task_handed_back_goes_to_the_next_worker_its_attempt_not_counted,
    a_task_waiting_on_a_question_is_handed_back_to_be_asked_again,
    a_retry_asked_for_later_is_not_claimed_before,
    a_task_handed_back_for_later_is_not_handed_straight_back,
    each_task_of_a_claim_has_a_lease_of_its_own,
    a_task_handed_back_for_others_goes_to_another_worker_at_once,
    a_completion_retried_under_its_lease_answers_the_task_it_completed,
    a_completion_whose_caller_goes_away_still_lands,
);

/// What a claim of up to `room` tasks under `request` hands out: exactly one
/// task, or the test fails saying `what` it expected.
async fn one_claim(h: &Harness, request: &ClaimRequest, room: u32, what: &str) -> Claimed {
    let mut claimed = h.repository.claim_tasks(request, room).await.unwrap();
    assert_eq!(claimed.len(), 1, "{what}: {claimed:?}");
    claimed.remove(0)
}

async fn a_task_handed_back_goes_to_the_next_worker_its_attempt_not_counted(h: Harness) {
    let task = h.task("ns", "echo", "deploy it").await;
    // No retries: a failure, even one asking for a retry, would end it.
    let leaving = claim_request("echo", "leaving", 1, Duration::from_secs(30), 0);
    let first = one_claim(&h, &leaving, 1, "one claim").await;
    let progress = StatusUpdate {
        state: TaskState::Working,
        message: Some(agent_message("half done")),
        lease_id: Some(first.lease_id.clone()),
    };
    h.store.update_status("ns", &task.id, progress).await.unwrap();
    let stale = h.store.release_task("ns", &task.id, "stolen", "shutting down", HandBack::default()).await.unwrap_err();
    assert!(matches!(stale, TaskStoreError::LeaseLost { .. }), "{stale}");

    let released =
        h.store.release_task("ns", &task.id, &first.lease_id, "shutting down", HandBack::default()).await.unwrap();
    assert_eq!((released.status.state, released.attempt), (TaskState::Submitted, 0));
    let said = released.status.message.as_ref().unwrap().joined_text();
    assert_eq!(said, "shutting down; handed back to the queue, the attempt not counted");
    let texts: Vec<String> = released.history.iter().map(|message| message.joined_text()).collect();
    assert!(texts.contains(&"half done".to_owned()), "what it reported stays: {texts:?}");
    let again = h.store.release_task("ns", &task.id, &first.lease_id, "twice", HandBack::default()).await.unwrap_err();
    assert!(matches!(again, TaskStoreError::LeaseLost { .. }), "the lease ended with it: {again}");

    let mut next = h.store.claim_stream(claim_request("echo", "next", 1, Duration::from_secs(30), 0));
    let second = next_claim(&mut next).await;
    assert_eq!((second.task.id.as_str(), second.task.attempt), (task.id.as_str(), 1), "its first counted attempt");
    let done = h.store.complete_task("ns", &task.id, &second.lease_id, None, Vec::new()).await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
}

/// A worker that stops while its task waits for an answer cannot take the
/// answer: it hands the task back, and the next worker asks again. Left
/// leased, the task was requeued as a failed attempt by each restart of the
/// worker, and failed by the third.
async fn a_task_waiting_on_a_question_is_handed_back_to_be_asked_again(h: Harness) {
    let task = h.task("ns", "echo", "deploy").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let asked = StatusUpdate {
        state: TaskState::InputRequired,
        message: Some(agent_message("which region?")),
        lease_id: Some(claimed.lease_id.clone()),
    };
    h.store.update_status("ns", &task.id, asked).await.unwrap();
    let released =
        h.store.release_task("ns", &task.id, &claimed.lease_id, "shutting down", HandBack::default()).await.unwrap();
    assert_eq!((released.status.state, released.attempt), (TaskState::Submitted, 0));
    let texts: Vec<String> = released.history.iter().map(|message| message.joined_text()).collect();
    assert!(texts.contains(&"which region?".to_owned()), "the question stays in the history: {texts:?}");
    drop(claims);
    let mut next = h.store.claim_stream(claim_request("echo", "w2", 1, Duration::from_secs(30), 0));
    let second = next_claim(&mut next).await;
    assert_eq!((second.task.id.as_str(), second.task.attempt), (task.id.as_str(), 1), "its first counted attempt");

    let done = h.store.complete_task("ns", &task.id, &second.lease_id, None, Vec::new()).await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    let late =
        h.store.release_task("ns", &task.id, &second.lease_id, "too late", HandBack::default()).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::LeaseLost { .. } | TaskStoreError::TaskFinished { .. }), "{late}");
}

async fn a_retry_asked_for_later_is_not_claimed_before(h: Harness) {
    let task = h.task("ns", "echo", "call the flaky upstream").await;
    let request = claim_request("echo", "w1", 1, Duration::from_secs(30), 1);
    let first = one_claim(&h, &request, 1, "one claim").await;
    let later = Some(Duration::from_millis(600));
    let requeued = h.store.fail_task("ns", &task.id, &first.lease_id, "upstream said 503", later).await.unwrap();
    assert_eq!(requeued.status.state, TaskState::Submitted);
    let said = requeued.status.message.as_ref().unwrap().joined_text();
    assert_eq!(said, "upstream said 503; requeued after attempt 1 of 2, to be taken again in 600ms");

    let leases = h.repository.worker_leases("ns", "w1", "echo").await.unwrap();
    assert!(!leases.ready, "nothing to claim yet: {leases:?}");
    assert!(h.repository.claim_tasks(&request, 1).await.unwrap().is_empty(), "not before its time");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(h.repository.worker_leases("ns", "w1", "echo").await.unwrap().ready);
    let second = one_claim(&h, &request, 1, "claimed once its time came").await;
    assert_eq!((second.task.id.as_str(), second.task.attempt), (task.id.as_str(), 2));
}

/// A worker that cannot take a task now hands it back for later: with room
/// left on its stream it would otherwise be handed the task straight back.
async fn a_task_handed_back_for_later_is_not_handed_straight_back(h: Harness) {
    let task = h.task("ns", "echo", "needs the GPU").await;
    let request = claim_request("echo", "w1", 2, Duration::from_secs(30), 0);
    let first = one_claim(&h, &request, 2, "one claim").await;
    let later = Duration::from_millis(600);
    let back = HandBack { after: later, others_first: false };
    let released = h.store.release_task("ns", &task.id, &first.lease_id, "no GPU free", back).await.unwrap();
    assert_eq!((released.status.state, released.attempt), (TaskState::Submitted, 0));
    let said = released.status.message.as_ref().unwrap().joined_text();
    assert_eq!(said, "no GPU free; handed back to the queue, the attempt not counted, to be taken again in 600ms");

    assert!(h.repository.claim_tasks(&request, 2).await.unwrap().is_empty(), "not handed straight back");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = one_claim(&h, &request, 2, "claimed once its time came").await;
    assert_eq!((second.task.id.as_str(), second.task.attempt), (task.id.as_str(), 1), "its first counted attempt");
}

/// A write about one task under the lease of another claimed with it is
/// refused, as one under another worker's lease is.
async fn each_task_of_a_claim_has_a_lease_of_its_own(h: Harness) {
    h.task("ns", "echo", "one").await;
    h.task("ns", "echo", "two").await;
    let request = claim_request("echo", "w1", 2, Duration::from_secs(30), 0);
    let claimed = h.repository.claim_tasks(&request, 2).await.unwrap();
    let [a, b] = claimed.as_slice() else { panic!("two claims: {claimed:?}") };
    assert_ne!(a.lease_id, b.lease_id);
    let crossed = h.store.complete_task("ns", &a.task.id, &b.lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(crossed, TaskStoreError::LeaseLost { .. }), "{crossed}");
    let kept = h.store.get_task("ns", &a.task.id, None).await.unwrap();
    assert_eq!(kept.status.state, TaskState::Working, "nothing changed");
    for claim in [a, b] {
        let done = h.store.complete_task("ns", &claim.task.id, &claim.lease_id, None, Vec::new()).await.unwrap();
        assert_eq!(done.status.state, TaskState::Completed);
    }
}

/// A worker that lost the answer to its completion and retries it learns it
/// landed; any other lease is still refused.
async fn a_completion_retried_under_its_lease_answers_the_task_it_completed(h: Harness) {
    let task = h.task("ns", "echo", "once").await;
    let request = claim_request("echo", "w1", 1, Duration::from_secs(30), 0);
    let claimed = one_claim(&h, &request, 1, "one claim").await;
    let first = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    let again = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    assert_eq!((again.status.state, again.status.timestamp), (TaskState::Completed, first.status.timestamp));
    let other = h.store.complete_task("ns", &task.id, "another-lease", None, Vec::new()).await.unwrap_err();
    assert!(matches!(other, TaskStoreError::TaskFinished { .. }), "{other}");
    assert_eq!(h.metrics.tasks_finished.with(["completed"]).get(), 1, "counted once");

    let canceled = h.task("ns", "echo", "canceled under its worker").await;
    let claimed = one_claim(&h, &request, 1, "one claim").await;
    h.store.cancel_task("ns", &canceled.id, None).await.unwrap();
    let late = h.store.complete_task("ns", &canceled.id, &claimed.lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::TaskFinished { state: TaskState::Canceled, .. }), "{late}");
}

/// A caller that hangs up once its completion has started (a worker killed,
/// a dropped connection) does not stop it halfway.
async fn a_completion_whose_caller_goes_away_still_lands(h: Harness) {
    let task = h.task("ns", "echo", "finish me").await;
    let request = claim_request("echo", "w1", 1, Duration::from_secs(30), 0);
    let claimed = one_claim(&h, &request, 1, "one claim").await;
    let completing = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new());
    // Polled once (or to its end, when it is that quick), then dropped.
    let _ = tokio::time::timeout(Duration::ZERO, completing).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.metrics.tasks_finished.with(["completed"]).get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the completion was stopped before it was counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = h.store.get_task("ns", &task.id, Some(0)).await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
}

/// "Not me, but someone else now": the worker that hands the task back waits
/// out the pause; another takes it at once.
async fn a_task_handed_back_for_others_goes_to_another_worker_at_once(h: Harness) {
    let task = h.task("ns", "echo", "needs a GPU").await;
    let busy = claim_request("echo", "w1", 2, Duration::from_secs(30), 0);
    let first = one_claim(&h, &busy, 2, "one claim").await;
    let back = HandBack { after: Duration::from_secs(60), others_first: true };
    let released = h.store.release_task("ns", &task.id, &first.lease_id, "GPU busy", back).await.unwrap();
    let said = released.status.message.as_ref().unwrap().joined_text();
    assert_eq!(
        said,
        "GPU busy; handed back to the queue, the attempt not counted, for another worker now or w1 again in 1m"
    );
    assert!(h.repository.claim_tasks(&busy, 2).await.unwrap().is_empty(), "not w1, before its time");
    let idle = claim_request("echo", "w2", 1, Duration::from_secs(30), 0);
    assert!(h.repository.worker_leases("ns", "w2", "echo").await.unwrap().ready, "w2 sees it waiting");
    let second = one_claim(&h, &idle, 1, "w2 takes it at once").await;
    assert_eq!((second.task.id.as_str(), second.task.attempt), (task.id.as_str(), 1));
}
