//! Hub settings (`[hub]` in `chorus.toml`).

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HubConfig {
    /// A message's time to live when the sender gives none.
    pub default_ttl_ms: u64,
    /// The longest time to live a sender may give (messages and state).
    pub max_ttl_ms: u64,
    /// Largest message payload or state value.
    pub max_payload_bytes: usize,
    /// Most messages queued in one agent's inbox.
    pub max_queue_depth: u32,
    /// An agent not heard from for this long is reported stale.
    pub stale_after_ms: u64,
    /// How long a handed-out message stays leased without an ack.
    pub default_ack_timeout_ms: u64,
    /// How often expired messages, state and delegations are cleared.
    pub reaper_interval_ms: u64,
    /// Longest a waiting call goes without re-reading the database when no
    /// wake-up signal arrives (signals are hints; this bounds a lost one).
    pub poll_interval_ms: u64,
    /// Agents that `static` discovery reports, by namespace.
    pub static_agents: BTreeMap<String, Vec<StaticAgent>>,
}

/// An agent known from configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaticAgent {
    pub id: String,
    pub agent_type: String,
    pub capabilities: Vec<String>,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            default_ttl_ms: 3_600_000,
            max_ttl_ms: 7 * 24 * 3_600_000,
            max_payload_bytes: 1 << 20,
            max_queue_depth: 10_000,
            stale_after_ms: 60_000,
            default_ack_timeout_ms: 30_000,
            reaper_interval_ms: 1_000,
            poll_interval_ms: 1_000,
            static_agents: BTreeMap::new(),
        }
    }
}

impl HubConfig {
    pub fn default_ttl(&self) -> Duration {
        Duration::from_millis(self.default_ttl_ms)
    }

    pub fn max_ttl(&self) -> Duration {
        Duration::from_millis(self.max_ttl_ms)
    }

    pub fn stale_after(&self) -> Duration {
        Duration::from_millis(self.stale_after_ms)
    }

    pub fn default_ack_timeout(&self) -> Duration {
        Duration::from_millis(self.default_ack_timeout_ms.max(1))
    }

    pub fn reaper_interval(&self) -> Duration {
        Duration::from_millis(self.reaper_interval_ms.max(1))
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms.max(1))
    }
}
