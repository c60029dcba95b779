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

use super::{SqlTaskRepository, rows};
use crate::{
    domain::{Cursor, EventBatch, EventQuery, TaskEvent},
    error::Result,
};

macro_rules! event_columns {
    () => {
        "id, tx_id, namespace, task_id, context_id, agent_id, kind, payload, created_at"
    };
}

/// The oldest transaction still running (PostgreSQL): no event below it can
/// still commit.
macro_rules! horizon {
    () => {
        "(pg_snapshot_xmin(pg_current_snapshot())::text::bigint)"
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
/// the cursor; SQLite's planner seeks a row comparison by its first column
/// only, and takes the two ranges.
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

macro_rules! by_task {
    ($after:expr, $horizon:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE namespace = $1 AND task_id = $2 AND ",
            $after,
            $horizon,
            " ORDER BY tx_id, id LIMIT $5"
        )
    };
}

macro_rules! by_namespace {
    ($after:expr, $horizon:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE namespace = $1 AND ($2 = '' OR agent_id = $2) \
             AND ($6 = '' OR context_id = $6) AND ",
            $after,
            $horizon,
            " ORDER BY tx_id, id LIMIT $5"
        )
    };
}

/// Whether committed events of the task ($2) after the cursor ($3, $4) wait
/// above the horizon (PostgreSQL only).
const TASK_HELD_BACK: &str = concat!(
    "SELECT COUNT(*) FROM (SELECT 1 FROM taskstore_events WHERE namespace = $1 AND task_id = $2 AND ",
    after_postgres!(),
    " AND tx_id >= ",
    horizon!(),
    " LIMIT 1) waiting"
);
/// The same for the namespace, after the cursor ($2, $3).
const NAMESPACE_HELD_BACK: &str = concat!(
    "SELECT COUNT(*) FROM (SELECT 1 FROM taskstore_events WHERE namespace = $1 AND (tx_id, id) > ($2, $3) \
     AND tx_id >= ",
    horizon!(),
    " LIMIT 1) waiting"
);

/// Every namespace's events after the cursor ($1, $2), up to $3. PostgreSQL
/// seeks the (tx_id, id) index with the row comparison.
const OUTBOX_POSTGRES: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM taskstore_events WHERE (tx_id, id) > ($1, $2)",
    visible_to_postgres!(),
    " ORDER BY tx_id, id LIMIT $3"
);

/// The same on SQLite, whose planner seeks a row comparison by its first
/// column only: the cursor's own transaction and the later ones are two
/// ranges, merged in order.
const OUTBOX_SQLITE: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM taskstore_events WHERE tx_id = $1 AND id > $2 UNION ALL SELECT ",
    event_columns!(),
    " FROM taskstore_events WHERE tx_id > $1 ORDER BY tx_id, id LIMIT $3"
);

/// Whether committed events of any namespace wait above the horizon ($1, $2:
/// the cursor).
const OUTBOX_HELD_BACK: &str = concat!(
    "SELECT COUNT(*) FROM (SELECT 1 FROM taskstore_events WHERE (tx_id, id) > ($1, $2) AND tx_id >= ",
    horizon!(),
    " LIMIT 1) waiting"
);

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

impl SqlTaskRepository {
    pub(super) async fn events(&self, query: &EventQuery) -> Result<EventBatch> {
        let postgres = self.backend() == Backend::Postgres;
        let statement = match (&query.task_id, postgres) {
            (Some(task_id), true) => {
                sqlx::query(by_task!(after_postgres!(), visible_to_postgres!())).bind(&query.namespace).bind(task_id)
            }
            (Some(task_id), false) => sqlx::query(by_task!(after_sqlite!(), "")).bind(&query.namespace).bind(task_id),
            (None, true) => sqlx::query(by_namespace!(after_postgres!(), visible_to_postgres!()))
                .bind(&query.namespace)
                .bind(query.agent_id.as_deref().unwrap_or_default()),
            (None, false) => sqlx::query(by_namespace!(after_sqlite!(), ""))
                .bind(&query.namespace)
                .bind(query.agent_id.as_deref().unwrap_or_default()),
        };
        let statement = statement.bind(query.after.tx).bind(query.after.id).bind(i64::from(query.limit));
        let statement = match query.task_id {
            Some(_) => statement,
            None => statement.bind(query.context_id.as_deref().unwrap_or_default()),
        };
        let mut snapshot = self.snapshot().await?;
        let rows = statement.fetch_all(&mut *snapshot).await?;
        let events = rows.iter().map(rows::decode_event).collect::<Result<Vec<_>>>()?;
        let full = events.len() >= query.limit as usize;
        let held_back = postgres
            && !full
            && held_back(&mut snapshot, query, events.last().map_or(query.after, |e| e.cursor)).await?;
        snapshot.commit().await?;
        Ok(EventBatch { events, held_back })
    }

    /// A read-only transaction whose statements share one snapshot on
    /// PostgreSQL, so that the horizon a read used and the count of what it
    /// held back agree.
    async fn snapshot(&self) -> Result<super::Tx<'static>> {
        Ok(match self.backend() {
            Backend::Postgres => self.db.pool().begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await?,
            Backend::Sqlite => self.db.pool().begin().await?,
        })
    }

    /// Every namespace's events after `after`, in commit order.
    pub(super) async fn outbox(&self, after: Cursor, limit: u32) -> Result<EventBatch> {
        let postgres = self.backend() == Backend::Postgres;
        let sql = if postgres { OUTBOX_POSTGRES } else { OUTBOX_SQLITE };
        let mut snapshot = self.snapshot().await?;
        let rows =
            sqlx::query(sql).bind(after.tx).bind(after.id).bind(i64::from(limit)).fetch_all(&mut *snapshot).await?;
        let events = rows.iter().map(rows::decode_event).collect::<Result<Vec<_>>>()?;
        let full = events.len() >= limit as usize;
        let held_back = postgres && !full && {
            let last = events.last().map_or(after, |event| event.cursor);
            let waiting: i64 =
                sqlx::query_scalar(OUTBOX_HELD_BACK).bind(last.tx).bind(last.id).fetch_one(&mut *snapshot).await?;
            waiting > 0
        };
        snapshot.commit().await?;
        Ok(EventBatch { events, held_back })
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
        let row = statement.fetch_optional(&mut *self.db.acquire().await?).await?;
        row.as_ref().map(rows::decode_event).transpose()
    }
}

/// Whether (PostgreSQL only) committed events after `after` wait above the
/// horizon of the snapshot.
async fn held_back(snapshot: &mut super::Tx<'static>, query: &EventQuery, after: Cursor) -> Result<bool> {
    let statement = match &query.task_id {
        Some(task_id) => sqlx::query_scalar(TASK_HELD_BACK).bind(&query.namespace).bind(task_id),
        None => sqlx::query_scalar(NAMESPACE_HELD_BACK).bind(&query.namespace),
    };
    let waiting: i64 = statement.bind(after.tx).bind(after.id).fetch_one(&mut **snapshot).await?;
    Ok(waiting > 0)
}
