//! The outbox relays' rows: each relay's cursor, under a lease that one
//! owner holds at a time.

use std::time::Duration;

use chorus_runtime::time::micros;

use super::SqlTaskRepository;
use crate::{
    domain::Cursor,
    error::{Result, TaskStoreError},
};

/// Creates relay $1 leased to $2 until $3, or takes the lease over when $2
/// already holds it or it ran out before $4; returns the cursor only then.
const ACQUIRE: &str = "INSERT INTO taskstore_outbox (name, owner, lease_until) VALUES ($1, $2, $3) \
     ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, lease_until = excluded.lease_until \
     WHERE taskstore_outbox.owner = excluded.owner OR taskstore_outbox.lease_until < $4 \
     RETURNING cursor_tx, cursor_id";

/// Saves relay $1's cursor ($3, $4) and renews its lease to $6, while $2
/// holds it at $5.
const SAVE: &str = "UPDATE taskstore_outbox SET cursor_tx = $3, cursor_id = $4, lease_until = $6 \
     WHERE name = $1 AND owner = $2 AND lease_until >= $5";

impl SqlTaskRepository {
    pub(super) async fn acquire_outbox(
        &self,
        relay: &str,
        owner: &str,
        now: i64,
        lease: Duration,
    ) -> Result<Option<Cursor>> {
        let lease_until = now.saturating_add(micros(lease));
        let row: Option<(i64, i64)> = sqlx::query_as(ACQUIRE)
            .bind(relay)
            .bind(owner)
            .bind(lease_until)
            .bind(now)
            .fetch_optional(&mut *self.db.acquire().await?)
            .await?;
        Ok(row.map(|(tx, id)| Cursor { tx, id }))
    }

    pub(super) async fn save_outbox(
        &self,
        relay: &str,
        owner: &str,
        cursor: Cursor,
        now: i64,
        lease: Duration,
    ) -> Result<()> {
        let saved = sqlx::query(SAVE)
            .bind(relay)
            .bind(owner)
            .bind(cursor.tx)
            .bind(cursor.id)
            .bind(now)
            .bind(now.saturating_add(micros(lease)))
            .execute(&mut *self.db.acquire().await?)
            .await?;
        if saved.rows_affected() == 0 {
            return Err(TaskStoreError::OutboxLeaseLost { relay: relay.to_owned(), owner: owner.to_owned() });
        }
        Ok(())
    }
}
