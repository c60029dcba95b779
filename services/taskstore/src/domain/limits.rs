//! Safety limits on subtask spawning.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::SpawnContext;

/// Limits on how subtasks may be spawned; each one has its own error.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Deepest subtask below a root created by an orchestrator.
    pub max_depth_orchestrator: u32,
    /// Deepest subtask below a root created by a standalone agent.
    pub max_depth_agent: u32,
    /// Unfinished children one parent may have at once.
    pub max_concurrent_subtasks: u32,
    /// Children one parent may spawn in its lifetime.
    pub max_total_subtasks: u32,
    /// Children one parent may spawn in any minute.
    pub max_spawns_per_minute: u32,
    /// Reject a spawn that repeats an ancestor's (agent, normalised prompt).
    pub reject_cycles: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_depth_orchestrator: 2,
            max_depth_agent: 1,
            max_concurrent_subtasks: 10,
            max_total_subtasks: 50,
            max_spawns_per_minute: 100,
            reject_cycles: true,
        }
    }
}

impl Limits {
    pub fn max_depth(&self, context: SpawnContext) -> u32 {
        match context {
            SpawnContext::Agent => self.max_depth_agent,
            SpawnContext::Orchestrator => self.max_depth_orchestrator,
        }
    }
}

/// Identifies "the same work": the agent and its prompt, lower-cased with
/// whitespace collapsed, hashed.
pub fn prompt_fingerprint(agent_id: &str, prompt: &str) -> String {
    let normalised = prompt.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    let digest = Sha256::new().chain_update(agent_id.as_bytes()).chain_update([0]).chain_update(normalised).finalize();
    digest.iter().take(16).map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_ignore_case_and_spacing_but_not_agents() {
        let a = prompt_fingerprint("coder", "Fix  the\nbug ");
        assert_eq!(a, prompt_fingerprint("coder", "fix the bug"));
        assert_ne!(a, prompt_fingerprint("reviewer", "fix the bug"));
        assert_ne!(a, prompt_fingerprint("coder", "fix the bugs"));
    }
}
