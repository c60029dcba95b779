//! SQLite's reader connections beside the one writer, and the checkpoints
//! they run for it.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use sqlx::{
    AnyPool, Executor as _,
    any::{AnyConnectOptions, AnyPoolOptions},
};

use super::{StorageConfig, lane::Lane};

/// Reader connections of a SQLite file.
pub(super) const READERS: u32 = 4;

/// Temporary tables, sorts and the journals that let a statement or a
/// savepoint be undone are kept in memory, where SQLite's default writes
/// each to a file of its own: a savepoint's first write of each page copied
/// the page there first.
pub(super) const TEMP_STORE: &str = "PRAGMA temp_store = MEMORY";

/// Whether a SQLite URL names a database in memory, which only its own
/// connection sees.
pub(super) fn in_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// The URL, creating its file when missing: a SQLite file URL that names
/// no `mode` opens read-write-create (sqlx alone would refuse a new file).
pub(super) fn created_if_missing(url: &str) -> std::borrow::Cow<'_, str> {
    if sqlite_file(url).is_none() || url.contains("mode=") {
        return url.into();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}mode=rwc").into()
}

/// The file a SQLite URL names; none for another backend or a database in
/// memory.
pub fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    let file = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let file = file.split('?').next().unwrap_or_default();
    (!file.is_empty() && !in_memory(url)).then(|| file.into())
}

/// Read-only connections to the SQLite file the writer's `options` open,
/// made as needed. The writer's pool has made the file WAL by then (a setting
/// the file keeps).
pub(super) fn readers(options: AnyConnectOptions, config: &StorageConfig) -> AnyPool {
    let nice = config.sqlite_thread_nice;
    AnyPoolOptions::new()
        .max_connections(READERS)
        .acquire_timeout(Duration::from_millis(config.acquire_timeout_ms))
        .test_before_acquire(false)
        .after_connect(move |connection, _meta| {
            Box::pin(async move {
                prioritize_connection_threads(nice);
                connection.execute("PRAGMA busy_timeout = 5000").await?;
                connection.execute("PRAGMA query_only = ON").await?;
                connection.execute(TEMP_STORE).await?;
                Ok(())
            })
        })
        .connect_lazy_with(options)
}

/// What the kernel calls sqlx's SQLite connection threads
/// (`sqlx-sqlite-worker-N`, cut to 15 bytes).
#[cfg(target_os = "linux")]
const CONNECTION_THREAD: &str = "sqlx-sqlite-wor";

/// Gives this process's SQLite connection threads the scheduling priority
/// `nice` (`storage.sqlite_thread_nice`; 0 leaves them as they are). The
/// writer is the one lane every write takes: when it wakes while the request
/// threads keep every core busy, it waits its turn on the run queue, and every
/// write waits with it — a quarter of its time at 64 clients on 2 cores.
/// Going below 0 needs `CAP_SYS_NICE` (or `RLIMIT_NICE`); without it the
/// threads keep their priority, which is said once. Setting a thread to the
/// nice it has already is allowed and changes nothing, so threads reniced by
/// an earlier connection are simply set again. Linux only: elsewhere a
/// thread's priority is not its own.
#[cfg(target_os = "linux")]
pub(super) fn prioritize_connection_threads(nice: i32) {
    use std::sync::atomic::{AtomicBool, Ordering};

    use rustix::process::{Pid, setpriority_process};

    static REFUSED: AtomicBool = AtomicBool::new(false);
    if nice == 0 {
        return;
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != CONNECTION_THREAD {
            continue;
        }
        let Some(tid) = task.file_name().to_str().and_then(|tid| tid.parse().ok()).and_then(Pid::from_raw) else {
            continue;
        };
        if let Err(error) = setpriority_process(Some(tid), nice)
            && !REFUSED.swap(true, Ordering::Relaxed)
        {
            tracing::info!(
                %error,
                nice,
                "SQLite's connection threads keep their scheduling priority: below 0 needs CAP_SYS_NICE \
                 (storage.sqlite_thread_nice = 0 stops asking)"
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn prioritize_connection_threads(_nice: i32) {}

/// How often a reader checkpoints the WAL into the database file, when
/// anything may have been written since the last time. Small checkpoints
/// often: each holds the disk for a moment only.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);

/// The writer checkpoints the WAL itself only once it is this long (in
/// pages), when the readers' checkpoints fall behind. SQLite's default is
/// 1,000 pages, checkpointed by the committing connection: here the one
/// writer, whose turn every write waits for.
pub(super) const WRITER_CHECKPOINT: &str = "PRAGMA wal_autocheckpoint = 10000";

/// Copies the WAL's committed pages into the database file from a reader
/// connection, beside the writer, every [`CHECKPOINT_EVERY`] in which a
/// use of the writer ended: a passive checkpoint, which waits for no reader or
/// writer. Ends once every clone of the `Db` is gone, or its readers are
/// closed.
pub(super) fn spawn_checkpoints(readers: (AnyPool, Arc<Lane>), writer: Weak<Lane>) {
    tokio::spawn(async move {
        let (pool, lane) = readers;
        let mut ticks = tokio::time::interval(CHECKPOINT_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut checkpointed_after = 0;
        loop {
            ticks.tick().await;
            let Some(writer) = writer.upgrade() else { return };
            if pool.is_closed() {
                return;
            }
            let turns = writer.turns_ended();
            if turns == checkpointed_after {
                continue;
            }
            let checkpoint = match lane.acquire(&pool).await {
                Ok(mut connection) => sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut *connection).await,
                Err(error) => Err(error),
            };
            match checkpoint {
                Ok(_) => checkpointed_after = turns,
                Err(error) => tracing::debug!(%error, "WAL checkpoint failed; the next one retries"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::CHECKPOINT_EVERY;
    use crate::storage::{
        Db, StorageConfig,
        demo::{demo_db, demo_rows},
    };

    #[tokio::test]
    async fn writes_reach_the_database_file_without_the_writer_checkpointing() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        let file = dir.path().join("chorus.db");
        let size = || std::fs::metadata(&file).expect("the database file").len();
        tokio::time::sleep(CHECKPOINT_EVERY * 4).await;
        let before = size();
        // Some hundred pages: far fewer than the writer's own checkpoint waits for.
        let rows = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 20000) \
                    INSERT INTO demo_rows (x) SELECT x FROM n";
        sqlx::query(rows).execute(&mut *db.acquire().await.unwrap()).await.unwrap();
        let grown = tokio::time::timeout(Duration::from_secs(5), async {
            while size() <= before {
                tokio::time::sleep(CHECKPOINT_EVERY).await;
            }
        });
        grown.await.expect("a reader checkpointed the WAL into the file");
        assert_eq!(demo_rows(&db).await.len(), 20_000);
    }

    /// `.cargo/config.toml` builds the bundled SQLite without its global
    /// memory statistics (a process-wide mutex on every allocation).
    #[tokio::test]
    async fn the_bundled_sqlite_keeps_no_global_memory_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let db = demo_db(&dir).await;
        let options: Vec<String> = sqlx::query_scalar("SELECT compile_options FROM pragma_compile_options")
            .fetch_all(&mut *db.acquire().await.unwrap())
            .await
            .unwrap();
        assert!(options.iter().any(|option| option == "DEFAULT_MEMSTATUS=0"), "compiled with {options:?}");
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
