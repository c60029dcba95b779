//! The SQL task repository: one implementation for PostgreSQL and SQLite.
//!
//! Each operation locks the rows it changes (`FOR UPDATE` on PostgreSQL;
//! SQLite has a single writer), changes them in memory through the domain
//! rules, writes them back, and records an event in the same transaction.

mod clock;
mod completion;
mod create;
mod endings;
mod events;
mod held;
mod inbox;
mod outbox;
mod push;
mod repository;
mod retention;
mod rows;
mod subtasks;
mod tasks;
mod turns;
mod workers;

use std::sync::Arc;

use chorus_runtime::storage::{Backend, Db, ServiceMigrations, Tx};
use sqlx::{AnyConnection, Row as _};

use self::rows::{EventPayload, TaskRecord, task_columns, to_json, to_json_opt};
use crate::{
    domain::{Artifact, EventKind, InboxKind, Message, Task, TaskState, TaskStatus, now_micros},
    error::{Result, TaskStoreError},
};

/// The task store's embedded migrations.
pub const MIGRATIONS: ServiceMigrations = chorus_runtime::service_migrations!(
    "taskstore",
    [
        (1, "taskstore", "0001_taskstore.sql"),
        (2, "outbox", "0002_outbox.sql"),
        (3, "leaner indexes", "0003_leaner_indexes.sql"),
        (4, "log by rowid", "0004_log_by_rowid.sql"),
        (5, "push delivery", "0005_push_delivery.sql"),
        (6, "push follower", "0006_push_follower.sql"),
        (7, "lease length", "0007_lease_length.sql"),
        (8, "artifact last chunk", "0008_artifact_last_chunk.sql"),
        (9, "retention", "0009_retention.sql"),
        (10, "context listing", "0010_context_listing.sql"),
        (11, "turn follower", "0011_turn_follower.sql"),
        (12, "retry after", "0012_retry_after.sql"),
        (13, "run by creator", "0013_run_by_creator.sql"),
        (14, "log clock", "0014_log_clock.sql"),
        (15, "inbox holds", "0015_inbox_holds.sql"),
        (16, "held from", "0016_held_from.sql"),
    ]
);

const SELECT_TASK: &str = concat!("SELECT ", task_columns!(), " FROM taskstore_tasks WHERE namespace = $1 AND id = $2");
const SELECT_TASK_FOR_UPDATE: &str =
    concat!("SELECT ", task_columns!(), " FROM taskstore_tasks WHERE namespace = $1 AND id = $2 FOR UPDATE");

const SAVE_TASK: &str = "UPDATE taskstore_tasks SET state = $3, status_message = $4, status_timestamp = $5, \
     lease_id = $6, worker_id = $7, lease_expires_at = $8, attempt = $9, max_retries = $10, history_count = $11 \
     WHERE namespace = $1 AND id = $2";

/// Task storage on a [`Db`].
#[derive(Debug, Clone)]
pub struct SqlTaskRepository {
    db: Db,
    /// The claims handed out here, for their completions.
    held: Arc<held::HeldClaims>,
}

impl SqlTaskRepository {
    pub fn new(db: Db) -> Self {
        Self { db, held: Arc::default() }
    }

    fn backend(&self) -> Backend {
        self.db.backend()
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(self.db.begin().await?)
    }

    /// Reads a task row, locking it for the rest of the transaction.
    async fn lock_record(&self, tx: &mut AnyConnection, namespace: &str, id: &str) -> Result<TaskRecord> {
        let sql = match self.backend() {
            Backend::Postgres => SELECT_TASK_FOR_UPDATE,
            Backend::Sqlite => SELECT_TASK,
        };
        let row = sqlx::query(sql).bind(namespace).bind(id).fetch_optional(&mut *tx).await?;
        let row = row.ok_or_else(|| TaskStoreError::TaskNotFound(id.to_owned()))?;
        TaskRecord::decode(&row)
    }
}

/// Reads a task row without locking it.
async fn read_record(conn: &mut AnyConnection, namespace: &str, id: &str) -> Result<TaskRecord> {
    let row = sqlx::query(SELECT_TASK).bind(namespace).bind(id).fetch_optional(&mut *conn).await?;
    let row = row.ok_or_else(|| TaskStoreError::TaskNotFound(id.to_owned()))?;
    TaskRecord::decode(&row)
}

/// Fills in the history (the last `history_length` messages, or all) and,
/// when asked, the artifacts of a task row.
async fn complete_task_view(
    conn: &mut AnyConnection,
    record: TaskRecord,
    history_length: Option<u32>,
    with_artifacts: bool,
) -> Result<Task> {
    let mut task = record.task;
    let first_position = match history_length {
        None => 0,
        Some(length) => record.history_count - i64::from(length),
    };
    if first_position >= record.history_count && !with_artifacts {
        return Ok(task);
    }
    // One round trip for both: the history window, then (when asked) the artifacts.
    let rows = sqlx::query(
        "SELECT 0 AS part, position, message AS body FROM taskstore_history \
         WHERE namespace = $1 AND task_id = $2 AND position >= $3 \
         UNION ALL SELECT 1 AS part, position, artifact AS body FROM taskstore_artifacts \
         WHERE namespace = $1 AND task_id = $2 AND $4 = 1 \
         ORDER BY part, position",
    )
    .bind(&task.namespace)
    .bind(&task.id)
    .bind(first_position)
    .bind(i64::from(with_artifacts))
    .fetch_all(&mut *conn)
    .await?;
    for row in &rows {
        let body: String = row.try_get("body")?;
        match row.try_get::<i64, _>("part")? {
            0 => task.history.push(rows::from_json(&body)?),
            _ => task.artifacts.push(rows::from_json(&body)?),
        }
    }
    Ok(task)
}

/// Writes back the mutable columns of a task row.
async fn save(conn: &mut AnyConnection, record: &TaskRecord) -> Result<()> {
    let task = &record.task;
    sqlx::query(SAVE_TASK)
        .bind(&task.namespace)
        .bind(&task.id)
        .bind(task.status.state.as_str())
        .bind(to_json_opt(task.status.message.as_ref())?)
        .bind(task.status.timestamp)
        .bind(record.lease_id.as_deref())
        .bind(record.worker_id.as_deref())
        .bind(record.lease_expires_at)
        .bind(i64::from(task.attempt))
        .bind(i64::from(record.max_retries))
        .bind(record.history_count)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Appends a message to a task's history (the row's count is saved by [`save`]).
async fn append_history(conn: &mut AnyConnection, record: &mut TaskRecord, message: &Message) -> Result<()> {
    let message = message.clone().bound_to(&record.task.id, &record.task.context_id)?;
    sqlx::query("INSERT INTO taskstore_history (namespace, task_id, position, message) VALUES ($1, $2, $3, $4)")
        .bind(&record.task.namespace)
        .bind(&record.task.id)
        .bind(record.history_count)
        .bind(to_json(&message)?)
        .execute(&mut *conn)
        .await?;
    record.history_count += 1;
    Ok(())
}

/// What an event carries beyond the task's status.
#[derive(Debug, Default, Clone, Copy)]
struct EventDetail<'a> {
    artifact: Option<&'a Artifact>,
    append: bool,
    last_chunk: bool,
    message: Option<&'a Message>,
}

async fn record_event(conn: &mut AnyConnection, task: &Task, kind: EventKind, detail: EventDetail<'_>) -> Result<()> {
    sqlx::query(
        "INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&task.namespace)
    .bind(&task.id)
    .bind(&task.context_id)
    .bind(&task.agent_id)
    .bind(kind.as_str())
    .bind(event_payload(&task.status, detail)?)
    .bind(now_micros())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The JSON an event row carries besides its columns.
fn event_payload(status: &TaskStatus, detail: EventDetail<'_>) -> Result<String> {
    to_json(&EventPayload {
        status: status.clone(),
        artifact: detail.artifact.cloned(),
        append: detail.append,
        last_chunk: detail.last_chunk,
        message: detail.message.cloned(),
    })
}

/// Checks that the caller may write to a task: not finished, and holding its
/// lease (see [`check_lease`]).
fn check_writable(record: &TaskRecord, lease_id: Option<&str>) -> Result<()> {
    let task = &record.task;
    if task.status.state.is_terminal() {
        return Err(TaskStoreError::TaskFinished { task_id: task.id.clone(), state: task.status.state });
    }
    check_lease(record, lease_id)
}

/// Checks that an agent's write comes with the task's lease: the current
/// one, named. Only a task its creator runs, and that no worker holds, takes
/// writes without one.
fn check_lease(record: &TaskRecord, lease_id: Option<&str>) -> Result<()> {
    check_fence(record, lease_id)?;
    if lease_id.is_none() && (record.lease_id.is_some() || !record.run_by_creator) {
        return Err(TaskStoreError::LeaseRequired { task_id: record.task.id.clone() });
    }
    Ok(())
}

/// Checks that a lease the caller names, if any, is the task's current one:
/// a worker whose lease ran out writes nothing.
fn check_fence(record: &TaskRecord, lease_id: Option<&str>) -> Result<()> {
    match lease_id {
        Some(given) if record.lease_id.as_deref() != Some(given) => {
            Err(TaskStoreError::LeaseLost { task_id: record.task.id.clone(), lease_id: given.to_owned() })
        }
        _ => Ok(()),
    }
}

/// Moves a task to `state` by the state machine, then records it all: the
/// message in the history, the row, the event, and, when the task finished,
/// its completion in its owner's inbox.
async fn apply_status(
    conn: &mut AnyConnection,
    record: &mut TaskRecord,
    state: TaskState,
    message: Option<Message>,
) -> Result<()> {
    let from = record.task.status.state;
    if from.is_terminal() {
        return Err(TaskStoreError::TaskFinished { task_id: record.task.id.clone(), state: from });
    }
    if !from.can_become(state) {
        return Err(TaskStoreError::IllegalTransition { task_id: record.task.id.clone(), from, to: state });
    }
    set_status(conn, record, state, message).await
}

/// Records a status change that the caller has already checked.
async fn set_status(
    conn: &mut AnyConnection,
    record: &mut TaskRecord,
    state: TaskState,
    message: Option<Message>,
) -> Result<()> {
    let message = message.map(|message| message.bound_to(&record.task.id, &record.task.context_id)).transpose()?;
    if let Some(message) = &message {
        append_history(conn, record, message).await?;
    }
    record.task.status = TaskStatus { state, message, timestamp: now_micros() };
    if state.is_terminal() || state == TaskState::Submitted {
        // The worker lets go. A finished task remembers its last lease, so
        // that worker (and only it) can learn it was canceled; a requeued
        // task forgets it, so the old worker cannot write any more.
        record.worker_id = None;
        record.lease_expires_at = None;
        if state == TaskState::Submitted {
            record.lease_id = None;
        }
    }
    save(conn, record).await?;
    record_event(conn, &record.task, EventKind::StatusChanged, EventDetail::default()).await?;
    if state.is_terminal() {
        deliver_completion(conn, &record.task).await?;
    }
    Ok(())
}

/// Puts a finished subtask's completion in its owner's inbox, once: a unique
/// index makes a second report a no-op.
async fn deliver_completion(conn: &mut AnyConnection, task: &Task) -> Result<()> {
    let Some(owner) = &task.owner else {
        return Ok(());
    };
    sqlx::query(
        "INSERT INTO taskstore_inbox (namespace, owner_kind, owner_id, task_id, parent_task_id, kind, message, \
         task_state, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (namespace, task_id) WHERE kind = 'completion' DO NOTHING",
    )
    .bind(&task.namespace)
    .bind(owner.kind.as_str())
    .bind(&owner.id)
    .bind(&task.id)
    .bind(task.parent_id.as_deref())
    .bind(InboxKind::Completion.as_str())
    .bind(to_json_opt(task.status.message.as_ref())?)
    .bind(task.status.state.as_str())
    .bind(now_micros())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
chorus_runtime::every_migration_is_registered!(MIGRATIONS);
