//! Workflow settings (`[workflow]` in `chorus.toml`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkflowConfig {
    /// The folder whose `*.yaml` / `*.yml` definitions are put into the
    /// default namespace at start-up; a missing folder is skipped.
    pub definitions_dir: String,
    /// The namespace the folder is loaded into.
    pub namespace: String,
}

impl Default for WorkflowConfig {
    fn default() -> Self {
        Self { definitions_dir: "workflows".to_owned(), namespace: "default".to_owned() }
    }
}
