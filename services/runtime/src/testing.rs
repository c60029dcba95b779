//! Test support (cargo feature `testing`): a database of its own for each
//! test — a SQLite file, or a fresh PostgreSQL database — and
//! [`backend_suite!`](crate::backend_suite), which runs a repository suite
//! against both.
//!
//! Tests that need PostgreSQL read [`postgres_admin_url`]: unset means skip
//! (say so with an `eprintln!`); set but unreachable is a failure, which
//! [`PostgresDatabase::create`] reports by panicking.

mod streaming;

use std::fmt;

pub use self::streaming::StreamingReceiver;
use crate::storage::{Db, ServiceMigrations, StorageConfig, redact_url};

/// The variable naming the PostgreSQL server tests may use; CI sets it.
pub const POSTGRES_URL_VAR: &str = "CHORUS_TEST_POSTGRES_URL";

/// The admin URL tests create their databases from, when one is configured.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var(POSTGRES_URL_VAR).ok().filter(|url| !url.is_empty())
}

/// One test's database: a SQLite file in a temporary directory, or a fresh
/// PostgreSQL database; removed when dropped.
#[derive(Debug)]
pub enum TestDatabase {
    Sqlite { url: String, _dir: tempfile::TempDir },
    Postgres(PostgresDatabase),
}

impl TestDatabase {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("cannot create a temporary directory: {error}"));
        let url = format!("sqlite://{}/test.db?mode=rwc", dir.path().display());
        Self::Sqlite { url, _dir: dir }
    }

    /// `None` when no PostgreSQL is configured for tests (see [`postgres_admin_url`]).
    pub async fn postgres() -> Option<Self> {
        Some(Self::Postgres(PostgresDatabase::create(&postgres_admin_url()?).await))
    }

    pub fn url(&self) -> &str {
        match self {
            Self::Sqlite { url, .. } => url,
            Self::Postgres(database) => database.url(),
        }
    }

    /// Connects and runs each service's migrations.
    ///
    /// # Panics
    /// When the database cannot be opened or migrated.
    pub async fn open(&self, migrations: &[&ServiceMigrations]) -> Db {
        let db = Db::connect(self.url(), &StorageConfig::default())
            .await
            .unwrap_or_else(|error| panic!("cannot open the test database: {error}"));
        for service in migrations {
            db.migrate(service).await.unwrap_or_else(|error| panic!("cannot migrate the test database: {error}"));
        }
        db
    }
}

/// Runs each listed test against SQLite and, when `CHORUS_TEST_POSTGRES_URL`
/// is set, against PostgreSQL. `$start` turns a [`TestDatabase`] into what
/// the tests take (`async fn test(harness: H)`); it is called with a fresh
/// database for every test and backend.
#[macro_export]
macro_rules! backend_suite {
    ($start:path; $($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test($start($crate::testing::TestDatabase::sqlite()).await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(database) = $crate::testing::TestDatabase::postgres().await else {
                        eprintln!("skipped: {} is not set", $crate::testing::POSTGRES_URL_VAR);
                        return;
                    };
                    super::$test($start(database).await).await;
                }
            )*
        }
    };
}

/// A fresh database `chorus_test_<uuid>`, dropped (`WITH (FORCE)`, so open
/// connections do not keep it alive) when this value is dropped.
pub struct PostgresDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl fmt::Debug for PostgresDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresDatabase").field("name", &self.name).field("url", &redact_url(&self.url)).finish()
    }
}

impl PostgresDatabase {
    /// Creates the database through `admin_url` (a URL of the server's
    /// maintenance database, such as `postgres://…/postgres`).
    ///
    /// # Panics
    /// When the server is unreachable or refuses: a configured PostgreSQL
    /// that does not work fails the test rather than skipping it.
    pub async fn create(admin_url: &str) -> Self {
        let name = format!("chorus_test_{}", uuid::Uuid::new_v4().simple());
        let admin = connect_admin(admin_url)
            .await
            .unwrap_or_else(|error| panic!("{POSTGRES_URL_VAR} is set but PostgreSQL is unreachable: {error}"));
        let created = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(admin.pool()).await;
        admin.pool().close().await;
        if let Err(error) = created {
            panic!("cannot create test database {name}: {error}");
        }
        let url = database_url(admin_url, &name);
        Self { admin_url: admin_url.to_owned(), name, url }
    }

    /// A database on the configured server; `None`, having said the test is
    /// skipped, when none is configured (see [`postgres_admin_url`]).
    pub async fn create_or_skip() -> Option<Self> {
        let Some(admin_url) = postgres_admin_url() else {
            eprintln!("skipped: {POSTGRES_URL_VAR} is not set");
            return None;
        };
        Some(Self::create(&admin_url).await)
    }

    /// The URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PostgresDatabase {
    /// Drops the database from a thread of its own, so that dropping works
    /// inside or outside an async runtime.
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let admin = connect_admin(&admin_url).await.map_err(std::io::Error::other)?;
                let outcome = sqlx::query(sqlx::AssertSqlSafe(statement)).execute(admin.pool()).await;
                admin.pool().close().await;
                outcome.map(drop).map_err(std::io::Error::other)
            })
        });
        match dropped.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("could not drop test database {}: {error}", self.name),
            Err(_) => eprintln!("could not drop test database {}: the dropping thread panicked", self.name),
        }
    }
}

async fn connect_admin(admin_url: &str) -> Result<Db, crate::storage::StorageError> {
    Db::connect(admin_url, &StorageConfig { max_connections: 1, ..StorageConfig::default() }).await
}

/// `admin_url` with its database name replaced by `name` (query kept).
pub(crate) fn database_url(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let (server, _database) = match base.split_once("://") {
        Some((_, rest)) if rest.contains('/') => base.rsplit_once('/').unwrap_or((base, "")),
        _ => (base, ""),
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// Returns once `count` transactions of `db`'s PostgreSQL database wait for
/// a lock, or `done()`: a test holds a race at the point it means to check.
///
/// # Panics
///
/// When that has not happened within 10 s, or the database cannot be read.
pub async fn until_waiting_for_locks(db: &Db, count: i64, done: impl Fn() -> bool) {
    let started = tokio::time::Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *db.acquire().await.expect("a connection"))
        .await
        .expect("pg_stat_activity");
        if waiting >= count || done() {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{waiting} of {count} transactions wait for a lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Polls `future` until it has waited `waits` times, then drops it: the way
/// a server drops a request's work when its client hangs up, at a chosen
/// point of that work.
pub async fn given_up_after<F: std::future::Future>(future: F, waits: usize) {
    let mut future = std::pin::pin!(future);
    let mut left = waits;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        std::task::Poll::Ready(_) => std::task::Poll::Ready(()),
        std::task::Poll::Pending if left == 0 => std::task::Poll::Ready(()),
        std::task::Poll::Pending => {
            left -= 1;
            std::task::Poll::Pending
        }
    })
    .await;
}

/// The migration files under `{manifest_dir}/migrations/{postgres,sqlite}/`
/// that `migrations` does not embed: written, but never run.
///
/// # Panics
///
/// When a folder cannot be read.
pub fn unregistered_migrations(migrations: &ServiceMigrations, manifest_dir: &str) -> Vec<String> {
    let backends = [("postgres", migrations.postgres), ("sqlite", migrations.sqlite)];
    let mut missing = Vec::new();
    for (backend, files) in backends {
        let folder = std::path::Path::new(manifest_dir).join("migrations").join(backend);
        let entries = std::fs::read_dir(&folder).unwrap_or_else(|error| panic!("{}: {error}", folder.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|error| panic!("{}: {error}", folder.display())).path();
            let sql = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            if !files.iter().any(|file| file.sql == sql) {
                missing.push(format!("{backend}/{}", path.file_name().unwrap_or_default().to_string_lossy()));
            }
        }
    }
    missing.sort();
    missing
}

/// A test that every migration file of the calling crate is embedded in
/// `$migrations` (a file left out is never run).
#[macro_export]
macro_rules! every_migration_is_registered {
    ($migrations:expr) => {
        #[test]
        fn every_migration_file_is_registered() {
            let missing = $crate::testing::unregistered_migrations(&$migrations, env!("CARGO_MANIFEST_DIR"));
            assert!(missing.is_empty(), "migration files written but never run: {missing:?}");
        }
    };
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn the_database_name_is_replaced_and_the_query_kept() {
        let url = database_url("postgres://u:p@h:5432/postgres", "t1");
        assert_eq!(url, "postgres://u:p@h:5432/t1");
        let url = database_url("postgres://u@h/postgres?sslmode=disable", "t1");
        assert_eq!(url, "postgres://u@h/t1?sslmode=disable");
        assert_eq!(database_url("postgres://h", "t1"), "postgres://h/t1");
    }
}
