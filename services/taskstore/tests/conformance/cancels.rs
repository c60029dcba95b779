//! Cancels: a cancel reaches the whole unfinished tree below a task, and a
//! spawn racing it lands first and is canceled with the tree.

use chorus_runtime::{storage::Backend, testing::until_waiting_for_locks};
use chorus_taskstore::{
    domain::{NewSubtask, SpawnContext, StatusUpdate, TaskState},
    error::TaskStoreError,
};

use crate::{
    harness::{Harness, conformance, own_task},
    subtasks::{spawn, subtask},
};

conformance!(
    cancel_reaches_the_whole_unfinished_subtree,
    a_spawn_in_flight_below_a_cancel_lands_before_it_and_is_canceled,
);

async fn cancel_reaches_the_whole_unfinished_subtree(h: Harness) {
    let mut root = own_task("ns", "planner", "plan");
    root.spawn_context = SpawnContext::Orchestrator;
    let root = h.store.create_task(root).await.unwrap();
    let child = spawn(&h, &root.id, "coder", "code it").await;
    let coding = h.claim("ns", "coder").await;
    let below = NewSubtask { lease_id: Some(coding.lease_id), ..subtask(&child.id, "tester", "test it") };
    let (grandchild, _) = h.store.spawn_subtask(below, false, None).await.unwrap();
    let finished = spawn(&h, &root.id, "writer", "write docs").await;
    let done = StatusUpdate {
        lease_id: Some(h.claim("ns", "writer").await.lease_id),
        state: TaskState::Completed,
        message: None,
    };
    h.store.update_status("ns", &finished.id, done).await.unwrap();

    let (root_after, canceled) = h.store.cancel_task("ns", &root.id, Some("user gave up".into())).await.unwrap();
    assert_eq!(root_after.status.state, TaskState::Canceled);
    assert!(root_after.status.message.as_ref().unwrap().joined_text().contains("user gave up"));
    assert_eq!(canceled.len(), 3);
    for id in [&root.id, &child.id, &grandchild.id] {
        assert!(canceled.contains(id));
        assert_eq!(h.store.get_task("ns", id, Some(0)).await.unwrap().status.state, TaskState::Canceled);
    }
    let untouched = h.store.get_task("ns", &finished.id, Some(0)).await.unwrap();
    assert_eq!(untouched.status.state, TaskState::Completed, "finished tasks stay as they were");
    let again = h.store.cancel_task("ns", &root.id, None).await.unwrap_err();
    assert!(matches!(again, TaskStoreError::TaskFinished { state: TaskState::Canceled, .. }));
}

/// A spawn below the tree that has locked its parent but not committed as
/// the cancel starts lands first, and its child is canceled with the tree.
async fn a_spawn_in_flight_below_a_cancel_lands_before_it_and_is_canceled(h: Harness) {
    let mut root = own_task("ns", "planner", "plan");
    root.spawn_context = SpawnContext::Orchestrator;
    let root = h.store.create_task(root).await.unwrap();
    let child = spawn(&h, &root.id, "coder", "code it").await;
    if h.db.backend() == Backend::Sqlite {
        // One writer: no spawn is in flight while a cancel runs.
        return;
    }
    // An open transaction holds a row under the spawn's request key, so the
    // spawn, having locked its parent, waits at its insert.
    let lease_id = Some(h.claim("ns", "coder").await.lease_id);
    let in_flight = NewSubtask { lease_id, ..subtask(&child.id, "tester", "test it") };
    let mut holder = h.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO taskstore_tasks (namespace, id, context_id, agent_id, state, status_timestamp, depth, \
         spawn_context, prompt_fingerprint, request_message_id, trace_context, created_at) \
         VALUES ('ns', 'holder', '', '', 'submitted', 0, 0, 'agent', '', $1, '{}', 0)",
    )
    .bind(&in_flight.message.message_id)
    .execute(&mut *holder)
    .await
    .unwrap();
    let store = h.store.clone();
    let spawn = tokio::spawn(async move { store.spawn_subtask(in_flight, false, None).await });
    until_waiting_for_locks(&h.db, 1, || false).await;
    let store = h.store.clone();
    let root_id = root.id.clone();
    let cancel = tokio::spawn(async move { store.cancel_task("ns", &root_id, None).await });
    until_waiting_for_locks(&h.db, 2, || false).await;
    holder.rollback().await.unwrap();
    let (grandchild, _) = spawn.await.unwrap().expect("the spawn went first");
    let (_, canceled) = cancel.await.unwrap().unwrap();
    assert_eq!(canceled, [root.id, child.id, grandchild.id.clone()]);
    let grandchild = h.store.get_task("ns", &grandchild.id, Some(0)).await.unwrap();
    assert_eq!(grandchild.status.state, TaskState::Canceled, "nothing lives on under a canceled tree");
}
