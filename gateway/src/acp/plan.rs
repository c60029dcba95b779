//! What an agent's status message may carry for the IDE beyond its words:
//! a plan (`acp/plan`, shown as the `plan` update) and narration of its
//! reasoning (`acp/thought: true`, shown as `agent_thought_chunk`).
//!
//! `acp/plan` is a list of `{"content", "priority": "high"|"medium"|"low",
//! "status": "pending"|"in_progress"|"completed"}`; each one replaces the
//! plan shown, as ACP plans do.

use a2a::Message;
use serde::Deserialize;

/// The metadata key of a plan.
pub(crate) const PLAN: &str = "acp/plan";
/// The metadata key marking a message as the agent's thinking.
pub(crate) const THOUGHT: &str = "acp/thought";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Priority {
    High,
    Medium,
    Low,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EntryStatus {
    Pending,
    InProgress,
    Completed,
}

/// One entry of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanEntry {
    pub(crate) content: String,
    pub(crate) priority: Priority,
    pub(crate) status: EntryStatus,
}

/// The plan `message` carries, if it carries one that reads as a plan
/// (a malformed one is logged and ignored: it is the agent's mistake, not
/// the IDE's).
pub(crate) fn plan_of(message: &Message) -> Option<Vec<PlanEntry>> {
    let plan = message.metadata.as_ref()?.get(PLAN)?;
    match serde_json::from_value(plan.clone()) {
        Ok(entries) => Some(entries),
        Err(error) => {
            tracing::warn!(message_id = %message.message_id, %error, "ignoring a malformed acp/plan");
            None
        }
    }
}

/// Whether `message` narrates the agent's thinking.
pub(crate) fn is_thought(message: &Message) -> bool {
    message.metadata.as_ref().and_then(|metadata| metadata.get(THOUGHT)).and_then(serde_json::Value::as_bool)
        == Some(true)
}

#[cfg(test)]
mod tests {
    use a2a::{Part, Role};
    use serde_json::json;

    use super::*;

    fn message(metadata: serde_json::Value) -> Message {
        let mut message = Message::new(Role::Agent, vec![Part::text("x")]);
        message.metadata = serde_json::from_value(metadata).expect("metadata is an object");
        message
    }

    #[test]
    fn plans_and_thoughts_are_read_from_metadata() {
        let planned = message(json!({"acp/plan": [
            {"content": "Read the files", "priority": "high", "status": "completed"},
            {"content": "Publish", "priority": "low", "status": "pending"},
        ]}));
        let plan = plan_of(&planned).expect("a plan");
        assert_eq!(plan.len(), 2);
        assert_eq!(plan[0].status, EntryStatus::Completed);
        assert_eq!(plan[1].priority, Priority::Low);
        assert!(
            plan_of(&message(json!({"acp/plan": [{"content": "x", "priority": "urgent", "status": "pending"}]})))
                .is_none()
        );
        assert!(plan_of(&message(json!({}))).is_none());
        assert!(is_thought(&message(json!({"acp/thought": true}))));
        assert!(!is_thought(&message(json!({"acp/thought": "yes"}))));
    }
}
