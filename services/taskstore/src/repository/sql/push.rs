//! A2A push-notification configs, per task.

use super::{SqlTaskRepository, read_record, rows};
use crate::{
    domain::{PushConfig, now_micros},
    error::{Result, TaskStoreError},
};

macro_rules! push_columns {
    () => {
        "id, task_id, url, token, auth_scheme, auth_credentials"
    };
}

impl SqlTaskRepository {
    pub(super) async fn create_push(&self, namespace: &str, config: PushConfig) -> Result<PushConfig> {
        let mut tx = self.begin().await?;
        read_record(&mut tx, namespace, &config.task_id).await?;
        sqlx::query(
            "INSERT INTO taskstore_push_configs (namespace, task_id, id, url, token, auth_scheme, auth_credentials, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (namespace, task_id, id) DO UPDATE SET \
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
}
