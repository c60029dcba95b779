//! How far each namespace's event triggers have read the event bus.

use sqlx::Row as _;

use super::{runs::TriggerCursor, sql_runs::SqlRunRepository};
use crate::error::Result;

impl SqlRunRepository {
    pub(super) async fn read_trigger_cursor(&self, namespace: &str) -> Result<Option<TriggerCursor>> {
        let row = sqlx::query("SELECT after_sequence, published_at FROM workflow_trigger_cursors WHERE namespace = $1")
            .bind(namespace)
            .fetch_optional(&mut *self.db.read().await?)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let after_sequence = u64::try_from(row.try_get::<i64, _>("after_sequence")?).unwrap_or_default();
        Ok(Some(TriggerCursor { after_sequence, published_at: row.try_get("published_at")? }))
    }

    pub(super) async fn save_trigger_cursor(&self, namespace: &str, cursor: &TriggerCursor) -> Result<()> {
        sqlx::query(
            "INSERT INTO workflow_trigger_cursors (namespace, after_sequence, published_at) VALUES ($1, $2, $3) \
             ON CONFLICT (namespace) DO UPDATE SET after_sequence = excluded.after_sequence, \
             published_at = excluded.published_at",
        )
        .bind(namespace)
        .bind(i64::try_from(cursor.after_sequence).unwrap_or(i64::MAX))
        .bind(cursor.published_at)
        .execute(&mut *self.db.acquire().await?)
        .await?;
        Ok(())
    }
}
