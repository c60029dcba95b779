//! The lease reaper: a task whose worker stopped renewing its lease is
//! requeued (while its agent's retries last) or failed — the fallback
//! completion that tells its owner the child is gone. On its rounds it also
//! gives a new database its first statistics (see `Db::analyze_once_filled`);
//! beside it, rounds of their own delete the finished tasks past
//! `retention_ms`. A worker that starts
//! again under its old id ends its previous run's leases at once instead. A
//! lease that ran out while no task store ran is left a lease length from
//! the reaper's start, for its worker to come back and renew it.

use std::time::Duration;

use chorus_runtime::{metrics::set_queue, outage::Outage, rounds::spawn_rounds, time::micros};
use tokio::task::JoinHandle;

use super::TaskStore;
use crate::{
    domain::{PurgeCursor, Task, now_micros},
    error::Result,
};

/// Expired leases handled per transaction.
const BATCH: u32 = 100;
/// Finished task trees examined per purge transaction: each holds the
/// writer (SQLite) or its roots' locks (PostgreSQL) only that long.
const PURGE_BATCH: u32 = 100;
/// How often finished tasks past their retention are deleted, at most: a
/// shorter retention purges as often as it is long.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How often the reaper reads the queue for its gauges.
const QUEUE_READ_EVERY: Duration = Duration::from_secs(5);
/// What the reaper's rounds do, as an outage of its database says.
const REAPING: &str = "expiring worker leases";
/// Tasks a new database holds when the reaper gives it its first statistics.
const FIRST_STATISTICS_AT: i64 = 100;

impl TaskStore {
    /// Runs the reaper until shutdown. Every replica may run one: rows are
    /// locked with `SKIP LOCKED`, so each lease is expired exactly once.
    pub fn spawn_reaper(&self) -> JoinHandle<()> {
        if let Some(retention) = self.config.retention() {
            let store = self.clone();
            spawn_rounds(retention.min(PURGE_EVERY), self.shutdown.clone(), move || {
                let store = store.clone();
                async move { store.purge(retention).await }
            });
        }
        let store = self.clone();
        let started = now_micros();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(store.config.reaper_interval());
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut has_statistics = false;
            let mut last_queue_read: Option<tokio::time::Instant> = None;
            // A database that is down is said once, not at every tick.
            let mut reaping = Outage::default();
            loop {
                tokio::select! {
                    () = store.shutdown.cancelled() => return,
                    _ = interval.tick() => reaping.track(REAPING, store.reap(started).await),
                }
                if last_queue_read.is_none_or(|last| last.elapsed() >= QUEUE_READ_EVERY) {
                    last_queue_read = Some(tokio::time::Instant::now());
                    store.read_queue().await;
                }
                if !has_statistics {
                    has_statistics =
                        store.repository.first_statistics(FIRST_STATISTICS_AT).await.unwrap_or_else(|error| {
                            tracing::warn!(%error, "cannot analyse the task tables; retrying on the next tick");
                            false
                        });
                }
            }
        })
    }

    /// Sets the queue's gauges: the tasks waiting for a worker, and how long
    /// the oldest has. A failed read leaves them as they were (the reaper's
    /// own round says when the database is down).
    async fn read_queue(&self) {
        match self.repository.queue_depth().await {
            Ok((queued, oldest)) => {
                set_queue(&self.metrics.tasks_queued, &self.metrics.oldest_queued_task_age, queued, oldest);
            }
            Err(error) => tracing::debug!(%error, "cannot read the queue's depth"),
        }
    }

    /// Expires the leases that ran out; those that ran out before `started`,
    /// when the workers holding them may have found no task store to renew
    /// with, a lease length later (see `TaskRepository::expire_leases`).
    async fn reap(&self, started: i64) -> Result<()> {
        loop {
            let expired = self.repository.expire_leases(now_micros(), started, BATCH).await?;
            for expiry in &expired {
                let task = &expiry.task;
                tracing::warn!(
                    namespace = %task.namespace,
                    task_id = %task.id,
                    agent_id = %task.agent_id,
                    attempt = task.attempt,
                    requeued = expiry.requeued,
                    "worker lease expired"
                );
                let outcome = if expiry.requeued { "requeued" } else { "failed" };
                self.metrics.lease_expiries.with([outcome]).inc();
                self.attempt_ended(task);
            }
            if expired.len() < BATCH as usize {
                return Ok(());
            }
        }
    }

    /// Opens a new run of `worker_id` for `agent_id`: the tasks its previous
    /// run still holds are requeued (or failed, their retries spent) now
    /// rather than when their leases run out. Returns how many.
    pub async fn start_worker_run(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<usize> {
        let ended = self.repository.end_previous_run(namespace, worker_id, agent_id).await?;
        for expiry in &ended {
            self.attempt_ended(&expiry.task);
        }
        if !ended.is_empty() {
            let requeued = ended.iter().filter(|expiry| expiry.requeued).count();
            tracing::info!(%namespace, %worker_id, %agent_id, requeued, failed = ended.len() - requeued,
                "a restarted worker's previous leases ended");
        }
        Ok(ended.len())
    }

    /// Tells of a task whose worker's attempt ended without it.
    fn attempt_ended(&self, task: &Task) {
        self.changed(task);
        self.count_if_finished(task);
    }

    /// Deletes, batch after batch, the finished task trees past `retention`,
    /// on rounds of its own: a backlog (after retention was shortened, or a
    /// burst of tasks aged out) can take minutes, which must not hold up
    /// the expiry of leases.
    async fn purge(&self, retention: Duration) {
        let finished_before = now_micros().saturating_sub(micros(retention));
        let mut after: Option<PurgeCursor> = None;
        let mut purged = 0;
        loop {
            match self.repository.purge_finished(finished_before, after.as_ref(), PURGE_BATCH).await {
                Ok(batch) => {
                    purged += batch.tasks;
                    after = batch.next;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot purge finished tasks; retrying on the next purge");
                    break;
                }
            }
            if after.is_none() || self.shutdown.is_cancelled() {
                break;
            }
        }
        if purged > 0 {
            tracing::info!(purged, "finished tasks past their retention deleted");
        }
    }
}
