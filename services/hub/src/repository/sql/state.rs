//! Shared state: versioned keys with compare-and-set and TTL.

use chorus_runtime::time::micros;
use sqlx::AssertSqlSafe;

use super::{SqlHubRepository, rows};
use crate::{
    domain::{StateChangeKind, StateEntry, StateWrite},
    error::{HubError, Result},
    repository::Expired,
};

impl SqlHubRepository {
    pub(super) async fn read_state(&self, namespace: &str, key: &str) -> Result<Option<StateEntry>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            rows::state_columns!(),
            " FROM hub_state WHERE namespace = $1 AND key = $2"
        ))
        .bind(namespace)
        .bind(key)
        .fetch_optional(&mut *self.db.read().await?)
        .await?;
        row.as_ref().map(rows::decode_state).transpose()
    }

    pub(super) async fn store_state(&self, write: StateWrite, now: i64) -> Result<StateEntry> {
        let mut tx = self.begin().await?;
        // Every key that was ever written keeps a row; a first write makes an
        // absent one (version 0) to lock, so concurrent first writes queue up.
        sqlx::query(
            "INSERT INTO hub_state (namespace, key, value, content_type, version, change, updated_by, updated_at) \
             VALUES ($1, $2, NULL, '', 0, 'deleted', '', $3) ON CONFLICT (namespace, key) DO NOTHING",
        )
        .bind(&write.namespace)
        .bind(&write.key)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let sql = format!(
            "SELECT {} FROM hub_state WHERE namespace = $1 AND key = $2{}",
            rows::state_columns!(),
            self.db.on_postgres(" FOR UPDATE")
        );
        let row = sqlx::query(AssertSqlSafe(sql)).bind(&write.namespace).bind(&write.key).fetch_one(&mut *tx).await?;
        let current = rows::decode_state(&row)?;
        let actual = current.current_version(now);
        if let Some(expected) = write.expected_version
            && expected != actual
        {
            return Err(HubError::VersionConflict { key: write.key, expected, actual });
        }
        let Some((value, content_type)) = write.value else {
            if actual == 0 {
                // Already absent: nothing to write (the version stays), not
                // even the row a key never written got above.
                tx.rollback().await?;
                return Ok(StateEntry { version: 0, ..current });
            }
            let entry = StateEntry {
                value: None,
                content_type: String::new(),
                version: current.version + 1,
                change: StateChangeKind::Deleted,
                updated_by: write.updated_by,
                updated_at: now,
                expires_at: None,
                ..current
            };
            save(&mut tx, &entry).await?;
            tx.commit().await?;
            return Ok(entry);
        };
        let entry = StateEntry {
            value: Some(value),
            content_type,
            version: current.version + 1,
            change: StateChangeKind::Set,
            updated_by: write.updated_by,
            updated_at: now,
            expires_at: write.ttl.map(|ttl| now.saturating_add(micros(ttl))),
            ..current
        };
        save(&mut tx, &entry).await?;
        tx.commit().await?;
        Ok(entry)
    }

    pub(super) async fn live_keys(
        &self,
        namespace: &str,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
        now: i64,
    ) -> Result<Vec<StateEntry>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            rows::state_columns!(),
            " FROM hub_state WHERE namespace = $1 AND substr(key, 1, CAST($2 AS INTEGER)) = $3 AND key > $4 AND change = 'set' \
             AND (expires_at IS NULL OR expires_at > $5) ORDER BY key LIMIT $6"
        ))
        .bind(namespace)
        .bind(i64::try_from(prefix.chars().count()).unwrap_or(i64::MAX))
        .bind(prefix)
        .bind(after.unwrap_or_default())
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        rows.iter().map(rows::decode_state).collect()
    }

    pub(super) async fn clear_expired(&self, now: i64, limit: u32) -> Result<Expired> {
        let mut tx = self.begin().await?;
        let mut expired = Expired::default();
        // Delegations before the inbox, in the order a reply and a
        // delegation's end lock them: the other order deadlocked with a
        // delegation ending as it expired (PostgreSQL).
        for table in ["hub_delegations", "hub_messages", "hub_inbox"] {
            let done = sqlx::query(AssertSqlSafe(format!("DELETE FROM {table} WHERE expires_at <= $1")))
                .bind(now)
                .execute(&mut *tx)
                .await?;
            expired.removed += done.rows_affected();
        }
        let sql = format!(
            "SELECT namespace, key FROM hub_state WHERE change = 'set' AND expires_at <= $1 ORDER BY expires_at \
             LIMIT $2{}",
            self.db.on_postgres(" FOR UPDATE SKIP LOCKED")
        );
        let keys: Vec<(String, String)> =
            sqlx::query_as(AssertSqlSafe(sql)).bind(now).bind(i64::from(limit)).fetch_all(&mut *tx).await?;
        for (namespace, key) in &keys {
            sqlx::query(
                "UPDATE hub_state SET change = 'expired', value = NULL, content_type = '', version = version + 1, \
                 updated_at = $3, expires_at = NULL WHERE namespace = $1 AND key = $2",
            )
            .bind(namespace)
            .bind(key)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        expired.keys = keys;
        tx.commit().await?;
        Ok(expired)
    }
}

async fn save(conn: &mut sqlx::AnyConnection, entry: &StateEntry) -> Result<()> {
    sqlx::query(
        "UPDATE hub_state SET value = $3, content_type = $4, version = $5, change = $6, updated_by = $7, \
         updated_at = $8, expires_at = $9 WHERE namespace = $1 AND key = $2",
    )
    .bind(&entry.namespace)
    .bind(&entry.key)
    .bind(&entry.value)
    .bind(&entry.content_type)
    .bind(entry.version)
    .bind(entry.change.as_str())
    .bind(&entry.updated_by)
    .bind(entry.updated_at)
    .bind(entry.expires_at)
    .execute(conn)
    .await?;
    Ok(())
}
