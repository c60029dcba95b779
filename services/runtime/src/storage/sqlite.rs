//! SQLite's reader connections, beside the one writer.

use std::time::Duration;

use sqlx::{
    AnyPool, Executor as _,
    any::{AnyConnectOptions, AnyPoolOptions},
};

use super::StorageConfig;

/// Reader connections of a SQLite file.
const READERS: u32 = 4;

/// Whether a SQLite URL names a database in memory, which only its own
/// connection sees.
pub(super) fn in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// Read-only connections to the SQLite file the writer's `options` open,
/// made as needed. The writer's pool has made the file WAL by then (a setting
/// the file keeps).
pub(super) fn readers(options: AnyConnectOptions, config: &StorageConfig) -> AnyPool {
    AnyPoolOptions::new()
        .max_connections(READERS)
        .acquire_timeout(Duration::from_millis(config.acquire_timeout_ms))
        .test_before_acquire(false)
        .after_connect(|connection, _meta| {
            Box::pin(async move {
                connection.execute("PRAGMA busy_timeout = 5000").await?;
                connection.execute("PRAGMA query_only = ON").await?;
                Ok(())
            })
        })
        .connect_lazy_with(options)
}

#[cfg(test)]
mod tests {
    use crate::storage::{Db, StorageConfig};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_reads_beside_an_open_write_and_never_write() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig { data_dir: dir.path().display().to_string(), ..Default::default() };
        let db = Db::connect(&config.effective_url().unwrap(), &config).await.unwrap();
        sqlx::query("CREATE TABLE demo_rows (x BIGINT)").execute(db.pool()).await.unwrap();
        let count = |db: Db| async move {
            let mut reader = db.read().await.unwrap();
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM demo_rows").fetch_one(&mut *reader).await.unwrap()
        };
        let mut write = db.pool().begin().await.unwrap();
        sqlx::query("INSERT INTO demo_rows (x) VALUES (1)").execute(&mut *write).await.unwrap();
        let during = tokio::time::timeout(Duration::from_secs(2), count(db.clone())).await;
        assert_eq!(during.expect("a read does not wait for the writer's transaction"), 0);
        write.commit().await.unwrap();
        assert_eq!(count(db.clone()).await, 1, "a read sees what committed before it began");
        let mut reader = db.read().await.unwrap();
        let refused = sqlx::query("INSERT INTO demo_rows (x) VALUES (2)").execute(&mut *reader).await;
        assert!(refused.is_err(), "reader connections are read-only");
    }
}
