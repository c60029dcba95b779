//! A `chorus` server process (`chorus dev` or `chorus serve <service>`):
//! started from `CHORUS_BIN`, found by the address it announces, ready once
//! gRPC health reports its service SERVING (the task store for `chorus dev`).

use std::{
    ffi::OsString,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::Duration,
};

use chorus_proto::{
    eventbus::event_bus_client::EventBusClient, hub::hub_client::HubClient,
    taskstore::task_store_client::TaskStoreClient,
};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};

use crate::{DEADLINE, process::ChildProcess};

/// The gRPC service a chorus server reports in its health once ready.
pub const TASK_STORE_SERVICE: &str = "chorus.taskstore.v1.TaskStore";
/// What a server prints on stdout, followed by its URL, once it listens.
const ANNOUNCEMENT: &str = "chorus listening on ";
/// How often readiness is checked while a server starts.
const READY_POLL: Duration = Duration::from_millis(25);

/// The `chorus` binary under test.
///
/// # Panics
/// When `CHORUS_BIN` is unset or names no file.
pub fn chorus_bin() -> PathBuf {
    let Some(bin) = std::env::var_os("CHORUS_BIN") else {
        panic!(
            "CHORUS_BIN is not set: run the tests with `make test`, or build the binary \
             (`cargo build --bin chorus`) and set CHORUS_BIN to its absolute path (target/debug/chorus)"
        );
    };
    let bin = PathBuf::from(bin);
    if !bin.is_file() {
        panic!("CHORUS_BIN={} is not a file: run `make test`, or `cargo build --bin chorus` first", bin.display());
    }
    bin
}

/// How to start one `chorus` server process.
#[derive(Debug)]
#[must_use = "a builder does nothing until `start`"]
pub struct ServerBuilder {
    name: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    workdir: PathBuf,
    /// The gRPC service whose health says the server is ready.
    ready_service: String,
}

impl ServerBuilder {
    /// `chorus dev` with SQLite in `data_dir`, run in `workdir`.
    pub(crate) fn dev(data_dir: &Path, workdir: &Path) -> Self {
        let args = ["dev", "--listen", "127.0.0.1:0", "--data-dir"].map(OsString::from);
        let mut args = args.to_vec();
        args.push(data_dir.into());
        let ready_service = TASK_STORE_SERVICE.to_owned();
        let env = vec![local_delegation()];
        Self { name: "chorus dev".to_owned(), args, env, workdir: workdir.to_owned(), ready_service }
    }

    /// `chorus serve <service>` on `database_url`, run in `workdir`.
    pub(crate) fn serve(service: &str, database_url: &str, workdir: &Path) -> Self {
        let args = ["serve", service, "--listen", "127.0.0.1:0", "--database-url", database_url];
        let ready_service = match service {
            "taskstore" => TASK_STORE_SERVICE,
            "eventbus" => "chorus.eventbus.v1.EventBus",
            "hub" => "chorus.hub.v1.Hub",
            "workflow" => "chorus.workflow.v1.Workflow",
            _ => "",
        };
        Self {
            name: format!("chorus serve {service}"),
            args: args.map(OsString::from).to_vec(),
            env: vec![local_delegation()],
            workdir: workdir.to_owned(),
            ready_service: ready_service.to_owned(),
        }
    }

    /// Listens on `address` rather than a free port: a server restarted where
    /// its clients know it.
    pub fn listen(mut self, address: SocketAddr) -> Self {
        let port = self.args.iter().position(|arg| arg == "--listen").map_or(self.args.len(), |flag| flag + 1);
        self.args[port] = address.to_string().into();
        self
    }

    /// Without the built-in agents (`chorus dev --no-agents`).
    pub fn no_agents(mut self) -> Self {
        self.args.push("--no-agents".into());
        self
    }

    /// Sets an environment variable of the process (the last setting of a
    /// variable wins), such as
    /// `CHORUS_TASKSTORE__REAPER_INTERVAL_MS`.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Names the process in messages (to tell replicas apart).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Starts the process and waits until it serves.
    ///
    /// # Panics
    /// When it does not announce its address or become ready within [`DEADLINE`].
    pub async fn start(self) -> Server {
        let mut command = crate::process::command(chorus_bin(), &self.workdir);
        command.args(&self.args).envs(self.env);
        let mut process = ChildProcess::spawn(self.name, command);
        let line = process.stdout_line(ANNOUNCEMENT).await;
        let url = line[ANNOUNCEMENT.len()..].trim().to_owned();
        let address = url.strip_prefix("http://").and_then(|address| address.parse().ok());
        let Some(address) = address else {
            process.fail(&format!("announced `{line}`, which has no http://IP:PORT")).await
        };
        let mut server = Server { process, url, address, ready_service: self.ready_service };
        server.wait_until_serving().await;
        server
    }
}

/// A running `chorus` server, killed when dropped.
#[derive(Debug)]
pub struct Server {
    process: ChildProcess,
    url: String,
    address: SocketAddr,
    ready_service: String,
}

impl Server {
    /// `http://127.0.0.1:PORT`, as announced.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// A new connection to the server.
    pub async fn channel(&self) -> Channel {
        match endpoint(&self.url).connect().await {
            Ok(channel) => channel,
            Err(error) => panic!("cannot connect to {} at {}: {error}", self.process.name(), self.url),
        }
    }

    /// A task-store client over a new connection.
    pub async fn task_store(&self) -> TaskStoreClient<Channel> {
        TaskStoreClient::new(self.channel().await)
    }

    /// An event-bus client over a new connection.
    pub async fn event_bus(&self) -> EventBusClient<Channel> {
        EventBusClient::new(self.channel().await)
    }

    /// A hub client over a new connection.
    pub async fn hub(&self) -> HubClient<Channel> {
        HubClient::new(self.channel().await)
    }

    /// What gRPC health says of the server's service now.
    pub async fn health(&self) -> Result<ServingStatus, String> {
        health_status(&self.url, &self.ready_service).await
    }

    /// Asserts the server still answers health with its service SERVING.
    pub async fn assert_serving(&self) {
        let status = self.health().await;
        assert_eq!(status, Ok(ServingStatus::Serving), "{} should still serve", self.process.name());
    }

    /// What the server wrote lately (its logs).
    pub fn output(&self) -> String {
        self.process.output()
    }

    /// Stops the server gracefully (`SIGTERM`) and returns how it exited.
    pub async fn stop(mut self) -> ExitStatus {
        self.process.terminate().await
    }

    /// Kills the server (`SIGKILL`).
    pub async fn kill(mut self) -> ExitStatus {
        self.process.kill().await
    }

    /// Polls gRPC health until the server's service is SERVING.
    async fn wait_until_serving(&mut self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let status = self.health().await;
            if status == Ok(ServingStatus::Serving) {
                return;
            }
            if let Some(exit) = self.process.exit_status() {
                self.process.fail(&format!("exited ({exit}) before it was ready")).await;
            }
            if Instant::now() >= deadline {
                let problem = format!("was not SERVING within {DEADLINE:?}; last health answer: {status:?}");
                self.process.fail(&problem).await;
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}

fn endpoint(url: &str) -> Endpoint {
    let endpoint = Endpoint::from_shared(url.to_owned()).unwrap_or_else(|error| panic!("bad url {url}: {error}"));
    endpoint.connect_timeout(Duration::from_secs(5))
}

/// One health check of `service` over a fresh connection.
async fn health_status(url: &str, service: &str) -> Result<ServingStatus, String> {
    let check = async {
        let channel = endpoint(url).connect().await.map_err(|error| format!("connect: {error}"))?;
        let request = HealthCheckRequest { service: service.to_owned() };
        let response = HealthClient::new(channel).check(request).await.map_err(|status| status.to_string())?;
        Ok(response.into_inner().status())
    };
    tokio::time::timeout(Duration::from_secs(5), check).await.unwrap_or_else(|_| Err("timed out".to_owned()))
}

/// The external agents these tests delegate to listen on loopback, which a
/// gateway refuses to call by default; the test of that refusal sets it back.
fn local_delegation() -> (OsString, OsString) {
    ("CHORUS_GATEWAY__DELEGATE__ALLOW_PRIVATE".into(), "true".into())
}
