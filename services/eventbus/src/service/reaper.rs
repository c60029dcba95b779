//! The lease reaper: a delivery whose consumer neither acked nor nacked it
//! before its lease ran out counts as a failed attempt — retried after the
//! backoff, or dead-lettered when its attempts are spent — even while no
//! consumer of its handler is connected. Beside it, rounds of their own
//! delete the finished events past `retention_ms`.

use std::time::Duration;

use chorus_runtime::{
    metrics::set_queue,
    outage::Outage,
    rounds::spawn_rounds,
    time::{micros, now_micros},
};
use tokio::task::JoinHandle;

use super::EventBus;
use crate::{domain::PurgeCursor, error::Result};

/// Expired leases handled per transaction.
const BATCH: u32 = 100;
/// Old events examined per purge transaction.
const PURGE_BATCH: u32 = 500;
/// How often finished events past their retention are deleted, at most: a
/// shorter retention purges as often as it is long.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How often the backlog is read for its gauges.
const BACKLOG_READ_EVERY: Duration = Duration::from_secs(5);
/// What the reaper's rounds do, as an outage of its database says.
const REAPING: &str = "expiring delivery leases";

impl EventBus {
    /// Runs the reaper until shutdown. Every replica may run one: rows are
    /// locked with `SKIP LOCKED`, so each lease is expired once.
    pub fn spawn_reaper(&self) -> JoinHandle<()> {
        if let Some(retention) = self.config.retention() {
            let bus = self.clone();
            spawn_rounds(retention.min(PURGE_EVERY), self.shutdown.clone(), move || {
                let bus = bus.clone();
                async move { bus.purge(retention).await }
            });
        }
        let bus = self.clone();
        spawn_rounds(BACKLOG_READ_EVERY, self.shutdown.clone(), move || {
            let bus = bus.clone();
            async move { bus.read_backlog().await }
        });
        let bus = self.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(bus.config.reaper_interval());
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // A database that is down is said once, not at every tick.
            let mut reaping = Outage::default();
            loop {
                tokio::select! {
                    () = bus.shutdown.cancelled() => return,
                    _ = interval.tick() => reaping.track(REAPING, bus.reap().await),
                }
            }
        })
    }

    /// Sets the backlog's gauges; a failed read leaves them as they were
    /// (the reaper says when the database is down).
    async fn read_backlog(&self) {
        match self.repository.backlog().await {
            Ok((open, oldest)) => {
                set_queue(&self.metrics.eventbus_backlog, &self.metrics.eventbus_backlog_oldest_age, open, oldest);
            }
            Err(error) => tracing::debug!(%error, "cannot read the event bus's backlog"),
        }
    }

    async fn reap(&self) -> Result<()> {
        loop {
            let expired = self.repository.expire(now_micros(), BATCH).await?;
            expired.namespaces.iter().for_each(|namespace| self.changed(namespace));
            self.metrics.eventbus_dead_letters.get().inc_by(expired.dead_lettered);
            if expired.namespaces.is_empty() {
                return Ok(());
            }
        }
    }

    /// Deletes, batch after batch, the finished events past `retention`, on
    /// rounds of its own: a backlog must not hold up the expiry of leases.
    async fn purge(&self, retention: Duration) {
        let published_before = now_micros().saturating_sub(micros(retention));
        let mut after: Option<PurgeCursor> = None;
        let mut purged = 0;
        loop {
            match self.repository.purge(published_before, after.as_ref(), PURGE_BATCH).await {
                Ok(batch) => {
                    purged += batch.events;
                    after = batch.next;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot purge finished events; retrying on the next purge");
                    break;
                }
            }
            if after.is_none() || self.shutdown.is_cancelled() {
                break;
            }
        }
        if purged > 0 {
            tracing::info!(purged, "finished events past their retention deleted");
        }
    }
}
