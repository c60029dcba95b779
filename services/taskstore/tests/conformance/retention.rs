//! Retention: finished task trees past their retention are deleted with
//! everything that belongs to them; live tasks, trees with a live task, and
//! trees whose events the outbox relay has not published stay.

use std::time::Duration;

use chorus_taskstore::{
    TaskStoreConfig,
    domain::{
        ArtifactChunk, Claimed, Cursor, InboxRead, NewSubtask, Owner, OwnerKind, PurgeCursor, PushConfig, StatusUpdate,
        Task, TaskState, now_micros,
    },
    error::TaskStoreError,
};

use chorus_runtime::{storage::Backend, testing::until_waiting_for_locks};

use crate::{
    harness::{Harness, agent_message, test_config, text_artifact},
    subtasks::{root_on, subtask},
    workers::{claim_request, next_claim},
};

crate::harness::conformance!(
    a_finished_tree_goes_with_all_that_belongs_to_it,
    a_live_task_and_a_tree_with_a_live_task_are_never_purged,
    a_tree_finished_after_the_cutoff_stays,
    unpublished_events_hold_their_tree_back,
    a_purge_goes_through_every_finished_tree_in_batches,
);

/// The reaper's purge, on a store that keeps finished tasks 300 ms.
mod reaper {
    use super::{a_purge_held_up_holds_up_no_lease_expiry, the_reaper_purges_tasks_past_a_short_retention};

    crate::harness::conformance!(
        start = crate::retention::start_short;
        the_reaper_purges_tasks_past_a_short_retention,
        a_purge_held_up_holds_up_no_lease_expiry,
    );
}

async fn start_short(database: chorus_runtime::testing::TestDatabase) -> Harness {
    Harness::start_with(database, TaskStoreConfig { retention_ms: 300, ..test_config() }).await
}

/// Deletes every tree finished at or before `finished_before`, batch after
/// batch; how many tasks went.
async fn purge(h: &Harness, finished_before: i64, limit: u32) -> u64 {
    let mut after: Option<PurgeCursor> = None;
    let mut purged = 0;
    loop {
        let batch = h.repository.purge_finished(finished_before, after.as_ref(), limit).await.unwrap();
        purged += batch.tasks;
        after = batch.next;
        if after.is_none() {
            return purged;
        }
    }
}

/// Far past every task of a test.
fn later() -> i64 {
    now_micros() + 3_600_000_000
}

/// Completes a task the test runs itself.
async fn finish(h: &Harness, task: &Task) -> Task {
    finish_under(h, &task.id, None).await
}

/// Completes a task a worker claimed.
async fn finish_claimed(h: &Harness, claimed: &Claimed) -> Task {
    finish_under(h, &claimed.task.id, Some(&claimed.lease_id)).await
}

async fn finish_under(h: &Harness, task_id: &str, lease_id: Option<&str>) -> Task {
    let lease_id = lease_id.map(str::to_owned);
    let update = StatusUpdate { state: TaskState::Completed, message: Some(agent_message("done")), lease_id };
    h.store.update_status("ns", task_id, update).await.unwrap()
}

/// The rows any table still holds about the task.
async fn rows_about(h: &Harness, task_id: &str) -> i64 {
    let mut rows = 0;
    for (table, column) in [
        ("taskstore_tasks", "id"),
        ("taskstore_history", "task_id"),
        ("taskstore_artifacts", "task_id"),
        ("taskstore_events", "task_id"),
        ("taskstore_inbox", "task_id"),
        ("taskstore_push_configs", "task_id"),
    ] {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE {column} = $1");
        let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(task_id)
            .fetch_one(&mut *h.db.acquire().await.unwrap())
            .await
            .unwrap();
        rows += count;
    }
    rows
}

/// A root the test runs with an owned child, claimed by a worker, that has
/// an artifact and a push config.
async fn tree(h: &Harness) -> (Task, Claimed) {
    let root = root_on(&h.store).await;
    let owner = Owner { kind: OwnerKind::Worker, id: root.id.clone() };
    let owned = NewSubtask { owner: Some(owner), ..subtask(&root.id, "coder", "build it") };
    let child = h.store.spawn_subtask(owned, false, None).await.unwrap().0;
    let claimed = h.claim("ns", "coder").await;
    assert_eq!(claimed.task.id, child.id);
    let lease_id = Some(claimed.lease_id.clone());
    let chunk = ArtifactChunk { artifact: text_artifact("a", "out"), append: false, last_chunk: true, lease_id };
    h.store.append_artifact("ns", &child.id, chunk).await.unwrap();
    let hook = PushConfig {
        id: "hook".into(),
        task_id: child.id.clone(),
        url: "https://a.example/hook".into(),
        token: Some("t0k3n".into()),
        auth_scheme: None,
        auth_credentials: None,
    };
    h.store.create_push_config("ns", hook, None, None).await.unwrap();
    (root, claimed)
}

async fn a_finished_tree_goes_with_all_that_belongs_to_it(h: Harness) {
    let (root, child) = tree(&h).await;
    finish_claimed(&h, &child).await;
    finish(&h, &root).await;
    let other = h.own_task("ns", "echo", "still here").await;
    assert!(rows_about(&h, &child.task.id).await >= 6, "the child has a row in every table");

    assert_eq!(purge(&h, later(), 100).await, 2);
    for id in [&root.id, &child.task.id] {
        assert!(matches!(h.store.get_task("ns", id, None).await, Err(TaskStoreError::TaskNotFound(_))));
        assert!(matches!(h.store.watch_task("ns", id, None).await, Err(TaskStoreError::TaskNotFound(_))));
        assert_eq!(rows_about(&h, id).await, 0, "nothing of task {id} is left");
    }
    assert_eq!(h.store.get_task("ns", &other.id, None).await.unwrap().id, other.id);
}

async fn a_live_task_and_a_tree_with_a_live_task_are_never_purged(h: Harness) {
    let live = h.own_task("ns", "echo", "working on it").await;
    let (root, child) = tree(&h).await;
    finish(&h, &root).await;
    let (other_root, other_child) = tree(&h).await;
    finish_claimed(&h, &other_child).await;

    assert_eq!(purge(&h, later(), 100).await, 0);
    for id in [&live.id, &root.id, &child.task.id, &other_root.id, &other_child.task.id] {
        h.store.get_task("ns", id, None).await.unwrap();
    }
    let owner = Owner { kind: OwnerKind::Worker, id: other_root.id.clone() };
    let inbox = h.store.read_inbox("ns", &owner, 10, Duration::ZERO, InboxRead::Peek);
    assert_eq!(inbox.await.unwrap().len(), 1, "a finished child's completion waits for its live parent");

    finish_claimed(&h, &child).await;
    assert_eq!(purge(&h, later(), 100).await, 2, "once its last task finished, the tree goes");
    assert!(matches!(h.store.get_task("ns", &root.id, None).await, Err(TaskStoreError::TaskNotFound(_))));
    h.store.get_task("ns", &live.id, None).await.unwrap();
}

async fn a_tree_finished_after_the_cutoff_stays(h: Harness) {
    let (root, child) = tree(&h).await;
    finish(&h, &root).await;
    let cutoff = now_micros();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let child = finish_claimed(&h, &child).await;
    assert!(child.status.timestamp > cutoff);

    assert_eq!(purge(&h, cutoff, 100).await, 0, "its child finished after the cutoff");
    h.store.get_task("ns", &root.id, None).await.unwrap();
    assert_eq!(purge(&h, child.status.timestamp, 100).await, 2);
}

async fn unpublished_events_hold_their_tree_back(h: Harness) {
    let task = h.own_task("ns", "echo", "publish me").await;
    let task = finish(&h, &task).await;
    let cursor = h.repository.acquire_outbox_lease("eventbus", "relay", now_micros(), Duration::from_secs(60));
    let cursor = cursor.await.unwrap().expect("the relay is free");

    assert_eq!(purge(&h, later(), 100).await, 0, "the relay has published none of its events");
    h.store.get_task("ns", &task.id, None).await.unwrap();
    // The task's last event as stored: on PostgreSQL, a reader sees it only
    // once no older transaction of the cluster (other tests') still runs.
    let (tx, id): (i64, i64) = sqlx::query_as(
        "SELECT tx_id, id FROM taskstore_events WHERE task_id = $1 ORDER BY tx_id DESC, id DESC LIMIT 1",
    )
    .bind(&task.id)
    .fetch_one(&mut *h.db.acquire().await.unwrap())
    .await
    .unwrap();
    let last = Cursor { tx, id };
    assert!(last > cursor);
    h.repository.save_outbox_cursor("eventbus", "relay", last, now_micros(), Duration::from_secs(60)).await.unwrap();
    assert_eq!(purge(&h, later(), 100).await, 1, "published, its events may go");
}

async fn a_purge_goes_through_every_finished_tree_in_batches(h: Harness) {
    let mut tasks = Vec::new();
    for n in 0..5 {
        let task = h.own_task("ns", "echo", &format!("task {n}")).await;
        tasks.push(finish(&h, &task).await);
    }
    let (held_back, _) = tree(&h).await;
    finish(&h, &held_back).await;
    let first = h.repository.purge_finished(later(), None, 2).await.unwrap();
    assert_eq!(first.tasks, 2);
    assert_eq!(first.next.as_ref().map(|next| next.id.as_str()), Some(tasks[1].id.as_str()));

    assert_eq!(purge(&h, later(), 2).await, 3, "a root held back by its live child does not stop the purge");
    for task in &tasks {
        assert!(matches!(h.store.get_task("ns", &task.id, None).await, Err(TaskStoreError::TaskNotFound(_))));
    }
    h.store.get_task("ns", &held_back.id, None).await.unwrap();
}

async fn the_reaper_purges_tasks_past_a_short_retention(h: Harness) {
    let live = h.own_task("ns", "echo", "still working").await;
    let done = h.own_task("ns", "echo", "done soon").await;
    finish(&h, &done).await;
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while h.store.get_task("ns", &done.id, None).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    gone.await.expect("the finished task is purged soon after its retention");
    h.store.get_task("ns", &live.id, None).await.unwrap();
}

/// A purge held up (here by a lock on rows only a purge writes) holds up
/// no lease expiry: purges run on rounds of their own. A backlog of tens of
/// thousands of tasks had left leases unexpired for minutes.
async fn a_purge_held_up_holds_up_no_lease_expiry(h: Harness) {
    if h.db.backend() == Backend::Sqlite {
        // One writer: rows cannot be locked apart from the others.
        return;
    }
    let done = h.own_task("ns", "echo", "done soon").await;
    finish(&h, &done).await;
    let mut holder = h.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM taskstore_history WHERE namespace = 'ns' AND task_id = $1 FOR UPDATE")
        .bind(&done.id)
        .execute(&mut *holder)
        .await
        .unwrap();
    until_waiting_for_locks(&h.db, 1, || false).await;
    h.task("ns", "echo", "hang").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_millis(300), 0));
    let claimed = next_claim(&mut claims).await;
    // Read, not watched: the held purge's open transaction holds back what
    // watches see of the event log until it ends.
    let expired = tokio::time::timeout(Duration::from_secs(10), async {
        while h.store.get_task("ns", &claimed.task.id, None).await.unwrap().status.state != TaskState::Failed {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    expired.await.expect("the lease expires while the purge is held up");
    holder.rollback().await.unwrap();
}
