//! Shared state: versions, compare-and-set, TTL, listing, watching.

use std::{sync::Arc, time::Duration};

use chorus_hub::{
    domain::{StateChangeKind, StateWrite},
    error::HubError,
};
use futures_util::StreamExt as _;

use crate::harness::{Harness, NS, conformance};

conformance!(
    versions_increase_and_never_restart,
    deleting_a_key_never_written_stores_nothing,
    a_stale_expected_version_fails_and_changes_nothing,
    ten_concurrent_cas_writers_count_exactly,
    keys_expire_with_their_ttl,
    keys_list_by_prefix,
    a_watch_sees_every_latest_change,
    state_stays_in_its_namespace,
);

fn set(key: &str, value: &str, expected: Option<i64>) -> StateWrite {
    StateWrite {
        namespace: NS.into(),
        key: key.into(),
        value: Some((value.as_bytes().to_vec(), "application/json".into())),
        expected_version: expected,
        ttl: None,
        updated_by: "tester".into(),
    }
}

fn delete(key: &str, expected: Option<i64>) -> StateWrite {
    StateWrite { value: None, ..set(key, "", expected) }
}

async fn versions_increase_and_never_restart(h: Harness) {
    assert_eq!(h.hub.write_state(set("k", "1", Some(0))).await.unwrap().version, 1);
    assert_eq!(h.hub.write_state(set("k", "2", None)).await.unwrap().version, 2);
    assert_eq!(h.hub.get_state(NS, "k").await.unwrap().value.as_deref(), Some(&b"2"[..]));
    assert_eq!(h.hub.write_state(delete("k", Some(2))).await.unwrap().version, 3);
    assert!(matches!(h.hub.get_state(NS, "k").await.unwrap_err(), HubError::KeyNotFound(_)));
    assert_eq!(h.hub.write_state(delete("k", None)).await.unwrap().version, 0, "already absent: nothing written");
    let again = h.hub.write_state(set("k", "3", Some(0))).await.unwrap();
    assert_eq!(again.version, 4, "a deleted key's version goes on");
}

/// A delete of a key never written stores nothing: a client deleting keys
/// by name cannot grow the table.
async fn deleting_a_key_never_written_stores_nothing(h: Harness) {
    for n in 0..3 {
        assert_eq!(h.hub.write_state(delete(&format!("never-{n}"), None)).await.unwrap().version, 0);
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM hub_state WHERE namespace = $1")
        .bind(NS)
        .fetch_one(&mut *h.db.acquire().await.unwrap())
        .await
        .unwrap();
    assert_eq!(rows, 0);
    assert_eq!(h.hub.write_state(set("never-0", "1", Some(0))).await.unwrap().version, 1);
}

async fn a_stale_expected_version_fails_and_changes_nothing(h: Harness) {
    h.hub.write_state(set("k", "\"one\"", Some(0))).await.unwrap();
    let error = h.hub.write_state(set("k", "\"two\"", Some(0))).await.unwrap_err();
    assert!(matches!(error, HubError::VersionConflict { expected: 0, actual: 1, .. }), "{error}");
    let error = h.hub.write_state(set("k", "\"two\"", Some(7))).await.unwrap_err();
    assert!(matches!(error, HubError::VersionConflict { expected: 7, actual: 1, .. }), "{error}");
    let error = h.hub.write_state(delete("k", Some(2))).await.unwrap_err();
    assert!(matches!(error, HubError::VersionConflict { .. }), "{error}");
    let entry = h.hub.get_state(NS, "k").await.unwrap();
    assert_eq!((entry.version, entry.value.as_deref()), (1, Some(&b"\"one\""[..])));
}

async fn ten_concurrent_cas_writers_count_exactly(h: Harness) {
    h.hub.write_state(set("counter", "0", Some(0))).await.unwrap();
    let hub = Arc::new(h.hub.clone());
    let writers = (0..10).map(|_| {
        let hub = Arc::clone(&hub);
        tokio::spawn(async move {
            let mut successes = 0u32;
            for _ in 0..10 {
                let current = hub.get_state(NS, "counter").await.unwrap();
                let value: i64 = serde_json::from_slice(current.value.as_deref().unwrap()).unwrap();
                match hub.write_state(set("counter", &(value + 1).to_string(), Some(current.version))).await {
                    Ok(_) => successes += 1,
                    Err(HubError::VersionConflict { .. }) => {}
                    Err(other) => panic!("unexpected error: {other}"),
                }
            }
            successes
        })
    });
    let mut successes = 0;
    for writer in writers {
        successes += writer.await.unwrap();
    }
    let entry = h.hub.get_state(NS, "counter").await.unwrap();
    let value: u32 = serde_json::from_slice(entry.value.as_deref().unwrap()).unwrap();
    assert!(successes > 0);
    assert_eq!(value, successes, "every successful CAS counted once, none lost");
    assert_eq!(entry.version, i64::from(successes) + 1);
}

async fn keys_expire_with_their_ttl(h: Harness) {
    let mut short = set("lease", "1", None);
    short.ttl = Some(Duration::from_millis(100));
    let written = h.hub.write_state(short).await.unwrap();
    assert!(written.expires_at.is_some());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(matches!(h.hub.get_state(NS, "lease").await.unwrap_err(), HubError::KeyNotFound(_)));
    // Absent once expired: create-only succeeds, with a later version.
    let again = h.hub.write_state(set("lease", "2", Some(0))).await.unwrap();
    assert!(again.version > written.version);
}

async fn keys_list_by_prefix(h: Harness) {
    for key in ["jobs/1", "jobs/2", "jobs/3", "other", "jobsx"] {
        h.hub.write_state(set(key, "1", None)).await.unwrap();
    }
    h.hub.write_state(delete("jobs/2", None)).await.unwrap();
    let keys = |entries: Vec<chorus_hub::domain::StateEntry>| entries.into_iter().map(|e| e.key).collect::<Vec<_>>();
    assert_eq!(keys(h.hub.list_state(NS, "jobs/", None, 10).await.unwrap()), ["jobs/1", "jobs/3"]);
    assert_eq!(keys(h.hub.list_state(NS, "jobs/", None, 1).await.unwrap()), ["jobs/1"]);
    assert_eq!(keys(h.hub.list_state(NS, "jobs/", Some("jobs/1"), 10).await.unwrap()), ["jobs/3"]);
    assert_eq!(h.hub.list_state(NS, "", None, 10).await.unwrap().len(), 4);
}

async fn a_watch_sees_every_latest_change(h: Harness) {
    h.hub.write_state(set("k", "1", None)).await.unwrap();
    let mut watch = h.hub.watch_state(NS, "k", 0);
    assert_eq!(next(&mut watch).await, (StateChangeKind::Set, 1));
    h.hub.write_state(set("k", "2", None)).await.unwrap();
    assert_eq!(next(&mut watch).await, (StateChangeKind::Set, 2));
    h.hub.write_state(delete("k", None)).await.unwrap();
    assert_eq!(next(&mut watch).await, (StateChangeKind::Deleted, 3));
    let mut short = set("k", "3", None);
    short.ttl = Some(Duration::from_millis(50));
    h.hub.write_state(short).await.unwrap();
    assert_eq!(next(&mut watch).await, (StateChangeKind::Set, 4));
    assert_eq!(next(&mut watch).await, (StateChangeKind::Expired, 5), "the reaper's expiry is a change too");
    // A watch from a version sees only what is newer.
    let mut late = h.hub.watch_state(NS, "k", 5);
    h.hub.write_state(set("k", "4", None)).await.unwrap();
    assert_eq!(next(&mut late).await, (StateChangeKind::Set, 6));
}

type Watch = tokio_stream::wrappers::ReceiverStream<chorus_hub::error::Result<chorus_hub::domain::StateEntry>>;

async fn next(watch: &mut Watch) -> (StateChangeKind, i64) {
    let entry = tokio::time::timeout(Duration::from_secs(5), watch.next()).await.unwrap().unwrap().unwrap();
    (entry.change, entry.version)
}

async fn state_stays_in_its_namespace(h: Harness) {
    h.hub.write_state(set("shared", "1", None)).await.unwrap();
    assert!(matches!(h.hub.get_state("other", "shared").await.unwrap_err(), HubError::KeyNotFound(_)));
    assert!(h.hub.list_state("other", "", None, 10).await.unwrap().is_empty());
    let mut theirs = set("shared", "2", Some(0));
    theirs.namespace = "other".into();
    assert_eq!(h.hub.write_state(theirs).await.unwrap().version, 1);
    assert_eq!(h.hub.get_state(NS, "shared").await.unwrap().version, 1);
}
