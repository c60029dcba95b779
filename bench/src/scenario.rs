//! The chorus runs: for each backend and client count a fresh `chorus serve
//! taskstore` on the same database, driven by [`Load`], with CPU sampled over
//! the measured window and, on PostgreSQL, commits and wake-ups counted over
//! the server's life.

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::{
    cpu::{CpuSnapshot, CpuUsage},
    load::{Load, LoadResult},
    notify::{Notifications, NotifyCounter, TASKSTORE_CHANNEL},
    postgres::{Admin, CommitCounter, Commits, EventLog},
    server::Server,
    stats::LatencySummary,
};

/// Commits one round trip is designed to cost: one per call.
pub(crate) const COMMIT_BUDGET: f64 = 3.0;

/// A storage backend chorus runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Backend {
    Postgres,
    Sqlite,
}

/// Client counts and durations shared by every run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) clients: Vec<usize>,
    /// How long each new database is filled before the first measured run.
    pub(crate) prime: Duration,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
}

/// One backend at one client count.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChorusResult {
    pub(crate) backend: Backend,
    pub(crate) clients: usize,
    pub(crate) seconds: f64,
    pub(crate) round_trips: u64,
    pub(crate) round_trips_per_sec: f64,
    /// CreateTask start → CompleteTask acknowledged.
    pub(crate) latency: LatencySummary,
    pub(crate) phases: Phases,
    /// What the round trips would commit at the designed 3 commits each.
    pub(crate) budget_commits_per_sec: f64,
    /// Measured on PostgreSQL.
    pub(crate) commits: Option<MeasuredCommits>,
    /// Against pgbench at the same client count (PostgreSQL only).
    pub(crate) vs_raw: Option<VsRaw>,
    pub(crate) cpu: CpuUsage,
}

/// Where a round trip's time goes.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Phases {
    pub(crate) create: LatencySummary,
    /// From CreateTask's answer to the ClaimedTask's arrival on the stream.
    pub(crate) claim: LatencySummary,
    pub(crate) complete: LatencySummary,
}

/// Commits on PostgreSQL over a server's whole life (see [`measure_postgres`]).
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct MeasuredCommits {
    /// Every round trip the server served: warm-up, window and tail.
    pub(crate) round_trips: u64,
    pub(crate) xact_commit: i64,
    pub(crate) xact_rollback: i64,
    /// Every transaction PostgreSQL counted, read-only ones included.
    pub(crate) commits_per_round_trip: f64,
    pub(crate) rollbacks_per_round_trip: f64,
    /// Task-store write transactions (distinct transactions in the event
    /// log): the durable commits the designed budget of 3 is about.
    pub(crate) write_transactions: i64,
    pub(crate) writes_per_round_trip: f64,
    /// `pg_notify` calls seen on the wake-up channel and the keys they carried.
    pub(crate) notifications: Notifications,
    pub(crate) notifications_per_round_trip: f64,
    /// commits − writes − notify calls, per round trip: read-only
    /// transactions (autocommit reads, chorus's LISTEN backend reading
    /// notifications, the reaper's empty scans) and start-up.
    pub(crate) other_per_round_trip: f64,
    /// Per round trip figures × the window's round trips/s.
    pub(crate) commits_per_sec: f64,
    pub(crate) writes_per_sec: f64,
}

/// chorus against the raw commit rate.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct VsRaw {
    pub(crate) raw_tps: f64,
    /// 3 × round trips/s ÷ raw tps (the same number as round trips/s ÷ (raw tps / 3)).
    pub(crate) budget_commit_ratio: f64,
    /// Measured write commits/s ÷ raw tps: the share of the durable commit
    /// capacity the round trips used.
    pub(crate) measured_write_ratio: Option<f64>,
}

/// How long the notify sender gets to drain after the load stops.
const SETTLE: Duration = Duration::from_secs(1);

/// Counters of the chorus database, read while no chorus process runs.
#[derive(Debug)]
struct PgProbes {
    commits: CommitCounter,
    notifications: NotifyCounter,
    events: EventLog,
}

impl PgProbes {
    /// Waits for every other session to end, then reads.
    async fn read(&mut self) -> anyhow::Result<(Commits, Notifications)> {
        self.commits.wait_for_sessions_to_end(self.notifications.backend_pid()).await?;
        Ok((self.commits.read().await?, self.notifications.read().await?))
    }
}

/// chorus on a scratch PostgreSQL database: a fresh server per client count.
pub(crate) async fn run_postgres(
    admin: &Admin,
    binary: &Path,
    plan: &Plan,
    interrupt: &CancellationToken,
) -> anyhow::Result<Vec<ChorusResult>> {
    admin
        .with_scratch("chorus", interrupt, |db| async move {
            let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
            prime(binary, &db.url, workdir.path(), Backend::Postgres, plan).await?;
            let mut probes = PgProbes {
                commits: admin.commit_counter(&db.name).await?,
                notifications: NotifyCounter::start(&db.url, TASKSTORE_CHANNEL).await?,
                events: EventLog::new(&db.url),
            };
            let mut results = Vec::with_capacity(plan.clients.len());
            for &clients in &plan.clients {
                results.push(measure_postgres(binary, &db.url, workdir.path(), clients, plan, &mut probes).await?);
            }
            Ok(results)
        })
        .await
}

/// One client count on PostgreSQL. Commits are counted from before the
/// server starts to after its last backend has exited: a backend that only
/// LISTENs (chorus's wake-up bridge) runs a transaction for each batch of
/// notifications it reads but reports them to the statistics only when it
/// exits, so a window inside the server's life would miss them. The counts
/// are divided by every round trip the server served; start-up and the
/// reaper (about 1 commit/s) add a few dozen commits to that.
async fn measure_postgres(
    binary: &Path,
    url: &str,
    workdir: &Path,
    clients: usize,
    plan: &Plan,
    probes: &mut PgProbes,
) -> anyhow::Result<ChorusResult> {
    // The event log is read before the counters and after them, so its own
    // reads stay outside the count.
    let position = probes.events.position().await?;
    let (commits_before, notes_before) = probes.read().await?;
    let server = Server::start(binary, "taskstore", url, workdir).await?;
    let (server, outcome) = drive(server, Backend::Postgres, clients, plan).await;
    let stopped = server.stop().await;
    let (load, cpu) = outcome?;
    stopped?;
    let (commits_after, notes_after) = probes.read().await?;
    let (_, writes) = probes.events.since(position).await?;
    let counts =
        Counts { commits: commits_before.until(commits_after), writes, notifications: notes_before.until(notes_after) };
    let commits = measured(&load, counts);
    Ok(result(Backend::Postgres, clients, load, Some(commits), cpu))
}

/// chorus on a SQLite file in a temp dir: a fresh server per client count.
pub(crate) async fn run_sqlite(
    binary: &Path,
    plan: &Plan,
    interrupt: &CancellationToken,
) -> anyhow::Result<Vec<ChorusResult>> {
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let url = format!("sqlite://{}?mode=rwc", workdir.path().join("taskstore.db").display());
    let runs = async {
        prime(binary, &url, workdir.path(), Backend::Sqlite, plan).await?;
        let mut results = Vec::with_capacity(plan.clients.len());
        for &clients in &plan.clients {
            let server = Server::start(binary, "taskstore", &url, workdir.path()).await?;
            let (server, outcome) = drive(server, Backend::Sqlite, clients, plan).await;
            let stopped = server.stop().await;
            let (load, cpu) = outcome?;
            stopped?;
            results.push(result(Backend::Sqlite, clients, load, None, cpu));
        }
        Ok(results)
    };
    tokio::select! {
        outcome = runs => outcome,
        () = interrupt.cancelled() => Err(anyhow::anyhow!("interrupted")),
    }
}

/// Fills a new database with round trips from as many clients as the
/// largest run, on a server of its own, so that no measured run starts on
/// empty tables: a steady-state benchmark should measure tables of some size,
/// with the statistics the task store gives a new database once it holds
/// tasks (before those, PostgreSQL's plans made on empty tables sent every
/// lookup of a task through `taskstore_tasks_recent`).
async fn prime(binary: &Path, url: &str, workdir: &Path, backend: Backend, plan: &Plan) -> anyhow::Result<()> {
    if plan.prime.is_zero() {
        return Ok(());
    }
    let clients = plan.clients.iter().copied().max().unwrap_or(1);
    eprintln!("chorus on {backend:?}: priming the database, {clients} client(s) for {:?}…", plan.prime);
    let server = Server::start(binary, "taskstore", url, workdir).await?;
    let outcome =
        async { Load::start(&server.endpoint, clients, Duration::ZERO, plan.prime).await?.finish().await }.await;
    let stopped = server.stop().await;
    outcome?;
    stopped
}

/// Runs the load against `server`, sampling CPU over the measured window,
/// and lets the server settle; hands the server back to be stopped.
async fn drive(
    mut server: Server,
    backend: Backend,
    clients: usize,
    plan: &Plan,
) -> (Server, anyhow::Result<(LoadResult, CpuUsage)>) {
    let outcome = async {
        eprintln!(
            "chorus on {backend:?}: {clients} client(s), {:?} warm-up + {:?} measured…",
            plan.warmup, plan.measure
        );
        let bench_pid = std::process::id();
        let mut load = Load::start(&server.endpoint, clients, plan.warmup, plan.measure).await?;
        let window = load.window;
        load.wait_until(window.start).await?;
        let cpu_before = CpuSnapshot::take(Some(server.pid), bench_pid)?;
        load.wait_until(window.end).await?;
        let cpu = cpu_before.usage_until(&CpuSnapshot::take(Some(server.pid), bench_pid)?);
        let load = load.finish().await?;
        tokio::time::sleep(SETTLE).await;
        server.check_running()?;
        Ok((load, cpu))
    }
    .await;
    (server, outcome)
}

/// What the database counted over one server's life.
#[derive(Debug, Clone, Copy)]
struct Counts {
    commits: Commits,
    writes: i64,
    notifications: Notifications,
}

fn measured(load: &LoadResult, counts: Counts) -> MeasuredCommits {
    let round_trips = load.all_round_trips.max(1) as f64;
    let window_rate = load.round_trips as f64 / load.seconds;
    let commits_per_round_trip = counts.commits.committed as f64 / round_trips;
    let writes_per_round_trip = counts.writes as f64 / round_trips;
    let notifications_per_round_trip = counts.notifications.total as f64 / round_trips;
    MeasuredCommits {
        round_trips: load.all_round_trips,
        xact_commit: counts.commits.committed,
        xact_rollback: counts.commits.rolled_back,
        commits_per_round_trip,
        rollbacks_per_round_trip: counts.commits.rolled_back as f64 / round_trips,
        write_transactions: counts.writes,
        writes_per_round_trip,
        notifications: counts.notifications,
        notifications_per_round_trip,
        other_per_round_trip: commits_per_round_trip - writes_per_round_trip - notifications_per_round_trip,
        commits_per_sec: commits_per_round_trip * window_rate,
        writes_per_sec: writes_per_round_trip * window_rate,
    }
}

fn result(
    backend: Backend,
    clients: usize,
    load: LoadResult,
    commits: Option<MeasuredCommits>,
    cpu: CpuUsage,
) -> ChorusResult {
    let round_trips_per_sec = load.round_trips as f64 / load.seconds;
    ChorusResult {
        backend,
        clients,
        seconds: load.seconds,
        round_trips: load.round_trips,
        round_trips_per_sec,
        latency: load.latency,
        phases: Phases { create: load.create, claim: load.claim, complete: load.complete },
        budget_commits_per_sec: COMMIT_BUDGET * round_trips_per_sec,
        commits,
        vs_raw: None,
        cpu,
    }
}

impl ChorusResult {
    /// Fills in the comparison with pgbench at the same client count.
    pub(crate) fn compare_with_raw(&mut self, raw_tps: f64) {
        if raw_tps <= 0.0 {
            return;
        }
        self.vs_raw = Some(VsRaw {
            raw_tps,
            budget_commit_ratio: self.budget_commits_per_sec / raw_tps,
            measured_write_ratio: self.commits.map(|commits| commits.writes_per_sec / raw_tps),
        });
    }
}
