//! Namespaces: nothing crosses them, for every operation.

use std::time::Duration;

use chorus_taskstore::{
    domain::{
        ArtifactChunk, EventQuery, InboxKind, InboxRead, Notification, Owner, OwnerKind, PushConfig, StatusUpdate,
        TaskQuery, TaskState,
    },
    error::TaskStoreError,
    service::{WatchFilter, WatchStart},
};
use tokio_stream::StreamExt as _;

use crate::{
    harness::{Harness, agent_message, conformance, new_task, text_artifact, user_message},
    workers::claim_request,
};

conformance!(nothing_crosses_namespaces);

fn not_found<T: std::fmt::Debug>(result: Result<T, TaskStoreError>) {
    assert!(matches!(result, Err(TaskStoreError::TaskNotFound(_))), "expected not found, got {result:?}");
}

async fn nothing_crosses_namespaces(h: Harness) {
    let mut watch_b = h.store.watch_tasks("b", WatchFilter::default(), WatchStart::Beginning).await.unwrap();
    let mut root = new_task("a", "echo", "secret");
    root.spawn_context = chorus_taskstore::domain::SpawnContext::Orchestrator;
    let task = h.store.create_task(root).await.unwrap();
    let id = task.id.as_str();
    let push = PushConfig {
        id: "p".into(),
        task_id: id.into(),
        url: "https://x.example".into(),
        token: None,
        auth_scheme: None,
        auth_credentials: None,
    };
    h.store.create_push_config("a", push.clone(), None, None).await.unwrap();

    not_found(h.store.get_task("b", id, None).await);
    let list = TaskQuery {
        namespace: "b".into(),
        context_id: None,
        state: None,
        agent_id: None,
        parent_id: None,
        updated_after: None,
        page_size: 50,
        page_token: None,
        history_length: None,
        include_artifacts: true,
    };
    assert_eq!(h.store.list_tasks(list).await.unwrap().total_size, 0);
    not_found(h.store.add_message("b", id, user_message("x"), None).await);
    let working = StatusUpdate { state: TaskState::Working, message: None, lease_id: None };
    not_found(h.store.update_status("b", id, working).await);
    let artifact = text_artifact("a", "x");
    let chunk = ArtifactChunk { artifact, append: false, last_chunk: false, lease_id: None };
    not_found(h.store.append_artifact("b", id, chunk).await);
    not_found(h.store.cancel_task("b", id, None).await);
    not_found(h.store.watch_task("b", id, None).await.map(drop));
    not_found(h.store.get_push_config("b", id, "p").await);
    not_found(h.store.list_push_configs("b", id).await);
    not_found(h.store.create_push_config("b", push, None, None).await);
    not_found(h.store.delete_push_config("b", id, "p").await);
    not_found(h.store.renew_lease("b", id, "lease", None).await);
    not_found(h.store.complete_task("b", id, "lease", None, Vec::new()).await);
    not_found(h.store.fail_task("b", id, "lease", "x", None).await);
    let spawn = chorus_taskstore::domain::NewSubtask {
        namespace: "b".into(),
        parent_id: id.into(),
        agent_id: "echo".into(),
        message: user_message("child"),
        owner: None,
        metadata: None,
        trace_context: Default::default(),
        lease_id: None,
    };
    not_found(h.store.spawn_subtask(spawn.clone(), false, None).await);
    not_found(h.store.await_subtasks("b", id, &[], false, Duration::ZERO).await);
    not_found(h.store.answer_question("b", id, user_message("x"), None).await);
    let notification = Notification {
        namespace: "b".into(),
        task_id: id.into(),
        kind: InboxKind::Status,
        message: agent_message("x"),
        lease_id: None,
    };
    not_found(h.store.notify_owner(notification).await);

    let mut claims = h.store.claim_stream(claim_request_in("b"));
    let claimed = tokio::time::timeout(Duration::from_millis(400), claims.next()).await;
    assert!(claimed.is_err(), "a worker in b never sees a's tasks");

    let lease_id = Some(h.claim("a", "echo").await.lease_id);
    let in_a = chorus_taskstore::domain::NewSubtask { namespace: "a".into(), lease_id, ..spawn };
    let (child, _) = h.store.spawn_subtask(in_a, false, None).await.unwrap();
    let lease_id = Some(h.claim("a", "echo").await.lease_id);
    h.store
        .update_status("a", &child.id, StatusUpdate { state: TaskState::Completed, message: None, lease_id })
        .await
        .unwrap();
    let owner = Owner { kind: OwnerKind::Worker, id: id.into() };
    assert!(h.store.read_inbox("b", &owner, 10, Duration::ZERO, InboxRead::Peek).await.unwrap().is_empty());
    assert_eq!(h.store.read_inbox("a", &owner, 10, Duration::ZERO, InboxRead::Peek).await.unwrap().len(), 1);

    let events = EventQuery {
        namespace: "b".into(),
        task_id: None,
        agent_id: None,
        context_id: None,
        after: Default::default(),
        limit: 100,
    };
    assert!(h.repository.read_events(&events).await.unwrap().events.is_empty());
    assert!(h.repository.latest_event("b", None).await.unwrap().is_none());
    let leaked = tokio::time::timeout(Duration::from_millis(300), watch_b.next()).await;
    assert!(leaked.is_err(), "a watch of b sees nothing of a");
}

fn claim_request_in(namespace: &str) -> chorus_taskstore::domain::ClaimRequest {
    chorus_taskstore::domain::ClaimRequest {
        namespace: namespace.into(),
        ..claim_request("echo", "w-b", 1, Duration::from_secs(5), 0)
    }
}
