//! The hub runs: the same three loads on chorus (`chorus serve hub` on a
//! scratch PostgreSQL database and on a SQLite file), on NATS JetStream and
//! on Redis Streams:
//!
//! - fan-out, saturated: one publisher, as fast as the subscribers drain
//!   ([`fanout`]);
//! - fan-out at equal load: the same at a fixed, modest publish rate, so
//!   that latencies compare at the same load;
//! - direct round trips: send → receive → ack, pair by pair ([`direct`]).
//!
//! chorus gets a fresh server (and namespace) for each load. On PostgreSQL
//! the database is primed first (see `scenario::prime`), and commits are
//! counted over each server's life (see `scenario::measure_postgres`).

mod chorus;
pub(crate) mod direct;
pub(crate) mod fanout;
mod jetstream;
pub(crate) mod redis;
pub(crate) mod report;

use std::{path::Path, time::Duration};

use anyhow::{Context as _, anyhow};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use self::{
    direct::DirectResult,
    fanout::{FanoutResult, Pace},
    redis::RedisServer,
};
use crate::{
    nats::NatsServer,
    postgres::{Admin, CommitCounter, Commits},
    scenario::Backend,
    server::Server,
};

/// The load every system gets.
#[derive(Debug, Clone)]
pub(crate) struct HubPlan {
    pub(crate) subscribers: usize,
    /// Most publishes sent and not yet acknowledged.
    pub(crate) publishes_in_flight: usize,
    /// Most messages published and not yet acked by every subscriber.
    pub(crate) backlog: usize,
    /// Most unacked messages one subscriber holds.
    pub(crate) max_in_flight: u32,
    /// Most messages one ack call carries.
    pub(crate) ack_batch: usize,
    /// Publishes per second of the equal-load run.
    pub(crate) steady_rate: f64,
    pub(crate) pairs: usize,
    /// How long a chorus database is filled before its first measured run.
    pub(crate) prime: Duration,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
}

impl HubPlan {
    /// As fast as the subscribers drain.
    pub(crate) fn saturated(&self) -> Pace {
        Pace { fan_out: self.fan_out(), in_flight: self.publishes_in_flight, rate: None }
    }

    /// At the equal-load rate.
    pub(crate) fn steady(&self) -> Pace {
        Pace { fan_out: self.fan_out(), in_flight: self.publishes_in_flight, rate: Some(self.steady_rate) }
    }

    fn fan_out(&self) -> u32 {
        u32::try_from(self.subscribers).unwrap_or(u32::MAX)
    }
}

/// A system the hub load runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum System {
    ChorusPostgres,
    ChorusSqlite,
    Nats,
    Redis,
}

impl System {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::ChorusPostgres => "chorus-postgres",
            Self::ChorusSqlite => "chorus-sqlite",
            Self::Nats => "nats",
            Self::Redis => "redis",
        }
    }
}

/// The three loads on one system.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SystemRuns {
    pub(crate) system: System,
    pub(crate) saturated: FanoutResult,
    /// At the equal-load publish rate.
    pub(crate) steady: FanoutResult,
    pub(crate) direct: DirectResult,
}

/// The servers chorus is compared with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peers<'a> {
    pub(crate) nats_url: &'a str,
    pub(crate) redis_url: &'a str,
}

/// What the hub part measured.
#[derive(Debug)]
pub(crate) struct Measured {
    /// chorus on each backend, then JetStream and Redis.
    pub(crate) systems: Vec<SystemRuns>,
    pub(crate) nats_server: NatsServer,
    pub(crate) redis_server: RedisServer,
}

/// JetStream and Redis (first: a server that is missing fails the run at
/// once), then chorus on every backend, under the same loads.
pub(crate) async fn run(
    admin: &Admin,
    binary: &Path,
    backends: &[Backend],
    peers: Peers<'_>,
    plan: &HubPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<Measured> {
    let (nats_server, nats) = jetstream::run(peers.nats_url, plan, interrupt).await?;
    let (redis_server, redis) = redis::run(peers.redis_url, plan, interrupt).await?;
    let mut systems = Vec::new();
    if backends.contains(&Backend::Postgres) {
        systems.push(run_postgres(admin, binary, plan, interrupt).await?);
    }
    if backends.contains(&Backend::Sqlite) {
        systems.push(run_sqlite(binary, plan, interrupt).await?);
    }
    systems.extend([nats, redis]);
    Ok(Measured { systems, nats_server, redis_server })
}

/// chorus on a scratch PostgreSQL database.
async fn run_postgres(
    admin: &Admin,
    binary: &Path,
    plan: &HubPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<SystemRuns> {
    admin
        .with_scratch("hub", interrupt, |db| async move {
            let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
            let mut target = Target {
                system: System::ChorusPostgres,
                binary,
                url: &db.url,
                workdir: workdir.path(),
                counter: Some(admin.commit_counter(&db.name).await?),
            };
            target.runs(plan).await
        })
        .await
}

/// chorus on a SQLite file in a temp dir.
async fn run_sqlite(binary: &Path, plan: &HubPlan, interrupt: &CancellationToken) -> anyhow::Result<SystemRuns> {
    let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
    let url = format!("sqlite://{}?mode=rwc", workdir.path().join("hub.db").display());
    let mut target = Target { system: System::ChorusSqlite, binary, url: &url, workdir: workdir.path(), counter: None };
    tokio::select! {
        outcome = target.runs(plan) => outcome,
        () = interrupt.cancelled() => Err(anyhow!("interrupted")),
    }
}

/// What every chorus run of one backend shares.
struct Target<'a> {
    system: System,
    binary: &'a Path,
    url: &'a str,
    workdir: &'a Path,
    /// On PostgreSQL: the database's commits.
    counter: Option<CommitCounter>,
}

impl Target<'_> {
    async fn runs(&mut self, plan: &HubPlan) -> anyhow::Result<SystemRuns> {
        self.prime(plan).await?;
        let saturated = self.fanout("fanout", plan, plan.saturated()).await?;
        let steady = self.fanout("steady", plan, plan.steady()).await?;
        let direct = self.direct("direct", plan).await?;
        Ok(SystemRuns { system: self.system, saturated, steady, direct })
    }

    /// Fills the new database with saturated fan-out on a server of its own.
    async fn prime(&mut self, plan: &HubPlan) -> anyhow::Result<()> {
        if plan.prime.is_zero() {
            return Ok(());
        }
        eprintln!("{}: priming the database with fan-out for {:?}…", self.system.name(), plan.prime);
        let priming = HubPlan { warmup: Duration::ZERO, measure: plan.prime, ..plan.clone() };
        let server = Server::start(self.binary, "hub", self.url, self.workdir).await?;
        let outcome =
            async { chorus::start_fanout(&server.endpoint, "prime", &priming, plan.saturated()).await?.finish().await }
                .await
                .map_err(|error| anyhow!("{error:#}\nchorus stderr:\n{}", server.log_tail()));
        let stopped = server.stop().await;
        outcome?;
        stopped
    }

    async fn fanout(&mut self, namespace: &str, plan: &HubPlan, pace: Pace) -> anyhow::Result<FanoutResult> {
        eprintln!("{}: {}…", self.system.name(), describe_fanout(plan, &pace));
        let before = self.commits().await?;
        let mut server = Server::start(self.binary, "hub", self.url, self.workdir).await?;
        let outcome = async {
            let mut flow = chorus::start_fanout(&server.endpoint, namespace, plan, pace).await?;
            let cpu = flow.sample_cpu(Some(server.pid)).await?;
            let result = FanoutResult::new(&pace, flow.finish().await?, cpu);
            server.check_running()?;
            Ok::<_, anyhow::Error>(result)
        }
        .await
        .map_err(|error| anyhow!("{error:#}\nchorus stderr:\n{}", server.log_tail()));
        let stopped = server.stop().await;
        let mut result = outcome?;
        stopped?;
        result.commits_per_delivery = self.commits_since(before, result.all_deliveries).await?;
        Ok(result)
    }

    async fn direct(&mut self, namespace: &str, plan: &HubPlan) -> anyhow::Result<DirectResult> {
        eprintln!("{}: {}…", self.system.name(), describe_direct(plan));
        let before = self.commits().await?;
        let mut server = Server::start(self.binary, "hub", self.url, self.workdir).await?;
        let outcome = async {
            let pairs = chorus::pairs(&server.endpoint, namespace, plan.pairs).await?;
            let result = direct::run(pairs, plan.warmup, plan.measure, Some(server.pid)).await?;
            server.check_running()?;
            Ok::<_, anyhow::Error>(result)
        }
        .await
        .map_err(|error| anyhow!("{error:#}\nchorus stderr:\n{}", server.log_tail()));
        let stopped = server.stop().await;
        let mut result = outcome?;
        stopped?;
        result.commits_per_round_trip = self.commits_since(before, result.all_round_trips).await?;
        Ok(result)
    }

    /// The database's commits once every chorus session has ended.
    async fn commits(&mut self) -> anyhow::Result<Option<Commits>> {
        let Some(counter) = &mut self.counter else { return Ok(None) };
        // The counter's own connection is to the maintenance database.
        counter.wait_for_sessions_to_end(0).await?;
        Ok(Some(counter.read().await?))
    }

    /// Commits since `before`, per each of `units`.
    async fn commits_since(&mut self, before: Option<Commits>, units: u64) -> anyhow::Result<Option<f64>> {
        let (Some(before), Some(after)) = (before, self.commits().await?) else { return Ok(None) };
        Ok(Some(before.until(after).committed as f64 / units.max(1) as f64))
    }
}

/// What a fan-out run does, for progress lines.
pub(crate) fn describe_fanout(plan: &HubPlan, pace: &Pace) -> String {
    let rate = pace.rate.map_or_else(|| "as fast as they drain".to_owned(), |rate| format!("{rate} publishes/s"));
    format!(
        "fan-out to {} subscribers, {rate}, {:?} warm-up + {:?} measured",
        plan.subscribers, plan.warmup, plan.measure
    )
}

/// What a direct run does, for progress lines.
pub(crate) fn describe_direct(plan: &HubPlan) -> String {
    format!("direct round trips, {} pairs, {:?} warm-up + {:?} measured", plan.pairs, plan.warmup, plan.measure)
}
