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
