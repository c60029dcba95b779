//! Connections kept warm for statements outside any transaction.
//!
//! sqlx tests every connection given back to its pool with a round trip (on
//! PostgreSQL a `Sync` and its `ReadyForQuery`, on SQLite a ping through the
//! connection's thread), as dear to both sides as the statement before it.
//! A connection used for autocommit statements only needs no such test: a
//! statement cut off mid-way leaves its answer to be drained (PostgreSQL) or
//! is reset (SQLite) at the connection's next use, and no transaction can be
//! left open on it. PostgreSQL's pool has a lane, and so do SQLite's
//! read-only connections and its one writing connection, which is lent
//! through its lane only: a [`Tx`](super::Tx) begun on it rolls back what it
//! leaves open before the connection goes back. The lane
//! keeps such connections out of the pool between uses, most recent first,
//! and gives one back through the pool (and its test) once it has been idle
//! for longer than [`PING_WHEN_IDLE_FOR`](super::PING_WHEN_IDLE_FOR).
//!
//! A connection is not tested when it comes back, so a lane cannot tell a
//! connection that broke (the server ended it, or the network did) from a
//! sound one: reused within the idle time, the broken one failed every
//! statement for as long as its callers kept it busy, which a workflow
//! engine polling every 200 ms did for ever. So a statement that fails for
//! want of its connection is noted ([`note_connection_lost`], by
//! [`classify`](super::classify)), and a lane keeps warm no connection that
//! was out, or idle, when such a failure happened anywhere: each goes back
//! through the pool's test once.
//!
//! The lane holds at most `capacity` connections, in use or idle, so the
//! rest of the pool stays free for transactions; callers beyond that wait
//! their turn in order. Without the bound and the queue, a caller finding the
//! lane empty waited in the pool while later callers took each connection
//! given back to the lane before it: under load, a few waited for hundreds of
//! milliseconds.

use std::{
    collections::VecDeque,
    ops::{Deref, DerefMut},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Instant,
};

use sqlx::{Any, AnyConnection, AnyPool, pool::PoolConnection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::PING_WHEN_IDLE_FOR;

/// Idle connections, the most recently used last, with when each came back.
#[derive(Debug)]
struct Idle {
    connections: VecDeque<(PoolConnection<Any>, Instant)>,
    /// The count of lost connections when these were checked: each came
    /// back from a turn that began after it, or was handed out since.
    lost: u64,
}

/// Statements of this process that failed for want of their connection.
static LOST: AtomicU64 = AtomicU64::new(0);

/// Notes that a statement failed because its connection broke: every lane
/// then has its connections tested before it hands them out again.
pub(super) fn note_connection_lost() {
    LOST.fetch_add(1, Ordering::AcqRel);
}

fn lost() -> u64 {
    LOST.load(Ordering::Acquire)
}

#[derive(Debug)]
pub(super) struct Lane {
    /// `None` once closed: connections then go straight back to the pool.
    idle: Mutex<Option<Idle>>,
    /// One per connection the lane may hold; taken in the order asked for.
    turns: Arc<Semaphore>,
    /// How many turns have ended so far.
    ended: AtomicU64,
    /// How many callers wait for a turn.
    waiting: AtomicUsize,
}

impl Lane {
    /// A lane holding at most `capacity` connections.
    pub(super) fn new(capacity: usize) -> Arc<Self> {
        let capacity = capacity.max(1);
        Arc::new(Self {
            idle: Mutex::new(Some(Idle { connections: VecDeque::with_capacity(capacity), lost: lost() })),
            turns: Arc::new(Semaphore::new(capacity)),
            ended: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
        })
    }

    /// The most recently used warm connection, or one from `pool`; the pool's
    /// acquire timeout bounds the whole wait, for a turn and then for a
    /// connection.
    pub(super) async fn acquire(self: &Arc<Self>, pool: &AnyPool) -> Result<DbConnection, sqlx::Error> {
        let deadline = tokio::time::Instant::now() + pool.options().get_acquire_timeout();
        let waiting = Waiting::new(&self.waiting);
        let turn = tokio::time::timeout_at(deadline, Arc::clone(&self.turns).acquire_owned()).await;
        drop(waiting);
        let turn = turn.map_err(|_| sqlx::Error::PoolTimedOut)?.expect("the lane's semaphore is never closed");
        let (warm, stale) = match self.idle.lock().expect("lane lock poisoned").as_mut() {
            Some(idle) => {
                let stale = Self::drain_stale(idle);
                (idle.connections.pop_back().map(|(connection, _)| connection), stale)
            }
            None => (None, Vec::new()),
        };
        // Dropped outside the lock: each goes back to the pool, which tests it.
        drop(stale);
        let lost_before = lost();
        let connection = match warm {
            Some(connection) => connection,
            None => {
                tokio::time::timeout_at(deadline, pool.acquire()).await.map_err(|_| sqlx::Error::PoolTimedOut)??
            }
        };
        Ok(DbConnection { connection: Some(connection), lane: Arc::clone(self), lost_before, _turn: turn })
    }

    /// The connections it keeps warm between turns: idle, though the pool
    /// counts them as lent.
    pub(super) fn idle(&self) -> usize {
        self.idle.lock().expect("lane lock poisoned").as_ref().map_or(0, |idle| idle.connections.len())
    }

    /// How many callers wait for a turn.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// How many turns have ended so far: on SQLite's writer lane, a count
    /// that moves after anything may have been written.
    pub(super) fn turns_ended(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }

    /// Keeps `connection`, handed out when `lost_before` connections had
    /// been lost, warm for the next turn (the lane never holds more than its
    /// turns, so it always has room).
    fn put(&self, connection: PoolConnection<Any>, lost_before: u64) {
        let stale = match self.idle.lock().expect("lane lock poisoned").as_mut() {
            Some(idle) => {
                let mut stale = Self::drain_stale(idle);
                // Kept unless a connection was lost since its turn began: it may be that one.
                match lost_before == idle.lost {
                    true => idle.connections.push_back((connection, Instant::now())),
                    false => stale.push(connection),
                }
                stale
            }
            None => vec![connection],
        };
        drop(stale);
    }

    /// Gives every idle connection back to the pool, and each one in use
    /// when it comes back, so that the pool can close.
    pub(super) fn close(&self) {
        let idle = self.idle.lock().expect("lane lock poisoned").take();
        drop(idle);
    }

    /// Takes out the connections idle for too long (the oldest are in
    /// front), and every one out or idle when a connection was lost since.
    fn drain_stale(idle: &mut Idle) -> Vec<PoolConnection<Any>> {
        let lost = lost();
        if idle.lost != lost {
            idle.lost = lost;
            return idle.connections.drain(..).map(|(connection, _)| connection).collect();
        }
        let mut stale = Vec::new();
        while idle.connections.front().is_some_and(|(_, since)| since.elapsed() > PING_WHEN_IDLE_FOR) {
            stale.extend(idle.connections.pop_front().map(|(connection, _)| connection));
        }
        stale
    }
}

/// A caller counted as waiting for a turn until dropped (its call may be
/// dropped while it waits).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection for statements outside any transaction; see
/// [`Db::acquire`](super::Db::acquire). Back to its lane when dropped.
#[derive(Debug)]
pub struct DbConnection {
    /// `None` once closed.
    connection: Option<PoolConnection<Any>>,
    /// The lane it goes back to, and the turn it holds there until then.
    lane: Arc<Lane>,
    /// The count of lost connections when it was handed out.
    lost_before: u64,
    _turn: OwnedSemaphorePermit,
}

impl DbConnection {
    /// Closes the connection instead of giving it back (its pool opens
    /// another when needed); closing a SQLite connection rolls back what it
    /// left open.
    fn close(mut self) {
        if let Some(connection) = self.connection.take() {
            drop(connection.detach());
        }
    }
}

/// A connection in the middle of work that must end whole (a transaction, a
/// script that begins and commits one). Unless [`finish`](Self::finish)ed,
/// it goes back to its lane only after a `ROLLBACK` ended whatever the work
/// left open, and is closed when that fails (closing a SQLite connection
/// rolls back too): sqlx stops a statement or script at its first error, or
/// once nobody reads its results, and would hand the connection on inside
/// the open transaction.
#[derive(Debug)]
pub(super) struct Unfinished(Option<DbConnection>);

impl Unfinished {
    pub(super) fn new(connection: DbConnection) -> Self {
        Self(Some(connection))
    }

    /// The work ended whole: the connection goes back as it is.
    pub(super) fn finish(mut self) {
        self.0.take();
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(mut connection) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if sqlx::query("ROLLBACK").execute(&mut *connection).await.is_err() {
                        connection.close();
                    }
                });
            }
            Err(_) => connection.close(),
        }
    }
}

impl Deref for Unfinished {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        self.0.as_deref().expect("held until finished or dropped")
    }
}

impl DerefMut for Unfinished {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        self.0.as_deref_mut().expect("held until finished or dropped")
    }
}

impl Deref for DbConnection {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        self.connection.as_ref().expect("a lane connection is held until dropped")
    }
}

impl DerefMut for DbConnection {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        self.connection.as_mut().expect("a lane connection is held until dropped")
    }
}

impl Drop for DbConnection {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            self.lane.put(connection, self.lost_before);
        }
        self.lane.ended.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::storage::{Db, StorageConfig};

    /// The tests here share the process's count of lost connections: one
    /// that ends a connection has every lane test the connections it holds,
    /// and so hand out another than a test that watches which one comes back
    /// expects. They run one at a time.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// A `Db` on the PostgreSQL of `CHORUS_TEST_POSTGRES_URL`, if set, and
    /// this test's turn among the others here.
    async fn postgres() -> Option<(Db, tokio::sync::MutexGuard<'static, ()>)> {
        let Some(url) = std::env::var("CHORUS_TEST_POSTGRES_URL").ok().filter(|url| !url.is_empty()) else {
            eprintln!("skipped: CHORUS_TEST_POSTGRES_URL is not set");
            return None;
        };
        let turn = ONE_AT_A_TIME.lock().await;
        Some((Db::connect(&url, &StorageConfig::default()).await.expect("connects"), turn))
    }

    async fn backend_pid(connection: &mut DbConnection) -> i32 {
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut **connection).await.expect("answers")
    }

    /// Which connections a lane hands out, as `scenario` sees them (backend
    /// pids: what it expected, what it got), from a run in which no statement
    /// anywhere in this process failed for want of its connection. Such a
    /// failure (another module's test) has every lane test its connections,
    /// which may hand out others: a run it disturbed is run again.
    async fn undisturbed<F, Fut>(mut scenario: F) -> (Vec<i32>, Vec<i32>)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = (Vec<i32>, Vec<i32>)>,
    {
        for _ in 0..5 {
            let before = lost();
            let seen = scenario().await;
            if lost() == before {
                return seen;
            }
        }
        panic!("every run was disturbed by a connection lost elsewhere in this process");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_connection_given_back_is_the_next_handed_out() {
        let Some((db, _turn)) = postgres().await else { return };
        let (expected, got) = undisturbed(|| async {
            let mut first = db.acquire().await.expect("a connection");
            let mut second = db.acquire().await.expect("another");
            let (first_pid, second_pid) = (backend_pid(&mut first).await, backend_pid(&mut second).await);
            drop(first);
            drop(second);
            let mut warmest = db.acquire().await.expect("a warm one");
            let mut next = db.acquire().await.expect("the other warm one");
            (vec![second_pid, first_pid], vec![backend_pid(&mut warmest).await, backend_pid(&mut next).await])
        })
        .await;
        assert_eq!(got, expected, "the warmest first");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_statement_cut_off_midway_leaves_its_connection_usable() {
        let Some((db, _turn)) = postgres().await else { return };
        let (expected, got) = undisturbed(|| async {
            let mut connection = db.acquire().await.expect("a connection");
            let pid = backend_pid(&mut connection).await;
            let cut = tokio::time::timeout(
                Duration::from_millis(20),
                sqlx::query("SELECT pg_sleep(0.3)").execute(&mut *connection),
            )
            .await;
            assert!(cut.is_err(), "the statement was meant to be cut off");
            drop(connection);
            let mut next = db.acquire().await.expect("the same connection");
            let answer: i32 = sqlx::query_scalar("SELECT 41 + 1").fetch_one(&mut *next).await.expect("a clean answer");
            assert_eq!(answer, 42);
            (vec![pid], vec![backend_pid(&mut next).await])
        })
        .await;
        assert_eq!(got, expected, "the same connection");
    }

    /// Reused within the idle time, a connection whose server ended it
    /// fails once: the next caller gets a sound one, however soon it asks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_that_broke_is_not_handed_out_again() {
        let Some((db, _turn)) = postgres().await else { return };
        let pid = end_the_warm_connection(&db).await;
        let mut broken = db.acquire().await.expect("the warm connection");
        let error = sqlx::query("SELECT 1").execute(&mut *broken).await.expect_err("its server ended it");
        assert_eq!(crate::storage::classify(&error), crate::storage::DbErrorKind::Unavailable, "{error}");
        drop(broken);
        for _ in 0..3 {
            let mut next = db.acquire().await.expect("a live connection");
            assert_ne!(backend_pid(&mut next).await, pid, "the broken connection was handed out again");
        }
    }

    /// A service that only answers health probes: a probe that finds its
    /// connection broken may fail, and the next one reconnects.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_health_probe_after_a_broken_connection_reconnects() {
        let Some((db, _turn)) = postgres().await else { return };
        db.ping().await.expect("healthy");
        end_the_warm_connection(&db).await;
        let _first = db.ping().await;
        db.ping().await.expect("the next probe reconnects");
    }

    /// Has the server end the connection the lane keeps warm; its pid.
    async fn end_the_warm_connection(db: &Db) -> i32 {
        let mut connection = db.acquire().await.expect("a connection");
        let pid = backend_pid(&mut connection).await;
        drop(connection);
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(db.pool())
            .await
            .expect("terminates");
        assert!(terminated);
        pid
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_lost_while_idle_is_replaced_unseen() {
        let Some((db, _turn)) = postgres().await else { return };
        let pid = end_the_warm_connection(&db).await;
        tokio::time::sleep(PING_WHEN_IDLE_FOR + Duration::from_millis(200)).await;
        let mut next = db.acquire().await.expect("a live connection");
        assert_ne!(backend_pid(&mut next).await, pid);
    }
}
