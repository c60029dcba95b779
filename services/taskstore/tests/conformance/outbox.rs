//! The outbox: every namespace's events in commit order, and the relay's
//! cursor under a lease that one owner holds at a time.

use std::time::Duration;

use chorus_runtime::storage::Backend;
use chorus_taskstore::{
    domain::{Cursor, EventKind, EventQuery, StatusUpdate, TaskEvent, TaskState, now_micros},
    error::TaskStoreError,
};

use crate::harness::{Harness, conformance};

conformance!(
    the_outbox_reads_every_namespace_in_commit_order,
    one_owner_at_a_time_holds_the_relay_lease,
    the_relay_cursor_outlives_its_owner,
    a_log_restored_on_a_server_whose_ids_are_behind_goes_on_after_its_cursor,
);

const SECOND: i64 = 1_000_000;
const LEASE: Duration = Duration::from_secs(10);

/// Reads until no committed event is held back behind another transaction.
async fn read_settled(h: &Harness, after: Cursor, limit: u32) -> Vec<TaskEvent> {
    for _ in 0..1_000 {
        let batch = h.repository.read_outbox(after, limit).await.unwrap();
        if !batch.held_back {
            return batch.events;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("events stayed held back for 5 s");
}

async fn the_outbox_reads_every_namespace_in_commit_order(h: Harness) {
    let first = h.own_task("a", "echo", "one").await;
    let second = h.own_task("b", "echo", "two").await;
    let working = StatusUpdate { state: TaskState::Working, message: None, lease_id: None };
    h.store.update_status("a", &first.id, working).await.unwrap();
    let third = h.own_task("c", "echo", "three").await;

    let all = read_settled(&h, Cursor::default(), 100).await;
    let seen: Vec<(&str, &str, EventKind)> =
        all.iter().map(|event| (event.namespace.as_str(), event.task_id.as_str(), event.kind)).collect();
    assert_eq!(
        seen,
        [
            ("a", first.id.as_str(), EventKind::Created),
            ("b", second.id.as_str(), EventKind::Created),
            ("a", first.id.as_str(), EventKind::StatusChanged),
            ("c", third.id.as_str(), EventKind::Created),
        ]
    );
    assert!(all.windows(2).all(|pair| pair[0].cursor < pair[1].cursor), "cursors increase");
    assert!(all.iter().all(|event| event.created_at >= first.created_at), "events carry when they were recorded");

    assert_eq!(read_settled(&h, Cursor::default(), 2).await, all[..2], "a page is the oldest events");
    assert_eq!(read_settled(&h, all[1].cursor, 100).await, all[2..], "a read resumes right after its cursor");
    assert!(read_settled(&h, all[3].cursor, 100).await.is_empty());
}

async fn one_owner_at_a_time_holds_the_relay_lease(h: Harness) {
    let r = &h.repository;
    let start = now_micros();
    let step = Cursor { tx: 0, id: 1 };
    assert_eq!(r.acquire_outbox_lease("bus", "a", start, LEASE).await.unwrap(), Some(Cursor::default()));
    assert_eq!(r.acquire_outbox_lease("bus", "b", start + SECOND, LEASE).await.unwrap(), None, "a holds it");
    assert_eq!(
        r.acquire_outbox_lease("bus", "a", start + 5 * SECOND, LEASE).await.unwrap(),
        Some(Cursor::default()),
        "the holder renews, until 15 s"
    );
    assert_eq!(r.acquire_outbox_lease("bus", "b", start + 12 * SECOND, LEASE).await.unwrap(), None, "renewed");
    let by_b = r.save_outbox_cursor("bus", "b", step, start + 12 * SECOND, LEASE).await;
    assert!(matches!(by_b, Err(TaskStoreError::OutboxLeaseLost { .. })), "{by_b:?}");
    r.save_outbox_cursor("bus", "a", step, start + 12 * SECOND, LEASE).await.unwrap();
    assert_eq!(
        r.acquire_outbox_lease("bus", "b", start + 16 * SECOND, LEASE).await.unwrap(),
        None,
        "a's save renewed its lease, until 22 s"
    );

    let late = r.save_outbox_cursor("bus", "a", Cursor { tx: 0, id: 2 }, start + 23 * SECOND, LEASE).await;
    assert!(matches!(late, Err(TaskStoreError::OutboxLeaseLost { .. })), "a's lease ran out: {late:?}");
    assert_eq!(
        r.acquire_outbox_lease("bus", "b", start + 23 * SECOND, LEASE).await.unwrap(),
        Some(step),
        "b takes over the expired lease where a left off"
    );
    assert_eq!(r.acquire_outbox_lease("bus", "a", start + 24 * SECOND, LEASE).await.unwrap(), None);
    let by_a = r.save_outbox_cursor("bus", "a", Cursor { tx: 0, id: 3 }, start + 24 * SECOND, LEASE).await;
    assert!(matches!(by_a, Err(TaskStoreError::OutboxLeaseLost { .. })), "{by_a:?}");

    assert_eq!(
        r.acquire_outbox_lease("other", "a", start + 24 * SECOND, LEASE).await.unwrap(),
        Some(Cursor::default()),
        "relays are leased apart"
    );
    let unknown = r.save_outbox_cursor("missing", "a", step, start, LEASE).await;
    assert!(matches!(unknown, Err(TaskStoreError::OutboxLeaseLost { .. })), "{unknown:?}");
}

async fn the_relay_cursor_outlives_its_owner(h: Harness) {
    for text in ["one", "two", "three"] {
        h.own_task("ns", "echo", text).await;
    }
    let events = read_settled(&h, Cursor::default(), 100).await;
    assert_eq!(events.len(), 3);
    let r = &h.repository;
    let start = now_micros();
    let cursor = r.acquire_outbox_lease("bus", "a", start, LEASE).await.unwrap().unwrap();
    let batch = read_settled(&h, cursor, 2).await;
    r.save_outbox_cursor("bus", "a", batch[1].cursor, start, LEASE).await.unwrap();
    assert_eq!(r.acquire_outbox_lease("bus", "a", start + SECOND, LEASE).await.unwrap(), Some(batch[1].cursor));

    let taken = r.acquire_outbox_lease("bus", "b", start + 20 * SECOND, LEASE).await.unwrap();
    let cursor = taken.expect("the lease ran out");
    assert_eq!(cursor, events[1].cursor, "the next owner starts where the last one saved");
    assert_eq!(read_settled(&h, cursor, 100).await, events[2..]);
}

/// Transaction ids belong to the PostgreSQL server: restored on another one,
/// a log's ids may be far ahead of the server's. Moving every stored id and
/// cursor ahead by a billion stands for that server here.
async fn a_log_restored_on_a_server_whose_ids_are_behind_goes_on_after_its_cursor(h: Harness) {
    if h.db.backend() != Backend::Postgres {
        assert_eq!(h.repository.align_log_clock().await.unwrap(), None, "SQLite's log is in rowid order");
        return;
    }
    let before = h.own_task("ns", "echo", "before").await;
    let r = &h.repository;
    let start = now_micros();
    r.acquire_outbox_lease("bus", "a", start, LEASE).await.unwrap();
    let published = read_settled(&h, Cursor::default(), 100).await;
    let last = published.last().expect("the first task's events").cursor;
    r.save_outbox_cursor("bus", "a", last, start, LEASE).await.unwrap();
    let ahead = "UPDATE taskstore_events SET tx_id = tx_id + 1000000000; \
                 UPDATE taskstore_outbox SET cursor_tx = cursor_tx + 1000000000";
    sqlx::raw_sql(ahead).execute(&mut *h.db.acquire().await.unwrap()).await.unwrap();
    let restored = Cursor { tx: last.tx + 1_000_000_000, id: last.id };

    h.store.align_log_clock().await.unwrap();
    assert_eq!(r.align_log_clock().await.unwrap(), None, "aligned once: the next start finds nothing to do");
    let after = h.own_task("ns", "echo", "after").await;
    let cursor = r.acquire_outbox_lease("bus", "a", start + SECOND, LEASE).await.unwrap();
    assert_eq!(cursor, Some(restored));
    let relayed = read_settled(&h, restored, 100).await;
    let tasks: Vec<&str> = relayed.iter().map(|event| event.task_id.as_str()).collect();
    assert_eq!(tasks, [after.id.as_str()], "the relay goes on with the new change");
    let query = EventQuery {
        namespace: "ns".into(),
        task_id: None,
        agent_id: None,
        context_id: None,
        after: Cursor::default(),
        limit: 100,
    };
    let read = h.repository.read_events(&query).await.unwrap();
    assert!(!read.held_back, "the new change is not held back behind a horizon of the old clock");
    let tasks: Vec<&str> = read.events.iter().map(|event| event.task_id.as_str()).collect();
    assert_eq!(tasks, [before.id.as_str(), after.id.as_str()], "old changes, then new ones");
}
