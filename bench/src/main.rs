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
//!   NATS JetStream and Redis Streams;
//! - `gateway`: blocking A2A SendMessage calls through the gateway
//!   (`chorus dev`) on SQLite and PostgreSQL against the a2a-sdk reference
//!   server (Python, in memory, on SQLite and on PostgreSQL), and the RSS of 1,000
//!   open SSE streams;
//! - `acp`: first-chunk latency through `chorus acp` beside direct A2A streaming;
//! - `workflow`: durable steps/s of a 10-step workflow at 64 runs in flight,
//!   commits per step, step overhead, and resume after SIGKILL.
//!
//! The chorus binary is built here with `cargo build --release --bin chorus`
//! (a debug binary would measure the wrong thing), unless `--chorus-bin` /
//! `CHORUS_BENCH_BIN` names one, which must then be a release build too.
//! `CHORUS_BIN` is not used: the Makefile points it at the debug binary.
//!
//! Every PostgreSQL database, NATS stream and Redis key is a scratch one,
//! dropped at the end however the run ends (Ctrl-C included); child
//! processes die with the run.

mod acp;
mod cpu;
mod eventbus;
mod flow;
mod gateway;
mod hub;
mod load;
mod nats;
mod notify;
mod options;
mod pgbench;
mod postgres;
mod report;
mod scenario;
mod server;
mod stats;
mod workflow;

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::{
    eventbus::report::{BusReport, BusRunConfig},
    gateway::{
        GatewayPlan,
        report::{GatewayReport, GatewayRunConfig},
    },
    hub::report::{HubReport, HubRunConfig, SQLITE_DURABILITY},
    options::{Options, Scenario},
    pgbench::{Pgbench, RawResult},
    postgres::Admin,
    report::{Report, RunConfig},
    scenario::Backend,
};

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
    let Reports { taskstore, bus, hub, gateway, acp, workflow } = Box::pin(run(&options, &interrupt)).await?;
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
    if let Some(report) = gateway {
        let path = options.gateway.gateway_output.clone().unwrap_or_else(|| report::default_json_path("gateway.json"));
        report.write_json(&path)?;
        print!("{}", report.table(&path));
    }
    if let Some(report) = acp {
        print_summary("acp.json", &report)?;
    }
    if let Some(report) = workflow {
        print_summary("workflow.json", &report)?;
    }
    Ok(())
}

/// Writes `report` as JSON under target/bench and prints it.
fn print_summary(file: &str, report: &(impl serde::Serialize + std::fmt::Display)) -> anyhow::Result<()> {
    let path = report::default_json_path(file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&path, serde_json::to_vec_pretty(report)?)?;
    print!("{report}");
    println!("JSON summary: {}", path.display());
    Ok(())
}

/// What a run measured, by scenario.
#[derive(Debug)]
struct Reports {
    taskstore: Option<Report>,
    bus: Option<BusReport>,
    hub: Option<HubReport>,
    gateway: Option<GatewayReport>,
    acp: Option<acp::AcpReport>,
    workflow: Option<workflow::WorkflowReport>,
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
    let binary = if [
        Scenario::Taskstore,
        Scenario::Eventbus,
        Scenario::Hub,
        Scenario::Gateway,
        Scenario::Acp,
        Scenario::Workflow,
    ]
    .into_iter()
    .any(|scenario| options.has(scenario))
    {
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
    let gateway = match (options.has(Scenario::Gateway), &binary) {
        (true, Some(binary)) => Some(run_gateway(options, &admin, binary, &common, interrupt).await?),
        _ => None,
    };
    let acp = match (options.has(Scenario::Acp), &binary) {
        (true, Some(binary)) => {
            eprintln!("acp: {} prompts through `chorus acp` and straight over A2A…", options.acp_samples);
            let workdir = tempfile::tempdir()?;
            let server = server::Server::start_dev(binary, None, workdir.path()).await?;
            Some(acp::run(binary, &server.endpoint, options.acp_samples).await?)
        }
        _ => None,
    };
    let workflow = match (options.has(Scenario::Workflow), &binary) {
        (true, Some(binary)) => {
            Some(workflow::run(&admin, binary, options.seconds, options.warmup, &common.raw, interrupt).await?)
        }
        _ => None,
    };
    Ok(Reports { taskstore, bus, hub, gateway, acp, workflow })
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
    let gateway_postgres = options.has(Scenario::Gateway) && options.gateway.uses_postgres();
    if raw_clients.is_empty() && !gateway_postgres {
        return Ok(common);
    }
    common.postgres_version = Some(admin.server_version().await?);
    common.postgres_durability = Some(admin.durability().await?);
    let preloaded = admin.preloaded_libraries().await?;
    if !preloaded.is_empty() {
        // pg_stat_statements, for one, cost pgbench about 40 % of its commits
        // on a 2-core machine, and the peers and chorus less.
        eprintln!(
            "warning: PostgreSQL loads {preloaded} into every backend: short transactions run slower, \
             pgbench's most of all, so ratios to it and to the peers are not those of a plain server"
        );
    }
    for name in admin.drop_stale().await? {
        eprintln!("dropped {name}, left behind by an earlier run");
    }
    if raw_clients.is_empty() {
        return Ok(common);
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

/// The gateway against the a2a-sdk on every pairing, and the streams' memory.
async fn run_gateway(
    options: &Options,
    admin: &Admin,
    binary: &Path,
    common: &Common,
    interrupt: &CancellationToken,
) -> anyhow::Result<GatewayReport> {
    let gateway = &options.gateway;
    let plan = GatewayPlan {
        clients: gateway.gateway_clients.clone(),
        warmup: Duration::from_secs(options.warmup),
        measure: Duration::from_secs(options.seconds),
        streams: gateway.gateway_streams,
    };
    let measured = gateway::run(admin, binary, gateway, &plan, interrupt).await?;
    let config = GatewayRunConfig {
        started_unix: common.started_unix,
        seconds: options.seconds,
        warmup_seconds: options.warmup,
        clients: plan.clients.clone(),
        backends: gateway.gateway_backends.clone(),
        streams: plan.streams,
        cores: common.cores,
        chorus_bin: binary.display().to_string(),
        chorus_env: common.chorus_env.clone(),
        postgres_version: common.postgres_version.clone(),
        postgres_durability: common.postgres_durability.clone(),
        sqlite_durability: SQLITE_DURABILITY.to_owned(),
    };
    Ok(GatewayReport::new(config, measured))
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
