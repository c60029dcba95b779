//! The event log: watches resume from a cursor and lose nothing.

use std::{sync::Arc, time::Duration};

use chorus_runtime::{storage::Backend, wakeup::Wakeups};
use chorus_taskstore::{
    TaskStore,
    domain::{ArtifactChunk, EventKind, EventQuery, Part, StatusUpdate, TaskEvent, TaskState},
    error::TaskStoreError,
    repository::sql::SqlTaskRepository,
    service::{WatchFilter, WatchStart},
};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::{
    harness::{Harness, agent_message, conformance, own_task, test_config, text_artifact},
    workers::claim_request,
};

conformance!(
    a_task_watch_replays_from_a_cursor_and_ends_with_the_task,
    a_namespace_watch_follows_live_changes_and_resumes,
    every_change_is_recorded_in_commit_order,
    an_event_that_commits_late_is_held_back_not_skipped,
    streams_cut_short_by_shutdown_end_unavailable,
);

async fn collect(
    stream: impl tokio_stream::Stream<Item = Result<TaskEvent, chorus_taskstore::error::TaskStoreError>>,
) -> Vec<TaskEvent> {
    tokio::time::timeout(Duration::from_secs(10), stream.map(Result::unwrap).collect::<Vec<_>>())
        .await
        .expect("the watch ends with the task")
}

async fn take(
    stream: &mut (impl tokio_stream::Stream<Item = Result<TaskEvent, chorus_taskstore::error::TaskStoreError>> + Unpin),
    count: usize,
) -> Vec<TaskEvent> {
    let mut events = Vec::new();
    while events.len() < count {
        let next =
            tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("an event arrives in time");
        events.push(next.expect("the stream is open").unwrap());
    }
    events
}

/// Reads until no committed event is held back behind another transaction.
async fn read_settled(h: &Harness, query: &EventQuery) -> Vec<TaskEvent> {
    for _ in 0..1_000 {
        let batch = h.repository.read_events(query).await.unwrap();
        if !batch.held_back {
            return batch.events;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("events stayed held back for 5 s");
}

async fn drive_to_completion(store: &TaskStore, task_id: &str) {
    let working = StatusUpdate { state: TaskState::Working, message: None, lease_id: None };
    store.update_status("ns", task_id, working).await.unwrap();
    let artifact = text_artifact("a", "chunk");
    let chunk = ArtifactChunk { artifact, append: false, last_chunk: true, lease_id: None };
    store.append_artifact("ns", task_id, chunk).await.unwrap();
    let done = StatusUpdate { state: TaskState::Completed, message: Some(agent_message("ok")), lease_id: None };
    store.update_status("ns", task_id, done).await.unwrap();
}

async fn a_task_watch_replays_from_a_cursor_and_ends_with_the_task(h: Harness) {
    let task = h.own_task("ns", "echo", "watch me").await;
    let live = h.store.watch_task("ns", &task.id, None).await.unwrap();
    let driver = {
        let store = h.store.clone();
        let id = task.id.clone();
        tokio::spawn(async move { drive_to_completion(&store, &id).await })
    };
    let events = collect(live).await;
    driver.await.unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|event| event.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Created, EventKind::StatusChanged, EventKind::ArtifactUpdated, EventKind::StatusChanged]
    );
    assert_eq!(events[0].message.as_ref().unwrap().joined_text(), "watch me");
    assert_eq!(events[2].artifact.as_ref().unwrap().parts, vec![Part::text("chunk")]);
    assert_eq!(events[3].status.state, TaskState::Completed);
    assert!(events.windows(2).all(|pair| pair[0].cursor < pair[1].cursor), "cursors increase");

    let resumed = collect(h.store.watch_task("ns", &task.id, Some(events[1].cursor.into())).await.unwrap()).await;
    assert_eq!(resumed, events[2..], "a resumed watch starts right after its cursor");
    let after_end = collect(h.store.watch_task("ns", &task.id, Some(events[3].cursor.into())).await.unwrap()).await;
    assert!(after_end.is_empty(), "nothing follows the final event");
}

async fn a_namespace_watch_follows_live_changes_and_resumes(h: Harness) {
    let before = h.own_task("ns", "echo", "before the watch").await;
    let mut all = h.store.watch_tasks("ns", WatchFilter::default(), WatchStart::Now).await.unwrap();
    let only_b = WatchFilter { agent_id: Some("b".into()), context_id: None };
    let mut filtered = h.store.watch_tasks("ns", only_b, WatchStart::Now).await.unwrap();
    let first_a = h.own_task("ns", "a", "one").await;
    let first_b = h.own_task("ns", "b", "two").await;
    // "Now" may also replay the last events committed before the call.
    let mut seen = take(&mut all, 2).await;
    seen.retain(|event| event.task_id != before.id);
    if seen.len() < 2 {
        seen.extend(take(&mut all, 2 - seen.len()).await);
    }
    assert_eq!(seen.iter().map(|event| &event.task_id).collect::<Vec<_>>(), [&first_a.id, &first_b.id]);
    assert_eq!(take(&mut filtered, 1).await[0].task_id, first_b.id);
    drop(all);

    let resume_from = seen[1].cursor;
    let missed = h.own_task("ns", "a", "while disconnected").await;
    let mut resumed = h.store.watch_tasks("ns", WatchFilter::default(), WatchStart::After(resume_from)).await.unwrap();
    assert_eq!(take(&mut resumed, 1).await[0].task_id, missed.id, "a reconnect gets what it missed");
    let mut everything = h.store.watch_tasks("ns", WatchFilter::default(), WatchStart::Beginning).await.unwrap();
    assert_eq!(take(&mut everything, 4).await[3].task_id, missed.id);
}

async fn every_change_is_recorded_in_commit_order(h: Harness) {
    let task = h.store.create_task(own_task("ns", "echo", "log me")).await.unwrap();
    drive_to_completion(&h.store, &task.id).await;
    let query = EventQuery {
        namespace: "ns".into(),
        task_id: None,
        agent_id: None,
        context_id: Some(task.context_id.clone()),
        after: Default::default(),
        limit: 100,
    };
    let events = read_settled(&h, &query).await;
    let states: Vec<TaskState> = events.iter().map(|event| event.status.state).collect();
    assert_eq!(states, [TaskState::Submitted, TaskState::Working, TaskState::Working, TaskState::Completed]);
    let latest = h.repository.latest_event("ns", Some(&task.id)).await.unwrap().unwrap();
    assert_eq!(latest, events[3]);
    let later = EventQuery { after: events[1].cursor, ..query };
    assert_eq!(read_settled(&h, &later).await, events[2..]);
}

async fn an_event_that_commits_late_is_held_back_not_skipped(h: Harness) {
    let task = h.own_task("ns", "echo", "commit order").await;
    let query = EventQuery {
        namespace: "ns".into(),
        task_id: Some(task.id.clone()),
        agent_id: None,
        context_id: None,
        after: Default::default(),
        limit: 100,
    };
    let created = read_settled(&h, &query).await;
    assert_eq!(created.len(), 1);
    if h.db.backend() == Backend::Sqlite {
        // One writer: no transaction can commit after a later one.
        return;
    }
    // An older transaction records an event of the task and stays open
    // while a newer one commits another.
    let mut older = h.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
         SELECT namespace, task_id, context_id, agent_id, 'message_added', payload, created_at \
         FROM taskstore_events WHERE namespace = 'ns' AND task_id = $1",
    )
    .bind(&task.id)
    .execute(&mut *older)
    .await
    .unwrap();
    let working = StatusUpdate { state: TaskState::Working, message: None, lease_id: None };
    h.store.update_status("ns", &task.id, working).await.unwrap();
    let after = EventQuery { after: created[0].cursor, ..query };
    let waiting = h.repository.read_events(&after).await.unwrap();
    assert!(waiting.events.is_empty(), "nothing above the open transaction shows: {:?}", waiting.events);
    assert!(waiting.held_back, "the newer event waits behind the open transaction");
    older.commit().await.unwrap();
    let kinds: Vec<EventKind> = read_settled(&h, &after).await.iter().map(|event| event.kind).collect();
    assert_eq!(kinds, [EventKind::MessageAdded, EventKind::StatusChanged], "the late event is not skipped");
}

/// A stream that a shutdown ends before its task did ends with UNAVAILABLE,
/// so that its client opens it again (elsewhere, or here once restarted)
/// rather than take the end for the task's or the queue's.
async fn streams_cut_short_by_shutdown_end_unavailable(h: Harness) {
    let shutdown = CancellationToken::new();
    let replica =
        TaskStore::new(Arc::new(SqlTaskRepository::new(h.db.clone())), Wakeups::new(), test_config(), shutdown.clone());
    let task = h.own_task("ns", "echo", "nobody works on this").await;
    let task_watch = replica.watch_task("ns", &task.id, None).await.unwrap();
    let namespace_watch = replica.watch_tasks("ns", WatchFilter::default(), WatchStart::Now).await.unwrap();
    let claims = replica.claim_stream(claim_request("idle", "w1", 1, Duration::from_secs(30), 0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    shutdown.cancel();
    let mut task_events = collect_outcomes(task_watch).await;
    assert!(matches!(task_events.pop(), Some(Err(TaskStoreError::ShuttingDown))), "{task_events:?}");
    assert!(task_events.iter().all(Result::is_ok), "{task_events:?}");
    let namespace_events = collect_outcomes(namespace_watch).await;
    assert!(matches!(namespace_events.last(), Some(Err(TaskStoreError::ShuttingDown))), "{namespace_events:?}");
    let claimed = collect_outcomes(claims).await;
    assert!(matches!(claimed.as_slice(), [Err(TaskStoreError::ShuttingDown)]), "{claimed:?}");
}

/// Every item of a stream, until it ends.
async fn collect_outcomes<T>(
    stream: impl tokio_stream::Stream<Item = Result<T, TaskStoreError>>,
) -> Vec<Result<T, TaskStoreError>> {
    tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>()).await.expect("the stream ends")
}
