//! Worker processes: the `test-worker` binary of this package and the
//! built-in agent verb `chorus agent echo`.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use crate::{process::ChildProcess, server::chorus_bin};

/// What `test-worker` prints on stdout once it is connected, before claiming.
pub const CONNECTED: &str = "test-worker connected";

/// What a `test-worker` does with each task it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Completes the task: its final message (and an artifact named after
    /// the worker id) is the task's text reversed.
    Complete,
    /// Claims and never finishes, renewing the lease until killed.
    Hang,
}

impl Mode {
    fn as_arg(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Hang => "hang",
        }
    }
}

/// The path of `test-worker`; only integration tests know it, so they call
/// this with `env!("CARGO_BIN_EXE_test-worker")` (see [`test_worker!`](crate::test_worker)).
#[derive(Debug)]
#[must_use = "a builder does nothing until `start`"]
pub struct TestWorkerBuilder {
    bin: PathBuf,
    workdir: PathBuf,
    args: Vec<OsString>,
    mode: Mode,
    worker_id: String,
}

impl TestWorkerBuilder {
    /// A `test-worker` at `bin` working for `server_url`, for agent
    /// `reverser` in namespace `default`, in [`Mode::Complete`].
    pub fn new(bin: impl Into<PathBuf>, server_url: &str, workdir: &Path) -> Self {
        let worker_id = format!("test-worker-{}", uuid::Uuid::new_v4().simple());
        let args = ["--server", server_url].map(OsString::from).to_vec();
        Self { bin: bin.into(), workdir: workdir.to_owned(), args, mode: Mode::Complete, worker_id }
    }

    fn arg(mut self, name: &str, value: impl Into<OsString>) -> Self {
        self.args.push(name.into());
        self.args.push(value.into());
        self
    }

    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    pub fn agent(self, agent_id: &str) -> Self {
        self.arg("--agent", agent_id)
    }

    pub fn namespace(self, namespace: &str) -> Self {
        self.arg("--namespace", namespace)
    }

    /// The lease the worker asks for (renewed every third of it).
    pub fn lease(self, lease: Duration) -> Self {
        self.arg("--lease-ms", lease.as_millis().to_string())
    }

    /// How many times the task store requeues a task whose lease expired.
    pub fn max_retries(self, max_retries: u32) -> Self {
        self.arg("--max-retries", max_retries.to_string())
    }

    pub fn capacity(self, capacity: u32) -> Self {
        self.arg("--capacity", capacity.to_string())
    }

    /// Starts the worker and waits until it is connected to its server.
    pub async fn start(self) -> WorkerProcess {
        let mut command = crate::process::command(&self.bin, &self.workdir);
        command.args(&self.args).args(["--mode", self.mode.as_arg(), "--worker-id", &self.worker_id]);
        let mut process = ChildProcess::spawn(self.worker_id.clone(), command);
        process.stdout_line(CONNECTED).await;
        WorkerProcess { process, worker_id: self.worker_id }
    }
}

/// A running worker process, killed when dropped.
#[derive(Debug)]
pub struct WorkerProcess {
    process: ChildProcess,
    worker_id: String,
}

impl WorkerProcess {
    /// `chorus agent <agent>` (a built-in agent: `echo`, `phases`, ...)
    /// working for `server_url` in `namespace`, with `options`.
    pub fn builtin_agent(agent: &str, server_url: &str, namespace: &str, options: &[&str], workdir: &Path) -> Self {
        let mut command = crate::process::command(chorus_bin(), workdir);
        command.args(["agent", agent, "--server", server_url, "--namespace", namespace]).args(options);
        let process = ChildProcess::spawn(format!("chorus agent {agent}"), command);
        Self { process, worker_id: String::new() }
    }

    /// The worker id its leases belong to (empty for a built-in agent).
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Kills the worker with `SIGKILL`, as a crash would.
    pub async fn kill(mut self) -> ExitStatus {
        self.process.kill().await
    }

    /// Stops the worker with `SIGTERM`.
    pub async fn stop(mut self) -> ExitStatus {
        self.process.terminate().await
    }

    /// What the worker wrote lately.
    pub fn output(&self) -> String {
        self.process.output()
    }
}
