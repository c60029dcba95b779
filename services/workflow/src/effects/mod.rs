//! Side effects of steps, behind one trait: tasks in the task store, hub
//! messages, outbound webhooks, A2A delegation through the gateway and
//! bus events. Every effect carries an idempotency key derived from (run,
//! step, iteration, attempt), so issuing it again after a crash finds the
//! first one instead of making a second.

mod clients;
mod task;

use async_trait::async_trait;
use serde_json::Value;

pub(crate) use self::clients::WEBHOOK_REMEDY;
pub use self::clients::{ClientEffects, Endpoints};

/// Why an effect did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    /// Worth trying again later (a service unavailable, a timeout).
    #[error("{0}")]
    Transient(String),
    /// The step's attempt fails with this error.
    #[error("{0}")]
    Failed(String),
    /// The step fails with this error, whatever attempts remain: no retry
    /// can change it (an address the guard refuses, an answer of 4xx).
    #[error("{0}")]
    Refused(String),
}

/// Who ran an effect: the run and its step record.
#[derive(Debug, Clone, PartialEq)]
pub struct Origin {
    pub namespace: String,
    pub workflow: String,
    pub run_id: String,
    pub step_id: String,
    pub iteration: u32,
    pub attempt: u32,
    /// The idempotency key of the effect.
    pub key: String,
}

/// How a spawned task ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutcome {
    /// Completed: the step's output.
    Completed(Value),
    /// Failed, rejected or canceled: why.
    Failed(String),
}

/// What a delegation came back with.
#[derive(Debug, Clone, PartialEq)]
pub struct Delegated {
    /// The agent's task, when it made one (an agent may answer with a
    /// message alone).
    pub task_id: Option<String>,
    pub outcome: TaskOutcome,
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Topic(String),
    Agent(String),
    Webhook(String),
    /// A bus event of this type.
    Event(String),
}

/// What a message says.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub text: Option<String>,
    /// `Null`: none.
    pub data: Value,
    /// A hub message's content type.
    pub kind: String,
}

/// The side effects the engine issues.
#[async_trait]
pub trait Effects: Send + Sync + std::fmt::Debug {
    /// Creates the task of a spawn step for `agent` (or finds the one made
    /// with the same key); its id. `input` is the record's rendered input.
    async fn spawn(&self, origin: &Origin, agent: &str, input: &Value) -> Result<String, EffectError>;

    /// Waits until the task ends; `None` when the task store has no such
    /// task (its data was restored from before the task was made).
    async fn await_task(&self, namespace: &str, task_id: &str) -> Result<Option<TaskOutcome>, EffectError>;

    /// Cancels a task, for `reason` (its status message); a task already
    /// finished is left as it is. The agent of a task canceled here that no
    /// worker ever claimed.
    async fn cancel_task(&self, namespace: &str, task_id: &str, reason: &str) -> Result<Option<String>, EffectError>;

    /// Sends a message to an external A2A agent and waits for its answer:
    /// the step's output. With a `timeout`, the delegation ends then, and the
    /// remote task is canceled, even when the engine is gone by then.
    async fn delegate(
        &self,
        origin: &Origin,
        agent: &str,
        input: &Value,
        timeout: Option<std::time::Duration>,
    ) -> Result<Delegated, EffectError>;

    /// Sends a hub message, calls a webhook or publishes a bus event; what to
    /// record as output.
    async fn message(&self, origin: &Origin, to: &Destination, note: &Note) -> Result<Value, EffectError>;

    /// Publishes an event on the bus; its sequence.
    async fn publish(&self, origin: &Origin, event_type: &str, payload: &Value) -> Result<u64, EffectError>;
}
