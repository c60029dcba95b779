//! `chorus-bench` (`make bench`): task-store round trips — CreateTask, the
//! ClaimedTask on a worker's stream, CompleteTask — on PostgreSQL and SQLite,
//! beside the raw commit rate pgbench gets from the same PostgreSQL.
//!
//! The chorus binary is built here with `cargo build --release --bin chorus`
//! (a debug binary would measure the wrong thing), unless `--chorus-bin` /
//! `CHORUS_BENCH_BIN` names one, which must then be a release build too.
//! `CHORUS_BIN` is not used: the Makefile points it at the debug binary.
//!
//! Every PostgreSQL database is a scratch one, dropped at the end however
//! the run ends (Ctrl-C included); child processes die with the run.

mod cpu;
mod load;
mod notify;
mod pgbench;
mod postgres;
mod report;
mod scenario;
mod server;
mod stats;

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::{
    pgbench::{Pgbench, RawResult},
    postgres::Admin,
    report::{Report, RunConfig},
    scenario::{Backend, Plan},
};

#[derive(Debug, Parser)]
#[command(name = "chorus-bench", about = "Task-store round trips against the raw PostgreSQL commit rate")]
struct Options {
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
    /// Concurrent clients, one run each (pgbench -c, chorus workers).
    #[arg(long, env = "CHORUS_BENCH_CLIENTS", value_delimiter = ',', default_values_t = [1, 16])]
    clients: Vec<usize>,
    /// Backends to run chorus on (PostgreSQL also runs pgbench).
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
    /// The JSON summary (default: target/bench/taskstore.json).
    #[arg(long, env = "CHORUS_BENCH_OUTPUT")]
    output: Option<PathBuf>,
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
        Ok(())
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
    let report = run(&options, &interrupt).await?;
    let json_path = options.output.clone().unwrap_or_else(report::default_json_path);
    report.write_json(&json_path)?;
    print!("{}", report.table(&json_path));
    Ok(())
}

async fn run(options: &Options, interrupt: &CancellationToken) -> anyhow::Result<Report> {
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let binary = match &options.chorus_bin {
        Some(binary) => binary.clone(),
        None => server::build_release().await?,
    };
    // Absolute: chorus runs in a scratch directory.
    let binary = std::fs::canonicalize(&binary).with_context(|| format!("no chorus binary at {}", binary.display()))?;
    if !binary.is_file() {
        bail!("{} is not a file", binary.display());
    }
    let plan = options.plan();
    let mut config = RunConfig {
        started_unix,
        seconds: options.seconds,
        warmup_seconds: options.warmup,
        prime_seconds: options.prime,
        clients: options.clients.clone(),
        backends: options.backends.clone(),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        commit_budget_per_round_trip: scenario::COMMIT_BUDGET,
        chorus_bin: binary.display().to_string(),
        chorus_env: std::env::vars()
            .map(|(name, _)| name)
            .filter(|name| name.starts_with("CHORUS_") && !name.starts_with("CHORUS_BENCH_"))
            .collect(),
        postgres_version: None,
        pgbench_version: None,
    };
    config.chorus_env.sort();
    let mut raw = Vec::new();
    let mut chorus = Vec::new();
    if options.backends.contains(&Backend::Postgres) {
        let admin = Admin::new(&options.postgres_url);
        config.postgres_version = Some(admin.server_version().await?);
        for name in admin.drop_stale().await? {
            eprintln!("dropped {name}, left behind by an earlier run");
        }
        let (results, version) = run_raw(&admin, options, interrupt).await?;
        raw = results;
        config.pgbench_version = Some(version);
        chorus.extend(scenario::run_postgres(&admin, &binary, &plan, interrupt).await?);
    }
    if options.backends.contains(&Backend::Sqlite) {
        chorus.extend(scenario::run_sqlite(&binary, &plan, interrupt).await?);
    }
    Ok(Report::new(config, raw, chorus))
}

/// pgbench at every client count, on a scratch database.
async fn run_raw(
    admin: &Admin,
    options: &Options,
    interrupt: &CancellationToken,
) -> anyhow::Result<(Vec<RawResult>, String)> {
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let (pgbench, version) = Pgbench::prepare(&options.pgbench, workdir.path()).await?;
    admin
        .with_scratch("raw", interrupt, |db| async move {
            pgbench.create_table(&db).await?;
            let mut counter = admin.commit_counter(&db.name).await?;
            let mut results = Vec::with_capacity(options.clients.len());
            for &clients in &options.clients {
                eprintln!("pgbench: {clients} client(s), {} s…", options.seconds);
                results.push(pgbench.run(&db, clients, options.seconds, &mut counter).await?);
            }
            Ok((results, version))
        })
        .await
}
