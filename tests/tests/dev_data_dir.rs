//! `chorus dev`'s data directory: one process at a time, and a directory
//! SQLite cannot use is reported at once, with the reason.

use std::{path::Path, process::Output, time::Duration};

use chorus_tests::{Sandbox, server::chorus_bin};

/// `chorus dev` on `data_dir`, which must fail to start: its output.
async fn refused_dev(data_dir: &Path, workdir: &Path) -> Output {
    let mut command = tokio::process::Command::new(chorus_bin());
    command.args(["dev", "--listen", "127.0.0.1:0", "--no-agents", "--data-dir"]).arg(data_dir).current_dir(workdir);
    command.kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(8), command.output()).await;
    let output = output.expect("refused at once, not after the pool's timeout").expect("run chorus");
    assert!(!output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_one_data_directory_is_refused() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let output = refused_dev(&sandbox.data_dir(), sandbox.path()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("in use by another chorus process"), "{stderr}");
    drop(server);
    // Once the first has stopped, the directory is free again.
    let again = sandbox.dev().no_agents().start().await;
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_sqlite_cannot_use_is_reported_at_once() {
    let sandbox = Sandbox::new();
    let data_dir = sandbox.path().join("broken");
    std::fs::create_dir_all(data_dir.join("chorus.db-wal")).expect("a folder where the WAL goes");
    let output = refused_dev(&data_dir, sandbox.path()).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("chorus.db"), "the file is named: {stderr}");
    assert!(!stderr.contains("pool timed out"), "the reason, not the pool's timeout: {stderr}");
}
