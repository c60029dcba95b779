//! Push-notification configs per task.

use chorus_taskstore::{
    domain::{Cursor, PendingPush, PushConfig, PushConfigKey},
    error::TaskStoreError,
};

use crate::harness::{Harness, conformance};

conformance!(
    push_configs_are_created_listed_replaced_and_deleted,
    a_push_configs_delivered_cursor_only_moves_forward_until_it_finishes,
    pending_push_configs_page_across_namespaces_in_key_order
);

fn hook(task_id: &str, id: &str) -> PushConfig {
    PushConfig {
        id: id.into(),
        task_id: task_id.into(),
        url: "https://a.example/hook".into(),
        token: None,
        auth_scheme: None,
        auth_credentials: None,
    }
}

fn key(namespace: &str, task_id: &str, id: &str) -> PushConfigKey {
    PushConfigKey { namespace: namespace.into(), task_id: task_id.into(), id: id.into() }
}

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
    let first = h.store.create_push_config("ns", config("one", "https://a.example/hook"), None).await.unwrap();
    h.store.create_push_config("ns", config("two", "https://b.example/hook"), None).await.unwrap();
    assert_eq!(h.store.get_push_config("ns", &task.id, "one").await.unwrap(), first);
    let replaced = h.store.create_push_config("ns", config("one", "https://c.example/hook"), None).await.unwrap();
    let listed = h.store.list_push_configs("ns", &task.id).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], replaced, "a create with a known id replaces it in place");
    h.store.delete_push_config("ns", &task.id, "one").await.unwrap();
    let missing = h.store.get_push_config("ns", &task.id, "one").await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::PushConfigNotFound { .. }));
    let again = h.store.delete_push_config("ns", &task.id, "one").await.unwrap_err();
    assert!(matches!(again, TaskStoreError::PushConfigNotFound { .. }));
    let unknown_task = PushConfig { task_id: "no-such-task".into(), ..config("x", "https://x.example") };
    let error = h.store.create_push_config("ns", unknown_task, None).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::TaskNotFound(_)));
    assert!(matches!(h.store.list_push_configs("ns", "no-such-task").await, Err(TaskStoreError::TaskNotFound(_))));
}

async fn a_push_configs_delivered_cursor_only_moves_forward_until_it_finishes(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    let start = Cursor { tx: 7, id: 40 };
    h.store.create_push_config("ns", hook(&task.id, "later"), Some(start)).await.unwrap();
    h.store.create_push_config("ns", hook(&task.id, "sent"), None).await.unwrap();
    let one = key("ns", &task.id, "later");
    let pending = |delivered| PendingPush { key: one.clone(), delivered };
    let listed = h.store.pending_push_configs(None, 10).await.unwrap();
    assert_eq!(listed, [pending(Some(start)), PendingPush { key: key("ns", &task.id, "sent"), delivered: None }]);

    let later = Cursor { tx: 7, id: 41 };
    h.store.advance_push_config(&one, Some(later), false).await.unwrap();
    for behind in [Some(start), Some(Cursor { tx: 3, id: 90 }), None] {
        h.store.advance_push_config(&one, behind, false).await.unwrap();
    }
    let replaced = h.store.create_push_config("ns", hook(&task.id, "later"), Some(start)).await.unwrap();
    assert_eq!(replaced.id, "later");
    let newer_tx = Cursor { tx: 8, id: 2 };
    h.store.advance_push_config(&one, Some(newer_tx), false).await.unwrap();
    let listed = h.store.pending_push_configs(None, 10).await.unwrap();
    assert_eq!(listed[0], pending(Some(newer_tx)), "only a later cursor moves it, and a replacement keeps it");

    h.store.advance_push_config(&one, None, true).await.unwrap();
    let listed = h.store.pending_push_configs(None, 10).await.unwrap();
    assert_eq!(listed, [PendingPush { key: key("ns", &task.id, "sent"), delivered: None }], "a finished config is not");
    h.store.advance_push_config(&one, Some(Cursor { tx: 9, id: 1 }), false).await.unwrap();
    assert_eq!(h.store.pending_push_configs(None, 10).await.unwrap().len(), 1, "finished stays finished");

    let missing = h.store.advance_push_config(&key("ns", &task.id, "nope"), None, true).await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::PushConfigNotFound { .. }));
    let elsewhere = h.store.advance_push_config(&key("other", &task.id, "sent"), None, true).await.unwrap_err();
    assert!(matches!(elsewhere, TaskStoreError::PushConfigNotFound { .. }));
}

async fn pending_push_configs_page_across_namespaces_in_key_order(h: Harness) {
    let mut expected = Vec::new();
    for namespace in ["b", "a", "c"] {
        let task = h.task(namespace, "echo", "notify me").await;
        for id in ["two", "one"] {
            h.store.create_push_config(namespace, hook(&task.id, id), None).await.unwrap();
            expected.push(key(namespace, &task.id, id));
        }
    }
    let done = expected.iter().find(|key| key.namespace == "c" && key.id == "one").unwrap().clone();
    h.store.advance_push_config(&done, Some(Cursor { tx: 1, id: 1 }), true).await.unwrap();
    expected.retain(|key| *key != done);
    expected.sort();

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = h.store.pending_push_configs(after.as_ref(), 2).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(|pending| pending.key.clone()));
        match page.last() {
            Some(last) if page.len() == 2 => after = Some(last.key.clone()),
            _ => break,
        }
    }
    assert_eq!(seen, expected, "every namespace's unfinished configs, each once, in key order");
}
