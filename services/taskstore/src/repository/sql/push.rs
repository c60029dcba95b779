//! A2A push-notification configs, per task.

use chorus_runtime::storage::Backend;

use super::{SqlTaskRepository, read_record, rows};
use crate::{
    domain::{Cursor, PendingPush, PushConfig, PushConfigKey, PushLease, now_micros},
    error::{Result, TaskStoreError},
};

macro_rules! push_columns {
    () => {
        "id, task_id, url, token, auth_scheme, auth_credentials"
    };
}

impl SqlTaskRepository {
    pub(super) async fn create_push(
        &self,
        namespace: &str,
        config: PushConfig,
        after: Option<Cursor>,
        lease: Option<&PushLease>,
        limit: u32,
    ) -> Result<PushConfig> {
        let mut tx = self.begin().await?;
        // Locked: creates of one task's configs count them one at a time.
        self.lock_record(&mut tx, namespace, &config.task_id).await?;
        let others: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM taskstore_push_configs WHERE namespace = $1 AND task_id = $2 AND id <> $3",
        )
        .bind(namespace)
        .bind(&config.task_id)
        .bind(&config.id)
        .fetch_one(&mut *tx)
        .await?;
        if others >= i64::from(limit) {
            return Err(TaskStoreError::TooManyPushConfigs { task_id: config.task_id, limit });
        }
        let row = sqlx::query(concat!(
            "INSERT INTO taskstore_push_configs (namespace, task_id, id, url, token, auth_scheme, auth_credentials, \
             created_at, delivered_tx, delivered_id, follower, follower_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (namespace, task_id, id) DO UPDATE SET \
             url = excluded.url, token = CASE WHEN taskstore_push_configs.finished_at IS NULL THEN excluded.token END, \
             auth_scheme = excluded.auth_scheme, auth_credentials = CASE WHEN taskstore_push_configs.finished_at IS NULL \
             THEN excluded.auth_credentials END, follower = excluded.follower, follower_until = excluded.follower_until \
             RETURNING ",
            push_columns!()
        ))
        .bind(namespace)
        .bind(&config.task_id)
        .bind(&config.id)
        .bind(&config.url)
        .bind(config.token.as_deref())
        .bind(config.auth_scheme.as_deref())
        .bind(config.auth_credentials.as_deref())
        .bind(now_micros())
        .bind(after.map(|cursor| cursor.tx))
        .bind(after.map(|cursor| cursor.id))
        .bind(lease.map(|lease| lease.follower.as_str()))
        .bind(lease.map(|lease| lease.until))
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        rows::decode_push_config(&row)
    }

    pub(super) async fn get_push(&self, namespace: &str, task_id: &str, id: &str) -> Result<PushConfig> {
        let mut conn = self.db.read().await?;
        read_record(&mut conn, namespace, task_id).await?;
        let row = sqlx::query(concat!(
            "SELECT ",
            push_columns!(),
            " FROM taskstore_push_configs WHERE namespace = $1 AND task_id = $2 AND id = $3"
        ))
        .bind(namespace)
        .bind(task_id)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
        let row =
            row.ok_or_else(|| TaskStoreError::PushConfigNotFound { task_id: task_id.to_owned(), id: id.to_owned() })?;
        rows::decode_push_config(&row)
    }

    pub(super) async fn list_push(&self, namespace: &str, task_id: &str) -> Result<Vec<PushConfig>> {
        let mut conn = self.db.read().await?;
        read_record(&mut conn, namespace, task_id).await?;
        let rows = sqlx::query(concat!(
            "SELECT ",
            push_columns!(),
            " FROM taskstore_push_configs WHERE namespace = $1 AND task_id = $2 ORDER BY created_at, id"
        ))
        .bind(namespace)
        .bind(task_id)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter().map(rows::decode_push_config).collect()
    }

    pub(super) async fn delete_push(&self, namespace: &str, task_id: &str, id: &str) -> Result<()> {
        let mut conn = self.db.acquire().await?;
        read_record(&mut conn, namespace, task_id).await?;
        let deleted =
            sqlx::query("DELETE FROM taskstore_push_configs WHERE namespace = $1 AND task_id = $2 AND id = $3")
                .bind(namespace)
                .bind(task_id)
                .bind(id)
                .execute(&mut *conn)
                .await?;
        if deleted.rows_affected() == 0 {
            return Err(TaskStoreError::PushConfigNotFound { task_id: task_id.to_owned(), id: id.to_owned() });
        }
        Ok(())
    }

    pub(super) async fn advance_push(
        &self,
        key: &PushConfigKey,
        delivered: Option<Cursor>,
        finished: bool,
        follower: Option<&str>,
    ) -> Result<()> {
        let mut conn = self.db.acquire().await?;
        let advance = sqlx::query(if follower.is_some() { ADVANCE_HELD_PUSH } else { ADVANCE_PUSH })
            .bind(&key.namespace)
            .bind(&key.task_id)
            .bind(&key.id)
            .bind(delivered.map(|cursor| cursor.tx))
            .bind(delivered.map(|cursor| cursor.id))
            .bind(finished.then(now_micros));
        let advance = match follower {
            Some(follower) => advance.bind(follower),
            None => advance,
        };
        let advanced = advance.execute(&mut *conn).await?;
        if advanced.rows_affected() > 0 {
            return Ok(());
        }
        let not_found = || TaskStoreError::PushConfigNotFound { task_id: key.task_id.clone(), id: key.id.clone() };
        let Some(follower) = follower else { return Err(not_found()) };
        let exists = sqlx::query(PUSH_EXISTS)
            .bind(&key.namespace)
            .bind(&key.task_id)
            .bind(&key.id)
            .fetch_optional(&mut *conn)
            .await?;
        match exists {
            Some(_) => Err(TaskStoreError::PushConfigNotHeld {
                task_id: key.task_id.clone(),
                id: key.id.clone(),
                follower: follower.to_owned(),
            }),
            None => Err(not_found()),
        }
    }

    pub(super) async fn claim_push(&self, lease: &PushLease, now: i64, limit: u32) -> Result<Vec<PendingPush>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let claim = match self.backend() {
            Backend::Postgres => CLAIM_PUSH_POSTGRES,
            Backend::Sqlite => CLAIM_PUSH_SQLITE,
        };
        let rows = claim_leased(&mut *self.db.acquire().await?, claim, lease, now, limit).await?;
        rows.iter().map(rows::decode_pending_push).collect()
    }

    pub(super) async fn renew_push(
        &self,
        lease: &PushLease,
        following: &[PushConfigKey],
    ) -> Result<Vec<PushConfigKey>> {
        if following.is_empty() {
            return Ok(Vec::new());
        }
        let renew = match self.backend() {
            Backend::Postgres => RENEW_PUSH_POSTGRES,
            Backend::Sqlite => RENEW_PUSH_SQLITE,
        };
        let keys: Vec<KeyRow<'_>> = following
            .iter()
            .map(|key| KeyRow { namespace: &key.namespace, task_id: &key.task_id, id: &key.id })
            .collect();
        let rows = renew_leased(&mut *self.db.acquire().await?, renew, lease, &keys).await?;
        rows.iter().map(rows::decode_push_key).collect()
    }

    pub(super) async fn release_push(&self, follower: &str, now: i64) -> Result<u64> {
        let released =
            sqlx::query(RELEASE_PUSH).bind(follower).bind(now).execute(&mut *self.db.acquire().await?).await?;
        Ok(released.rows_affected())
    }
}

/// Runs a claim statement: to follower $1 until $2, what lapsed by $3, at
/// most $4.
pub(super) async fn claim_leased(
    conn: &mut sqlx::AnyConnection,
    claim: &'static str,
    lease: &PushLease,
    now: i64,
    limit: u32,
) -> Result<Vec<sqlx::any::AnyRow>> {
    let rows = sqlx::query(claim)
        .bind(&lease.follower)
        .bind(lease.until)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows)
}

/// Runs a renewal statement: follower $1's leases extended to $2 on the
/// keys of $3, a JSON list of `keys`.
pub(super) async fn renew_leased(
    conn: &mut sqlx::AnyConnection,
    renew: &'static str,
    lease: &PushLease,
    keys: &impl serde::Serialize,
) -> Result<Vec<sqlx::any::AnyRow>> {
    let rows = sqlx::query(renew)
        .bind(&lease.follower)
        .bind(lease.until)
        .bind(rows::to_json(keys)?)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows)
}

/// Whether cursor ($4, $5) is past the one saved (none saved: before all).
macro_rules! past_delivered {
    () => {
        "($4, $5) > (COALESCE(delivered_tx, -1), COALESCE(delivered_id, -1))"
    };
}

/// Moves the saved cursor forward only, and sets `finished_at` ($6) once.
/// A finished config is sent nothing more: its token and credentials are
/// cleared, so that a stored config outlives no secret it no longer needs.
macro_rules! advance_push {
    () => {
        concat!(
            "UPDATE taskstore_push_configs SET delivered_tx = CASE WHEN ",
            past_delivered!(),
            " THEN $4 ELSE delivered_tx END, delivered_id = CASE WHEN ",
            past_delivered!(),
            " THEN $5 ELSE delivered_id END, finished_at = COALESCE(finished_at, $6), \
             token = CASE WHEN COALESCE(finished_at, $6) IS NULL THEN token END, \
             auth_credentials = CASE WHEN COALESCE(finished_at, $6) IS NULL THEN auth_credentials END \
             WHERE namespace = $1 AND task_id = $2 AND id = $3"
        )
    };
}
const ADVANCE_PUSH: &str = advance_push!();
/// Only while follower $7 holds the config (its lease may have run out, as
/// long as no one claimed the config since).
const ADVANCE_HELD_PUSH: &str = concat!(advance_push!(), " AND follower = $7");

const PUSH_EXISTS: &str = "SELECT 1 FROM taskstore_push_configs WHERE namespace = $1 AND task_id = $2 AND id = $3";

/// Unfinished configs no follower holds at $3: none named, or its lease
/// ended.
macro_rules! claimable_push {
    () => {
        "SELECT namespace, task_id, id FROM taskstore_push_configs \
         WHERE finished_at IS NULL AND (follower_until IS NULL OR follower_until <= $3) LIMIT $4"
    };
}
/// Hands up to $4 claimable configs to follower $1 until $2, skipping rows
/// another claim holds, in one statement.
const CLAIM_PUSH_POSTGRES: &str = concat!(
    "UPDATE taskstore_push_configs SET follower = $1, follower_until = $2 \
     WHERE (namespace, task_id, id) IN (",
    claimable_push!(),
    " FOR UPDATE SKIP LOCKED) RETURNING namespace, task_id, id, delivered_tx, delivered_id"
);
const CLAIM_PUSH_SQLITE: &str = concat!(
    "UPDATE taskstore_push_configs SET follower = $1, follower_until = $2 \
     WHERE (namespace, task_id, id) IN (",
    claimable_push!(),
    ") RETURNING namespace, task_id, id, delivered_tx, delivered_id"
);

/// A push config's key as the renewal's JSON list ($3) holds it.
#[derive(serde::Serialize)]
struct KeyRow<'a> {
    namespace: &'a str,
    task_id: &'a str,
    id: &'a str,
}

/// Extends to $2 the leases follower $1 holds on the unfinished configs of
/// $3, a JSON list of keys.
macro_rules! renew_push {
    ($keys:literal) => {
        concat!(
            "UPDATE taskstore_push_configs SET follower_until = $2 \
             WHERE follower = $1 AND finished_at IS NULL AND (namespace, task_id, id) IN (",
            $keys,
            ") RETURNING namespace, task_id, id"
        )
    };
}
const RENEW_PUSH_POSTGRES: &str = renew_push!(
    "SELECT k.namespace, k.task_id, k.id \
     FROM json_to_recordset(CAST($3 AS json)) AS k(namespace text, task_id text, id text)"
);
const RENEW_PUSH_SQLITE: &str =
    renew_push!("SELECT k.value ->> 'namespace', k.value ->> 'task_id', k.value ->> 'id' FROM json_each($3) k");

/// Ends at $2 the leases follower $1 holds on unfinished configs; it stays
/// their follower (and may advance them) until another claims them.
const RELEASE_PUSH: &str = "UPDATE taskstore_push_configs SET follower_until = $2 \
     WHERE follower = $1 AND finished_at IS NULL AND follower_until > $2";
