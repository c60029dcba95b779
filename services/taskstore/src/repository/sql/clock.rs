//! The log's clock across database servers (PostgreSQL). The log orders
//! events by their transaction's id, which belongs to the server, not to the
//! database: restored on another server whose counter is behind, the log
//! would sort every new event before the restored ones and the cursors past
//! them. At start-up the task store finds that the log is ahead of the server
//! and numbers new events after it from then on, by an offset added to every
//! transaction id (the column's default and the horizon readers stop at).
//! Every stored id and cursor keeps its value and its order.

use chorus_runtime::storage::Backend;
use sqlx::AssertSqlSafe;

use super::SqlTaskRepository;
use crate::error::Result;

/// The offset, the log's newest event, and this transaction's id (which
/// every later transaction's exceeds).
const READ: &str = "SELECT c.xid_offset, (SELECT max(tx_id) FROM taskstore_events), \
     pg_current_xact_id()::text::bigint FROM taskstore_clock c";

impl SqlTaskRepository {
    pub(super) async fn align_clock(&self) -> Result<Option<i64>> {
        if self.backend() != Backend::Postgres {
            return Ok(None);
        }
        let mut tx = self.begin().await?;
        // Replicas starting together align once, one after the other.
        sqlx::query("LOCK TABLE taskstore_clock IN EXCLUSIVE MODE").execute(&mut *tx).await?;
        let (offset, newest, now): (i64, Option<i64>, i64) = sqlx::query_as(READ).fetch_one(&mut *tx).await?;
        let Some(newest) = newest.filter(|newest| *newest >= now.saturating_add(offset)) else {
            tx.rollback().await?;
            return Ok(None);
        };
        let offset = newest - now + 1;
        sqlx::query("UPDATE taskstore_clock SET xid_offset = $1").bind(offset).execute(&mut *tx).await?;
        let default = format!(
            "ALTER TABLE taskstore_events ALTER COLUMN tx_id SET DEFAULT (pg_current_xact_id()::text::bigint + {offset})"
        );
        sqlx::query(AssertSqlSafe(default)).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(Some(offset))
    }
}
