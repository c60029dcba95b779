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
