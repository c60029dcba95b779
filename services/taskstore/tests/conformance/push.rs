//! Push-notification configs per task, and the leases of their followers.

use std::time::Duration;

use chorus_taskstore::{
    domain::{Cursor, PendingPush, PushConfig, PushConfigKey, PushLease, now_micros},
    error::TaskStoreError,
};

use crate::harness::{Harness, conformance};

conformance!(
    push_configs_are_created_listed_replaced_and_deleted,
    a_push_configs_delivered_cursor_only_moves_forward_until_it_finishes,
    claims_take_every_namespaces_unowned_configs_each_once,
    a_created_config_is_held_by_its_follower_until_its_lease_ends,
    only_the_holder_advances_a_config,
    renewing_extends_the_leases_followed_and_names_the_configs_lost,
    released_leases_are_claimed_at_once,
    a_finished_config_keeps_no_token_or_credentials,
    a_task_holds_at_most_its_limit_of_configs
);

const MINUTE: Duration = Duration::from_secs(60);
/// The configs a task may have, for the repository's creates.
const LIMIT: u32 = 10;

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

fn lease(follower: &str, until: i64) -> PushLease {
    PushLease { follower: follower.into(), until }
}

/// Every unfinished config with its cursor, in key order, as a claim long
/// after every lease ended sees them (the claim holds none: its own lease
/// ended before it began).
async fn unfinished(h: &Harness) -> Vec<PendingPush> {
    let mut configs = h.repository.claim_push_configs(&lease("reader", 0), i64::MAX, 100).await.unwrap();
    configs.sort_by(|a, b| a.key.cmp(&b.key));
    configs
}

/// The keys a claim by `follower` at `now` takes, sorted.
async fn claimed(h: &Harness, follower: &str, now: i64) -> Vec<PushConfigKey> {
    let lease = lease(follower, now + 60_000_000);
    let taken = h.repository.claim_push_configs(&lease, now, 100).await.unwrap();
    let mut keys: Vec<_> = taken.into_iter().map(|pending| pending.key).collect();
    keys.sort();
    keys
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
    let first = h.store.create_push_config("ns", config("one", "https://a.example/hook"), None, None).await.unwrap();
    h.store.create_push_config("ns", config("two", "https://b.example/hook"), None, None).await.unwrap();
    assert_eq!(h.store.get_push_config("ns", &task.id, "one").await.unwrap(), first);
    let replaced = h.store.create_push_config("ns", config("one", "https://c.example/hook"), None, None).await.unwrap();
    let listed = h.store.list_push_configs("ns", &task.id).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0], replaced, "a create with a known id replaces it in place");
    h.store.delete_push_config("ns", &task.id, "one").await.unwrap();
    let missing = h.store.get_push_config("ns", &task.id, "one").await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::PushConfigNotFound { .. }));
    let again = h.store.delete_push_config("ns", &task.id, "one").await.unwrap_err();
    assert!(matches!(again, TaskStoreError::PushConfigNotFound { .. }));
    let unknown_task = PushConfig { task_id: "no-such-task".into(), ..config("x", "https://x.example") };
    let error = h.store.create_push_config("ns", unknown_task, None, None).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::TaskNotFound(_)));
    assert!(matches!(h.store.list_push_configs("ns", "no-such-task").await, Err(TaskStoreError::TaskNotFound(_))));
}

async fn a_push_configs_delivered_cursor_only_moves_forward_until_it_finishes(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    let start = Cursor { tx: 7, id: 40 };
    h.store.create_push_config("ns", hook(&task.id, "later"), Some(start), None).await.unwrap();
    h.store.create_push_config("ns", hook(&task.id, "sent"), None, None).await.unwrap();
    let one = key("ns", &task.id, "later");
    let pending = |delivered| PendingPush { key: one.clone(), delivered };
    let listed = unfinished(&h).await;
    assert_eq!(listed, [pending(Some(start)), PendingPush { key: key("ns", &task.id, "sent"), delivered: None }]);

    let later = Cursor { tx: 7, id: 41 };
    h.store.advance_push_config(&one, Some(later), false, None).await.unwrap();
    for behind in [Some(start), Some(Cursor { tx: 3, id: 90 }), None] {
        h.store.advance_push_config(&one, behind, false, None).await.unwrap();
    }
    let replaced = h.store.create_push_config("ns", hook(&task.id, "later"), Some(start), None).await.unwrap();
    assert_eq!(replaced.id, "later");
    let newer_tx = Cursor { tx: 8, id: 2 };
    h.store.advance_push_config(&one, Some(newer_tx), false, None).await.unwrap();
    let listed = unfinished(&h).await;
    assert_eq!(listed[0], pending(Some(newer_tx)), "only a later cursor moves it, and a replacement keeps it");

    h.store.advance_push_config(&one, None, true, None).await.unwrap();
    let listed = unfinished(&h).await;
    assert_eq!(listed, [PendingPush { key: key("ns", &task.id, "sent"), delivered: None }], "a finished config is not");
    h.store.advance_push_config(&one, Some(Cursor { tx: 9, id: 1 }), false, None).await.unwrap();
    assert_eq!(unfinished(&h).await.len(), 1, "finished stays finished");

    let missing = h.store.advance_push_config(&key("ns", &task.id, "nope"), None, true, None).await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::PushConfigNotFound { .. }));
    let elsewhere = h.store.advance_push_config(&key("other", &task.id, "sent"), None, true, None).await.unwrap_err();
    assert!(matches!(elsewhere, TaskStoreError::PushConfigNotFound { .. }));
}

async fn claims_take_every_namespaces_unowned_configs_each_once(h: Harness) {
    let mut expected = Vec::new();
    for namespace in ["b", "a", "c"] {
        let task = h.task(namespace, "echo", "notify me").await;
        for id in ["two", "one"] {
            h.store.create_push_config(namespace, hook(&task.id, id), None, None).await.unwrap();
            expected.push(key(namespace, &task.id, id));
        }
    }
    let done = expected.iter().find(|key| key.namespace == "c" && key.id == "one").unwrap().clone();
    h.store.advance_push_config(&done, Some(Cursor { tx: 1, id: 1 }), true, None).await.unwrap();
    expected.retain(|key| *key != done);
    expected.sort();

    let mut seen = Vec::new();
    loop {
        let page = h.store.claim_push_configs("gateway-a".into(), MINUTE, 2).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(page.iter().map(|pending| pending.key.clone()));
        if page.len() < 2 {
            break;
        }
    }
    seen.sort();
    assert_eq!(seen, expected, "every namespace's unfinished configs, each once");
    let other = h.store.claim_push_configs("gateway-b".into(), MINUTE, 100).await.unwrap();
    assert_eq!(other, [], "configs another follower holds are not claimed");
}

async fn a_created_config_is_held_by_its_follower_until_its_lease_ends(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    let now = now_micros();
    let start = Cursor { tx: 3, id: 9 };
    h.repository
        .create_push_config("ns", hook(&task.id, "held"), Some(start), Some(&lease("a", now + 1_000)), LIMIT)
        .await
        .unwrap();
    h.repository.create_push_config("ns", hook(&task.id, "free"), None, None, LIMIT).await.unwrap();
    let (held, free) = (key("ns", &task.id, "held"), key("ns", &task.id, "free"));

    assert_eq!(claimed(&h, "b", now).await, [free], "an unowned config is claimed at once, a held one not");
    assert_eq!(claimed(&h, "c", now + 999).await, [], "neither lease has ended");
    let taken = h.repository.claim_push_configs(&lease("c", now + 60_000_000), now + 1_000, 100).await.unwrap();
    assert_eq!(taken, [PendingPush { key: held.clone(), delivered: Some(start) }], "with its cursor");
    assert_eq!(claimed(&h, "a", now + 1_000).await, [], "its creator holds it no more");

    h.repository
        .create_push_config("ns", hook(&task.id, "held"), None, Some(&lease("a", now + 2_000)), LIMIT)
        .await
        .unwrap();
    assert_eq!(claimed(&h, "c", now + 1_999).await, [], "a replacement takes the lease of its creator");
}

async fn only_the_holder_advances_a_config(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    h.store.create_push_config("ns", hook(&task.id, "p"), None, Some(("a".into(), MINUTE))).await.unwrap();
    let p = key("ns", &task.id, "p");
    let first = Cursor { tx: 5, id: 1 };
    h.store.advance_push_config(&p, Some(first), false, Some("a")).await.unwrap();
    let refused = h.store.advance_push_config(&p, Some(Cursor { tx: 6, id: 1 }), true, Some("b")).await.unwrap_err();
    assert!(matches!(refused, TaskStoreError::PushConfigNotHeld { ref follower, .. } if follower == "b"), "{refused}");

    // The lease ran out and b took the config, as a left it: a is refused
    // from then on.
    let taken = h.repository.claim_push_configs(&lease("b", i64::MAX), i64::MAX - 1, 100).await.unwrap();
    assert_eq!(taken, [PendingPush { key: p.clone(), delivered: Some(first) }], "the refused call changed nothing");
    let refused = h.store.advance_push_config(&p, Some(Cursor { tx: 7, id: 1 }), false, Some("a")).await.unwrap_err();
    assert!(matches!(refused, TaskStoreError::PushConfigNotHeld { .. }), "{refused}");
    h.store.advance_push_config(&p, Some(Cursor { tx: 7, id: 1 }), true, Some("b")).await.unwrap();
    assert_eq!(unfinished(&h).await, [], "the holder finished it");

    let missing = h.store.advance_push_config(&key("ns", &task.id, "nope"), None, true, Some("b")).await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::PushConfigNotFound { .. }), "{missing}");
}

async fn renewing_extends_the_leases_followed_and_names_the_configs_lost(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    let now = now_micros();
    for (id, follower, until) in [("x", "a", 1_000), ("y", "a", 1_000), ("z", "b", 10_000)] {
        let lease = lease(follower, now + until);
        h.repository.create_push_config("ns", hook(&task.id, id), None, Some(&lease), LIMIT).await.unwrap();
    }
    let [x, y, z, gone] = ["x", "y", "z", "gone"].map(|id| key("ns", &task.id, id));

    let followed = [x.clone(), z.clone(), gone.clone()];
    let held = h.repository.renew_push_configs(&lease("a", now + 5_000), &followed).await.unwrap();
    assert_eq!(held, std::slice::from_ref(&x), "what a holds of what it follows");
    assert_eq!(claimed(&h, "c", now + 999).await, [], "no lease has ended");
    assert_eq!(
        claimed(&h, "c", now + 1_000).await,
        std::slice::from_ref(&y),
        "a holds y but follows it no more (its previous run did): y's lease was left to run out"
    );
    assert_eq!(claimed(&h, "c", now + 4_999).await, [], "x renewed, z still held");
    assert_eq!(claimed(&h, "c", now + 5_000).await, std::slice::from_ref(&x));
    assert_eq!(
        claimed(&h, "c", now + 10_000).await,
        std::slice::from_ref(&z),
        "renewing does not touch another's lease"
    );
    assert_eq!(h.repository.renew_push_configs(&lease("c", now), &[]).await.unwrap(), [], "following nothing");

    let following = vec![x.clone(), y.clone(), z.clone(), gone.clone()];
    let lost = h.store.renew_push_configs("a".into(), MINUTE, following.clone()).await.unwrap();
    assert_eq!(lost, following, "c holds every config now; gone is no config");
    for id in [&x, &y] {
        h.repository
            .create_push_config("ns", hook(&task.id, &id.id), None, Some(&lease("a", now)), LIMIT)
            .await
            .unwrap();
    }
    h.store.advance_push_config(&y, None, true, Some("a")).await.unwrap();
    let lost = h.store.renew_push_configs("a".into(), MINUTE, vec![x.clone(), y.clone()]).await.unwrap();
    assert_eq!(lost, [y], "a finished config is held no more");
    assert_eq!(claimed(&h, "c", now_micros()).await, [], "x was renewed");
}

async fn released_leases_are_claimed_at_once(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    for id in ["p", "q"] {
        h.store.create_push_config("ns", hook(&task.id, id), None, Some(("a".into(), MINUTE))).await.unwrap();
    }
    let p = key("ns", &task.id, "p");
    h.store.advance_push_config(&p, Some(Cursor { tx: 1, id: 1 }), true, Some("a")).await.unwrap();
    assert_eq!(h.store.claim_push_configs("b".into(), MINUTE, 100).await.unwrap(), []);
    assert_eq!(h.store.release_push_configs("a").await.unwrap(), 1, "the unfinished one");
    let q = key("ns", &task.id, "q");
    h.store.advance_push_config(&q, Some(Cursor { tx: 2, id: 1 }), false, Some("a")).await.unwrap();
    let taken = h.store.claim_push_configs("b".into(), MINUTE, 100).await.unwrap();
    assert_eq!(taken, [PendingPush { key: q.clone(), delivered: Some(Cursor { tx: 2, id: 1 }) }]);
    assert_eq!(h.store.release_push_configs("a").await.unwrap(), 0, "a holds nothing now");
    let refused = h.store.advance_push_config(&q, None, false, Some("a")).await.unwrap_err();
    assert!(matches!(refused, TaskStoreError::PushConfigNotHeld { .. }), "{refused}");
}

async fn a_finished_config_keeps_no_token_or_credentials(h: Harness) {
    let task = h.task("ns", "echo", "notify me").await;
    let secret = |id: &str| PushConfig {
        token: Some("t0k3n".into()),
        auth_scheme: Some("Bearer".into()),
        auth_credentials: Some("secret".into()),
        ..hook(&task.id, id)
    };
    h.store.create_push_config("ns", secret("done"), None, None).await.unwrap();
    h.store.create_push_config("ns", secret("open"), None, None).await.unwrap();
    h.store
        .advance_push_config(&key("ns", &task.id, "open"), Some(Cursor { tx: 1, id: 1 }), false, None)
        .await
        .unwrap();
    h.store.advance_push_config(&key("ns", &task.id, "done"), None, true, None).await.unwrap();

    let cleared = PushConfig { token: None, auth_credentials: None, ..secret("done") };
    assert_eq!(h.store.get_push_config("ns", &task.id, "done").await.unwrap(), cleared);
    assert_eq!(
        h.store.get_push_config("ns", &task.id, "open").await.unwrap(),
        secret("open"),
        "an unfinished one keeps them"
    );
    let replaced = h.store.create_push_config("ns", secret("done"), None, None).await.unwrap();
    assert_eq!(replaced, cleared, "a finished config replaced stays finished, without secrets");
    assert_eq!(h.store.get_push_config("ns", &task.id, "done").await.unwrap(), cleared);
}

async fn a_task_holds_at_most_its_limit_of_configs(h: Harness) {
    let task = h.task("ns", "echo", "notify me often").await;
    let limit = crate::harness::test_config().max_push_configs_per_task;
    for n in 0..limit {
        h.store.create_push_config("ns", hook(&task.id, &format!("c{n}")), None, None).await.unwrap();
    }
    let refused = h.store.create_push_config("ns", hook(&task.id, "one-more"), None, None).await.unwrap_err();
    assert!(matches!(refused, TaskStoreError::TooManyPushConfigs { limit: l, .. } if l == limit), "{refused}");
    assert!(h.store.get_push_config("ns", &task.id, "one-more").await.is_err(), "nothing stored");
    h.store.create_push_config("ns", hook(&task.id, "c0"), None, None).await.expect("a config replaced by its id");
    h.store.delete_push_config("ns", &task.id, "c1").await.unwrap();
    h.store.create_push_config("ns", hook(&task.id, "one-more"), None, None).await.expect("room again");
    let other = h.task("ns", "echo", "another task").await;
    h.store.create_push_config("ns", hook(&other.id, "c0"), None, None).await.expect("the limit is per task");
}
