//! Push-notification configs per task.

use chorus_taskstore::{domain::PushConfig, error::TaskStoreError};

use crate::harness::{Harness, conformance};

conformance!(push_configs_are_created_listed_replaced_and_deleted);

async fn push_configs_are_created_listed_replaced_and_deleted(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    let config = |id: &str, url: &str| PushConfig {
        id: id.into(),
        task_id: task.id.clone(),
        url: url.into(),
        token: Some("t0k3n".into()),
        auth_scheme: Some("Bearer".into()),
        auth_credentials: Some("secret".into()),
    };
    let first = h.store.create_push_config("ns", config("one", "https://a.example/hook")).await.unwrap();
    h.store.create_push_config("ns", config("two", "https://b.example/hook")).await.unwrap();
    assert_eq!(h.store.get_push_config("ns", &task.id, "one").await.unwrap(), first);
    let replaced = h.store.create_push_config("ns", config("one", "https://c.example/hook")).await.unwrap();
    let listed = h.store.list_push_configs("ns", &task.id).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], replaced, "a create with a known id replaces it in place");
    h.store.delete_push_config("ns", &task.id, "one").await.unwrap();
    let missing = h.store.get_push_config("ns", &task.id, "one").await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::PushConfigNotFound { .. }));
    let again = h.store.delete_push_config("ns", &task.id, "one").await.unwrap_err();
    assert!(matches!(again, TaskStoreError::PushConfigNotFound { .. }));
    let unknown_task = PushConfig { task_id: "no-such-task".into(), ..config("x", "https://x.example") };
    let error = h.store.create_push_config("ns", unknown_task).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::TaskNotFound(_)));
    assert!(matches!(h.store.list_push_configs("ns", "no-such-task").await, Err(TaskStoreError::TaskNotFound(_))));
}
