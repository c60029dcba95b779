//! A SQLite file's connection threads run at `storage.sqlite_thread_nice`.
//! Its own test binary: the setting reaches every SQLite connection thread of
//! the process, which other tests' databases would share.
#![cfg(target_os = "linux")]

use chorus_runtime::storage::{Db, StorageConfig};

/// The nice value of the thread whose `/proc` folder is `task`; none when
/// the thread ended since it was listed.
fn nice(task: &std::path::Path) -> Option<i32> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // The fields after the command's closing parenthesis; nice is the 19th of stat.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("stat").1.split_whitespace().collect();
    Some(fields[16].parse().expect("nice"))
}

/// The nice value of each of this process's SQLite connection threads.
fn connection_thread_nices() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim_end() == "sqlx-sqlite-wor"
        })
        .filter_map(|task| nice(&task.path()))
        .collect()
}

/// A SQLite file in `dir` whose writer and a reader have connected.
async fn used_db(dir: &tempfile::TempDir, nice: i32) -> Db {
    let config =
        StorageConfig { data_dir: dir.path().display().to_string(), sqlite_thread_nice: nice, ..Default::default() };
    let db = Db::connect(&config.effective_url().expect("url"), &config).await.expect("connect");
    sqlx::query("CREATE TABLE IF NOT EXISTS t (x BIGINT)")
        .execute(&mut *db.acquire().await.expect("writer"))
        .await
        .expect("write");
    sqlx::query("SELECT 1").execute(&mut *db.read().await.expect("reader")).await.expect("read");
    db
}

/// Waits until `holds` is true of the connection threads' nice values,
/// which new connections (a checkpoint's reader, say) change for a moment.
async fn eventually(what: &str, holds: impl Fn(&[i32]) -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let nices = connection_thread_nices();
        if holds(&nices) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {nices:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_threads_take_the_configured_priority_and_zero_leaves_them_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let inherited = nice(std::path::Path::new("/proc/thread-self")).expect("this thread's nice value");
    let untouched = used_db(&dir, 0).await;
    let nices = connection_thread_nices();
    assert!(nices.len() >= 2, "a writer and a reader thread: {nices:?}");
    assert!(nices.iter().all(|&nice| nice == inherited), "0 leaves the threads as they started: {nices:?}");
    drop(untouched);
    eventually("a dropped database's threads end", <[i32]>::is_empty).await;
    // Going up needs no privilege, so this holds for any user.
    let _lowered = used_db(&dir, 5).await;
    eventually("every connection thread at 5", |nices| nices.len() >= 2 && nices.iter().all(|&nice| nice == 5)).await;
}
