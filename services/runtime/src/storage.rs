//! Storage: a database URL selects PostgreSQL or SQLite.
//!
//! Services write their SQL once, against sqlx's `Any` driver, in the subset
//! both databases share (BIGINT times in microseconds, TEXT, BLOB/BYTEA); the
//! rare statement that must differ is chosen by [`Backend`]. Each service owns
//! its tables (prefixed with its name) and its migrations, which are embedded
//! in its crate, recorded in its own ledger table and run at start-up.

use std::{
    fmt,
    str::FromStr,
    sync::{Arc, Once},
    time::Duration,
};

use sqlx::{AnyPool, Connection as _, Executor as _, any::AnyPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::{batch::Batcher, wakeup::Wakeups};

mod config;
#[cfg(test)]
mod demo;
mod errors;
mod grouped;
mod lane;
mod migrations;
mod probe;
mod scripts;
mod sql;
mod sqlite;
mod tx;

pub use self::{
    config::{Backend, SqliteSynchronous, StorageConfig, redact_url, with_application_name},
    errors::{DbErrorKind, StorageError, classify, storage_error},
    lane::DbConnection,
    migrations::{MigrationFile, ServiceMigrations},
    scripts::TransactionScript,
    sql::{padded_len, placeholders},
    sqlite::sqlite_file,
    tx::Tx,
};

/// A connection pool and the backend behind it. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    pool: AnyPool,
    /// Warm connections: on PostgreSQL for autocommit statements, on SQLite
    /// the one writing connection, for everything.
    lane: Arc<lane::Lane>,
    /// Read-only connections beside the single writer (SQLite files only),
    /// kept warm in a lane of their own: no transaction is ever begun on them.
    readers: Option<(AnyPool, Arc<lane::Lane>)>,
    /// SQLite's transaction scripts, waiting for the writer in batches
    /// ([`run_transaction_script`](Self::run_transaction_script)).
    scripts: Batcher<scripts::PendingScript, scripts::ScriptAnswer>,
    /// PostgreSQL's writes of one statement, waiting in batches
    /// ([`run_grouped`](Self::run_grouped)).
    statements: Batcher<grouped::PendingStatement, scripts::ScriptAnswer>,
    backend: Backend,
    url: String,
    /// How to open a connection apart from the pool (the readiness probe).
    options: sqlx::any::AnyConnectOptions,
    /// The services whose tables this process made sure of ([`Db::migrate`]).
    migrated: Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db").field("backend", &self.backend).field("url", &redact_url(&self.url)).finish()
    }
}

/// What the pool gauges read ([`Db::connections`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    pub connections: u32,
    pub idle: usize,
    /// Calls waiting for a connection to statements outside transactions.
    pub waiting: usize,
}

static INSTALL_DRIVERS: Once = Once::new();

/// A pooled connection idle for longer than this is pinged before it is
/// handed out, so one dropped while the database restarted is replaced
/// unseen. One in steady use is not: sqlx's default pings on every acquire,
/// a round trip as dear as the statement that follows.
const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(1);

impl Db {
    /// Connects to `url`. SQLite runs in WAL mode with a single writing
    /// connection, so writers never meet `SQLITE_BUSY`, and a few read-only
    /// ones for [`read`](Self::read).
    pub async fn connect(url: &str, config: &StorageConfig) -> Result<Self, StorageError> {
        INSTALL_DRIVERS.call_once(sqlx::any::install_default_drivers);
        let backend = Backend::from_url(url)?;
        let url = &*sqlite::created_if_missing(url);
        let max_connections = match backend {
            Backend::Postgres => config.max_connections.max(1),
            Backend::Sqlite => 1,
        };
        let connect_error = |cause| StorageError::Connect { url: redact_url(url), cause };
        let options = sqlx::any::AnyConnectOptions::from_str(url).map_err(connect_error)?;
        let sqlite_file = backend == Backend::Sqlite && !sqlite::in_memory(url);
        let nice = config.sqlite_thread_nice;
        let synchronous = config.sqlite_synchronous;
        let readers =
            sqlite_file.then(|| (sqlite::readers(options.clone(), config), lane::Lane::new(sqlite::READERS as usize)));
        if sqlite_file {
            // A file SQLite cannot set up (a read-only folder, a folder in
            // the WAL's place) fails every pooled connection's set-up until
            // the pool gives up; one direct try says why, at once.
            let mut first = sqlx::AnyConnection::connect_with(&options).await.map_err(connect_error)?;
            first.execute("PRAGMA journal_mode = WAL").await.map_err(connect_error)?;
            first.close().await.map_err(connect_error)?;
        }
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_millis(config.acquire_timeout_ms))
            .test_before_acquire(false)
            .before_acquire(|connection, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_WHEN_IDLE_FOR {
                        connection.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |connection, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        sqlite::prioritize_connection_threads(nice);
                        connection.execute("PRAGMA journal_mode = WAL").await?;
                        connection.execute(synchronous.pragma()).await?;
                        connection.execute("PRAGMA foreign_keys = ON").await?;
                        connection.execute("PRAGMA busy_timeout = 5000").await?;
                        connection.execute(sqlite::TEMP_STORE).await?;
                    }
                    if sqlite_file {
                        connection.execute(sqlite::WRITER_CHECKPOINT).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options.clone())
            .await;
        let pool = match pool {
            Ok(pool) => pool,
            // The pool retries until its timeout, then says only that it
            // timed out; one direct attempt tells why (refused, no such host
            // or database, a wrong password).
            Err(sqlx::Error::PoolTimedOut) => {
                let timeout = Duration::from_millis(config.acquire_timeout_ms);
                let why = probe::connect_directly(&options, timeout).await.err().unwrap_or(sqlx::Error::PoolTimedOut);
                return Err(connect_error(why));
            }
            Err(error) => return Err(connect_error(error)),
        };
        // On PostgreSQL the lane may hold up to half the pool between
        // statements; the rest stays free for transactions. SQLite's one
        // writing connection is lent through the lane only, transactions
        // included ([`begin`](Self::begin)).
        let lane = lane::Lane::new(match backend {
            Backend::Postgres => max_connections as usize / 2,
            Backend::Sqlite => 1,
        });
        if let Some((readers, readers_lane)) = &readers {
            sqlite::spawn_checkpoints((readers.clone(), Arc::clone(readers_lane)), Arc::downgrade(&lane));
        }
        let scripts = scripts::script_batcher(pool.clone(), Arc::clone(&lane));
        let statements = grouped::statement_batcher(pool.clone(), Arc::clone(&lane));
        Ok(Self {
            pool,
            lane,
            readers,
            scripts,
            statements,
            backend,
            url: url.to_owned(),
            options,
            migrated: Arc::default(),
        })
    }

    /// A connection for reads outside any transaction. On a SQLite file, one
    /// of the read-only connections, which WAL lets read beside the writer
    /// (seeing everything committed before the read began) instead of
    /// queueing behind its transactions; elsewhere [`acquire`](Self::acquire)'s.
    pub async fn read(&self) -> Result<DbConnection, sqlx::Error> {
        match &self.readers {
            Some((readers, lane)) => lane.acquire(readers).await,
            None => self.acquire().await,
        }
    }

    /// A connection for statements outside any transaction (each its own,
    /// autocommitted). It skips the round trip sqlx spends testing a
    /// connection its pool takes back. Never begin a transaction on it; use
    /// [`begin`](Self::begin) for those.
    pub async fn acquire(&self) -> Result<DbConnection, sqlx::Error> {
        self.lane.acquire(&self.pool).await
    }

    /// A transaction; rolled back unless committed.
    pub async fn begin(&self) -> Result<Tx, sqlx::Error> {
        match self.backend {
            Backend::Postgres => Ok(Tx::pool(self.pool.begin().await?)),
            Backend::Sqlite => Tx::held(self.acquire().await?).await,
        }
    }

    /// Runs a service's pending migrations (under a lock on PostgreSQL, so
    /// replicas starting together migrate once).
    pub async fn migrate(&self, migrations: &ServiceMigrations) -> Result<(), StorageError> {
        let migrator = migrations.migrator(self.backend);
        let migrated = match self.backend {
            Backend::Postgres => migrator.run(&self.pool).await,
            Backend::Sqlite => match self.acquire().await {
                Ok(mut connection) => migrator.run(&mut *connection).await,
                Err(error) => Err(error.into()),
            },
        };
        migrated.map_err(|cause| StorageError::Migrate { service: migrations.service, cause })?;
        self.migrated.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(migrations.service);
        Ok(())
    }

    /// Closes every connection, waiting for those in use to come back.
    pub async fn close(&self) {
        self.lane.close();
        if let Some((readers, lane)) = &self.readers {
            lane.close();
            readers.close().await;
        }
        self.pool.close().await;
    }

    /// The connections this `Db` holds, how many of them are idle (its
    /// pool's, the readers' on SQLite, and those its lanes keep warm between
    /// turns: idle, though their pools count them as lent), and the calls
    /// waiting for one.
    pub fn connections(&self) -> PoolCounts {
        let count = |pool: &AnyPool, lane: &lane::Lane| PoolCounts {
            connections: pool.size(),
            idle: pool.num_idle() + lane.idle(),
            waiting: lane.waiting(),
        };
        let mut counts = count(&self.pool, &self.lane);
        if let Some((readers, lane)) = &self.readers {
            let readers = count(readers, lane);
            counts.connections += readers.connections;
            counts.idle += readers.idle;
            counts.waiting += readers.waiting;
        }
        counts
    }

    /// The pool behind this `Db`, for PostgreSQL. On SQLite its one writing
    /// connection is lent through [`acquire`](Self::acquire) and
    /// [`begin`](Self::begin) only: a caller of the pool would wait for it
    /// while they keep it warm.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Gives a new database its first statistics without waiting for
    /// autovacuum: once `trigger` holds at least `min_rows` rows and has never
    /// been analysed, analyses `tables` (which should include it). Whether
    /// `trigger` has statistics now; always true on SQLite.
    ///
    /// PostgreSQL plans a connection's prepared statements for good after a
    /// few calls. On tables still empty, an index that narrows a lookup only
    /// by its leading column can cost the same as the primary key and be
    /// chosen, and the plan stays until the table is first analysed, up to a
    /// minute into a busy new database. Analysing invalidates those plans, and
    /// real statistics break the tie.
    pub async fn analyze_once_filled(
        &self,
        trigger: &'static str,
        tables: &[&'static str],
        min_rows: i64,
    ) -> Result<bool, sqlx::Error> {
        if self.backend == Backend::Sqlite {
            return Ok(true);
        }
        let mut connection = self.acquire().await?;
        let (analyzed, rows): (bool, i64) = sqlx::query_as(
            "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL, n_live_tup \
             FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
        )
        .bind(trigger)
        .fetch_optional(&mut *connection)
        .await?
        .unwrap_or((false, 0));
        if analyzed {
            return Ok(true);
        }
        if rows < min_rows {
            return Ok(false);
        }
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {}", tables.join(", ")))).execute(&mut *connection).await?;
        Ok(true)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// `clause` (a lock such as ` FOR UPDATE`) on PostgreSQL; nothing on
    /// SQLite, whose single writer needs none.
    pub fn on_postgres(&self, clause: &'static str) -> &'static str {
        if self.backend == Backend::Postgres { clause } else { "" }
    }

    /// A transaction whose commit does not wait for the disk on PostgreSQL
    /// (`synchronous_commit = off` for it alone): for writes a crash may
    /// lose without harm, such as leases, which only mean a redelivery.
    pub async fn begin_relaxed(&self) -> Result<Tx, sqlx::Error> {
        let mut tx = self.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT set_config('synchronous_commit', 'off', true)").execute(&mut *tx).await?;
        }
        Ok(tx)
    }

    /// Carries `wakeups` across processes sharing this PostgreSQL database
    /// (see [`crate::wakeup::bridge`]). On SQLite (one process) does nothing.
    pub fn bridge_wakeups(&self, channel: &'static str, wakeups: &Wakeups, shutdown: CancellationToken) {
        if self.backend == Backend::Postgres {
            crate::wakeup::bridge::spawn(self.pool.clone(), self.url.clone(), channel, wakeups, shutdown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_server_is_named_with_why() {
        let config = StorageConfig { acquire_timeout_ms: 300, ..StorageConfig::default() };
        let error = Db::connect("postgres://u:hunter2@127.0.0.1:1/db", &config).await.expect_err("nothing listens");
        let text = error.to_string();
        assert!(text.to_lowercase().contains("refused"), "the cause, not only a timeout: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[tokio::test]
    async fn a_server_that_never_answers_is_named_as_such() {
        // Connections queue in the listener's backlog, and nothing answers them.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("postgres://u@{}/db", silent.local_addr().unwrap());
        let config = StorageConfig { acquire_timeout_ms: 300, ..StorageConfig::default() };
        let error = Db::connect(&url, &config).await.expect_err("no session starts");
        let text = error.to_string();
        assert!(text.contains("did not answer in time (storage.acquire_timeout_ms)"), "{text}");
    }

    /// A PostgreSQL SQLSTATE of digits (22021: a NUL in text) is not read as
    /// a SQLite result code (22021 & 0xff is SQLite's "busy").
    #[tokio::test]
    async fn postgres_errors_are_not_read_as_sqlite_codes() {
        let Ok(url) = std::env::var(crate::testing::POSTGRES_URL_VAR) else { return };
        let db = Db::connect(&url, &StorageConfig::default()).await.unwrap();
        let mut connection = db.acquire().await.unwrap();
        let outcome = sqlx::query("SELECT CAST($1 AS TEXT)").bind("a\0b").execute(&mut *connection).await;
        let error = outcome.expect_err("PostgreSQL text holds no NUL");
        assert_eq!(error.as_database_error().and_then(|error| error.code()).as_deref(), Some("22021"), "{error}");
        assert_eq!(classify(&error), DbErrorKind::Other, "not 'retry later': {error}");
    }

    #[tokio::test]
    async fn sqlite_commits_wait_for_the_disk_when_configured_to() {
        let dir = tempfile::tempdir().unwrap();
        for (synchronous, pragma) in [(SqliteSynchronous::Normal, 1), (SqliteSynchronous::Full, 2)] {
            let data_dir = dir.path().join(format!("{synchronous:?}")).display().to_string();
            let config = StorageConfig { data_dir, sqlite_synchronous: synchronous, ..Default::default() };
            let db = Db::connect(&config.effective_url().unwrap(), &config).await.unwrap();
            let mut connection = db.acquire().await.unwrap();
            let level: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&mut *connection).await.unwrap();
            assert_eq!(level, pragma, "{synchronous:?}");
        }
    }

    #[tokio::test]
    async fn a_sqlite_url_naming_no_mode_creates_its_file() {
        let dir = tempfile::tempdir().unwrap();
        for (name, query) in [("plain.db", ""), ("tuned.db", "?cache=shared")] {
            let file = dir.path().join(name);
            let db = Db::connect(&format!("sqlite://{}{query}", file.display()), &StorageConfig::default()).await;
            db.unwrap_or_else(|error| panic!("{name}: {error}")).close().await;
            assert!(file.exists(), "{name} was created");
        }
        let read_only = format!("sqlite://{}?mode=ro", dir.path().join("absent.db").display());
        assert!(Db::connect(&read_only, &StorageConfig::default()).await.is_err(), "a mode given is kept");
        assert_eq!(sqlite::created_if_missing("postgres://h/db"), "postgres://h/db");
        assert_eq!(sqlite::created_if_missing("sqlite::memory:"), "sqlite::memory:");
    }

    /// What the pool gauges read: on SQLite the readers beside the writer,
    /// and the connections kept warm between calls as idle.
    #[tokio::test]
    async fn connections_count_the_readers_and_those_kept_warm() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("pools.db").display());
        let db = Db::connect(&url, &StorageConfig::default()).await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *db.acquire().await.unwrap()).await.unwrap();
        sqlx::query("SELECT 1").execute(&mut *db.read().await.unwrap()).await.unwrap();
        let PoolCounts { connections, idle, waiting } = db.connections();
        assert!(connections >= 2, "the writer and a reader: {connections}");
        // Both kept warm; the pools may have more, coming back as this reads.
        assert!((2..=connections as usize).contains(&idle), "{idle} of {connections} idle");
        assert_eq!(waiting, 0);
        db.close().await;
    }

    /// A call waiting for the one writing connection waits no longer than
    /// `acquire_timeout_ms`, counted as waiting meanwhile.
    #[tokio::test]
    async fn a_call_waits_for_a_connection_no_longer_than_the_acquire_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("busy.db").display());
        let db =
            Db::connect(&url, &StorageConfig { acquire_timeout_ms: 300, ..StorageConfig::default() }).await.unwrap();
        let held = db.acquire().await.unwrap();
        let waiter = tokio::spawn({
            let db = db.clone();
            async move { db.acquire().await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(db.connections().waiting, 1);
        let waited = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("the wait is bounded");
        assert!(matches!(waited.unwrap(), Err(sqlx::Error::PoolTimedOut)));
        assert_eq!(db.connections().waiting, 0);
        drop(held);
        db.close().await;
    }

    #[tokio::test]
    async fn sqlite_file_in_data_dir_migrates_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig { data_dir: dir.path().join("d").display().to_string(), ..Default::default() };
        let url = config.effective_url().unwrap();
        let db = Db::connect(&url, &config).await.unwrap();
        const FILES: &[MigrationFile] =
            &[MigrationFile { version: 1, description: "t", sql: "CREATE TABLE demo_t (x BIGINT)" }];
        let migrations = ServiceMigrations { service: "demo", postgres: FILES, sqlite: FILES };
        db.migrate(&migrations).await.unwrap();
        db.migrate(&migrations).await.unwrap();
        db.ping().await.unwrap();
        // Its tables gone under it (a database made again): not ready.
        db.acquire().await.unwrap().execute("DROP TABLE _chorus_demo_migrations").await.unwrap();
        let gone = db.ping().await.unwrap_err();
        assert!(gone.starts_with("the demo tables are gone"), "{gone}");
    }
}
