//! Event bus settings (`[eventbus]` in `chorus.toml`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::RetryPolicy;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventBusConfig {
    /// Retry policy fields a registration leaves unset.
    pub default_max_attempts: u32,
    pub default_initial_backoff_ms: u64,
    pub default_max_backoff_ms: u64,
    pub default_visibility_timeout_ms: u64,
    /// How often leases that ran out are looked for.
    pub reaper_interval_ms: u64,
    /// Longest a waiting stream goes without re-reading the database when no
    /// wake-up signal arrives (signals are hints; this bounds a lost one).
    pub poll_interval_ms: u64,
    /// Largest payload of one event.
    pub max_payload_bytes: usize,
    /// How long an event is kept: then, once every handler has finished it
    /// (acked, skipped or dead-lettered), the reaper deletes it with its
    /// deliveries and dead letters. 0 keeps every event forever.
    pub retention_ms: u64,
}

impl Default for EventBusConfig {
    fn default() -> Self {
        Self {
            default_max_attempts: 5,
            default_initial_backoff_ms: 1_000,
            default_max_backoff_ms: 60_000,
            default_visibility_timeout_ms: 30_000,
            reaper_interval_ms: 1_000,
            poll_interval_ms: 1_000,
            max_payload_bytes: 1 << 20,
            retention_ms: 7 * 24 * 3_600_000,
        }
    }
}

impl EventBusConfig {
    pub fn default_retry(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.default_max_attempts.max(1),
            initial_backoff: Duration::from_millis(self.default_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.default_max_backoff_ms),
            visibility_timeout: Duration::from_millis(self.default_visibility_timeout_ms.max(1)),
        }
    }

    pub fn reaper_interval(&self) -> Duration {
        Duration::from_millis(self.reaper_interval_ms.max(1))
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms.max(1))
    }

    /// How long an event is kept; `None`: forever.
    pub fn retention(&self) -> Option<Duration> {
        (self.retention_ms > 0).then(|| Duration::from_millis(self.retention_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_kept_seven_days_or_forever_at_zero() {
        assert_eq!(EventBusConfig::default().retention(), Some(Duration::from_secs(7 * 24 * 3_600)));
        let forever = EventBusConfig { retention_ms: 0, ..EventBusConfig::default() };
        assert_eq!(forever.retention(), None);
    }
}
