//! `chorus-bench` (`make bench`), beside the raw commit rate pgbench gets
//! from the same PostgreSQL:
//!
//! - `taskstore`: task-store round trips — CreateTask, the ClaimedTask on a
//!   worker's stream, CompleteTask — on PostgreSQL and SQLite;
//! - `eventbus`: events published in batches through the event bus on
//!   PostgreSQL and finished by a chain of three handlers;
//! - `nats`: the same load on NATS JetStream (file storage), for comparison;
//! - `hub`: topic fan-out (1 publisher, 10 subscribers) and direct round
//!   trips through the hub on PostgreSQL and SQLite, and the same work on
//!   NATS JetStream and Redis Streams.
//!
//! The chorus binary is built here with `cargo build --release --bin chorus`
//! (a debug binary would measure the wrong thing), unless `--chorus-bin` /
//! `CHORUS_BENCH_BIN` names one, which must then be a release build too.
//! `CHORUS_BIN` is not used: the Makefile points it at the debug binary.
//!
//! Every PostgreSQL database, NATS stream and Redis key is a scratch one,
//! dropped at the end however the run ends (Ctrl-C included); child
//! processes die with the run.

mod cpu;
mod eventbus;
mod flow;
mod hub;
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
    hub::{
        HubPlan,
        report::{HubReport, HubRunConfig, SQLITE_DURABILITY},
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
    Hub,
}

#[derive(Debug, Parser)]
#[command(
    name = "chorus-bench",
    about = "Task-store round trips, event-bus throughput and hub messaging against the raw PostgreSQL commit rate, \
             NATS JetStream and Redis Streams"
)]
struct Options {
    /// What to measure.
    #[arg(long, env = "CHORUS_BENCH_SCENARIOS", value_enum, value_delimiter = ',', default_values = ["taskstore", "eventbus", "nats", "hub"])]
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
    /// Backends to run the task store and the hub on (PostgreSQL also runs pgbench).
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
    /// Most unacked deliveries a consumer holds (Subscribe and StreamInbox
    /// max_in_flight, JetStream max_ack_pending, Redis XREADGROUP COUNT).
    #[arg(long, env = "CHORUS_BENCH_MAX_IN_FLIGHT", default_value_t = 500)]
    max_in_flight: u32,
    /// Most deliveries one Ack (or XACK) call carries.
    #[arg(long, env = "CHORUS_BENCH_ACK_BATCH", default_value_t = 200)]
    ack_batch: usize,
    /// A NATS server with JetStream; a scratch stream is made on it.
    #[arg(long, env = "CHORUS_BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The event-bus JSON summary (default: target/bench/eventbus.json).
    #[arg(long, env = "CHORUS_BENCH_EVENTBUS_OUTPUT")]
    eventbus_output: Option<PathBuf>,
    /// Subscribers of the hub's fan-out topic (JetStream consumers, Redis groups).
    #[arg(long, env = "CHORUS_BENCH_HUB_SUBSCRIBERS", default_value_t = 10)]
    hub_subscribers: usize,
    /// Most publishes the hub's fan-out publisher has in flight (pipelined).
    #[arg(long, env = "CHORUS_BENCH_HUB_PUBLISHES_IN_FLIGHT", default_value_t = 16)]
    hub_publishes_in_flight: usize,
    /// Most fan-out messages published and not yet acked by every subscriber.
    #[arg(long, env = "CHORUS_BENCH_HUB_BACKLOG", default_value_t = 1000)]
    hub_backlog: usize,
    /// Publishes per second of the hub's equal-load fan-out, the same for
    /// every system.
    #[arg(long, env = "CHORUS_BENCH_HUB_RATE", default_value_t = 200.0)]
    hub_rate: f64,
    /// Sender → receiver pairs of the hub's direct round trips.
    #[arg(long, env = "CHORUS_BENCH_HUB_PAIRS", default_value_t = 16)]
    hub_pairs: usize,
    /// A Redis server; scratch streams are made on it.
    #[arg(long, env = "CHORUS_BENCH_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// The hub JSON summary (default: target/bench/hub.json).
    #[arg(long, env = "CHORUS_BENCH_HUB_OUTPUT")]
    hub_output: Option<PathBuf>,
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
        if !(1..=100).contains(&self.hub_subscribers) || !(1..=64).contains(&self.hub_pairs) {
            bail!("--hub-subscribers must be 1..=100 and --hub-pairs 1..=64");
        }
        // The hub refuses sends past an inbox's max_queue_depth (10000 by default).
        if !(1..=256).contains(&self.hub_publishes_in_flight) || !(1..=10_000).contains(&self.hub_backlog) {
            bail!("--hub-publishes-in-flight must be 1..=256 and --hub-backlog 1..=10000");
        }
        if !(1.0..=10_000.0).contains(&self.hub_rate) {
            bail!("--hub-rate must be 1..=10000 publishes/s");
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
        if self.has(Scenario::Eventbus) || (self.has(Scenario::Hub) && self.backends.contains(&Backend::Postgres)) {
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

    fn hub_plan(&self) -> HubPlan {
        HubPlan {
            subscribers: self.hub_subscribers,
            publishes_in_flight: self.hub_publishes_in_flight,
            backlog: self.hub_backlog,
            max_in_flight: self.max_in_flight,
            ack_batch: self.ack_batch,
            steady_rate: self.hub_rate,
            pairs: self.hub_pairs,
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
    let Reports { taskstore, bus, hub } = run(&options, &interrupt).await?;
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
    if let Some(report) = hub {
        let path = options.hub_output.clone().unwrap_or_else(|| report::default_json_path("hub.json"));
        report.write_json(&path)?;
        print!("{}", report.table(&path));
    }
    Ok(())
}

/// What a run measured, by scenario.
#[derive(Debug)]
struct Reports {
    taskstore: Option<Report>,
    bus: Option<BusReport>,
    hub: Option<HubReport>,
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

async fn run(options: &Options, interrupt: &CancellationToken) -> anyhow::Result<Reports> {
    let binary =
        if [Scenario::Taskstore, Scenario::Eventbus, Scenario::Hub].into_iter().any(|scenario| options.has(scenario)) {
            Some(server::release_binary(options.chorus_bin.as_deref()).await?)
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
        Some(run_bus(options, &admin, binary.as_deref(), &common, interrupt).await?)
    } else {
        None
    };
    let hub = match (options.has(Scenario::Hub), &binary) {
        (true, Some(binary)) => Some(run_hub(options, &admin, binary, &common, interrupt).await?),
        _ => None,
    };
    Ok(Reports { taskstore, bus, hub })
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
        chorus_env: server::inherited_env(),
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
    common: &Common,
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
        chorus_env: common.chorus_env.clone(),
        postgres_version: common.postgres_version.clone(),
        postgres_durability: common.postgres_durability.clone(),
        pgbench_version: common.pgbench_version.clone(),
        nats_url: options.has(Scenario::Nats).then(|| options.nats_url.clone()),
    };
    Ok(BusReport::new(config, &common.raw, chorus, nats))
}

/// The hub on every backend, and JetStream and Redis under the same loads.
async fn run_hub(
    options: &Options,
    admin: &Admin,
    binary: &Path,
    common: &Common,
    interrupt: &CancellationToken,
) -> anyhow::Result<HubReport> {
    let plan = options.hub_plan();
    let peers = hub::Peers { nats_url: &options.nats_url, redis_url: &options.redis_url };
    let measured = hub::run(admin, binary, &options.backends, peers, &plan, interrupt).await?;
    let config = HubRunConfig {
        started_unix: common.started_unix,
        seconds: options.seconds,
        warmup_seconds: options.warmup,
        prime_seconds: options.prime,
        cores: common.cores,
        backends: options.backends.clone(),
        subscribers: plan.subscribers,
        publishes_in_flight: plan.publishes_in_flight,
        backlog: plan.backlog,
        max_in_flight: plan.max_in_flight,
        ack_batch: plan.ack_batch,
        steady_rate: plan.steady_rate,
        pairs: plan.pairs,
        chorus_bin: binary.display().to_string(),
        chorus_env: common.chorus_env.clone(),
        postgres_version: common.postgres_version.clone(),
        postgres_durability: common.postgres_durability.clone(),
        sqlite_durability: SQLITE_DURABILITY.to_owned(),
        pgbench_version: common.pgbench_version.clone(),
        nats_url: options.nats_url.clone(),
        redis_url: options.redis_url.clone(),
    };
    Ok(HubReport::new(config, &common.raw, measured))
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
