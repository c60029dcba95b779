//! A task's context never changes: a message written to a task that names
//! another context is refused, with nothing changed, not re-stamped.

use chorus_taskstore::{
    domain::{InboxKind, Message, NewTask, Notification, StatusUpdate, TaskState},
    error::TaskStoreError,
};

use crate::harness::{Harness, agent_message, conformance, new_task, user_message};

conformance!(
    a_message_naming_another_context_is_refused_and_changes_nothing,
    a_message_naming_its_task_context_is_taken,
    a_new_task_takes_its_first_message_context,
    a_worker_message_naming_another_context_is_refused,
);

fn in_context(message: Message, context_id: &str) -> Message {
    Message { context_id: Some(context_id.to_owned()), ..message }
}

fn assert_mismatch(error: TaskStoreError, task_id: &str, context_id: &str) {
    match error {
        TaskStoreError::ContextMismatch { task_id: refused, context_id: its, named } => {
            assert_eq!((refused.as_str(), its.as_str(), named.as_str()), (task_id, context_id, "ctx-other"));
        }
        other => panic!("expected ContextMismatch, got {other:?}"),
    }
}

async fn a_message_naming_another_context_is_refused_and_changes_nothing(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    let (id, context) = (task.id.as_str(), task.context_id.as_str());
    let added = h.store.add_message("ns", id, in_context(user_message("more"), "ctx-other"), None).await;
    assert_mismatch(added.unwrap_err(), id, context);
    let update = StatusUpdate {
        state: TaskState::InputRequired,
        message: Some(in_context(agent_message("which region?"), "ctx-other")),
        lease_id: None,
    };
    assert_mismatch(h.store.update_status("ns", id, update).await.unwrap_err(), id, context);

    let after = h.store.get_task("ns", id, None).await.unwrap();
    assert_eq!((&after.status, after.history.len()), (&task.status, 1));
}

async fn a_message_naming_its_task_context_is_taken(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    let message = in_context(user_message("more"), &task.context_id);
    let added = h.store.add_message("ns", &task.id, message, None).await.unwrap();
    let last = added.history.last().expect("the message");
    assert_eq!((last.context_id.as_deref(), last.task_id.as_deref()), (Some(&*task.context_id), Some(&*task.id)));
}

async fn a_new_task_takes_its_first_message_context(h: Harness) {
    let message = in_context(user_message("deploy"), "ctx-chosen");
    let task = h.store.create_task(NewTask { message, ..new_task("ns", "ops", "") }).await.unwrap();
    assert_eq!(task.context_id, "ctx-chosen");
    let unnamed = h.task("ns", "ops", "deploy").await;
    assert!(!unnamed.context_id.is_empty() && unnamed.context_id != "ctx-chosen", "a new context: {unnamed:?}");
}

async fn a_worker_message_naming_another_context_is_refused(h: Harness) {
    let parent = crate::subtasks::root_on(&h.store).await;
    let child = crate::subtasks::spawn(&h, &parent.id, "ops", "deploy").await;
    let claimed = h.claim("ns", "ops").await;
    let (id, context, lease) = (child.id.as_str(), child.context_id.as_str(), claimed.lease_id.as_str());
    let notification = Notification {
        namespace: "ns".into(),
        task_id: id.to_owned(),
        kind: InboxKind::Question,
        message: in_context(agent_message("which region?"), "ctx-other"),
        lease_id: Some(lease.to_owned()),
    };
    assert_mismatch(h.store.notify_owner(notification).await.unwrap_err(), id, context);
    let done = h.store.complete_task("ns", id, lease, Some(in_context(agent_message("done"), "ctx-other")), Vec::new());
    assert_mismatch(done.await.unwrap_err(), id, context);

    let after = h.store.get_task("ns", id, None).await.unwrap();
    assert_eq!((after.status.state, after.history.len()), (TaskState::Working, 1));
    let done = h.store.complete_task("ns", id, lease, Some(in_context(agent_message("done"), context)), Vec::new());
    assert_eq!(done.await.unwrap().status.state, TaskState::Completed);
}
