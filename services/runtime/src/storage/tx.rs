//! Transactions, on either backend.

use std::ops::{Deref, DerefMut};

use sqlx::{Any, AnyConnection, Transaction};

use super::lane::{DbConnection, Unfinished};

/// A transaction: rolled back when dropped uncommitted.
///
/// On PostgreSQL, sqlx's, on a connection of the pool. On SQLite, begun on
/// the one writing connection, which its lane lends and takes back without
/// the round trip sqlx's pool spends testing every connection given back:
/// SQLite's writes queue for that connection, so the test lengthened every
/// write's turn.
#[derive(Debug)]
pub struct Tx(Inner);

/// Each side `None` once the transaction ended.
#[derive(Debug)]
enum Inner {
    Pool(Option<Transaction<'static, Any>>),
    /// Rolled back when dropped open.
    Held(Option<Unfinished>),
}

const OPEN: &str = "a transaction is open until it ends";

impl Tx {
    pub(super) fn pool(transaction: Transaction<'static, Any>) -> Self {
        Self(Inner::Pool(Some(transaction)))
    }

    /// Begins a transaction on `connection`: held as begun from the start,
    /// so a `BEGIN` that fails, or whose caller goes away, is undone too.
    pub(super) async fn held(connection: DbConnection) -> Result<Self, sqlx::Error> {
        let mut tx = Self(Inner::Held(Some(Unfinished::new(connection))));
        sqlx::query("BEGIN").execute(&mut *tx).await?;
        Ok(tx)
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.end(true).await
    }

    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        self.end(false).await
    }

    async fn end(mut self, commit: bool) -> Result<(), sqlx::Error> {
        match &mut self.0 {
            Inner::Pool(transaction) => {
                let transaction = transaction.take().expect(OPEN);
                if commit { transaction.commit().await } else { transaction.rollback().await }
            }
            Inner::Held(held) => {
                // Left in place until it ends: a transaction whose end failed
                // is rolled back when `self` drops.
                let statement = if commit { "COMMIT" } else { "ROLLBACK" };
                sqlx::query(statement).execute(&mut **held.as_mut().expect(OPEN)).await?;
                held.take().expect(OPEN).finish();
                Ok(())
            }
        }
    }
}

impl Deref for Tx {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        match &self.0 {
            Inner::Pool(transaction) => transaction.as_ref().expect(OPEN),
            Inner::Held(held) => held.as_deref().expect(OPEN),
        }
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match &mut self.0 {
            Inner::Pool(transaction) => transaction.as_mut().expect(OPEN),
            Inner::Held(held) => held.as_deref_mut().expect(OPEN),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        storage::{
            Db,
            demo::{demo_db, demo_rows},
        },
        testing::given_up_after,
    };

    async fn insert(db: &Db, x: i64, commit: bool) {
        let mut tx = db.begin().await.unwrap();
        sqlx::query("INSERT INTO demo_rows (x) VALUES ($1)").bind(x).execute(&mut *tx).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sqlite_transaction_commits_or_rolls_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        insert(&db, 1, true).await;
        insert(&db, 2, false).await;
        let mut tx = db.begin().await.expect("the writer is free again after a rollback");
        sqlx::query("INSERT INTO demo_rows (x) VALUES (3)").execute(&mut *tx).await.unwrap();
        tx.rollback().await.unwrap();
        insert(&db, 4, true).await;
        assert_eq!(demo_rows(&db).await, [1, 4]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_used_sqlite_database_closes() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        insert(&db, 1, true).await;
        assert_eq!(demo_rows(&db).await, [1]);
        let closed = tokio::time::timeout(std::time::Duration::from_secs(5), db.close()).await;
        assert!(closed.is_ok(), "the warm connections went back to their pools, which closed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sqlite_transaction_given_up_leaves_nothing_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        for waits in 0..8 {
            given_up_after(insert(&db, 10 + waits as i64, true), waits).await;
        }
        insert(&db, 100, true).await;
        let kept = demo_rows(&db).await;
        assert_eq!(kept.last(), Some(&100), "the writer still commits: {kept:?}");
    }
}
