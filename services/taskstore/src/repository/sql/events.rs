//! The event log (outbox): reads in commit order, from a cursor.
//!
//! On PostgreSQL a reader only sees events of transactions older than the
//! oldest one still running (`pg_snapshot_xmin`), and orders by (tx_id, id):
//! an event whose transaction commits late still sorts after every cursor
//! handed out before it, so no reader skips it. SQLite has one writer, so its
//! ids already commit in order.
//!
//! Readers follow one task or one namespace; the outbox relay follows them all.

use chorus_runtime::storage::Backend;
use sqlx::Row as _;

use super::{
    SqlTaskRepository, rows,
    rows::{aggregated_parts, task_columns},
};
use crate::{
    domain::{Cursor, EventBatch, EventQuery, Task, TaskCursor, TaskEvent},
    error::{Result, TaskStoreError},
};

macro_rules! event_columns {
    () => {
        "id, tx_id, namespace, task_id, context_id, agent_id, kind, payload, created_at"
    };
}

/// The oldest transaction still running (PostgreSQL), on the log's clock
/// (see `clock.rs`): no event below it can still commit.
macro_rules! horizon {
    () => {
        "(pg_snapshot_xmin(pg_current_snapshot())::text::bigint + (SELECT xid_offset FROM taskstore_clock))"
    };
}

macro_rules! visible_to_postgres {
    () => {
        concat!(" AND tx_id < ", horizon!())
    };
}

/// After the cursor ($3, $4). PostgreSQL seeks the index with the row
/// comparison (after the namespace and task, or the namespace alone), so no
/// plan, not even one made while the log was empty, reads the events before
/// the cursor. SQLite's planner seeks a row comparison by its first column
/// only; there the two cases are spelt out.
macro_rules! after_postgres {
    () => {
        "(tx_id, id) > ($3, $4)"
    };
}
macro_rules! after_sqlite {
    () => {
        "(tx_id > $3 OR (tx_id = $3 AND id > $4))"
    };
}

/// A task's events ($2).
macro_rules! task_filter {
    () => {
        "namespace = $1 AND task_id = $2 AND "
    };
}

/// A namespace's events, of one agent ($2) and context ($6) when not empty.
macro_rules! namespace_filter {
    () => {
        "namespace = $1 AND ($2 = '' OR agent_id = $2) AND ($6 = '' OR context_id = $6) AND "
    };
}

/// Up to $5 events after the cursor, on SQLite.
macro_rules! read_sqlite {
    ($filter:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE ",
            $filter,
            after_sqlite!(),
            " ORDER BY tx_id, id LIMIT $5"
        )
    };
}

/// Up to `$limit` events after the cursor and below the horizon, on
/// PostgreSQL, each row with whether events of the same filter wait above the
/// horizon (`held_back`): one statement, so the read and the count share one
/// snapshot without a transaction around them. When no event is visible, the
/// one row carries only `held_back`. The look above the horizon is ordered
/// like the index it seeks, so the planner walks the index from the cursor
/// rather than scanning the table for a row that is usually not there.
macro_rules! read_postgres {
    ($filter:expr, $after:expr, $limit:expr) => {
        concat!(
            "WITH batch AS (SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE ",
            $filter,
            $after,
            visible_to_postgres!(),
            " ORDER BY tx_id, id LIMIT ",
            $limit,
            "), waiting AS (SELECT COUNT(*) AS held_back FROM (SELECT 1 FROM taskstore_events WHERE ",
            $filter,
            $after,
            " AND tx_id >= ",
            horizon!(),
            " ORDER BY tx_id, id LIMIT 1) above) SELECT batch.*, waiting.held_back FROM waiting LEFT JOIN batch ON true \
             ORDER BY batch.tx_id, batch.id"
        )
    };
}

/// Every namespace's events after the cursor ($1, $2), up to $3. PostgreSQL
/// seeks the (tx_id, id) index with the row comparison.
const OUTBOX_POSTGRES: &str = read_postgres!("", "(tx_id, id) > ($1, $2)", "$3");

/// Every event after the cursor's id ($1), up to $2, on SQLite: there every
/// tx_id is 0, so commit order is the table's rowid order, read as a range
/// of it.
const OUTBOX_SQLITE: &str =
    concat!("SELECT ", event_columns!(), " FROM taskstore_events WHERE id > $1 ORDER BY id LIMIT $2");

/// The newest event of a task ($2), or of a namespace: each has its own
/// statement, so each reads its own index backwards.
macro_rules! latest {
    ($task:expr, $horizon:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE namespace = $1",
            $task,
            $horizon,
            " ORDER BY tx_id DESC, id DESC LIMIT 1"
        )
    };
}

/// Task $2 whole, the cursor of its newest event below `$horizon`
/// (`latest`, as `tx.id`), and the columns `$seen` adds: one statement, so
/// one snapshot holds them all.
macro_rules! snapshot {
    ($horizon:expr, $seen:expr) => {
        concat!(
            "SELECT ",
            task_columns!(),
            ", ",
            aggregated_parts!("t", ""),
            ", (SELECT tx_id || '.' || id FROM taskstore_events e WHERE e.namespace = $1 AND e.task_id = $2",
            $horizon,
            " ORDER BY tx_id DESC, id DESC LIMIT 1) AS latest",
            $seen,
            " FROM taskstore_tasks t WHERE t.namespace = $1 AND t.id = $2"
        )
    };
}

/// On PostgreSQL, the snapshot also lists the task's events it sees above
/// the horizon (`seen`, as `tx.id+tx.id...`): they are in the task read,
/// yet an older transaction may still commit an event sorting before them.
const SNAPSHOT_POSTGRES: &str = snapshot!(
    visible_to_postgres!(),
    concat!(
        ", (SELECT string_agg(tx_id::text || '.' || id::text, '+' ORDER BY tx_id, id) FROM taskstore_events e \
         WHERE e.namespace = $1 AND e.task_id = $2 AND tx_id >= ",
        horizon!(),
        ") AS seen"
    )
);

/// SQLite commits its events in id order: the newest is always exact.
const SNAPSHOT_SQLITE: &str = snapshot!("", "");

impl SqlTaskRepository {
    /// The task whole and a cursor after exactly the events it includes,
    /// read in one snapshot; `None` while it includes too many events an
    /// older transaction may yet precede (PostgreSQL).
    pub(super) async fn snapshot(&self, namespace: &str, task_id: &str) -> Result<Option<(Task, Option<TaskCursor>)>> {
        let postgres = self.backend() == Backend::Postgres;
        let sql = if postgres { SNAPSHOT_POSTGRES } else { SNAPSHOT_SQLITE };
        let row = sqlx::query(sql).bind(namespace).bind(task_id).fetch_optional(&mut *self.db.read().await?).await?;
        let row = row.ok_or_else(|| TaskStoreError::TaskNotFound(task_id.to_owned()))?;
        let latest = row.try_get::<Option<String>, _>("latest")?;
        let seen = if postgres { row.try_get::<Option<String>, _>("seen")? } else { None };
        let written = match (latest, seen) {
            (latest, None) => latest,
            (latest, Some(seen)) => Some(format!("{}+{seen}", latest.unwrap_or_else(|| Cursor::default().to_string()))),
        };
        let cursor = match written.map(|written| written.parse::<TaskCursor>()) {
            None => None,
            Some(Ok(cursor)) => Some(cursor),
            Some(Err(())) => return Ok(None),
        };
        Ok(Some((rows::decode_whole(&row)?, cursor)))
    }

    pub(super) async fn events(&self, query: &EventQuery) -> Result<EventBatch> {
        let postgres = self.backend() == Backend::Postgres;
        let sql = match (&query.task_id, postgres) {
            (Some(_), true) => read_postgres!(task_filter!(), after_postgres!(), "$5"),
            (Some(_), false) => read_sqlite!(task_filter!()),
            (None, true) => read_postgres!(namespace_filter!(), after_postgres!(), "$5"),
            (None, false) => read_sqlite!(namespace_filter!()),
        };
        let filter = match &query.task_id {
            Some(task_id) => task_id.as_str(),
            None => query.agent_id.as_deref().unwrap_or_default(),
        };
        let statement = sqlx::query(sql)
            .bind(&query.namespace)
            .bind(filter)
            .bind(query.after.tx)
            .bind(query.after.id)
            .bind(i64::from(query.limit));
        let statement = match query.task_id {
            Some(_) => statement,
            None => statement.bind(query.context_id.as_deref().unwrap_or_default()),
        };
        let rows = statement.fetch_all(&mut *self.db.read().await?).await?;
        batch(&rows, postgres, query.limit)
    }

    /// Every namespace's events after `after`, in commit order.
    pub(super) async fn outbox(&self, after: Cursor, limit: u32) -> Result<EventBatch> {
        let postgres = self.backend() == Backend::Postgres;
        let statement = if postgres { sqlx::query(OUTBOX_POSTGRES).bind(after.tx) } else { sqlx::query(OUTBOX_SQLITE) };
        let rows = statement.bind(after.id).bind(i64::from(limit)).fetch_all(&mut *self.db.read().await?).await?;
        batch(&rows, postgres, limit)
    }

    pub(super) async fn latest(&self, namespace: &str, task_id: Option<&str>) -> Result<Option<TaskEvent>> {
        let sql = match (self.backend(), task_id.is_some()) {
            (Backend::Postgres, true) => latest!(" AND task_id = $2", visible_to_postgres!()),
            (Backend::Postgres, false) => latest!("", visible_to_postgres!()),
            (Backend::Sqlite, true) => latest!(" AND task_id = $2", ""),
            (Backend::Sqlite, false) => latest!("", ""),
        };
        let mut statement = sqlx::query(sql).bind(namespace);
        if let Some(task_id) = task_id {
            statement = statement.bind(task_id);
        }
        let row = statement.fetch_optional(&mut *self.db.read().await?).await?;
        row.as_ref().map(rows::decode_event).transpose()
    }
}

/// The events of a read; on PostgreSQL each row also says whether events
/// wait above the horizon, and a row without an event says only that. What
/// waits counts only when the batch is not full: a full batch is read on at
/// once anyway.
fn batch(rows: &[sqlx::any::AnyRow], postgres: bool, limit: u32) -> Result<EventBatch> {
    let mut events = Vec::with_capacity(rows.len());
    let mut waiting = false;
    for row in rows {
        if postgres {
            waiting = row.try_get::<i64, _>("held_back")? > 0;
            if row.try_get::<Option<i64>, _>("id")?.is_none() {
                continue;
            }
        }
        events.push(rows::decode_event(row)?);
    }
    let full = events.len() >= limit as usize;
    Ok(EventBatch { events, held_back: waiting && !full })
}
