//! chorus end-to-end tests: a sandbox that runs the real `chorus` binary
//! (`CHORUS_BIN`), worker processes, event-bus handler processes and hub
//! agent processes over real sockets.
//!
//! ```no_run
//! # async fn demo() {
//! let sandbox = chorus_tests::Sandbox::new();
//! let server = sandbox.dev().no_agents().start().await; // waits for gRPC health
//! let mut client = server.task_store().await;
//! # }
//! ```
//!
//! Every process is killed when its handle is dropped; the sandbox's
//! directory (data, working directories) is removed when it is dropped.

pub mod a2a;
pub mod acp;
pub mod agent;
pub mod grpc_web;
pub mod handler;
pub mod otlp;
pub mod process;
pub mod push;
pub mod server;
pub mod status;
pub mod tasks;
pub mod worker;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

pub use agent::TestAgentBuilder;
pub use handler::TestHandlerBuilder;
pub use process::ReadyProcess;
pub use server::{Server, ServerBuilder};
pub use worker::{Mode, TestWorkerBuilder, WorkerProcess};

/// The longest a test waits for anything (a process to start, a task to
/// finish): generous for a loaded machine; things normally take milliseconds.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A temporary directory for the processes of one test.
#[derive(Debug)]
pub struct Sandbox {
    dir: tempfile::TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("chorus-e2e-").tempdir();
        Self { dir: dir.unwrap_or_else(|error| panic!("cannot create a temporary directory: {error}")) }
    }

    /// The sandbox's directory: every process's working directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where `chorus dev` keeps its SQLite file; the same for every start,
    /// so a restarted server finds its data.
    pub fn data_dir(&self) -> PathBuf {
        self.path().join("data")
    }

    /// `chorus dev --listen 127.0.0.1:0 --data-dir <data_dir>`.
    pub fn dev(&self) -> ServerBuilder {
        ServerBuilder::dev(&self.data_dir(), self.path())
    }

    /// `chorus serve taskstore --listen 127.0.0.1:0 --database-url <database_url>`.
    pub fn serve_taskstore(&self, database_url: &str) -> ServerBuilder {
        self.serve("taskstore", database_url)
    }

    /// `chorus serve <service> --listen 127.0.0.1:0 --database-url <database_url>`.
    pub fn serve(&self, service: &str, database_url: &str) -> ServerBuilder {
        ServerBuilder::serve(service, database_url, self.path())
    }

    /// A `test-worker` (at `bin`) for the server at `server_url`; see [`test_worker!`].
    pub fn test_worker(&self, bin: impl Into<PathBuf>, server_url: &str) -> TestWorkerBuilder {
        TestWorkerBuilder::new(bin, server_url, self.path())
    }

    /// A `test-handler` (at `bin`) for handler `handler` of `namespace` on
    /// the server at `server_url`; see [`test_handler!`].
    pub fn test_handler(
        &self,
        bin: impl Into<PathBuf>,
        server_url: &str,
        namespace: &str,
        handler: &str,
    ) -> TestHandlerBuilder {
        TestHandlerBuilder::new(bin, server_url, namespace, handler, self.path())
    }

    /// A `test-agent` (at `bin`) for worker `agent_id` of `namespace` on the
    /// hub at `server_url`; see [`test_agent!`].
    pub fn test_agent(
        &self,
        bin: impl Into<PathBuf>,
        server_url: &str,
        namespace: &str,
        agent_id: &str,
    ) -> TestAgentBuilder {
        TestAgentBuilder::new(bin, server_url, namespace, agent_id, self.path())
    }

    /// `chorus agent echo --server <server_url> --namespace <namespace>`.
    pub fn echo_agent(&self, server_url: &str, namespace: &str) -> WorkerProcess {
        self.builtin_agent("echo", server_url, namespace)
    }

    /// `chorus agent <agent> --server <server_url> --namespace <namespace>`.
    pub fn builtin_agent(&self, agent: &str, server_url: &str, namespace: &str) -> WorkerProcess {
        WorkerProcess::builtin_agent(agent, server_url, namespace, &[], self.path())
    }

    /// As [`builtin_agent`](Self::builtin_agent), with `options` after the others.
    pub fn builtin_agent_with(
        &self,
        agent: &str,
        server_url: &str,
        namespace: &str,
        options: &[&str],
    ) -> WorkerProcess {
        WorkerProcess::builtin_agent(agent, server_url, namespace, options, self.path())
    }
}

/// `sandbox.test_worker(<this package's test-worker binary>, server_url)`:
/// only integration tests know the binary's path, so this is a macro.
#[macro_export]
macro_rules! test_worker {
    ($sandbox:expr, $server_url:expr) => {
        $sandbox.test_worker(env!("CARGO_BIN_EXE_test-worker"), $server_url)
    };
}

/// `sandbox.test_handler(<this package's test-handler binary>, server_url,
/// namespace, handler)`: only integration tests know the binary's path, so
/// this is a macro.
#[macro_export]
macro_rules! test_handler {
    ($sandbox:expr, $server_url:expr, $namespace:expr, $handler:expr) => {
        $sandbox.test_handler(env!("CARGO_BIN_EXE_test-handler"), $server_url, $namespace, $handler)
    };
}

/// `sandbox.test_agent(<this package's test-agent binary>, server_url,
/// namespace, agent_id)`: only integration tests know the binary's path, so
/// this is a macro.
#[macro_export]
macro_rules! test_agent {
    ($sandbox:expr, $server_url:expr, $namespace:expr, $agent_id:expr) => {
        $sandbox.test_agent(env!("CARGO_BIN_EXE_test-agent"), $server_url, $namespace, $agent_id)
    };
}
