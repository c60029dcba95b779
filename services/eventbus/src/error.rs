//! The event bus's one error type, and its one mapping to error codes.

use chorus_runtime::{
    error::{ErrorCode, ServiceError},
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
        Some(prost_types::Any {
            type_url: "type.googleapis.com/chorus.eventbus.v1.HandlerCycle".into(),
            value: prost::Message::encode_to_vec(&cycle),
        })
    }
}

impl From<EventBusError> for tonic::Status {
    fn from(error: EventBusError) -> Self {
        chorus_runtime::error::into_status(error)
    }
}
