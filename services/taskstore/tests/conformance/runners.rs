//! Who runs a task: a worker, which claims it and writes under its lease, or
//! its creator (a gateway's own agents), which writes without one and whose
//! tasks no worker is offered.

use std::time::Duration;

use chorus_taskstore::{
    domain::{
        ArtifactChunk, InboxKind, NewSubtask, NewTask, Notification, StatusUpdate, TaskQuery, TaskState, TurnFollower,
    },
    error::TaskStoreError,
};

use crate::{
    harness::{Harness, agent_message, conformance, new_task, text_artifact, user_message},
    workers::{claim_request, next_claim},
};

conformance!(
    an_agents_write_to_a_queued_task_a_worker_runs_needs_a_lease,
    a_task_its_creator_runs_takes_writes_without_a_lease,
    no_worker_is_offered_a_task_its_creator_runs,
);

fn lease_required<T: std::fmt::Debug>(result: Result<T, TaskStoreError>, what: &str) {
    let error = result.expect_err(what);
    assert!(matches!(error, TaskStoreError::LeaseRequired { .. }), "{what}: {error}");
}

/// A caller without a lease could move a queued task out of `submitted`,
/// and no worker would ever claim it: each of the agent's writes is refused,
/// changes nothing, and the task stays in the queue for a worker.
async fn an_agents_write_to_a_queued_task_a_worker_runs_needs_a_lease(h: Harness) {
    let task = h.task("ns", "echo", "queued").await;
    let working = StatusUpdate { state: TaskState::Working, message: Some(agent_message("on it")), lease_id: None };
    lease_required(h.store.update_status("ns", &task.id, working).await, "a status");
    let chunk = ArtifactChunk { artifact: text_artifact("out", "x"), append: false, last_chunk: true, lease_id: None };
    lease_required(h.store.append_artifact("ns", &task.id, chunk).await, "an artifact");
    lease_required(h.store.add_message("ns", &task.id, agent_message("hi"), None).await, "an agent's message");
    let spawn = NewSubtask { lease_id: None, ..crate::subtasks::subtask(&task.id, "helper", "help") };
    lease_required(h.store.spawn_subtask(spawn, false, None).await, "a spawn");

    let unchanged = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!(unchanged.status.state, TaskState::Submitted);
    assert!(unchanged.artifacts.is_empty());
    assert_eq!(unchanged.history.len(), 1, "only the first message");
    let helpers = TaskQuery {
        namespace: "ns".into(),
        context_id: None,
        state: None,
        agent_id: Some("helper".into()),
        parent_id: None,
        updated_after: None,
        page_size: 10,
        page_token: None,
        history_length: None,
        include_artifacts: false,
    };
    assert!(h.store.list_tasks(helpers).await.unwrap().tasks.is_empty(), "no child");

    let followed_up = h.store.add_message("ns", &task.id, user_message("and also"), None).await.unwrap();
    assert_eq!(followed_up.history.len(), 2, "a client's message needs no lease");
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    assert_eq!(claimed.task.id, task.id, "the task is still a worker's to take");
    let working = StatusUpdate {
        state: TaskState::Working,
        message: Some(agent_message("on it")),
        lease_id: Some(claimed.lease_id.clone()),
    };
    h.store.update_status("ns", &task.id, working).await.unwrap();

    // A subtask is a worker's too: its question to its owner needs its lease.
    let spawn = NewSubtask { lease_id: Some(claimed.lease_id), ..crate::subtasks::subtask(&task.id, "helper", "help") };
    let (child, _) = h.store.spawn_subtask(spawn, false, None).await.unwrap();
    let question = Notification {
        namespace: "ns".into(),
        task_id: child.id.clone(),
        kind: InboxKind::Question,
        message: agent_message("which one?"),
        lease_id: None,
    };
    lease_required(h.store.notify_owner(question).await, "a question to the owner");
}

async fn a_task_its_creator_runs_takes_writes_without_a_lease(h: Harness) {
    let task = h.own_task("ns", "tck", "run it yourself").await;
    let working = StatusUpdate { state: TaskState::Working, message: None, lease_id: None };
    h.store.update_status("ns", &task.id, working).await.unwrap();
    let chunk = ArtifactChunk { artifact: text_artifact("out", "x"), append: false, last_chunk: true, lease_id: None };
    h.store.append_artifact("ns", &task.id, chunk).await.unwrap();
    h.store.add_message("ns", &task.id, agent_message("nearly"), None).await.unwrap();
    let done = StatusUpdate { state: TaskState::Completed, message: Some(agent_message("done")), lease_id: None };
    let done = h.store.update_status("ns", &task.id, done).await.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    assert_eq!(done.artifacts.len(), 1);

    let other = h.own_task("ns", "tck", "another").await;
    let named = StatusUpdate { state: TaskState::Working, message: None, lease_id: Some("made-up".into()) };
    let error = h.store.update_status("ns", &other.id, named).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::LeaseLost { .. }), "a lease it never had: {error}");
}

/// Neither a claim nor a worker waiting with room takes a task its creator
/// runs, whether the creator said so or followed the task from its start.
async fn no_worker_is_offered_a_task_its_creator_runs(h: Harness) {
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let own = h.own_task("ns", "echo", "mine").await;
    let follower = TurnFollower { name: "gw-1".into(), lease: Duration::from_secs(30) };
    let followed = NewTask { follower: Some(follower), ..new_task("ns", "echo", "followed") };
    let followed = h.store.create_task(followed).await.unwrap();
    assert_eq!(h.repository.queue_depth().await.unwrap().0, 0, "neither waits for a worker");
    let queued = h.task("ns", "echo", "a worker's").await;
    assert_eq!(next_claim(&mut claims).await.task.id, queued.id, "the waiting worker gets only the worker's task");
    let mut later = h.store.claim_stream(claim_request("echo", "w2", 5, Duration::from_secs(30), 0));
    let next = h.task("ns", "echo", "another worker's").await;
    assert_eq!(next_claim(&mut later).await.task.id, next.id, "a claim passes over the older ones");
    for id in [&own.id, &followed.id] {
        assert_eq!(h.store.get_task("ns", id, None).await.unwrap().status.state, TaskState::Submitted);
    }
}
