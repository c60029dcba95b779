//! The reaper: messages, replies and state whose TTL passed are cleared;
//! an expired key takes a new version, which its watchers see.

use std::time::Duration;

use chorus_runtime::{rounds::spawn_rounds, time::now_micros};
use tokio::task::JoinHandle;

use super::{Hub, keys};

/// Expired keys handled per transaction.
const BATCH: u32 = 500;
/// How often the inboxes' depth is read for its gauge.
const DEPTH_READ_EVERY: Duration = Duration::from_secs(5);

impl Hub {
    /// Runs the reaper until shutdown. Every replica may run one.
    pub fn spawn_reaper(&self) -> JoinHandle<()> {
        let hub = self.clone();
        spawn_rounds(DEPTH_READ_EVERY, self.shutdown.clone(), move || {
            let hub = hub.clone();
            async move { hub.read_inbox_depth().await }
        });
        let hub = self.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(hub.config.reaper_interval());
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = hub.shutdown.cancelled() => return,
                    _ = interval.tick() => hub.reap().await,
                }
            }
        })
    }

    /// Sets the gauge of the messages waiting in inboxes; a failed read
    /// leaves it as it was (the reaper says when the database is down).
    async fn read_inbox_depth(&self) {
        match self.repository.inbox_depth(now_micros()).await {
            Ok(depth) => self.metrics.hub_inbox_messages.get().set(i64::try_from(depth).unwrap_or(i64::MAX)),
            Err(error) => tracing::debug!(%error, "cannot read the inboxes' depth"),
        }
    }

    async fn reap(&self) {
        loop {
            match self.repository.expire(now_micros(), BATCH).await {
                Ok(expired) => {
                    if expired.removed > 0 || !expired.keys.is_empty() {
                        tracing::debug!(
                            removed = expired.removed,
                            keys = expired.keys.len(),
                            "expired hub data cleared"
                        );
                    }
                    for (namespace, key) in &expired.keys {
                        self.wakeups.notify(&keys::state(namespace, key));
                    }
                    if expired.keys.len() < BATCH as usize {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "hub reaper failed; retrying on the next tick");
                    return;
                }
            }
        }
    }
}
