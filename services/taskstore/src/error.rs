//! The task store's one error type, and its one mapping to error codes.

use chorus_runtime::{
    error::{ErrorCode, Reason, ServiceError},
    storage::storage_error,
    validate::FieldViolation,
};

use crate::domain::{SpawnContext, TaskState};

#[derive(Debug, thiserror::Error)]
pub enum TaskStoreError {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("task {0} not found")]
    TaskNotFound(String),
    #[error(
        "request key {key} already made task {task_id}, which {mismatch}; reuse a message id or idempotency key \
         only to retry the same request"
    )]
    RequestKeyInUse { key: String, task_id: String, mismatch: String },
    #[error(
        "message id {key} already told the owner of task {task_id} something else (a {kind} notification); reuse \
         a message id only to retry the same notification"
    )]
    NotificationKeyInUse { key: String, task_id: String, kind: &'static str },
    #[error("push notification config {id} of task {task_id} not found")]
    PushConfigNotFound { task_id: String, id: String },
    #[error(
        "push notification config {id} of task {task_id} is not held by follower {follower}: its lease ran out and \
         another gateway took it, or it was replaced"
    )]
    PushConfigNotHeld { task_id: String, id: String, follower: String },
    #[error(
        "task {task_id} has {limit} push notification configs, the most a task may have \
         (taskstore.max_push_configs_per_task): delete one first, or replace one by its id"
    )]
    TooManyPushConfigs { task_id: String, limit: u32 },
    #[error(
        "task {task_id} holds {held} bytes of messages and artifacts, and {adding} more would pass the {limit} \
         a task may hold (taskstore.max_task_bytes): start a new task"
    )]
    TaskTooLarge { task_id: String, held: u64, adding: u64, limit: u64 },
    #[error("task {task_id} cannot move from {from} to {to}")]
    IllegalTransition { task_id: String, from: TaskState, to: TaskState },
    #[error("task {task_id} is {state} and can no longer change")]
    TaskFinished { task_id: String, state: TaskState },
    #[error(
        "the message names context {named}, but task {task_id} is in context {context_id}: leave the message's \
         context_id empty or name that context"
    )]
    ContextMismatch { task_id: String, context_id: String, named: String },
    #[error("task {task_id} is leased by a worker: only the lease holder may write, pass its lease_id")]
    LeaseRequired { task_id: String },
    #[error(
        "lease {lease_id} is not task {task_id}'s: it ran out, or was given back, or the task went to another worker \
         (or is queued for one)"
    )]
    LeaseLost { task_id: String, lease_id: String },
    #[error("artifact {artifact_id} of task {task_id} does not exist, so nothing can be appended to it")]
    ArtifactNotFound { task_id: String, artifact_id: String },
    #[error("artifact {artifact_id} of task {task_id} got its last chunk, so nothing more can be appended to it")]
    ArtifactClosed { task_id: String, artifact_id: String },
    #[error("task {task_id} has no owner to notify: it is not a subtask")]
    NoOwner { task_id: String },
    #[error("task {task_id} is {state}, not waiting for an answer")]
    NoQuestion { task_id: String, state: TaskState },
    #[error("subtask depth limit: depth {depth} exceeds the maximum of {max} for {}-spawned work", context.as_str())]
    DepthLimit { depth: u32, max: u32, context: SpawnContext },
    #[error("concurrent subtask limit: parent {parent_id} already has {limit} unfinished subtasks")]
    ConcurrencyLimit { parent_id: String, limit: u32 },
    #[error("total subtask limit: parent {parent_id} has already spawned {limit} subtasks")]
    TotalLimit { parent_id: String, limit: u32 },
    #[error("spawn rate limit: parent {parent_id} spawned {limit} subtasks in the last minute")]
    RateLimit { parent_id: String, limit: u32 },
    #[error("spawn cycle: agent {agent_id} already works on the same prompt in ancestor task {ancestor_id}")]
    Cycle { agent_id: String, ancestor_id: String },
    #[error(
        "worker {worker_id} opened another claim stream for agent {agent_id}, which replaces this one: a worker id \
         names one worker, with one stream per agent"
    )]
    StreamReplaced { worker_id: String, agent_id: String },
    #[error("outbox relay {relay} is not leased to {owner}: its lease ran out or another replica took it")]
    OutboxLeaseLost { relay: String, owner: String },
    #[error("the event bus did not take the events ({:?}): {}", .0.code(), .0.message())]
    EventBus(Box<tonic::Status>),
    #[error("the task store is shutting down; call again (another replica, or this one once restarted)")]
    ShuttingDown,
    #[error("the database is unavailable, retry later: {0}")]
    Unavailable(sqlx::Error),
    #[error("storage error: {0}")]
    Storage(sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = TaskStoreError> = std::result::Result<T, E>;

impl From<sqlx::Error> for TaskStoreError {
    fn from(error: sqlx::Error) -> Self {
        storage_error(error, Self::Unavailable, Self::Storage)
    }
}

impl ServiceError for TaskStoreError {
    fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) | Self::ContextMismatch { .. } => ErrorCode::InvalidArgument,
            Self::TaskNotFound(_) | Self::PushConfigNotFound { .. } => ErrorCode::NotFound,
            Self::RequestKeyInUse { .. } | Self::NotificationKeyInUse { .. } => ErrorCode::AlreadyExists,
            Self::IllegalTransition { .. }
            | Self::TaskFinished { .. }
            | Self::LeaseRequired { .. }
            | Self::LeaseLost { .. }
            | Self::ArtifactNotFound { .. }
            | Self::ArtifactClosed { .. }
            | Self::NoOwner { .. }
            | Self::NoQuestion { .. }
            | Self::DepthLimit { .. }
            | Self::Cycle { .. }
            | Self::OutboxLeaseLost { .. }
            | Self::PushConfigNotHeld { .. }
            | Self::TooManyPushConfigs { .. }
            | Self::TaskTooLarge { .. } => ErrorCode::FailedPrecondition,
            Self::StreamReplaced { .. } => ErrorCode::Aborted,
            Self::ConcurrencyLimit { .. } | Self::TotalLimit { .. } | Self::RateLimit { .. } => {
                ErrorCode::ResourceExhausted
            }
            Self::Unavailable(_) | Self::EventBus(_) | Self::ShuttingDown => ErrorCode::Unavailable,
            Self::Storage(_) | Self::Corrupt(_) => ErrorCode::Internal,
        }
    }

    fn field(&self) -> Option<&str> {
        if let Self::InvalidArgument(violation) = self { Some(&violation.field) } else { None }
    }

    /// Every refusal a caller may act on has its reason: a worker tells a
    /// lost lease (stop) from a finished task (stop, nothing to report) or a
    /// task too large (start another) by it, not by the message's words.
    fn reason(&self) -> Option<Reason> {
        let reason = |name| Reason::new(DOMAIN, name);
        let about = |name, task_id: &str| reason(name).with("task_id", task_id);
        Some(match self {
            Self::InvalidArgument(_) | Self::Storage(_) | Self::Corrupt(_) => return None,
            Self::TaskNotFound(task_id) => about("TASK_NOT_FOUND", task_id),
            Self::RequestKeyInUse { task_id, .. } | Self::NotificationKeyInUse { task_id, .. } => {
                about("REQUEST_KEY_IN_USE", task_id)
            }
            Self::PushConfigNotFound { task_id, id } => about("PUSH_CONFIG_NOT_FOUND", task_id).with("id", id),
            Self::PushConfigNotHeld { task_id, id, .. } => about("PUSH_CONFIG_NOT_HELD", task_id).with("id", id),
            Self::TooManyPushConfigs { task_id, .. } => about("TOO_MANY_PUSH_CONFIGS", task_id),
            Self::TaskTooLarge { task_id, .. } => about("TASK_TOO_LARGE", task_id),
            Self::IllegalTransition { task_id, from, to } => {
                about("ILLEGAL_TRANSITION", task_id).with("from", from.as_str()).with("to", to.as_str())
            }
            Self::TaskFinished { task_id, state } => about("TASK_FINISHED", task_id).with("state", state.as_str()),
            Self::ContextMismatch { task_id, context_id, .. } => {
                about("CONTEXT_MISMATCH", task_id).with("context_id", context_id)
            }
            Self::LeaseRequired { task_id } => about("LEASE_REQUIRED", task_id),
            Self::LeaseLost { task_id, .. } => about("LEASE_LOST", task_id),
            Self::ArtifactNotFound { task_id, artifact_id } => {
                about("ARTIFACT_NOT_FOUND", task_id).with("artifact_id", artifact_id)
            }
            Self::ArtifactClosed { task_id, artifact_id } => {
                about("ARTIFACT_CLOSED", task_id).with("artifact_id", artifact_id)
            }
            Self::NoOwner { task_id } => about("NO_OWNER", task_id),
            Self::NoQuestion { task_id, state } => about("NO_QUESTION", task_id).with("state", state.as_str()),
            Self::DepthLimit { depth, max, .. } => {
                reason("SUBTASK_DEPTH_LIMIT").with("depth", depth).with("max_depth", max)
            }
            Self::ConcurrencyLimit { parent_id, limit } => {
                about("SUBTASK_CONCURRENCY_LIMIT", parent_id).with("limit", limit)
            }
            Self::TotalLimit { parent_id, limit } => about("SUBTASK_TOTAL_LIMIT", parent_id).with("limit", limit),
            Self::RateLimit { parent_id, limit } => about("SUBTASK_RATE_LIMIT", parent_id).with("limit", limit),
            Self::Cycle { ancestor_id, .. } => about("SUBTASK_CYCLE", ancestor_id),
            Self::StreamReplaced { .. } => reason("STREAM_REPLACED"),
            Self::OutboxLeaseLost { .. } => reason("OUTBOX_LEASE_LOST"),
            Self::EventBus(_) => reason("EVENT_BUS_UNAVAILABLE"),
            Self::ShuttingDown => reason("SHUTTING_DOWN"),
            Self::Unavailable(_) => reason("DATABASE_UNAVAILABLE"),
        })
    }
}

/// The domain of the task store's error reasons.
pub const DOMAIN: &str = "taskstore.chorus.dev";

impl From<TaskStoreError> for tonic::Status {
    fn from(error: TaskStoreError) -> Self {
        chorus_runtime::error::into_status(error)
    }
}

#[cfg(test)]
mod tests {
    use chorus_runtime::error::ServiceError as _;

    use super::*;

    /// A limit's refusal says the limit, so a caller can tell what it ran into.
    #[test]
    fn the_subtask_limits_name_their_limit() {
        let depth = TaskStoreError::DepthLimit { depth: 3, max: 2, context: SpawnContext::Orchestrator };
        let depth = depth.reason().expect("a reason");
        assert_eq!(
            (depth.reason, depth.metadata["depth"].as_str(), depth.metadata["max_depth"].as_str()),
            ("SUBTASK_DEPTH_LIMIT", "3", "2")
        );
        for (error, reason) in [
            (TaskStoreError::ConcurrencyLimit { parent_id: "p".into(), limit: 10 }, "SUBTASK_CONCURRENCY_LIMIT"),
            (TaskStoreError::TotalLimit { parent_id: "p".into(), limit: 10 }, "SUBTASK_TOTAL_LIMIT"),
            (TaskStoreError::RateLimit { parent_id: "p".into(), limit: 10 }, "SUBTASK_RATE_LIMIT"),
        ] {
            let said = error.reason().expect("a reason");
            assert_eq!(
                (said.reason, said.metadata["limit"].as_str(), said.metadata["task_id"].as_str()),
                (reason, "10", "p")
            );
        }
    }
}
