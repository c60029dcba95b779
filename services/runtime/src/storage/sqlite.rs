//! SQLite's reader connections, beside the one writer.

use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

use futures_util::FutureExt as _;
use sqlx::{
    Any, AnyPool, AssertSqlSafe, Execute as _, Executor as _,
    any::{AnyArguments, AnyConnectOptions, AnyPoolOptions, AnyRow},
    query::Query,
};

use super::{
    Backend, Db, StorageConfig,
    lane::{Lane, Unfinished},
};
use crate::batch::Batcher;

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

/// A script of writes that must land whole, for SQLite's writer: its
/// statements without a `BEGIN` or `COMMIT` of their own, `$1`… bound by the
/// caller ([`query`](Self::query)). [`Db::run_transaction_script`] runs it in
/// a transaction of its own, or, when other scripts wait with it, under a
/// savepoint of one transaction it shares with them.
#[derive(Debug)]
pub struct TransactionScript {
    /// The script in a transaction of its own.
    alone: Arc<str>,
    /// The script under a savepoint of a batch's transaction.
    nested: Arc<str>,
}

impl TransactionScript {
    pub fn new(body: &str) -> Self {
        Self {
            alone: format!("BEGIN; {body}; COMMIT").into(),
            nested: format!("SAVEPOINT {SAVEPOINT}; {body}; RELEASE {SAVEPOINT}").into(),
        }
    }

    /// The script alone, for its parameters to be bound to.
    pub fn query(&self) -> Query<'static, Any, AnyArguments> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.alone)))
    }
}

/// The savepoint each script of a batch runs under.
const SAVEPOINT: &str = "chorus_script";

/// Undoes what a failed script of a batch wrote.
static UNDO_SCRIPT: LazyLock<String> = LazyLock::new(|| format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}"));

/// A script waiting for the writer, its parameters bound.
pub(super) type PendingScript = (&'static TransactionScript, Query<'static, Any, AnyArguments>);

/// The rows a script's statements returned, or why it wrote nothing.
pub(super) type ScriptAnswer = Result<Vec<AnyRow>, sqlx::Error>;

/// Scripts in one batch at most: the writer serves other work between batches.
const BATCH: usize = 32;

/// Serves the scripts waiting for the writer at the same time in one
/// transaction, one commit for all, a batch at a time (there is one writer).
pub(super) fn script_batcher(pool: AnyPool, lane: Arc<Lane>) -> Batcher<PendingScript, ScriptAnswer> {
    Batcher::new(BATCH, 1, move |scripts: Vec<PendingScript>| {
        let (pool, lane) = (pool.clone(), Arc::clone(&lane));
        async move {
            let count = scripts.len();
            let connection = match lane.acquire(&pool).await {
                Ok(connection) => Unfinished::new(connection),
                Err(error) => return each_failed(count, &error),
            };
            match <[PendingScript; 1]>::try_from(scripts) {
                Ok([(_, query)]) => vec![alone(connection, query).await],
                Err(scripts) => together(connection, scripts).await,
            }
        }
        .boxed()
    })
}

/// A lone script, in a transaction its own text begins and commits.
async fn alone(mut connection: Unfinished, query: Query<'static, Any, AnyArguments>) -> ScriptAnswer {
    let rows = query.fetch_all(&mut *connection).await?;
    connection.finish();
    Ok(rows)
}

/// Scripts in one transaction, each under a savepoint: one that fails is
/// rolled back alone and answered with its error, the rest commit together.
/// When the transaction itself fails, nothing is written and every script
/// fails (as unavailable, apart from one whose own error ended it).
async fn together(mut connection: Unfinished, scripts: Vec<PendingScript>) -> Vec<ScriptAnswer> {
    let count = scripts.len();
    if let Err(error) = sqlx::query("BEGIN").execute(&mut *connection).await {
        return each_failed(count, &error);
    }
    let mut answers = Vec::with_capacity(count);
    for (script, mut query) in scripts {
        let answer = match query.take_arguments() {
            Ok(arguments) => {
                let nested = sqlx::query_with(AssertSqlSafe(Arc::clone(&script.nested)), arguments.unwrap_or_default());
                nested.fetch_all(&mut *connection).await
            }
            Err(error) => Err(sqlx::Error::Encode(error)),
        };
        if answer.is_err()
            && let Err(error) = sqlx::query(AssertSqlSafe(UNDO_SCRIPT.as_str())).execute(&mut *connection).await
        {
            let failed = answers.len();
            let mut answers = each_failed(count, &error);
            answers[failed] = answer;
            return answers;
        }
        answers.push(answer);
    }
    match sqlx::query("COMMIT").execute(&mut *connection).await {
        Ok(_) => {
            connection.finish();
            answers
        }
        Err(error) => each_failed(count, &error),
    }
}

/// An answer for each of `count` scripts their batch could not write:
/// unavailable, as each may land when tried again.
fn each_failed(count: usize, error: &sqlx::Error) -> Vec<ScriptAnswer> {
    (0..count)
        .map(|_| Err(sqlx::Error::Io(std::io::Error::other(format!("the writes were not committed: {error}")))))
        .collect()
}

impl Db {
    /// Runs a SQLite script that must land whole, its parameters bound to
    /// `query` (made by [`TransactionScript::query`]); the rows its
    /// statements returned. Scripts that wait for the writer at the same time
    /// go in one transaction with one commit, where each would have taken
    /// the writer's turn, a round trip to its thread and a commit of its own
    /// (group commit); each is answered once its batch committed. A caller
    /// that goes away does not stop its script: it lands, or fails, whole.
    pub async fn run_transaction_script(
        &self,
        script: &'static TransactionScript,
        query: Query<'static, Any, AnyArguments>,
    ) -> ScriptAnswer {
        debug_assert_eq!(self.backend, Backend::Sqlite, "PostgreSQL runs one statement per round trip");
        self.scripts.call((script, query)).await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::LazyLock, time::Duration};

    use super::TransactionScript;
    use crate::{
        storage::{
            Db, StorageConfig,
            demo::{demo_db, demo_rows},
        },
        testing::given_up_after,
    };

    static TWO_ROWS: LazyLock<TransactionScript> = LazyLock::new(|| {
        TransactionScript::new(
            "INSERT INTO demo_rows (x) VALUES ($1); INSERT INTO demo_rows (x) VALUES ($2); \
             SELECT COUNT(*) AS n FROM demo_rows",
        )
    });

    async fn two_rows(db: &Db, a: i64, b: i64) -> Result<i64, sqlx::Error> {
        let rows = db.run_transaction_script(&TWO_ROWS, TWO_ROWS.query().bind(a).bind(b)).await?;
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

    #[tokio::test]
    async fn scripts_waiting_together_commit_together_and_one_that_fails_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        // On this test's one thread the batcher runs only once all four wait:
        // they go to the writer as one batch, in order.
        let answers =
            futures_util::future::join_all([(1, 2), (3, 4), (5, 1), (6, 7)].map(|(a, b)| two_rows(&db, a, b)));
        let [first, second, repeating, last] = answers.await.try_into().expect("four answers");
        assert_eq!((first.unwrap(), second.unwrap()), (2, 4), "each sees the writes of those before it");
        assert!(repeating.is_err(), "the third repeats a key");
        assert_eq!(last.unwrap(), 6, "the fourth runs after the third's writes were undone");
        assert_eq!(demo_rows(&db).await, [1, 2, 3, 4, 6, 7], "committed, without the failed script's first insert");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_script_given_up_still_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        for waits in 0..12_i64 {
            given_up_after(two_rows(&db, waits * 10, waits * 10 + 1), waits as usize).await;
            let rows =
                tokio::time::timeout(Duration::from_secs(10), demo_rows(&db)).await.expect("no write waits forever");
            let halves = (rows.contains(&(waits * 10)), rows.contains(&(waits * 10 + 1)));
            assert!(halves == (true, true) || halves == (false, false), "given up after {waits} waits: {rows:?}");
        }
        two_rows(&db, 1000, 1001).await.expect("the writer still runs whole scripts");
        let landed: Vec<i64> = (0..12).flat_map(|waits| [waits * 10, waits * 10 + 1]).chain([1000, 1001]).collect();
        assert_eq!(demo_rows(&db).await, landed, "every script landed whole, in the order sent");
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
