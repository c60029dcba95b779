//! The lease reaper: a delivery whose consumer neither acked nor nacked it
//! before its lease ran out counts as a failed attempt — retried after the
//! backoff, or dead-lettered when its attempts are spent — even while no
//! consumer of its handler is connected.

use chorus_runtime::time::now_micros;
use tokio::task::JoinHandle;

use super::EventBus;

/// Expired leases handled per transaction.
const BATCH: u32 = 100;

impl EventBus {
    /// Runs the reaper until shutdown. Every replica may run one: rows are
    /// locked with `SKIP LOCKED`, so each lease is expired once.
    pub fn spawn_reaper(&self) -> JoinHandle<()> {
        let bus = self.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(bus.config.reaper_interval());
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = bus.shutdown.cancelled() => return,
                    _ = interval.tick() => bus.reap().await,
                }
            }
        })
    }

    async fn reap(&self) {
        loop {
            match self.repository.expire(now_micros(), BATCH).await {
                Ok(expired) => {
                    expired.namespaces.iter().for_each(|namespace| self.changed(namespace));
                    self.metrics.eventbus_dead_letters.get().inc_by(expired.dead_lettered);
                    if expired.namespaces.is_empty() {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "delivery lease reaper failed; retrying on the next tick");
                    return;
                }
            }
        }
    }
}
