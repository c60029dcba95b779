//! Task store settings (`[taskstore]` in `chorus.toml`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::Limits;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskStoreConfig {
    /// Lease length when a worker does not ask for one (at least 100).
    #[serde(deserialize_with = "lease_ms")]
    pub default_lease_ms: u64,
    /// Longest lease a worker may ask for (at least 100).
    #[serde(deserialize_with = "lease_ms")]
    pub max_lease_ms: u64,
    /// How often expired leases are looked for.
    pub reaper_interval_ms: u64,
    /// Longest a waiting reader goes without re-reading the database when no
    /// wake-up signal arrives (signals are hints; this bounds a lost one).
    pub poll_interval_ms: u64,
    /// How long a blocking spawn waits when the caller gives no timeout.
    pub default_spawn_timeout_ms: u64,
    /// The event bus every change is published to (`http://host:port`).
    /// Unset: changes are not published, except under `chorus dev`, which
    /// publishes to its own bus.
    pub eventbus_url: Option<String>,
    /// Most events the outbox relay publishes to the event bus per round.
    pub outbox_batch_size: u32,
    /// How long a replica keeps the outbox relay without renewing: when it
    /// stops, another replica takes over after this.
    pub outbox_lease_ms: u64,
    /// The largest event payload the relay publishes whole: a larger one
    /// (a big message or artifact) goes without its content, flagged
    /// `content_omitted`. Keep it at most the event bus's
    /// `max_payload_bytes`, or the bus refuses such events and the relay
    /// offers them again and again, holding up every event after them.
    pub outbox_max_payload_bytes: usize,
    /// How long a task is kept after it finished: then the reaper deletes it
    /// with its history, artifacts, events, inbox rows and push configs
    /// (a subtask goes with its whole tree, once every task in it is that
    /// old). 0 keeps every task forever.
    pub retention_ms: u64,
    /// The most bytes of messages and artifacts (as stored, JSON) a task may
    /// hold; a message or artifact that would take it past is refused.
    /// 0: no limit.
    pub max_task_bytes: u64,
    /// The most push notification configs one task may have (at least 1).
    #[serde(deserialize_with = "at_least_one")]
    pub max_push_configs_per_task: u32,
    pub limits: Limits,
}

/// A lease length in milliseconds: no shorter than a worker may ask for
/// ([`MIN_LEASE`](crate::service::MIN_LEASE)); a bound below it would refuse
/// every claim.
fn lease_ms<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let lease = u64::deserialize(deserializer)?;
    let min = crate::service::MIN_LEASE.as_millis();
    if u128::from(lease) >= min {
        Ok(lease)
    } else {
        Err(serde::de::Error::custom(format!("{lease} ms is shorter than the shortest lease, {min} ms")))
    }
}

/// A count that must be at least 1: 0 would refuse everything it counts.
fn at_least_one<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    match u32::deserialize(deserializer)? {
        0 => Err(serde::de::Error::custom("must be at least 1")),
        count => Ok(count),
    }
}

impl Default for TaskStoreConfig {
    fn default() -> Self {
        Self {
            default_lease_ms: 30_000,
            max_lease_ms: 3_600_000,
            reaper_interval_ms: 1_000,
            poll_interval_ms: 1_000,
            default_spawn_timeout_ms: 60_000,
            eventbus_url: None,
            outbox_batch_size: 500,
            outbox_lease_ms: 10_000,
            outbox_max_payload_bytes: 1 << 20,
            retention_ms: 30 * 24 * 3_600_000,
            max_task_bytes: 16 << 20,
            max_push_configs_per_task: 10,
            limits: Limits::default(),
        }
    }
}

impl TaskStoreConfig {
    pub fn default_lease(&self) -> Duration {
        Duration::from_millis(self.default_lease_ms)
    }

    pub fn max_lease(&self) -> Duration {
        Duration::from_millis(self.max_lease_ms)
    }

    pub fn reaper_interval(&self) -> Duration {
        Duration::from_millis(self.reaper_interval_ms.max(1))
    }

    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms.max(1))
    }

    pub fn default_spawn_timeout(&self) -> Duration {
        Duration::from_millis(self.default_spawn_timeout_ms)
    }

    pub fn outbox_batch_size(&self) -> u32 {
        self.outbox_batch_size.max(1)
    }

    pub fn outbox_lease(&self) -> Duration {
        Duration::from_millis(self.outbox_lease_ms.max(1))
    }

    /// How long a finished task is kept; `None`: forever.
    pub fn retention(&self) -> Option<Duration> {
        (self.retention_ms > 0).then(|| Duration::from_millis(self.retention_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_tasks_are_kept_thirty_days_or_forever_at_zero() {
        assert_eq!(TaskStoreConfig::default().retention(), Some(Duration::from_secs(30 * 24 * 3_600)));
        let forever = TaskStoreConfig { retention_ms: 0, ..TaskStoreConfig::default() };
        assert_eq!(forever.retention(), None);
    }

    #[test]
    fn lease_bounds_below_the_shortest_lease_are_refused() {
        let parse = |json: &str| serde_json::from_str::<TaskStoreConfig>(json).map_err(|error| error.to_string());
        let config = parse(r#"{"default_lease_ms": 100, "max_lease_ms": 120000}"#).expect("in bounds");
        assert_eq!((config.default_lease_ms, config.max_lease_ms), (100, 120_000));
        for refused in [r#"{"max_lease_ms": 50}"#, r#"{"default_lease_ms": 0}"#] {
            let error = parse(refused).expect_err(refused);
            assert!(error.contains("shorter than the shortest lease, 100 ms"), "{error}");
        }
    }
}
