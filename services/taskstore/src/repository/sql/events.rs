//! The event log (outbox): reads in commit order, from a cursor.
//!
//! On PostgreSQL a reader only sees events of transactions older than the
//! oldest one still running (`pg_snapshot_xmin`), and orders by (tx_id, id):
//! an event whose transaction commits late still sorts after every cursor
//! handed out before it, so no reader skips it. SQLite has one writer, so its
//! ids already commit in order.

use chorus_runtime::storage::Backend;

use super::{SqlTaskRepository, rows};
use crate::{
    domain::{Cursor, EventBatch, EventQuery, TaskEvent},
    error::Result,
};

macro_rules! event_columns {
    () => {
        "id, tx_id, namespace, task_id, context_id, agent_id, kind, payload"
    };
}

macro_rules! visible_to_postgres {
    () => {
        " AND tx_id < (pg_snapshot_xmin(pg_current_snapshot())::text::bigint)"
    };
}

macro_rules! by_task {
    ($horizon:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE namespace = $1 AND task_id = $2 AND (tx_id > $3 OR (tx_id = $3 AND id > $4))",
            $horizon,
            " ORDER BY tx_id, id LIMIT $5"
        )
    };
}

macro_rules! by_namespace {
    ($horizon:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE namespace = $1 AND ($2 = '' OR agent_id = $2) \
             AND ($6 = '' OR context_id = $6) AND (tx_id > $3 OR (tx_id = $3 AND id > $4))",
            $horizon,
            " ORDER BY tx_id, id LIMIT $5"
        )
    };
}

/// Whether committed events wait above the horizon ($1..$4 as in the reads).
macro_rules! held_back {
    () => {
        "SELECT COUNT(*) FROM taskstore_events WHERE namespace = $1 AND ($2 = '' OR task_id = $2) \
         AND (tx_id > $3 OR (tx_id = $3 AND id > $4)) \
         AND tx_id >= (pg_snapshot_xmin(pg_current_snapshot())::text::bigint)"
    };
}

macro_rules! latest {
    ($horizon:expr) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM taskstore_events WHERE namespace = $1 AND ($2 = '' OR task_id = $2)",
            $horizon,
            " ORDER BY tx_id DESC, id DESC LIMIT 1"
        )
    };
}

impl SqlTaskRepository {
    pub(super) async fn events(&self, query: &EventQuery) -> Result<EventBatch> {
        let postgres = self.backend() == Backend::Postgres;
        let statement = match (&query.task_id, postgres) {
            (Some(task_id), true) => sqlx::query(by_task!(visible_to_postgres!())).bind(&query.namespace).bind(task_id),
            (Some(task_id), false) => sqlx::query(by_task!("")).bind(&query.namespace).bind(task_id),
            (None, true) => sqlx::query(by_namespace!(visible_to_postgres!()))
                .bind(&query.namespace)
                .bind(query.agent_id.as_deref().unwrap_or_default()),
            (None, false) => sqlx::query(by_namespace!(""))
                .bind(&query.namespace)
                .bind(query.agent_id.as_deref().unwrap_or_default()),
        };
        let statement = statement.bind(query.after.tx).bind(query.after.id).bind(i64::from(query.limit));
        let statement = match query.task_id {
            Some(_) => statement,
            None => statement.bind(query.context_id.as_deref().unwrap_or_default()),
        };
        let rows = statement.fetch_all(self.db.pool()).await?;
        let events = rows.iter().map(rows::decode_event).collect::<Result<Vec<_>>>()?;
        let full = events.len() >= query.limit as usize;
        let held_back =
            postgres && !full && self.held_back(query, events.last().map_or(query.after, |e| e.cursor)).await?;
        Ok(EventBatch { events, held_back })
    }

    /// Counts (PostgreSQL only) committed events after `after` that the
    /// horizon still hides.
    async fn held_back(&self, query: &EventQuery, after: Cursor) -> Result<bool> {
        let waiting: i64 = sqlx::query_scalar(held_back!())
            .bind(&query.namespace)
            .bind(query.task_id.as_deref().unwrap_or_default())
            .bind(after.tx)
            .bind(after.id)
            .fetch_one(self.db.pool())
            .await?;
        Ok(waiting > 0)
    }

    pub(super) async fn latest(&self, namespace: &str, task_id: Option<&str>) -> Result<Option<TaskEvent>> {
        let sql = match self.backend() {
            Backend::Postgres => latest!(visible_to_postgres!()),
            Backend::Sqlite => latest!(""),
        };
        let row =
            sqlx::query(sql).bind(namespace).bind(task_id.unwrap_or_default()).fetch_optional(self.db.pool()).await?;
        row.as_ref().map(rows::decode_event).transpose()
    }
}
