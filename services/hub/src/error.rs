//! The hub's one error type, and its one mapping to error codes.

use chorus_runtime::{
    error::{ErrorCode, Reason, ServiceError, any},
    storage::storage_error,
    validate::FieldViolation,
};

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("agent {0} is not registered")]
    AgentNotFound(String),
    #[error("key {0} not found")]
    KeyNotFound(String),
    #[error(
        "idempotency key {key} already sent message {message_id}, which {mismatch}; reuse a key only to retry the \
         same send"
    )]
    IdempotencyKeyInUse { key: String, message_id: String, mismatch: String },
    #[error("key {key} is at version {actual}, not {expected}")]
    VersionConflict { key: String, expected: i64, actual: i64 },
    #[error("inbox of agent {recipient} is full ({depth} messages): ack or let them expire first")]
    QueueFull { recipient: String, depth: u32 },
    #[error("no delegated request with correlation id {0} waits for a reply (it timed out or was answered)")]
    NoPendingRequest(String),
    #[error("only {recipient}, the agent the request was sent to, may reply to {correlation_id}")]
    NotTheRecipient { correlation_id: String, recipient: String },
    #[error("no reply to {correlation_id} from {recipient} after {attempts} attempt(s)")]
    DelegationTimedOut { correlation_id: String, recipient: String, attempts: u32 },
    #[error("a newer inbox stream of consumer {0} replaced this one")]
    StreamSuperseded(String),
    #[error("the hub is shutting down; call again (another replica, or this one once restarted)")]
    ShuttingDown,
    #[error("the database is unavailable, retry later: {0}")]
    Unavailable(sqlx::Error),
    #[error("storage error: {0}")]
    Storage(sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = HubError> = std::result::Result<T, E>;

impl From<sqlx::Error> for HubError {
    fn from(error: sqlx::Error) -> Self {
        storage_error(error, Self::Unavailable, Self::Storage)
    }
}

impl ServiceError for HubError {
    fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::AgentNotFound(_) | Self::KeyNotFound(_) => ErrorCode::NotFound,
            Self::IdempotencyKeyInUse { .. } => ErrorCode::AlreadyExists,
            Self::VersionConflict { .. } | Self::StreamSuperseded(_) => ErrorCode::Aborted,
            Self::QueueFull { .. } => ErrorCode::ResourceExhausted,
            Self::NoPendingRequest(_) => ErrorCode::FailedPrecondition,
            Self::NotTheRecipient { .. } => ErrorCode::PermissionDenied,
            Self::DelegationTimedOut { .. } => ErrorCode::DeadlineExceeded,
            Self::Unavailable(_) | Self::ShuttingDown => ErrorCode::Unavailable,
            Self::Storage(_) | Self::Corrupt(_) => ErrorCode::Internal,
        }
    }

    fn field(&self) -> Option<&str> {
        if let Self::InvalidArgument(violation) = self { Some(&violation.field) } else { None }
    }

    fn detail(&self) -> Option<prost_types::Any> {
        let Self::VersionConflict { key, expected, actual } = self else { return None };
        let conflict = chorus_proto::hub::StateConflict {
            key: key.clone(),
            expected_version: u64::try_from(*expected).unwrap_or_default(),
            actual_version: u64::try_from(*actual).unwrap_or_default(),
        };
        Some(any("chorus.hub.v1.StateConflict", &conflict))
    }

    fn reason(&self) -> Option<Reason> {
        let reason = |name| Reason::new(DOMAIN, name);
        let about = |name, correlation_id: &str| reason(name).with("correlation_id", correlation_id);
        Some(match self {
            Self::InvalidArgument(_) | Self::Storage(_) | Self::Corrupt(_) => return None,
            Self::AgentNotFound(agent_id) => reason("AGENT_NOT_FOUND").with("agent_id", agent_id),
            Self::KeyNotFound(key) => reason("KEY_NOT_FOUND").with("key", key),
            Self::IdempotencyKeyInUse { key, message_id, .. } => {
                reason("REQUEST_KEY_IN_USE").with("key", key).with("message_id", message_id)
            }
            Self::VersionConflict { key, expected, actual } => reason("VERSION_CONFLICT")
                .with("key", key)
                .with("expected_version", expected)
                .with("actual_version", actual),
            Self::QueueFull { recipient, depth } => {
                reason("INBOX_FULL").with("recipient", recipient).with("depth", depth)
            }
            Self::NoPendingRequest(correlation_id) => about("NO_PENDING_REQUEST", correlation_id),
            Self::NotTheRecipient { correlation_id, recipient } => {
                about("NOT_THE_RECIPIENT", correlation_id).with("recipient", recipient)
            }
            Self::DelegationTimedOut { correlation_id, recipient, attempts } => {
                about("DELEGATION_TIMED_OUT", correlation_id).with("recipient", recipient).with("attempts", attempts)
            }
            Self::StreamSuperseded(consumer) => reason("STREAM_REPLACED").with("consumer", consumer),
            Self::ShuttingDown => reason("SHUTTING_DOWN"),
            Self::Unavailable(_) => reason("DATABASE_UNAVAILABLE"),
        })
    }
}

/// The domain of the hub's `google.rpc.ErrorInfo` reasons.
pub const DOMAIN: &str = "hub.chorus.dev";

impl From<HubError> for tonic::Status {
    fn from(error: HubError) -> Self {
        chorus_runtime::error::into_status(error)
    }
}
