//! PostgreSQL's group commit: writes of one statement each that wait at the
//! same time share a transaction and its commit.
//!
//! A commit waits for its WAL to reach the disk. A short write alone spends
//! most of its time and much of the server's CPU there: the flush, and the
//! wake-ups of every backend that waited for it. Served together, the writes
//! of a batch go one after another on one connection and commit once.

use std::sync::Arc;

use futures_util::FutureExt as _;
use sqlx::{Any, AnyPool, Execute as _, SqlStr, any::AnyArguments, query::Query};

use super::{
    Backend, Db,
    lane::{Lane, Unfinished},
    scripts::{ScriptAnswer, each_failed, lane_batcher},
};
use crate::batch::Batcher;

/// A statement waiting for its batch, with its parameters.
pub(super) type PendingStatement = (SqlStr, AnyArguments);

/// Statements in one batch at most: a batch's last statement waits for all
/// before it, run one after another.
const BATCH: usize = 16;

/// Batches in the database at once, each on a connection of its own. (With
/// 64 clients sending on 2 cores, 3 or 4 batches of up to 16 served 30–50 %
/// more requests than one commit per write, at the same tail latency; 8 or
/// more made the tail longer.)
const IN_FLIGHT: usize = 4;

/// Serves the statements waiting at the same time in one transaction.
pub(super) fn statement_batcher(pool: AnyPool, lane: Arc<Lane>) -> Batcher<PendingStatement, ScriptAnswer> {
    lane_batcher(pool, lane, BATCH, IN_FLIGHT, |connection, statements| {
        if statements.len() == 1 {
            each_alone(connection, statements).boxed()
        } else {
            together(connection, statements).boxed()
        }
    })
}

/// Runs `statement` with a copy of its parameters, so that it can run again
/// alone if its batch fails.
async fn execute(connection: &mut Unfinished, (sql, arguments): &PendingStatement) -> ScriptAnswer {
    let mut copy = AnyArguments::default();
    copy.values.0.extend(arguments.values.0.iter().cloned());
    sqlx::query_with(sql.clone(), copy).fetch_all(&mut **connection).await
}

/// The statements in one transaction. When one fails, the transaction is
/// rolled back and each statement is run alone, as it would have been
/// without company, so that one that fails fails alone with its own error.
/// When the commit fails, every statement fails (nothing was written).
async fn together(mut connection: Unfinished, statements: Vec<PendingStatement>) -> Vec<ScriptAnswer> {
    let count = statements.len();
    if let Err(error) = sqlx::query("BEGIN").execute(&mut *connection).await {
        return each_failed(count, &error);
    }
    let mut answers = Vec::with_capacity(count);
    for statement in &statements {
        match execute(&mut connection, statement).await {
            Ok(rows) => answers.push(Ok(rows)),
            Err(_) => {
                if let Err(error) = sqlx::query("ROLLBACK").execute(&mut *connection).await {
                    return each_failed(count, &error);
                }
                return each_alone(connection, statements).await;
            }
        }
    }
    match sqlx::query("COMMIT").execute(&mut *connection).await {
        Ok(_) => {
            connection.finish();
            answers
        }
        Err(error) => each_failed(count, &error),
    }
}

/// Each statement in a transaction of its own (autocommit), its last run:
/// it takes its parameters as they are. After an error the connection is not
/// trusted as it is: it goes back through a rollback, and is closed if that
/// fails too.
async fn each_alone(mut connection: Unfinished, statements: Vec<PendingStatement>) -> Vec<ScriptAnswer> {
    let mut answers = Vec::with_capacity(statements.len());
    for (sql, arguments) in statements {
        answers.push(sqlx::query_with(sql, arguments).fetch_all(&mut *connection).await);
    }
    if answers.iter().all(Result::is_ok) {
        connection.finish();
    }
    answers
}

impl Db {
    /// Runs `query`, one PostgreSQL statement that writes; the rows it
    /// returned. Statements that wait at the same time go in one transaction
    /// with one commit (group commit); each is answered once that committed,
    /// and one that fails writes nothing and fails alone. A caller that goes
    /// away does not stop its statement.
    pub async fn run_grouped(&self, mut query: Query<'static, Any, AnyArguments>) -> ScriptAnswer {
        debug_assert_eq!(self.backend, Backend::Postgres, "SQLite groups its writes as transaction scripts");
        let arguments = query.take_arguments().map_err(sqlx::Error::Encode)?.unwrap_or_default();
        self.statements.call((query.sql(), arguments)).await.unwrap_or(Err(sqlx::Error::PoolClosed))
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row as _;

    use crate::{
        storage::Db,
        testing::{TestDatabase, given_up_after},
    };

    /// A fresh PostgreSQL database with an empty `demo_rows (x BIGINT
    /// PRIMARY KEY)`, when one is configured for tests.
    async fn demo_db() -> Option<(TestDatabase, Db)> {
        let Some(database) = TestDatabase::postgres().await else {
            eprintln!("skipped: CHORUS_TEST_POSTGRES_URL is not set");
            return None;
        };
        let db = database.open(&[]).await;
        sqlx::query("CREATE TABLE demo_rows (x BIGINT PRIMARY KEY)").execute(db.pool()).await.unwrap();
        Some((database, db))
    }

    /// Inserts `x`; the row with the transaction that wrote it.
    async fn insert(db: &Db, x: i64) -> Result<(i64, i64), sqlx::Error> {
        let query =
            sqlx::query("INSERT INTO demo_rows (x) VALUES ($1) RETURNING x, txid_current()::text::bigint AS tx")
                .bind(x);
        let rows = db.run_grouped(query).await?;
        let [row] = rows.as_slice() else { panic!("one row, not {}", rows.len()) };
        Ok((row.get("x"), row.get("tx")))
    }

    async fn rows(db: &Db) -> Vec<i64> {
        sqlx::query_scalar("SELECT x FROM demo_rows ORDER BY x").fetch_all(db.pool()).await.unwrap()
    }

    #[tokio::test]
    async fn statements_waiting_together_commit_in_one_transaction_each_with_its_own_rows() {
        let Some((_database, db)) = demo_db().await else { return };
        // On this test's one thread the batcher runs only once all four wait:
        // they go as one batch, in order.
        let answers = futures_util::future::join_all([1, 2, 3, 4].map(|x| insert(&db, x))).await;
        let answers: Vec<(i64, i64)> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers.iter().map(|(x, _)| *x).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(answers.iter().all(|(_, tx)| *tx == answers[0].1), "one transaction: {answers:?}");
        assert_eq!(rows(&db).await, [1, 2, 3, 4], "committed: another connection sees them");
        let (_, alone) = insert(&db, 5).await.unwrap();
        assert_ne!(alone, answers[0].1, "a lone statement goes in a transaction of its own");
    }

    #[tokio::test]
    async fn a_statement_that_fails_in_a_batch_fails_alone_with_its_own_error() {
        let Some((_database, db)) = demo_db().await else { return };
        insert(&db, 1).await.unwrap();
        let answers = futures_util::future::join_all([2, 1, 3].map(|x| insert(&db, x))).await;
        let [before, repeating, after] = answers.try_into().expect("three answers");
        let error = repeating.expect_err("1 is taken");
        let unique = error.as_database_error().is_some_and(|error| error.is_unique_violation());
        assert!(unique, "its own error, not the batch's: {error}");
        let ((_, first), (_, last)) = (before.unwrap(), after.unwrap());
        assert_ne!(first, last, "after the failure, each ran alone");
        assert_eq!(rows(&db).await, [1, 2, 3]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_given_up_by_its_caller_still_commits() {
        let Some((_database, db)) = demo_db().await else { return };
        for waits in 0..6_i64 {
            given_up_after(insert(&db, waits), waits as usize).await;
        }
        insert(&db, 100).await.unwrap();
        assert_eq!(rows(&db).await, [0, 1, 2, 3, 4, 5, 100], "each landed, though its caller went away");
    }
}
