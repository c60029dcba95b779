//! The engine: claims runs that are due, drives each until it needs no
//! engine, renews its claims, and purges runs past their retention. Several
//! engines share one database; a run's claim lapses `lease_ms` after its
//! engine stops renewing it, and another engine resumes it. The claim loop
//! also gives a new database its first statistics (see
//! `Db::analyze_once_filled`): the batched write of the runs an engine holds
//! otherwise kept a plan made on the empty table, which read every run.

mod driver;
mod gates;
mod parallel;
pub(crate) mod plan;
pub(crate) mod render;
pub(crate) mod schedule;
mod triggers;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use chorus_runtime::time::{micros, now_micros, until};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use self::triggers::TriggerSource;
use crate::{
    config::WorkflowConfig,
    domain::RunState,
    repository::{Claim, Fence, Taker},
    service::{ENGINE_KEY, Workflows},
};

/// How often finished runs past their retention are deleted.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How often the unfinished runs are counted for the gauges (at most: the
/// renewal loop's pace, a third of a lease, bounds it too).
const GAUGES_EVERY: Duration = Duration::from_secs(5);
/// The least time between two claims of the claim loop: how late a timer
/// may fire at most, beyond the time a claim takes.
const CLAIM_SPACING: Duration = Duration::from_millis(10);
/// Runs a new database holds when the claim loop gives it its first statistics.
const FIRST_STATISTICS_AT: i64 = 100;

/// The drivers of one engine, by run id: each takes newer claims of its run.
type Drivers = Arc<Mutex<HashMap<String, watch::Sender<Fence>>>>;

/// The engine as the service that spawned it sees it: a run started there
/// and due at once is created claimed for the engine, when it has room, and
/// driven from the start, without waiting for the claim loop and its write.
#[derive(Debug, Clone)]
pub(crate) struct LocalEngine {
    owner: String,
    drivers: Drivers,
    shutdown: CancellationToken,
}

impl LocalEngine {
    /// The claim a run starting now may be created under: none once the
    /// engine stopped, or while it drives `max_active_runs` runs. Starts in
    /// flight together may each see the last free place, and take the engine
    /// that many runs past the limit for a moment; the claim loop then claims
    /// nothing until it is back under it.
    pub(crate) fn taker(&self, config: &WorkflowConfig, now: i64) -> Option<Taker> {
        let active = self.drivers.lock().expect("drivers lock poisoned").len();
        let room = usize::try_from(config.max_active_runs).unwrap_or(usize::MAX) > active;
        (room && !self.shutdown.is_cancelled())
            .then(|| Taker { owner: self.owner.clone(), lease_until: lease_end(config, now) })
    }

    /// Drives a run created claimed for this engine.
    pub(crate) fn drive(&self, workflows: &Workflows, claim: Claim) {
        start_driver(workflows, &self.drivers, claim, &self.shutdown);
    }
}

/// When a claim this engine makes (or renews) at `now` ends: every claim is
/// made so, which is what lets a restarted engine tell its claims from before
/// (see `spawn`).
fn lease_end(config: &WorkflowConfig, now: i64) -> i64 {
    now + micros(config.lease())
}

/// Starts the engine's loops; they end with `shutdown`. Runs started through
/// `workflows` (or a clone) go straight to this engine when it has room; the
/// first engine spawned on it is the one.
pub fn spawn(workflows: Workflows, triggers: Option<TriggerSource>, shutdown: CancellationToken) {
    let owner = workflows.config().engine_id.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "chorus".into());
        format!("{host}-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8])
    });
    tracing::info!(engine = %owner, "workflow engine started");
    // Every claim this engine makes from now on ends later than this; one
    // of its name that ends sooner was made before it started.
    let claimed_before = lease_end(workflows.config(), now_micros());
    let drivers = Drivers::default();
    workflows.attach_engine(LocalEngine {
        owner: owner.clone(),
        drivers: Arc::clone(&drivers),
        shutdown: shutdown.clone(),
    });
    tokio::spawn(claim_loop(workflows.clone(), owner, claimed_before, drivers, shutdown.clone()));
    if let Some(source) = triggers {
        triggers::spawn(workflows, source, shutdown);
    }
}

async fn claim_loop(
    workflows: Workflows,
    owner: String,
    claimed_before: i64,
    drivers: Drivers,
    shutdown: CancellationToken,
) {
    let config = workflows.config().clone();
    // Starts through `workflows` may already have created runs claimed for
    // this engine, and driven them: those are not taken back. Claims are
    // renewed only once the runs from before are back: renewed first, their
    // claims would never lapse, and nobody would drive them.
    loop {
        match workflows.runs.adopt(&owner, claimed_before, lease_end(&config, now_micros())).await {
            Ok(claims) => {
                if !claims.is_empty() {
                    tracing::info!(runs = claims.len(), "resuming the runs this engine held before it restarted");
                }
                for claim in claims {
                    start_driver(&workflows, &drivers, claim, &shutdown);
                }
                break;
            }
            Err(error) => tracing::warn!(%error, "cannot take back this engine's runs yet; retrying"),
        }
        tokio::select! {
            () = tokio::time::sleep(config.poll()) => {}
            () = shutdown.cancelled() => return,
        }
    }
    tokio::spawn(renew_loop(workflows.clone(), owner.clone(), shutdown.clone()));
    let mut has_statistics = false;
    while !shutdown.is_cancelled() {
        let looked = tokio::time::Instant::now();
        let mut waiter = workflows.wakeups.waiter(ENGINE_KEY);
        let active = drivers.lock().expect("drivers lock poisoned").len();
        let free = config.max_active_runs.saturating_sub(u32::try_from(active).unwrap_or(u32::MAX));
        let mut wait = config.poll();
        if free > 0 {
            let now = now_micros();
            match workflows.runs.claim_due(&owner, now, lease_end(&config, now), free).await {
                Ok(claims) => {
                    for claim in claims {
                        start_driver(&workflows, &drivers, claim, &shutdown);
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot claim due runs"),
            }
            // A timer that fires before the next poll (one set before this
            // engine started, or by another process) is not left late.
            match workflows.runs.next_due(now).await {
                Ok(Some(next)) => wait = wait.min(until(now_micros(), next)),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "cannot read when the next run is due"),
            }
        }
        if !has_statistics {
            has_statistics = workflows.runs.first_statistics(FIRST_STATISTICS_AT).await.unwrap_or_else(|error| {
                tracing::warn!(%error, "cannot analyse the run tables; retrying");
                false
            });
        }
        tokio::select! {
            () = waiter.wait(wait) => {}
            () = shutdown.cancelled() => return,
        }
        // Timers that fire a moment apart, and runs due a moment apart, are
        // claimed together: thousands of waits ending within a second cost
        // a hundred claims, not thousands.
        tokio::select! {
            () = tokio::time::sleep_until(looked + CLAIM_SPACING) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

fn start_driver(workflows: &Workflows, drivers: &Drivers, claim: Claim, shutdown: &CancellationToken) {
    let mut map = drivers.lock().expect("drivers lock poisoned");
    if let Some(sender) = map.get(&claim.run_id) {
        // This engine's driver of the run outlived its claim: it takes the new one.
        let _ = sender.send(claim.fence);
        return;
    }
    let (sender, receiver) = watch::channel(claim.fence.clone());
    map.insert(claim.run_id.clone(), sender);
    let registry = Arc::clone(drivers);
    let run_id = claim.run_id.clone();
    let stop = move |fences: &mut watch::Receiver<Fence>| {
        let mut map = registry.lock().expect("drivers lock poisoned");
        if fences.has_changed().unwrap_or(false) {
            return false;
        }
        map.remove(&run_id);
        true
    };
    let span = tracing::info_span!("workflow_run", run_id = %claim.run_id, namespace = %claim.namespace);
    let driven = driver::drive(workflows.clone(), claim, receiver, stop, shutdown.clone());
    tokio::spawn(tracing::Instrument::instrument(driven, span));
}

async fn renew_loop(workflows: Workflows, owner: String, shutdown: CancellationToken) {
    let lease = workflows.config().lease();
    let mut last_purge = tokio::time::Instant::now();
    let mut last_gauges: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(lease / 3) => {}
            () = shutdown.cancelled() => return,
        }
        if let Err(error) = workflows.runs.renew(&owner, lease_end(workflows.config(), now_micros())).await {
            tracing::warn!(%error, "cannot renew run claims");
        }
        if last_gauges.is_none_or(|last| last.elapsed() >= GAUGES_EVERY) {
            last_gauges = Some(tokio::time::Instant::now());
            read_gauges(&workflows).await;
        }
        if last_purge.elapsed() >= PURGE_EVERY {
            last_purge = tokio::time::Instant::now();
            match workflows.runs.purge(now_micros()).await {
                Ok(0) => {}
                Ok(purged) => tracing::info!(purged, "finished runs past their retention deleted"),
                Err(error) => tracing::warn!(%error, "cannot purge finished runs"),
            }
        }
    }
}

/// Sets the unfinished runs' gauges. A failed read leaves them as they were
/// (the claim loop says when the database is down).
async fn read_gauges(workflows: &Workflows) {
    let unfinished = match workflows.runs.unfinished().await {
        Ok(unfinished) => unfinished,
        Err(error) => return tracing::debug!(%error, "cannot count the unfinished runs"),
    };
    let now = now_micros();
    for state in [RunState::Pending, RunState::Running, RunState::Waiting] {
        let of_state = unfinished.iter().find(|counted| counted.state == state);
        let (runs, idle) = of_state.map_or((0, 0), |counted| (counted.runs, (now - counted.since).max(0) / 1_000_000));
        let metrics = &workflows.metrics;
        metrics.workflow_runs_unfinished.with([state.as_str()]).set(i64::try_from(runs).unwrap_or(i64::MAX));
        metrics.workflow_runs_idle.with([state.as_str()]).set(idle);
    }
}
