//! A2A push-notification configs, per task.

use super::{SqlTaskRepository, read_record, rows};
use crate::{
    domain::{Cursor, PendingPush, PushConfig, PushConfigKey, now_micros},
    error::{Result, TaskStoreError},
};

macro_rules! pending_push {
    () => {
        "SELECT namespace, task_id, id, delivered_tx, delivered_id FROM taskstore_push_configs WHERE finished_at IS NULL"
    };
}

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
    ) -> Result<PushConfig> {
        let mut tx = self.begin().await?;
        read_record(&mut tx, namespace, &config.task_id).await?;
        sqlx::query(
            "INSERT INTO taskstore_push_configs (namespace, task_id, id, url, token, auth_scheme, auth_credentials, \
             created_at, delivered_tx, delivered_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (namespace, task_id, id) DO UPDATE SET \
             url = excluded.url, token = excluded.token, auth_scheme = excluded.auth_scheme, \
             auth_credentials = excluded.auth_credentials",
        )
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
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(config)
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
    ) -> Result<()> {
        let mut conn = self.db.acquire().await?;
        let advanced = sqlx::query(ADVANCE_PUSH)
            .bind(&key.namespace)
            .bind(&key.task_id)
            .bind(&key.id)
            .bind(delivered.map(|cursor| cursor.tx))
            .bind(delivered.map(|cursor| cursor.id))
            .bind(finished.then(now_micros))
            .execute(&mut *conn)
            .await?;
        if advanced.rows_affected() == 0 {
            return Err(TaskStoreError::PushConfigNotFound { task_id: key.task_id.clone(), id: key.id.clone() });
        }
        Ok(())
    }

    pub(super) async fn pending_push(&self, after: Option<&PushConfigKey>, limit: u32) -> Result<Vec<PendingPush>> {
        let mut conn = self.db.read().await?;
        let query = match after {
            None => sqlx::query(concat!(pending_push!(), " ORDER BY namespace, task_id, id LIMIT $1"))
                .bind(i64::from(limit)),
            Some(after) => sqlx::query(concat!(
                pending_push!(),
                " AND (namespace, task_id, id) > ($2, $3, $4) ORDER BY namespace, task_id, id LIMIT $1"
            ))
            .bind(i64::from(limit))
            .bind(&after.namespace)
            .bind(&after.task_id)
            .bind(&after.id),
        };
        let rows = query.fetch_all(&mut *conn).await?;
        rows.iter().map(rows::decode_pending_push).collect()
    }
}

/// Whether cursor ($4, $5) is past the one saved (none saved: before all).
macro_rules! past_delivered {
    () => {
        "($4, $5) > (COALESCE(delivered_tx, -1), COALESCE(delivered_id, -1))"
    };
}

/// Moves the saved cursor forward only, and sets `finished_at` ($6) once.
const ADVANCE_PUSH: &str = concat!(
    "UPDATE taskstore_push_configs SET delivered_tx = CASE WHEN ",
    past_delivered!(),
    " THEN $4 ELSE delivered_tx END, delivered_id = CASE WHEN ",
    past_delivered!(),
    " THEN $5 ELSE delivered_id END, finished_at = COALESCE(finished_at, $6) \
     WHERE namespace = $1 AND task_id = $2 AND id = $3"
);
