//! The task model: A2A tasks plus chorus's subtask fields. No wire types here.

use serde::{Deserialize, Serialize};

use super::state::TaskState;
use crate::error::TaskStoreError;

/// Free-form JSON object (A2A `metadata`).
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Agent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartContent {
    Text(String),
    Raw(#[serde(with = "base64_bytes")] Vec<u8>),
    Url(String),
    Data(serde_json::Value),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Part {
    pub content: PartContent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Self { content: PartContent::Text(text.into()), metadata: None, filename: None, media_type: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    pub role: Role,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// A message of one text part.
    pub fn text(message_id: impl Into<String>, role: Role, text: impl Into<String>) -> Self {
        Self {
            message_id: message_id.into(),
            context_id: None,
            task_id: None,
            role,
            parts: vec![Part::text(text)],
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        }
    }

    /// The text parts joined by newlines.
    pub fn joined_text(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|part| match &part.content {
                PartContent::Text(text) => Some(text.as_str()),
                PartContent::Raw(_) | PartContent::Url(_) | PartContent::Data(_) => None,
            })
            .collect();
        texts.join("\n")
    }

    /// This message as stored with a task: stamped with its task and context.
    /// A message that names another context is refused: a task's context
    /// never changes, and its messages are its context's (A2A §3.4.3).
    pub(crate) fn bound_to(mut self, task_id: &str, context_id: &str) -> Result<Self, TaskStoreError> {
        if let Some(named) = self.context_id.take().filter(|named| named != context_id) {
            return Err(TaskStoreError::ContextMismatch {
                task_id: task_id.to_owned(),
                context_id: context_id.to_owned(),
                named,
            });
        }
        self.task_id = Some(task_id.to_owned());
        self.context_id = Some(context_id.to_owned());
        Ok(self)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    pub artifact_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub parts: Vec<Part>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<JsonObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// Microseconds since the Unix epoch.
    pub timestamp: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerKind {
    Orchestrator,
    Worker,
    Agent,
}

impl OwnerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Orchestrator => "orchestrator",
            Self::Worker => "worker",
            Self::Agent => "agent",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [Self::Orchestrator, Self::Worker, Self::Agent].into_iter().find(|kind| kind.as_str() == value)
    }
}

/// Who receives a subtask's completion and notifications.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub kind: OwnerKind,
    pub id: String,
}

/// Where a task tree's root came from; it sets the depth limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnContext {
    Agent,
    Orchestrator,
}

impl SpawnContext {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Orchestrator => "orchestrator",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [Self::Agent, Self::Orchestrator].into_iter().find(|context| context.as_str() == value)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub namespace: String,
    pub id: String,
    pub context_id: String,
    pub agent_id: String,
    pub status: TaskStatus,
    pub artifacts: Vec<Artifact>,
    pub history: Vec<Message>,
    pub metadata: Option<JsonObject>,
    pub parent_id: Option<String>,
    pub owner: Option<Owner>,
    pub depth: u32,
    pub spawn_context: SpawnContext,
    /// How many times a worker has claimed the task.
    pub attempt: u32,
    /// Microseconds since the Unix epoch.
    pub created_at: i64,
}

mod base64_bytes {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_through_json() {
        let part = Part { content: PartContent::Raw(vec![0, 159, 255]), ..Part::text("") };
        let json = serde_json::to_string(&part).unwrap();
        assert!(json.contains("AJ//"), "{json}");
        assert_eq!(serde_json::from_str::<Part>(&json).unwrap(), part);
    }

    #[test]
    fn joined_text_skips_other_parts() {
        let mut message = Message::text("m", Role::User, "one");
        message.parts.push(Part { content: PartContent::Url("https://x".into()), ..Part::text("") });
        message.parts.push(Part::text("two"));
        assert_eq!(message.joined_text(), "one\ntwo");
    }
}
