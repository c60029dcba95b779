//! The `gateway` scenario: blocking A2A `SendMessage` calls (JSON-RPC,
//! `A2A-Version: 1.0`, a fresh messageId each) from closed-loop clients,
//! against chorus (`chorus dev`, agent `echo`: every call is a durable task,
//! created, claimed by the built-in echo worker and completed) and against
//! the reference Python server (a2a-sdk 1.3.0, `a2a_sdk_echo_server.py`),
//! in the same run:
//!
//! - `sqlite`: chorus on SQLite against the a2a-sdk with its in-memory store,
//!   and with its `DatabaseTaskStore` on a SQLite file (aiosqlite);
//! - `postgres`: both on a scratch PostgreSQL database.
//!
//! Then the streaming-memory point ([`streams`]): many `SubscribeToTask`
//! streams held open against chorus, and what they cost it in RSS.

mod peer;
pub(crate) mod report;
mod send;
mod streams;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, anyhow, bail};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub(crate) use self::{peer::PeerInfo, send::Point, streams::StreamsResult};
use self::{
    peer::{PeerSetup, PeerStore},
    send::GATEWAY_AGENT,
};
use crate::{postgres::Admin, scenario::Backend, server::Server};

/// The `gateway` scenario's flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct GatewayOptions {
    /// Concurrent SendMessage clients, one measured point each.
    #[arg(long, env = "CHORUS_BENCH_GATEWAY_CLIENTS", value_delimiter = ',', default_values_t = [1, 16, 64])]
    pub(crate) gateway_clients: Vec<usize>,
    /// Pairings to measure: sqlite (chorus on SQLite, the a2a-sdk in memory
    /// and on SQLite), postgres (both on PostgreSQL).
    #[arg(long, env = "CHORUS_BENCH_GATEWAY_BACKENDS", value_enum, value_delimiter = ',', default_values = ["sqlite", "postgres"])]
    pub(crate) gateway_backends: Vec<Backend>,
    /// SSE streams held open against chorus for the memory point (0: none).
    /// Each is a connection of this process and of chorus: `ulimit -n` must
    /// allow them.
    #[arg(long, env = "CHORUS_BENCH_GATEWAY_STREAMS", default_value_t = 1000)]
    pub(crate) gateway_streams: usize,
    /// The a2a-sdk echo server (default: ../shared/peers/a2a_sdk_echo_server.py
    /// beside the workspace); it runs in its own directory.
    #[arg(long, env = "CHORUS_BENCH_PEER_SERVER")]
    pub(crate) peer_server: Option<PathBuf>,
    /// A Python venv with a2a-sdk 1.3.0 and uvicorn, made when missing
    /// (default: target/bench/peers-venv).
    #[arg(long, env = "CHORUS_BENCH_PEER_VENV")]
    pub(crate) peer_venv: Option<PathBuf>,
    /// The Python that makes the venv.
    #[arg(long, env = "CHORUS_BENCH_PYTHON", default_value = "python3")]
    pub(crate) python: PathBuf,
    /// The gateway JSON summary (default: target/bench/gateway.json).
    #[arg(long, env = "CHORUS_BENCH_GATEWAY_OUTPUT")]
    pub(crate) gateway_output: Option<PathBuf>,
}

/// File descriptors this process keeps for itself beside the streams.
const SPARE_FDS: u64 = 256;

impl GatewayOptions {
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.gateway_clients.is_empty() || self.gateway_clients.iter().any(|&clients| !(1..=1024).contains(&clients))
        {
            bail!("--gateway-clients must list counts from 1 to 1024");
        }
        if self.gateway_backends.is_empty() && self.gateway_streams == 0 {
            bail!("--gateway-backends must name a backend, or --gateway-streams be above 0");
        }
        if self.gateway_streams > 20_000 {
            bail!("--gateway-streams must be at most 20000");
        }
        if self.gateway_streams > 0 {
            // chorus inherits the limit, and holds one connection per stream too.
            let limit = open_files_limit()?;
            let needed = self.gateway_streams as u64 + SPARE_FDS;
            if limit < needed {
                bail!(
                    "{} streams need at least {needed} open files, the limit is {limit}: raise it \
                     (`ulimit -n {needed}`) or lower --gateway-streams",
                    self.gateway_streams
                );
            }
        }
        Ok(())
    }

    pub(crate) fn uses_postgres(&self) -> bool {
        self.gateway_backends.contains(&Backend::Postgres)
    }

    fn peer_server(&self) -> PathBuf {
        self.peer_server
            .clone()
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/peers/a2a_sdk_echo_server.py"))
    }

    fn peer_venv(&self) -> PathBuf {
        self.peer_venv.clone().unwrap_or_else(|| crate::report::default_json_path("peers-venv"))
    }
}

/// The soft limit on open files of this process (`/proc/self/limits`).
fn open_files_limit() -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").context("cannot read /proc/self/limits")?;
    let line = limits.lines().find(|line| line.starts_with("Max open files")).context("no open-files limit")?;
    let soft = line.trim_start_matches("Max open files").split_whitespace().next().unwrap_or_default();
    Ok(if soft == "unlimited" { u64::MAX } else { soft.parse().context("unexpected /proc/self/limits format")? })
}

/// Durations and counts shared by every point.
#[derive(Debug, Clone)]
pub(crate) struct GatewayPlan {
    pub(crate) clients: Vec<usize>,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
    pub(crate) streams: usize,
}

/// A server the load runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum System {
    ChorusSqlite,
    ChorusPostgres,
    A2aSdkMemory,
    A2aSdkSqlite,
    A2aSdkPostgres,
}

impl System {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::ChorusSqlite => "chorus-sqlite",
            Self::ChorusPostgres => "chorus-postgres",
            Self::A2aSdkMemory => "a2a-sdk-memory",
            Self::A2aSdkSqlite => "a2a-sdk-sqlite",
            Self::A2aSdkPostgres => "a2a-sdk-postgres",
        }
    }
}

/// Every point of one system.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SystemRuns {
    pub(crate) system: System,
    /// Where its JSON-RPC endpoint was (the port differs from run to run).
    pub(crate) url: String,
    pub(crate) points: Vec<Point>,
}

/// What the scenario measured.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) systems: Vec<SystemRuns>,
    pub(crate) peer: Option<PeerInfo>,
    pub(crate) streams: Option<StreamsResult>,
}

/// Every pairing of `options`, each peer beside its chorus, then the
/// streaming-memory point.
pub(crate) async fn run(
    admin: &Admin,
    binary: &Path,
    options: &GatewayOptions,
    plan: &GatewayPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<Measured> {
    let setup = if options.gateway_backends.is_empty() {
        None
    } else {
        Some(peer::prepare(&options.python, &options.peer_venv(), &options.peer_server()).await?)
    };
    let mut systems = Vec::new();
    if let (true, Some(setup)) = (options.gateway_backends.contains(&Backend::Sqlite), &setup) {
        let pair = async {
            let chorus = run_chorus(System::ChorusSqlite, binary, None, plan).await?;
            let memory = run_a2a_sdk(System::A2aSdkMemory, setup, PeerStore::Memory, plan).await?;
            let sqlite = run_a2a_sdk(System::A2aSdkSqlite, setup, PeerStore::Sqlite, plan).await?;
            Ok::<_, anyhow::Error>([chorus, memory, sqlite])
        };
        systems.extend(interruptible(pair, interrupt).await?);
    }
    if let (true, Some(setup)) = (options.uses_postgres(), &setup) {
        let chorus = admin
            .with_scratch("gateway", interrupt, |db| async move {
                run_chorus(System::ChorusPostgres, binary, Some(&db.url), plan).await
            })
            .await?;
        let peer = admin
            .with_scratch("a2a_sdk", interrupt, |db| async move {
                let url = peer::asyncpg_url(&db.url)?;
                run_a2a_sdk(System::A2aSdkPostgres, setup, PeerStore::Postgres(&url), plan).await
            })
            .await?;
        systems.extend([chorus, peer]);
    }
    let streams =
        if plan.streams > 0 { Some(interruptible(run_streams(binary, plan), interrupt).await?) } else { None };
    Ok(Measured { systems, peer: setup.map(|setup| setup.info), streams })
}

async fn interruptible<T>(
    work: impl Future<Output = anyhow::Result<T>>,
    interrupt: &CancellationToken,
) -> anyhow::Result<T> {
    tokio::select! {
        outcome = work => outcome,
        () = interrupt.cancelled() => Err(anyhow!("interrupted")),
    }
}

/// `chorus dev` on `database_url` (SQLite in a temp dir when `None`), one
/// server for every point.
async fn run_chorus(
    system: System,
    binary: &Path,
    database_url: Option<&str>,
    plan: &GatewayPlan,
) -> anyhow::Result<SystemRuns> {
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let mut server = Server::start_dev(binary, database_url, workdir.path()).await?;
    let url = format!("{}/a2a/{GATEWAY_AGENT}", server.endpoint);
    let outcome = async {
        let points = points(system, &url, server.pid, plan).await?;
        server.check_running()?;
        Ok::<_, anyhow::Error>(points)
    }
    .await
    .map_err(|error| anyhow!("{error:#}\nchorus stderr:\n{}", server.log_tail()));
    let stopped = server.stop().await;
    let points = outcome?;
    stopped?;
    Ok(SystemRuns { system, url, points })
}

/// The a2a-sdk echo server on `store`.
async fn run_a2a_sdk(
    system: System,
    setup: &PeerSetup,
    store: PeerStore<'_>,
    plan: &GatewayPlan,
) -> anyhow::Result<SystemRuns> {
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let mut server = peer::Peer::start(setup, store, workdir.path()).await?;
    let url = server.url.clone();
    let outcome = async {
        let points = points(system, &url, server.pid, plan).await?;
        server.check_running()?;
        Ok::<_, anyhow::Error>(points)
    }
    .await
    .map_err(|error| anyhow!("{error:#}\na2a-sdk server log:\n{}", server.log_tail()));
    let stopped = server.stop().await;
    let points = outcome?;
    stopped?;
    Ok(SystemRuns { system, url, points })
}

/// The load at every client count, one after the other.
async fn points(system: System, url: &str, server_pid: u32, plan: &GatewayPlan) -> anyhow::Result<Vec<Point>> {
    let mut points = Vec::with_capacity(plan.clients.len());
    for &clients in &plan.clients {
        eprintln!(
            "gateway, {}: {clients} client(s), {:?} warm-up + {:?} measured…",
            system.name(),
            plan.warmup,
            plan.measure
        );
        let point = send::run(url, server_pid, clients, plan.warmup, plan.measure).await?;
        if point.errors > 0 {
            eprintln!("  {} error(s), the first: {}", point.errors, point.first_error.as_deref().unwrap_or_default());
        }
        points.push(point);
    }
    Ok(points)
}

/// The streaming-memory point, on a fresh `chorus dev` on SQLite.
async fn run_streams(binary: &Path, plan: &GatewayPlan) -> anyhow::Result<StreamsResult> {
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let mut server = Server::start_dev(binary, None, workdir.path()).await?;
    let outcome = async {
        let result = streams::run(&server.endpoint, server.pid, plan.streams).await?;
        server.check_running()?;
        Ok::<_, anyhow::Error>(result)
    }
    .await
    .map_err(|error| anyhow!("{error:#}\nchorus stderr:\n{}", server.log_tail()));
    let stopped = server.stop().await;
    let result = outcome?;
    stopped?;
    Ok(result)
}
