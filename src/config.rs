//! The configuration of a chorus process: every section, loaded in layers.

use serde::{Deserialize, Serialize};

use chorus_eventbus::EventBusConfig;
use chorus_gateway::GatewayConfig;
use chorus_hub::HubConfig;
use chorus_runtime::{server::ServerConfig, storage::StorageConfig, telemetry::TelemetryConfig};
use chorus_taskstore::TaskStoreConfig;
use chorus_workflow::WorkflowConfig;

/// `chorus.toml`. Every key can also be set as `CHORUS_<SECTION>__<KEY>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ChorusConfig {
    /// Where gRPC and HTTP are served (one port).
    pub(crate) listen: String,
    pub(crate) server: ServerConfig,
    pub(crate) storage: StorageConfig,
    pub(crate) telemetry: TelemetryConfig,
    pub(crate) taskstore: TaskStoreConfig,
    pub(crate) eventbus: EventBusConfig,
    pub(crate) hub: HubConfig,
    pub(crate) gateway: GatewayConfig,
    pub(crate) workflow: WorkflowConfig,
}

impl Default for ChorusConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7800".to_owned(),
            server: ServerConfig::default(),
            storage: StorageConfig::default(),
            telemetry: TelemetryConfig::default(),
            taskstore: TaskStoreConfig::default(),
            eventbus: EventBusConfig::default(),
            hub: HubConfig::default(),
            gateway: GatewayConfig::default(),
            workflow: WorkflowConfig::default(),
        }
    }
}

/// The longest a blocking `SendMessage` may wait, as the README states.
const MAX_BLOCKING_MS: u64 = 3_600_000;

impl ChorusConfig {
    /// Settings each valid alone that no process could work with, or that
    /// contradict each other: each names the keys and what to do. Empty for
    /// a sound configuration.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut zero = |key: &str, value: u64, what: &str| {
            if value == 0 {
                problems.push(format!("{key} must be more than 0: {what}"));
            }
        };
        zero(
            "server.request_timeout_ms",
            self.server.request_timeout_ms,
            "every call, health included, would end at once",
        );
        zero("storage.max_connections", u64::from(self.storage.max_connections), "no statement could run");
        zero("storage.acquire_timeout_ms", self.storage.acquire_timeout_ms, "no connection could be waited for");
        zero("workflow.lease_ms", self.workflow.lease_ms, "a run's claim would lapse as it is made");
        zero("workflow.poll_ms", self.workflow.poll_ms, "the engine would look for due runs without pause");
        let mut at_most = |key: &str, value: u64, bound_key: &str, bound: u64| {
            if value > bound {
                problems.push(format!("{key} ({value}) must be at most {bound_key} ({bound})"));
            }
        };
        let (taskstore, hub, eventbus) = (&self.taskstore, &self.hub, &self.eventbus);
        at_most(
            "taskstore.default_lease_ms",
            taskstore.default_lease_ms,
            "taskstore.max_lease_ms",
            taskstore.max_lease_ms,
        );
        at_most("hub.default_ttl_ms", hub.default_ttl_ms, "hub.max_ttl_ms", hub.max_ttl_ms);
        let backoff = eventbus.default_initial_backoff_ms;
        at_most(
            "eventbus.default_initial_backoff_ms",
            backoff,
            "eventbus.default_max_backoff_ms",
            eventbus.default_max_backoff_ms,
        );
        at_most("gateway.blocking_timeout_ms", self.gateway.blocking_timeout_ms, "an hour", MAX_BLOCKING_MS);
        problems
    }
}

/// Command-line overrides: the last layer. Absent flags change nothing.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Flags {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<String>,
    #[serde(skip_serializing_if = "StorageFlags::is_empty")]
    pub(crate) storage: StorageFlags,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct StorageFlags {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) database_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) data_dir: Option<String>,
}

impl StorageFlags {
    fn is_empty(&self) -> bool {
        self.database_url.is_none() && self.data_dir.is_none()
    }
}

#[cfg(test)]
mod tests {
    use figment::{Figment, providers::Format as _, providers::Toml};

    use super::*;

    /// The README's configuration reference, which a reader copies from.
    fn readme_reference() -> String {
        let readme = include_str!("../README.md");
        let section = &readme[readme.find("## Configuration").expect("a configuration section")..];
        let block = &section[section.find("```toml\n").expect("a TOML block") + "```toml\n".len()..];
        block[..block.find("```").expect("the block ends")].to_owned()
    }

    /// A line that sets a key, commented out (`# key = value`), set.
    fn uncommented(line: &str) -> &str {
        let setting = line.strip_prefix("# ").filter(|rest| {
            rest.split_once(" = ").is_some_and(|(key, _)| key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        });
        setting.unwrap_or(line)
    }

    #[test]
    fn settings_no_process_could_work_with_are_each_named() {
        assert_eq!(ChorusConfig::default().problems(), Vec::<String>::new());
        let mut config = ChorusConfig::default();
        config.server.request_timeout_ms = 0;
        config.workflow.poll_ms = 0;
        config.taskstore.default_lease_ms = 5_000;
        config.taskstore.max_lease_ms = 1_000;
        config.gateway.blocking_timeout_ms = 4_000_000;
        let problems = config.problems();
        let keys: Vec<&str> = problems.iter().filter_map(|problem| problem.split(' ').next()).collect();
        let expected = [
            "server.request_timeout_ms",
            "workflow.poll_ms",
            "taskstore.default_lease_ms",
            "gateway.blocking_timeout_ms",
        ];
        assert_eq!(keys, expected, "{problems:?}");
        assert!(problems[2].ends_with("must be at most taskstore.max_lease_ms (1000)"), "{problems:?}");
    }

    #[test]
    fn the_readme_configuration_reference_names_only_real_settings() {
        let reference = readme_reference();
        let load = |toml: &str| {
            Figment::from(Toml::string(toml))
                .extract::<ChorusConfig>()
                .unwrap_or_else(|error| panic!("the README's configuration block does not load: {error}\n{toml}"))
        };
        let loaded = load(&reference);
        assert_eq!(loaded.gateway.agents.len(), 3, "{:?}", loaded.gateway.agents);
        assert_eq!(loaded.taskstore.max_push_configs_per_task, 10);
        let every: String = reference.lines().map(|line| format!("{}\n", uncommented(line))).collect();
        assert_ne!(every, reference, "the reference shows optional settings commented out");
        let loaded = load(&every);
        assert_eq!(loaded.workflow.engine_id.as_deref(), Some("engine-1"));
        assert!(loaded.gateway.registry_file.is_some());
    }
}
