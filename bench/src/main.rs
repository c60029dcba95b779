//! `chorus-bench` (`make bench`), beside the raw commit rate pgbench gets
//! from the same PostgreSQL:
//!
//! - `taskstore`: task-store round trips — CreateTask, the ClaimedTask on a
//!   worker's stream, CompleteTask — on PostgreSQL and SQLite;
//! - `eventbus`: events published in batches through the event bus on
//!   PostgreSQL and finished by a chain of three handlers;
//! - `nats`: the same load on NATS JetStream (file storage), for comparison.
//!
//! The chorus binary is built here with `cargo build --release --bin chorus`
//! (a debug binary would measure the wrong thing), unless `--chorus-bin` /
//! `CHORUS_BENCH_BIN` names one, which must then be a release build too.
//! `CHORUS_BIN` is not used: the Makefile points it at the debug binary.
//!
//! Every PostgreSQL database and NATS stream is a scratch one, dropped at
//! the end however the run ends (Ctrl-C included); child processes die with
//! the run.

mod cpu;
mod eventbus;
mod flow;
mod load;
mod nats;
mod notify;
mod pgbench;
mod postgres;
mod report;
mod scenario;
mod server;
mod stats;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::{
    eventbus::{
        BusPlan,
        report::{BusReport, BusRunConfig},
    },
    pgbench::{Pgbench, RawResult},
    postgres::Admin,
    report::{GOAL_CLIENTS, Report, RunConfig},
    scenario::{Backend, Plan},
};

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    Taskstore,
    Eventbus,
    Nats,
}

#[derive(Debug, Parser)]
#[command(
    name = "chorus-bench",
    about = "Task-store round trips and event-bus throughput against the raw PostgreSQL commit rate and NATS"
)]
struct Options {
    /// What to measure.
    #[arg(long, env = "CHORUS_BENCH_SCENARIOS", value_enum, value_delimiter = ',', default_values = ["taskstore", "eventbus", "nats"])]
    scenarios: Vec<Scenario>,
    /// Measured seconds of each run.
    #[arg(long, env = "CHORUS_BENCH_SECONDS", default_value_t = 10)]
    seconds: u64,
    /// Seconds of round trips that fill each new chorus database before the
    /// first measured run (0: measure from empty tables).
    #[arg(long, env = "CHORUS_BENCH_PRIME", default_value_t = 3)]
    prime: u64,
    /// Warm-up seconds before each chorus run's measured window.
    #[arg(long, env = "CHORUS_BENCH_WARMUP", default_value_t = 2)]
    warmup: u64,
    /// Concurrent task-store clients, one run each (pgbench -c, chorus workers).
    #[arg(long, env = "CHORUS_BENCH_CLIENTS", value_delimiter = ',', default_values_t = [1, 16])]
    clients: Vec<usize>,
    /// Backends to run the task store on (PostgreSQL also runs pgbench).
    #[arg(long, env = "CHORUS_BENCH_BACKENDS", value_enum, value_delimiter = ',', default_values = ["postgres", "sqlite"])]
    backends: Vec<Backend>,
    /// A PostgreSQL maintenance database; scratch databases are made beside it.
    #[arg(
        long,
        env = "CHORUS_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    postgres_url: String,
    /// A release `chorus` binary to use instead of building one.
    #[arg(long, env = "CHORUS_BENCH_BIN")]
    chorus_bin: Option<PathBuf>,
    #[arg(long, env = "CHORUS_BENCH_PGBENCH", default_value = "pgbench")]
    pgbench: PathBuf,
    /// The task-store JSON summary (default: target/bench/taskstore.json).
    #[arg(long, env = "CHORUS_BENCH_OUTPUT")]
    output: Option<PathBuf>,
    /// Events per PublishBatch (and per pipelined JetStream batch), one
    /// event-bus and one NATS run each.
    #[arg(long, env = "CHORUS_BENCH_BATCH_SIZES", value_delimiter = ',', default_values_t = [100, 1])]
    batch_sizes: Vec<u32>,
    /// Concurrent publishers of the event-bus and NATS runs.
    #[arg(long, env = "CHORUS_BENCH_PUBLISHERS", default_value_t = 4)]
    publishers: usize,
    /// Most events published and not yet finished by the last consumer.
    #[arg(long, env = "CHORUS_BENCH_BACKLOG", default_value_t = 2000)]
    backlog: usize,
    /// Most unacked deliveries a consumer holds (Subscribe max_in_flight,
    /// JetStream max_ack_pending).
    #[arg(long, env = "CHORUS_BENCH_MAX_IN_FLIGHT", default_value_t = 500)]
    max_in_flight: u32,
    /// Most deliveries one Ack call carries.
    #[arg(long, env = "CHORUS_BENCH_ACK_BATCH", default_value_t = 200)]
    ack_batch: usize,
    /// A NATS server with JetStream; a scratch stream is made on it.
    #[arg(long, env = "CHORUS_BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The event-bus JSON summary (default: target/bench/eventbus.json).
    #[arg(long, env = "CHORUS_BENCH_EVENTBUS_OUTPUT")]
    eventbus_output: Option<PathBuf>,
}

impl Options {
    fn check(&self) -> anyhow::Result<()> {
        if !(1..=600).contains(&self.seconds) || self.warmup > 60 || self.prime > 60 {
            bail!("--seconds must be 1..=600, --warmup and --prime at most 60");
        }
        // pgbench and the chorus pool must fit in max_connections (100 by default).
        if self.clients.is_empty() || self.clients.iter().any(|&clients| !(1..=64).contains(&clients)) {
            bail!("--clients must list counts from 1 to 64");
        }
        if self.backends.is_empty() {
            bail!("--backends must name at least one backend");
        }
        if self.scenarios.is_empty() {
            bail!("--scenarios must name at least one scenario");
        }
        let largest_batch = self.batch_sizes.iter().copied().max().unwrap_or(0);
        if self.batch_sizes.is_empty() || self.batch_sizes.iter().any(|&batch| !(1..=1000).contains(&batch)) {
            bail!("--batch-sizes must list sizes from 1 to 1000");
        }
        if !(1..=64).contains(&self.publishers) {
            bail!("--publishers must be 1..=64");
        }
        if !(largest_batch as usize..=1_000_000).contains(&self.backlog) {
            bail!("--backlog must hold the largest batch and be at most 1000000");
        }
        if !(1..=1000).contains(&self.max_in_flight) || !(1..=1000).contains(&self.ack_batch) {
            bail!("--max-in-flight and --ack-batch must be 1..=1000");
        }
        Ok(())
    }

    fn has(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }

    /// The client counts pgbench runs at: the task store's on PostgreSQL,
    /// and the goal's for the event bus.
    fn raw_clients(&self) -> Vec<usize> {
        let mut clients = Vec::new();
        if self.has(Scenario::Taskstore) && self.backends.contains(&Backend::Postgres) {
            clients.extend(&self.clients);
        }
        if self.has(Scenario::Eventbus) {
            clients.push(GOAL_CLIENTS);
        }
        clients.sort_unstable();
        clients.dedup();
        clients
    }

    fn bus_plan(&self) -> BusPlan {
        BusPlan {
            batch_sizes: self.batch_sizes.clone(),
            publishers: self.publishers,
            backlog: self.backlog,
            max_in_flight: self.max_in_flight,
            ack_batch: self.ack_batch,
            prime: Duration::from_secs(self.prime),
            warmup: Duration::from_secs(self.warmup),
            measure: Duration::from_secs(self.seconds),
        }
    }

    fn plan(&self) -> Plan {
        Plan {
            clients: self.clients.clone(),
            prime: Duration::from_secs(self.prime),
            warmup: Duration::from_secs(self.warmup),
            measure: Duration::from_secs(self.seconds),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = Options::parse();
    options.check()?;
    let interrupt = CancellationToken::new();
    let on_signal = interrupt.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("interrupted: stopping chorus and dropping the scratch databases…");
            on_signal.cancel();
        }
    });
    let (taskstore, bus) = run(&options, &interrupt).await?;
    if let Some(report) = taskstore {
        let path = options.output.clone().unwrap_or_else(|| report::default_json_path("taskstore.json"));
        report.write_json(&path)?;
        print!("{}", report.table(&path));
    }
    if let Some(report) = bus {
        let path = options.eventbus_output.clone().unwrap_or_else(|| report::default_json_path("eventbus.json"));
        report.write_json(&path)?;
        print!("{}", report.table(&path));
    }
    Ok(())
}

/// What every part of a run shares: when it started, the machine, the
/// PostgreSQL server and pgbench's raw commit rates.
#[derive(Debug)]
struct Common {
    started_unix: u64,
    cores: usize,
    chorus_env: Vec<String>,
    postgres_version: Option<String>,
    postgres_durability: Option<String>,
    pgbench_version: Option<String>,
    raw: Vec<RawResult>,
}

async fn run(options: &Options, interrupt: &CancellationToken) -> anyhow::Result<(Option<Report>, Option<BusReport>)> {
    let binary = if options.has(Scenario::Taskstore) || options.has(Scenario::Eventbus) {
        Some(chorus_binary(options).await?)
    } else {
        None
    };
    let admin = Admin::new(&options.postgres_url);
    let common = prepare(options, &admin, interrupt).await?;
    let taskstore = match (options.has(Scenario::Taskstore), &binary) {
        (true, Some(binary)) => Some(run_taskstore(options, &admin, binary, &common, interrupt).await?),
        _ => None,
    };
    let bus = if options.has(Scenario::Eventbus) || options.has(Scenario::Nats) {
        Some(run_bus(options, &admin, binary.as_deref(), common, interrupt).await?)
    } else {
        None
    };
    Ok((taskstore, bus))
}

/// Reads the machine and the PostgreSQL server, drops what earlier runs
/// left behind, and runs pgbench at every client count a scenario needs.
async fn prepare(options: &Options, admin: &Admin, interrupt: &CancellationToken) -> anyhow::Result<Common> {
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let mut common = Common {
        started_unix,
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        chorus_env: chorus_env(),
        postgres_version: None,
        postgres_durability: None,
        pgbench_version: None,
        raw: Vec::new(),
    };
    let raw_clients = options.raw_clients();
    if raw_clients.is_empty() {
        return Ok(common);
    }
    common.postgres_version = Some(admin.server_version().await?);
    common.postgres_durability = Some(admin.durability().await?);
    for name in admin.drop_stale().await? {
        eprintln!("dropped {name}, left behind by an earlier run");
    }
    let (raw, version) = run_raw(admin, options, &raw_clients, interrupt).await?;
    common.raw = raw;
    common.pgbench_version = Some(version);
    Ok(common)
}

/// The task store on every backend at every client count.
async fn run_taskstore(
    options: &Options,
    admin: &Admin,
    binary: &Path,
    common: &Common,
    interrupt: &CancellationToken,
) -> anyhow::Result<Report> {
    let plan = options.plan();
    let mut chorus = Vec::new();
    if options.backends.contains(&Backend::Postgres) {
        chorus.extend(scenario::run_postgres(admin, binary, &plan, interrupt).await?);
    }
    if options.backends.contains(&Backend::Sqlite) {
        chorus.extend(scenario::run_sqlite(binary, &plan, interrupt).await?);
    }
    let config = RunConfig {
        started_unix: common.started_unix,
        seconds: options.seconds,
        warmup_seconds: options.warmup,
        prime_seconds: options.prime,
        clients: options.clients.clone(),
        backends: options.backends.clone(),
        cores: common.cores,
        commit_budget_per_round_trip: scenario::COMMIT_BUDGET,
        chorus_bin: binary.display().to_string(),
        chorus_env: common.chorus_env.clone(),
        postgres_version: common.postgres_version.clone(),
        pgbench_version: common.pgbench_version.clone(),
    };
    let raw = common.raw.iter().filter(|raw| options.clients.contains(&raw.clients)).cloned().collect();
    Ok(Report::new(config, raw, chorus))
}

/// The event bus (with `binary`) and NATS, as the scenarios ask, at every
/// batch size.
async fn run_bus(
    options: &Options,
    admin: &Admin,
    binary: Option<&Path>,
    common: Common,
    interrupt: &CancellationToken,
) -> anyhow::Result<BusReport> {
    let plan = options.bus_plan();
    let mut chorus = Vec::new();
    if let (true, Some(binary)) = (options.has(Scenario::Eventbus), binary) {
        chorus = eventbus::run_postgres(admin, binary, &plan, interrupt).await?;
    }
    let nats =
        if options.has(Scenario::Nats) { Some(nats::run(&options.nats_url, &plan, interrupt).await?) } else { None };
    let config = BusRunConfig {
        started_unix: common.started_unix,
        seconds: options.seconds,
        warmup_seconds: options.warmup,
        prime_seconds: options.prime,
        cores: common.cores,
        handlers: eventbus::chain::describe(),
        publishers: options.publishers,
        batch_sizes: options.batch_sizes.clone(),
        backlog: options.backlog,
        max_in_flight: options.max_in_flight,
        ack_batch: options.ack_batch,
        chorus_bin: binary.map(|binary| binary.display().to_string()),
        chorus_env: common.chorus_env,
        postgres_version: common.postgres_version,
        postgres_durability: common.postgres_durability,
        pgbench_version: common.pgbench_version,
        nats_url: options.has(Scenario::Nats).then(|| options.nats_url.clone()),
    };
    Ok(BusReport::new(config, &common.raw, chorus, nats))
}

/// The release chorus binary: named by the caller, or built.
async fn chorus_binary(options: &Options) -> anyhow::Result<PathBuf> {
    let binary = match &options.chorus_bin {
        Some(binary) => binary.clone(),
        None => server::build_release().await?,
    };
    // Absolute: chorus runs in a scratch directory.
    let binary = std::fs::canonicalize(&binary).with_context(|| format!("no chorus binary at {}", binary.display()))?;
    if !binary.is_file() {
        bail!("{} is not a file", binary.display());
    }
    Ok(binary)
}

/// Names of the `CHORUS_*` variables chorus inherits, sorted.
fn chorus_env() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("CHORUS_") && !name.starts_with("CHORUS_BENCH_"))
        .collect();
    names.sort();
    names
}

/// pgbench at every client count, on a scratch database.
async fn run_raw(
    admin: &Admin,
    options: &Options,
    clients: &[usize],
    interrupt: &CancellationToken,
) -> anyhow::Result<(Vec<RawResult>, String)> {
    let seconds = options.seconds;
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let (pgbench, version) = Pgbench::prepare(&options.pgbench, workdir.path()).await?;
    admin
        .with_scratch("raw", interrupt, |db| async move {
            pgbench.create_table(&db).await?;
            let mut counter = admin.commit_counter(&db.name).await?;
            let mut results = Vec::with_capacity(clients.len());
            for &clients in clients {
                eprintln!("pgbench: {clients} client(s), {seconds} s…");
                results.push(pgbench.run(&db, clients, seconds, &mut counter).await?);
            }
            Ok((results, version))
        })
        .await
}
