//! Stored definition versions.

use serde_json::{Map, Value};

/// A trigger as stored beside a version (what the contract lists): an
/// event type and filter, or a cron schedule.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredTrigger {
    /// Empty for a schedule.
    pub event_type: String,
    pub filter: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
}

impl StoredTrigger {
    /// Whether events on the bus start runs by it (not a schedule).
    pub fn listens(&self) -> bool {
        self.cron.is_none()
    }
}

/// One stored version of a workflow definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub namespace: String,
    pub name: String,
    /// 1, 2, 3, ... per name.
    pub version: u32,
    pub description: String,
    pub triggers: Vec<StoredTrigger>,
    /// The YAML text; empty in lists that did not ask for it.
    pub source: String,
    pub file: String,
    /// Hex SHA-256 of `source`.
    pub source_sha256: String,
    pub created_by: String,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
    /// Whether the workflow (every version of it) is disabled now, and by
    /// whom: it is a workflow's state, not its version's.
    pub disabled: Option<Disabled>,
}

/// Who disabled a workflow, when and why. A disabled workflow starts no
/// run, by any trigger or start, until it is enabled; runs already started
/// go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub by: String,
    pub reason: String,
    /// Microseconds since the Unix epoch.
    pub at: i64,
}

/// What a start needs of a workflow before it reads its version: the latest
/// version's number, and whether the workflow is disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub latest: u32,
    pub disabled: Option<Disabled>,
}

/// A validated definition to store as the next version.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDefinition {
    pub namespace: String,
    pub name: String,
    pub description: String,
    pub triggers: Vec<StoredTrigger>,
    pub source: String,
    pub file: String,
    pub source_sha256: String,
    pub created_by: String,
    /// A text some version already has changes nothing, not only the
    /// latest's: a folder loaded again at start-up leaves a version applied
    /// since (from another file, by an operator) the latest.
    pub keep_if_stored: bool,
}

/// What a put did.
#[derive(Debug, Clone, PartialEq)]
pub struct Put {
    pub definition: Definition,
    /// The source matched the latest version: nothing was added.
    pub unchanged: bool,
    /// The version that was the latest before this put added one.
    pub replaced: Option<Definition>,
}

/// Where a list page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageToken {
    /// Latest versions by name: after this name.
    AfterName(String),
    /// Versions of one name, newest first: below this version.
    BelowVersion(u32),
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq)]
pub struct DefinitionPage {
    pub definitions: Vec<Definition>,
    pub next: Option<PageToken>,
}
