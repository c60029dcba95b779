//! The event-bus runs: on a scratch PostgreSQL database, primed first, a
//! fresh `chorus serve eventbus` for each batch size, each with a namespace
//! of its own holding the chain `a` → `b` → `c` ([`chain`]).
//!
//! CPU is sampled over the window. Commits and wake-up notifications are
//! counted from before the server starts to after its last session ended
//! (why: `scenario::measure_postgres`) and divided by the events it carried,
//! every one of which the chain finished before the server stopped.

pub(crate) mod chain;
pub(crate) mod report;

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::{
    cpu::CpuUsage,
    flow::{FlowPlan, FlowResult},
    notify::{EVENTBUS_CHANNEL, NotifyCounter},
    postgres::{Admin, CommitCounter, Commits},
    server::Server,
};

/// Batch sizes and the load shared by the event-bus and NATS runs.
#[derive(Debug, Clone)]
pub(crate) struct BusPlan {
    pub(crate) batch_sizes: Vec<u32>,
    pub(crate) publishers: usize,
    pub(crate) backlog: usize,
    pub(crate) max_in_flight: u32,
    pub(crate) ack_batch: usize,
    /// How long the chorus database is filled before the first measured run.
    pub(crate) prime: Duration,
    pub(crate) warmup: Duration,
    pub(crate) measure: Duration,
}

impl BusPlan {
    /// The measured load at one batch size.
    pub(crate) fn flow(&self, batch: u32) -> FlowPlan {
        FlowPlan {
            publishers: self.publishers,
            batch,
            backlog: self.backlog,
            max_in_flight: self.max_in_flight,
            ack_batch: self.ack_batch,
            warmup: self.warmup,
            measure: self.measure,
        }
    }
}

/// The chain at one batch size.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BusResult {
    pub(crate) batch_size: u32,
    pub(crate) publishers: usize,
    /// Finished: acked by `c`, the chain's last handler.
    pub(crate) flow: FlowResult,
    pub(crate) commits: BusCommits,
    pub(crate) cpu: CpuUsage,
}

/// PostgreSQL's counts over one server's life.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct BusCommits {
    /// Events the server carried through the chain: warm-up, window and the
    /// drain after it.
    pub(crate) events: u64,
    /// Every transaction PostgreSQL counted, read-only ones included.
    pub(crate) xact_commit: i64,
    pub(crate) xact_rollback: i64,
    pub(crate) commits_per_event: f64,
    pub(crate) rollbacks_per_event: f64,
    /// `pg_notify` calls on the event bus's wake-up channel.
    pub(crate) notifications: u64,
    pub(crate) notifications_per_event: f64,
    /// Commits per event × the window's finished events/s.
    pub(crate) commits_per_sec: f64,
}

/// Counters of the chorus database, read while no chorus process runs.
#[derive(Debug)]
struct Probes {
    commits: CommitCounter,
    notifications: NotifyCounter,
}

impl Probes {
    /// Waits for every other session to end, then reads.
    async fn read(&mut self) -> anyhow::Result<(Commits, u64)> {
        self.commits.wait_for_sessions_to_end(self.notifications.backend_pid()).await?;
        Ok((self.commits.read().await?, self.notifications.read().await?.total))
    }
}

/// Every batch size on a scratch PostgreSQL database.
pub(crate) async fn run_postgres(
    admin: &Admin,
    binary: &Path,
    plan: &BusPlan,
    interrupt: &CancellationToken,
) -> anyhow::Result<Vec<BusResult>> {
    admin
        .with_scratch("eventbus", interrupt, |db| async move {
            let workdir = tempfile::tempdir().context("cannot create a temp dir")?;
            prime(binary, &db.url, workdir.path(), plan).await?;
            let mut probes = Probes {
                commits: admin.commit_counter(&db.name).await?,
                notifications: NotifyCounter::start(&db.url, EVENTBUS_CHANNEL).await?,
            };
            let mut results = Vec::with_capacity(plan.batch_sizes.len());
            for (index, &batch) in plan.batch_sizes.iter().enumerate() {
                let namespace = format!("bench-{index}-batch-{batch}");
                results.push(measure(binary, &db.url, workdir.path(), &namespace, plan, batch, &mut probes).await?);
            }
            Ok(results)
        })
        .await
}

/// Fills the new database through the chain at the largest batch size, on a
/// server of its own, so that no measured run starts on empty tables (see
/// `scenario::prime`).
async fn prime(binary: &Path, url: &str, workdir: &Path, plan: &BusPlan) -> anyhow::Result<()> {
    if plan.prime.is_zero() {
        return Ok(());
    }
    let batch = plan.batch_sizes.iter().copied().max().unwrap_or(1);
    eprintln!("chorus event bus: priming the database, batches of {batch} for {:?}…", plan.prime);
    let flow = FlowPlan { warmup: Duration::ZERO, measure: plan.prime, ..plan.flow(batch) };
    let server = Server::start(binary, "eventbus", url, workdir).await?;
    let outcome = async { chain::start(&server.endpoint, "bench-prime", &flow).await?.finish().await }.await;
    let stopped = server.stop().await;
    outcome?;
    stopped
}

/// One batch size on a fresh server.
async fn measure(
    binary: &Path,
    url: &str,
    workdir: &Path,
    namespace: &str,
    plan: &BusPlan,
    batch: u32,
    probes: &mut Probes,
) -> anyhow::Result<BusResult> {
    eprintln!(
        "chorus event bus: batches of {batch}, {} publisher(s), {:?} warm-up + {:?} measured…",
        plan.publishers, plan.warmup, plan.measure
    );
    let (commits_before, notes_before) = probes.read().await?;
    let mut server = Server::start(binary, "eventbus", url, workdir).await?;
    let outcome = async {
        let mut flow = chain::start(&server.endpoint, namespace, &plan.flow(batch)).await?;
        let cpu = flow.sample_cpu(Some(server.pid)).await?;
        let result = flow.finish().await?;
        server.check_running()?;
        Ok::<_, anyhow::Error>((result, cpu))
    }
    .await
    .map_err(|error| anyhow::anyhow!("{error:#}\nchorus stderr:\n{}", server.log_tail()));
    let stopped = server.stop().await;
    let (flow, cpu) = outcome?;
    stopped?;
    let (commits_after, notes_after) = probes.read().await?;
    let commits = counts(&flow, commits_before.until(commits_after), notes_after - notes_before);
    Ok(BusResult { batch_size: batch, publishers: plan.publishers, flow, commits, cpu })
}

fn counts(flow: &FlowResult, commits: Commits, notifications: u64) -> BusCommits {
    let events = flow.all_events.max(1) as f64;
    let commits_per_event = commits.committed as f64 / events;
    BusCommits {
        events: flow.all_events,
        xact_commit: commits.committed,
        xact_rollback: commits.rolled_back,
        commits_per_event,
        rollbacks_per_event: commits.rolled_back as f64 / events,
        notifications,
        notifications_per_event: notifications as f64 / events,
        commits_per_sec: commits_per_event * flow.finished_per_sec,
    }
}
