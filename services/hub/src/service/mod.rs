//! The hub service: the repository plus what storage alone cannot do —
//! waiting for messages, replies and changes, waking waiters after commits,
//! and expiring what outlived its TTL.
//!
//! Every write goes through the repository (one transaction) and is then
//! announced on [`Wakeups`], so waiting calls and streams re-read at once;
//! they also poll, so a lost signal only delays.

mod agents;
mod handoff;
mod messaging;
mod reaper;
mod state;

use std::sync::Arc;

use chorus_runtime::{metrics::Metrics, wakeup::Wakeups};
use tokio_util::sync::CancellationToken;

pub use self::{
    agents::DISCOVERY_TOPIC,
    messaging::{Delegated, Delegation, Inbox, Receive, Received, TimeoutPolicy},
};
use crate::{config::HubConfig, repository::HubRepository};

/// The hub. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Hub {
    repository: Arc<dyn HubRepository>,
    wakeups: Wakeups,
    config: Arc<HubConfig>,
    shutdown: CancellationToken,
    /// The inbox streams open in this process, for hand-offs.
    streams: handoff::Streams,
    /// Where messages sent are counted.
    metrics: Metrics,
}

/// Wake-up keys: who waits for what.
mod keys {
    pub(super) fn inbox(namespace: &str, agent_id: &str) -> String {
        format!("hub/{namespace}/inbox/{agent_id}")
    }

    pub(super) fn reply(namespace: &str, correlation_id: &str) -> String {
        format!("hub/{namespace}/reply/{correlation_id}")
    }

    pub(super) fn acked(namespace: &str, message_id: &str) -> String {
        format!("hub/{namespace}/acked/{message_id}")
    }

    pub(super) fn state(namespace: &str, key: &str) -> String {
        format!("hub/{namespace}/state/{key}")
    }
}

impl Hub {
    /// `shutdown` ends every stream and wait the service has open.
    pub fn new(
        repository: Arc<dyn HubRepository>,
        wakeups: Wakeups,
        config: HubConfig,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            repository,
            wakeups,
            config: Arc::new(config),
            shutdown,
            streams: handoff::Streams::default(),
            metrics: Metrics::default(),
        }
    }

    /// Counts into `metrics` (the server's) instead of a set of its own.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }
}
