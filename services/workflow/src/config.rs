//! Workflow settings (`[workflow]` in `chorus.toml`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkflowConfig {
    /// The folder whose `*.yaml` / `*.yml` definitions are put into the
    /// default namespace at start-up; a missing folder is skipped.
    pub definitions_dir: String,
    /// The namespace the folder is loaded into.
    pub namespace: String,
    /// An invalid file of the folder is logged (each problem an ERROR) and
    /// passed over, its workflow left at its latest stored version, instead
    /// of stopping start-up: one bad edit does not keep every other
    /// workflow (and, in `chorus dev`, every service) down.
    pub skip_invalid_definitions: bool,
    /// What templates see as `config` (`{{ config.notify }}`).
    pub vars: BTreeMap<String, serde_json::Value>,
    /// How long an engine's claim on a run lasts without renewal; another
    /// engine resumes a run this long after its engine died.
    pub lease_ms: u64,
    /// How often an engine looks for due runs without a wake-up.
    pub poll_ms: u64,
    /// The most runs one engine drives at once.
    pub max_active_runs: u32,
    /// This engine's name in run claims; an engine restarted under the same
    /// name resumes its runs at once instead of after their claims lapse.
    /// Default for `chorus dev` / `serve`: the host name and listen address
    /// (unique among live processes, stable across restarts on a fixed port).
    pub engine_id: Option<String>,
    /// The services steps call; unset: this process's own (called in
    /// process when it serves them, else at its own address).
    pub taskstore_url: Option<String>,
    pub hub_url: Option<String>,
    pub eventbus_url: Option<String>,
    pub gateway_url: Option<String>,
    /// A bearer token the engine's calls to other processes carry: a
    /// gateway that checks credentials (`gateway.auth`) takes one for every
    /// namespace on the services beside it, Delegate included.
    pub token: Option<String>,
    /// Webhook steps may call loopback and private addresses.
    pub allow_private_webhooks: bool,
    pub webhook_timeout_ms: u64,
}

impl Default for WorkflowConfig {
    fn default() -> Self {
        Self {
            definitions_dir: "workflows".to_owned(),
            namespace: "default".to_owned(),
            skip_invalid_definitions: false,
            vars: BTreeMap::new(),
            lease_ms: 2_000,
            poll_ms: 200,
            max_active_runs: 512,
            engine_id: None,
            taskstore_url: None,
            hub_url: None,
            eventbus_url: None,
            gateway_url: None,
            token: None,
            allow_private_webhooks: false,
            webhook_timeout_ms: 10_000,
        }
    }
}

impl WorkflowConfig {
    pub fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_ms.max(100))
    }

    pub fn poll(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.poll_ms.clamp(10, 60_000))
    }
}
