//! PostgreSQL administration for the benchmark: scratch databases that are
//! dropped however a run ends, and the commit counters of one database.

use std::{future::Future, path::Path, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use sqlx::{AssertSqlSafe, Connection as _, Executor as _, PgConnection};
use tokio_util::sync::CancellationToken;

/// Every scratch database (and NATS stream) is `chorus_bench_<pid>_<label>`:
/// a later run drops those whose process is gone (a run killed before it
/// could clean up).
pub(crate) const PREFIX: &str = "chorus_bench_";

/// `PGSSLMODE` for the benchmark's other PostgreSQL clients (pgbench, the
/// a2a-sdk's asyncpg): plain text, as chorus connects.
pub(crate) const PLAIN_TEXT: &str = "disable";

/// How long the sessions of a stopped chorus may take to end.
const SESSIONS_END_TIMEOUT: Duration = Duration::from_secs(10);

/// Talks to the maintenance database (`postgres`) of a server.
#[derive(Debug, Clone)]
pub(crate) struct Admin {
    url: String,
}

/// A database created for one part of the run.
#[derive(Debug, Clone)]
pub(crate) struct ScratchDb {
    pub(crate) name: String,
    pub(crate) url: String,
}

/// `pg_stat_database` counters of one database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Commits {
    pub(crate) committed: i64,
    pub(crate) rolled_back: i64,
}

impl Commits {
    /// What happened between `self` and `later`.
    pub(crate) fn until(self, later: Self) -> Self {
        Self { committed: later.committed - self.committed, rolled_back: later.rolled_back - self.rolled_back }
    }
}

/// Reads a database's commit counters over its own connection to the
/// maintenance database, so the reads are not counted in what they measure.
#[derive(Debug)]
pub(crate) struct CommitCounter {
    connection: PgConnection,
    database: String,
}

impl Admin {
    pub(crate) fn new(url: &str) -> Self {
        Self { url: url.to_owned() }
    }

    async fn connect(&self) -> anyhow::Result<PgConnection> {
        PgConnection::connect(&self.url).await.context("cannot connect to PostgreSQL (see --postgres-url)")
    }

    /// One text value read over a connection of its own; `what` names it in errors.
    async fn text(&self, sql: &'static str, what: &str) -> anyhow::Result<String> {
        let mut connection = self.connect().await?;
        let value: String =
            sqlx::query_scalar(sql).fetch_one(&mut connection).await.with_context(|| format!("reading {what}"))?;
        connection.close().await.context("closing the admin connection")?;
        Ok(value)
    }

    /// The server's version string.
    pub(crate) async fn server_version(&self) -> anyhow::Result<String> {
        self.text("SHOW server_version", "server_version").await
    }

    /// The settings that decide whether a commit waits for the disk.
    pub(crate) async fn durability(&self) -> anyhow::Result<String> {
        let sql = "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings \
                   WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method')";
        self.text(sql, "pg_settings").await
    }

    /// The libraries the server loads into every backend
    /// (`shared_preload_libraries`); empty when none.
    pub(crate) async fn preloaded_libraries(&self) -> anyhow::Result<String> {
        self.text("SHOW shared_preload_libraries", "shared_preload_libraries").await
    }

    /// Drops the scratch databases of earlier runs whose process has exited.
    pub(crate) async fn drop_stale(&self) -> anyhow::Result<Vec<String>> {
        let mut connection = self.connect().await?;
        let names: Vec<String> = sqlx::query_scalar("SELECT datname FROM pg_database WHERE starts_with(datname, $1)")
            .bind(PREFIX)
            .fetch_all(&mut connection)
            .await
            .context("listing scratch databases")?;
        let mut dropped = Vec::new();
        for name in names {
            if !owner_gone(&name) {
                continue;
            }
            drop_database(&mut connection, &name).await?;
            dropped.push(name);
        }
        connection.close().await.context("closing the admin connection")?;
        Ok(dropped)
    }

    /// Creates a scratch database, runs `body` on it (stopping early when
    /// `interrupt` fires), and drops the database whatever `body` returned.
    pub(crate) async fn with_scratch<T, F, Fut>(
        &self,
        label: &str,
        interrupt: &CancellationToken,
        body: F,
    ) -> anyhow::Result<T>
    where
        F: FnOnce(ScratchDb) -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let name = format!("{PREFIX}{}_{label}", std::process::id());
        let mut connection = self.connect().await?;
        drop_database(&mut connection, &name).await?;
        connection
            .execute(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        let scratch = ScratchDb { url: database_url(&self.url, &name)?, name: name.clone() };
        let outcome = tokio::select! {
            outcome = body(scratch) => outcome,
            () = interrupt.cancelled() => Err(anyhow!("interrupted")),
        };
        // `body`'s child processes are killed when it is dropped; FORCE ends
        // any session they left behind.
        let dropped = drop_database(&mut connection, &name).await;
        let _ = connection.close().await;
        match (outcome, dropped) {
            (Ok(value), Ok(())) => Ok(value),
            (Ok(_), Err(error)) => Err(error),
            (Err(error), Ok(())) => Err(error),
            (Err(error), Err(drop_error)) => {
                eprintln!("warning: {drop_error:#}");
                Err(error)
            }
        }
    }

    /// A counter of `database`'s commits.
    pub(crate) async fn commit_counter(&self, database: &str) -> anyhow::Result<CommitCounter> {
        Ok(CommitCounter { connection: self.connect().await?, database: database.to_owned() })
    }
}

impl CommitCounter {
    /// The counters as the statistics system has them now. Busy backends
    /// report about once a second, idle ones later, exiting ones at once:
    /// exact readings need every session of the database to have ended.
    pub(crate) async fn read(&mut self) -> anyhow::Result<Commits> {
        let (committed, rolled_back): (i64, i64) =
            sqlx::query_as("SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1")
                .bind(&self.database)
                .fetch_one(&mut self.connection)
                .await
                .with_context(|| format!("reading pg_stat_database for {}", self.database))?;
        Ok(Commits { committed, rolled_back })
    }
}

impl CommitCounter {
    /// Waits until no session but `except_pid` is connected to the database:
    /// a backend reports its last statistics as it exits.
    pub(crate) async fn wait_for_sessions_to_end(&mut self, except_pid: i32) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + SESSIONS_END_TIMEOUT;
        loop {
            let sessions: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> $2")
                    .bind(&self.database)
                    .bind(except_pid)
                    .fetch_one(&mut self.connection)
                    .await
                    .context("reading pg_stat_activity")?;
            if sessions == 0 {
                // Past the activity entry, the exit may still be reporting.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{sessions} session(s) still connected to {} after {SESSIONS_END_TIMEOUT:?}", self.database);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The task store's event log, read to count its write transactions: every
/// task-store write records at least one event, stamped with the id of the
/// transaction that wrote it (`taskstore_events.tx_id`).
#[derive(Debug)]
pub(crate) struct EventLog {
    url: String,
}

impl EventLog {
    pub(crate) fn new(database_url: &str) -> Self {
        Self { url: database_url.to_owned() }
    }

    /// The id of the last event (0 for none).
    pub(crate) async fn position(&self) -> anyhow::Result<i64> {
        let (position, _) = self.since(0).await?;
        Ok(position)
    }

    /// The last event id and how many transactions wrote events after `position`.
    pub(crate) async fn since(&self, position: i64) -> anyhow::Result<(i64, i64)> {
        let mut connection = PgConnection::connect(&self.url).await.context("cannot connect to the chorus database")?;
        // Before chorus first starts, its migrations have not made the table.
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('taskstore_events') IS NOT NULL")
            .fetch_one(&mut connection)
            .await
            .context("looking for taskstore_events")?;
        if !exists {
            connection.close().await.context("closing the chorus database connection")?;
            return Ok((0, 0));
        }
        let counts: (i64, i64) =
            sqlx::query_as("SELECT coalesce(max(id), 0), count(DISTINCT tx_id) FROM taskstore_events WHERE id > $1")
                .bind(position)
                .fetch_one(&mut connection)
                .await
                .context("reading taskstore_events")?;
        connection.close().await.context("closing the chorus database connection")?;
        Ok(counts)
    }
}

async fn drop_database(connection: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    connection
        .execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
        .await
        .with_context(|| format!("cannot drop database {name}"))?;
    Ok(())
}

/// Whether `name` is a scratch name whose process has exited.
pub(crate) fn owner_gone(name: &str) -> bool {
    owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// The pid in a scratch database's name.
fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('_').next()?.parse().ok()
}

/// `url` with its database replaced by `database` (query parameters kept).
pub(crate) fn database_url(url: &str, database: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url.split_once("://").with_context(|| "the PostgreSQL URL has no scheme")?;
    if !scheme.starts_with("postgres") {
        bail!("not a PostgreSQL URL (postgres://…)");
    }
    let (location, query) = rest.split_once('?').map_or((rest, None), |(location, query)| (location, Some(query)));
    let authority = location.split_once('/').map_or(location, |(authority, _)| authority);
    let query = query.map(|query| format!("?{query}")).unwrap_or_default();
    Ok(format!("{scheme}://{authority}/{database}{query}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_replace_only_the_database() {
        let cases = [
            ("postgres://postgres@127.0.0.1:5432/postgres", "postgres://postgres@127.0.0.1:5432/x"),
            ("postgres://u:p@h/postgres?sslmode=disable", "postgres://u:p@h/x?sslmode=disable"),
            ("postgresql://h:5432", "postgresql://h:5432/x"),
            ("postgres://h?application_name=a/b", "postgres://h/x?application_name=a/b"),
        ];
        for (url, expected) in cases {
            assert_eq!(database_url(url, "x").expect(url), expected);
        }
        assert!(database_url("sqlite://x.db", "x").is_err());
    }

    #[test]
    fn scratch_names_carry_their_owner() {
        assert_eq!(owner_pid("chorus_bench_1234_raw"), Some(1234));
        assert_eq!(owner_pid("chorus_bench_x_raw"), None);
        assert_eq!(owner_pid("other"), None);
    }

    #[test]
    fn commits_subtract() {
        let before = Commits { committed: 10, rolled_back: 2 };
        let after = Commits { committed: 25, rolled_back: 3 };
        assert_eq!(before.until(after), Commits { committed: 15, rolled_back: 1 });
    }
}
