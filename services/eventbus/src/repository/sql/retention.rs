//! Retention: events past `eventbus.retention_ms` that every handler has
//! finished are deleted with their deliveries. A dead letter goes with its
//! event once it is that old too; until then it may still be replayed.

use std::collections::BTreeMap;

use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::SqlEventRepository;
use crate::{
    domain::{PurgeCursor, Purged},
    error::Result,
};

/// Events published at or before $1, after the event ($2, $3, $4) in the
/// order they were published, up to $5; `done` when no handler still has to
/// process one (each delivery finished, or dead-lettered at or before $1).
const OLD_EVENTS: &str = "SELECT namespace, sequence, published_at, CASE WHEN EXISTS (SELECT 1 FROM eventbus_deliveries d \
     WHERE d.namespace = e.namespace AND d.sequence = e.sequence AND d.finished_at IS NULL \
     AND NOT (d.state = 'dead_lettered' AND d.updated_at <= $1)) THEN 0 ELSE 1 END AS done \
     FROM eventbus_events e WHERE published_at <= $1 AND (published_at, namespace, sequence) > ($2, $3, $4) \
     ORDER BY published_at, namespace, sequence LIMIT $5";

impl SqlEventRepository {
    pub(super) async fn purge_events(
        &self,
        published_before: i64,
        after: Option<&PurgeCursor>,
        limit: u32,
    ) -> Result<Purged> {
        let mut tx = self.begin().await?;
        // Another replica's purge skips the events this one holds.
        let sql = format!("{OLD_EVENTS}{}", self.db.on_postgres(" FOR UPDATE SKIP LOCKED"));
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(published_before)
            .bind(after.map_or(i64::MIN, |cursor| cursor.published_at))
            .bind(after.map_or("", |cursor| cursor.namespace.as_str()))
            .bind(after.map_or(0, |cursor| cursor.sequence))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        let mut done: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut purged = Purged::default();
        for row in &rows {
            let event = PurgeCursor {
                published_at: row.try_get("published_at")?,
                namespace: row.try_get("namespace")?,
                sequence: row.try_get("sequence")?,
            };
            if row.try_get::<i64, _>("done")? == 1 {
                done.entry(event.namespace.clone()).or_default().push(event.sequence);
            }
            purged.next = Some(event);
        }
        for (namespace, sequences) in &done {
            delete(&mut tx, "eventbus_deliveries", namespace, sequences).await?;
            purged.events += delete(&mut tx, "eventbus_events", namespace, sequences).await?;
        }
        tx.commit().await?;
        if rows.len() < limit as usize {
            purged.next = None;
        }
        Ok(purged)
    }
}

/// Deletes the rows of `table` about these events of the namespace; how many.
async fn delete(conn: &mut AnyConnection, table: &str, namespace: &str, sequences: &[i64]) -> Result<u64> {
    let placeholders: Vec<String> = (2..sequences.len() + 2).map(|n| format!("${n}")).collect();
    let sql = format!("DELETE FROM {table} WHERE namespace = $1 AND sequence IN ({})", placeholders.join(", "));
    let statement =
        sequences.iter().fold(sqlx::query(AssertSqlSafe(sql)).bind(namespace), |query, sequence| query.bind(*sequence));
    Ok(statement.execute(&mut *conn).await?.rows_affected())
}
