//! A SQLite file with one table, for the storage tests.

use super::{Db, StorageConfig};

/// A SQLite database in `dir` with an empty `demo_rows (x BIGINT PRIMARY KEY)`.
pub(super) async fn demo_db(dir: &tempfile::TempDir) -> Db {
    let config = StorageConfig { data_dir: dir.path().display().to_string(), ..Default::default() };
    let db = Db::connect(&config.effective_url().unwrap(), &config).await.unwrap();
    sqlx::query("CREATE TABLE demo_rows (x BIGINT PRIMARY KEY)")
        .execute(&mut *db.acquire().await.unwrap())
        .await
        .unwrap();
    db
}

/// What `demo_rows` holds, read beside the writer.
pub(super) async fn demo_rows(db: &Db) -> Vec<i64> {
    let mut reader = db.read().await.unwrap();
    sqlx::query_scalar("SELECT x FROM demo_rows ORDER BY x").fetch_all(&mut *reader).await.unwrap()
}
