//! SQLite's reader connections, beside the one writer.

use std::time::Duration;

use sqlx::{
    Any, AnyPool, Executor as _,
    any::{AnyArguments, AnyConnectOptions, AnyPoolOptions, AnyRow},
    query::Query,
};

use super::{Backend, Db, StorageConfig, lane::Unfinished};

/// Reader connections of a SQLite file.
pub(super) const READERS: u32 = 4;

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

impl Db {
    /// Runs a SQLite script that begins and commits its own transaction
    /// (`BEGIN; …; COMMIT`) in one round trip to the writer, where a
    /// transaction handle takes three (begin, script, commit), each waiting
    /// for the writer's thread and then for the caller's; the rows its
    /// statements return.
    ///
    /// The connection is held unfinished until the script ends well: when it
    /// fails, or its caller goes away first, whatever it began is rolled back
    /// before the connection goes back.
    pub async fn run_transaction_script<'q>(
        &self,
        script: Query<'q, Any, AnyArguments>,
    ) -> Result<Vec<AnyRow>, sqlx::Error> {
        debug_assert_eq!(self.backend, Backend::Sqlite, "PostgreSQL runs one statement per round trip");
        let mut connection = Unfinished::new(self.acquire().await?);
        let rows = script.fetch_all(&mut *connection).await?;
        connection.finish();
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        storage::{
            Db, StorageConfig,
            demo::{demo_db, demo_rows},
        },
        testing::given_up_after,
    };
    use std::time::Duration;

    const TWO_ROWS: &str = "BEGIN; INSERT INTO demo_rows (x) VALUES ($1); INSERT INTO demo_rows (x) VALUES ($2); \
                            SELECT COUNT(*) AS n FROM demo_rows; COMMIT";

    async fn two_rows(db: &Db, a: i64, b: i64) -> Result<i64, sqlx::Error> {
        let rows = db.run_transaction_script(sqlx::query(TWO_ROWS).bind(a).bind(b)).await?;
        Ok(sqlx::Row::get(rows.last().expect("the count"), "n"))
    }

    #[tokio::test]
    async fn a_transaction_script_commits_and_answers_with_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        assert_eq!(two_rows(&db, 1, 2).await.unwrap(), 2);
        assert_eq!(demo_rows(&db).await, [1, 2], "committed: a reader sees it");
    }

    #[tokio::test]
    async fn a_failing_transaction_script_writes_nothing_and_leaves_no_transaction_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        two_rows(&db, 1, 2).await.unwrap();
        // The second insert repeats a key: the script stops there, after its first insert.
        assert!(two_rows(&db, 3, 1).await.is_err());
        assert_eq!(demo_rows(&db).await, [1, 2], "the first insert was rolled back");
        assert_eq!(two_rows(&db, 4, 5).await.unwrap(), 4, "the next script runs in a transaction of its own");
        let mut tx = db.begin().await.expect("and a transaction handle can begin");
        sqlx::query("INSERT INTO demo_rows (x) VALUES (6)").execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(demo_rows(&db).await, [1, 2, 4, 5, 6]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_script_given_up_writes_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        for waits in 0..12_i64 {
            let (a, b) = (waits * 10, waits * 10 + 1);
            given_up_after(two_rows(&db, a, b), waits as usize).await;
            let rows =
                tokio::time::timeout(Duration::from_secs(10), demo_rows(&db)).await.expect("no write waits forever");
            let halves = (rows.contains(&a), rows.contains(&b));
            assert!(halves == (true, true) || halves == (false, false), "given up after {waits} waits: {rows:?}");
        }
        two_rows(&db, 1000, 1001).await.expect("the writer still runs whole scripts");
        assert!(demo_rows(&db).await.ends_with(&[1000, 1001]), "and commits them");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_reads_beside_an_open_write_and_never_write() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig { data_dir: dir.path().display().to_string(), ..Default::default() };
        let db = Db::connect(&config.effective_url().unwrap(), &config).await.unwrap();
        sqlx::query("CREATE TABLE demo_rows (x BIGINT)").execute(&mut *db.acquire().await.unwrap()).await.unwrap();
        let count = |db: Db| async move {
            let mut reader = db.read().await.unwrap();
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM demo_rows").fetch_one(&mut *reader).await.unwrap()
        };
        let mut write = db.begin().await.unwrap();
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
