//! The event bus's one error type, and its one mapping to error codes.

use chorus_runtime::{
    error::{ErrorCode, Reason, ServiceError, any},
    storage::storage_error,
    validate::FieldViolation,
};

use crate::domain::{DeliveryId, DeliveryState};

#[derive(Debug, thiserror::Error)]
pub enum EventBusError {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("handler {0} not found")]
    HandlerNotFound(String),
    #[error("delivery {0} not found")]
    DeliveryNotFound(DeliveryId),
    #[error("handler {name} would close a cycle: {}", path.join(" -> "))]
    Cycle { name: String, path: Vec<String> },
    #[error("delivery {id} is {state}, so it can no longer be {action}")]
    DeliveryFinished { id: DeliveryId, state: DeliveryState, action: &'static str },
    #[error("delivery {id} is {state}, not in flight: only a leased delivery can be {action}")]
    NotInFlight { id: DeliveryId, state: DeliveryState, action: &'static str },
    #[error("attempt {attempt} of delivery {id} is over (attempt {current} is the current one): it cannot be {action}")]
    AttemptOver { id: DeliveryId, attempt: u32, current: u32, action: &'static str },
    #[error("delivery {id} is not a dead letter of handler {handler}")]
    NotDeadLettered { id: DeliveryId, handler: String },
    #[error("consumer {0} opened a newer stream, which replaces this one")]
    StreamSuperseded(String),
    #[error("the event bus is shutting down; call again (another replica, or this one once restarted)")]
    ShuttingDown,
    #[error("the database is unavailable, retry later: {0}")]
    Unavailable(sqlx::Error),
    #[error("storage error: {0}")]
    Storage(sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = EventBusError> = std::result::Result<T, E>;

impl From<sqlx::Error> for EventBusError {
    fn from(error: sqlx::Error) -> Self {
        storage_error(error, Self::Unavailable, Self::Storage)
    }
}

impl ServiceError for EventBusError {
    fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Self::HandlerNotFound(_) | Self::DeliveryNotFound(_) => ErrorCode::NotFound,
            Self::Cycle { .. }
            | Self::DeliveryFinished { .. }
            | Self::NotInFlight { .. }
            | Self::AttemptOver { .. }
            | Self::NotDeadLettered { .. } => ErrorCode::FailedPrecondition,
            Self::StreamSuperseded(_) => ErrorCode::Aborted,
            Self::Unavailable(_) | Self::ShuttingDown => ErrorCode::Unavailable,
            Self::Storage(_) | Self::Corrupt(_) => ErrorCode::Internal,
        }
    }

    fn field(&self) -> Option<&str> {
        if let Self::InvalidArgument(violation) = self { Some(&violation.field) } else { None }
    }

    fn detail(&self) -> Option<prost_types::Any> {
        let Self::Cycle { path, .. } = self else { return None };
        let cycle = chorus_proto::eventbus::HandlerCycle { path: path.clone() };
        Some(any("chorus.eventbus.v1.HandlerCycle", &cycle))
    }

    fn reason(&self) -> Option<Reason> {
        let reason = |name| Reason::new(DOMAIN, name);
        let about = |name, id: &DeliveryId| reason(name).with("delivery_id", id);
        Some(match self {
            Self::InvalidArgument(_) | Self::Storage(_) | Self::Corrupt(_) => return None,
            Self::HandlerNotFound(handler) => reason("HANDLER_NOT_FOUND").with("handler", handler),
            Self::DeliveryNotFound(id) => about("DELIVERY_NOT_FOUND", id),
            Self::Cycle { name, .. } => reason("HANDLER_CYCLE").with("handler", name),
            Self::DeliveryFinished { id, state, .. } => about("DELIVERY_FINISHED", id).with("state", state),
            Self::NotInFlight { id, state, .. } => about("DELIVERY_NOT_IN_FLIGHT", id).with("state", state),
            Self::AttemptOver { id, attempt, current, .. } => {
                about("ATTEMPT_OVER", id).with("attempt", attempt).with("current_attempt", current)
            }
            Self::NotDeadLettered { id, handler } => about("NOT_DEAD_LETTERED", id).with("handler", handler),
            Self::StreamSuperseded(consumer) => reason("STREAM_REPLACED").with("consumer", consumer),
            Self::ShuttingDown => reason("SHUTTING_DOWN"),
            Self::Unavailable(_) => reason("DATABASE_UNAVAILABLE"),
        })
    }
}

/// The domain of the event bus's `google.rpc.ErrorInfo` reasons.
pub const DOMAIN: &str = "eventbus.chorus.dev";

impl From<EventBusError> for tonic::Status {
    fn from(error: EventBusError) -> Self {
        chorus_runtime::error::into_status(error)
    }
}
