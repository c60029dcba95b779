//! The gateway's one error type, and its one mapping to each binding: a
//! JSON-RPC error code, an HTTP status with the `google.rpc.Status` body,
//! and a gRPC status, each with a `google.rpc.ErrorInfo` (spec 1.0.1 §5.4).

use serde_json::{Value, json};
use tonic::Code;

/// The domain every A2A `ErrorInfo` names.
pub(crate) const DOMAIN: &str = "a2a-protocol.org";

pub(crate) type Result<T, E = GatewayError> = std::result::Result<T, E>;

#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("task {0} not found")]
    TaskNotFound(String),
    /// An A2A TaskNotFoundError too: the spec has no error of its own for it.
    #[error("push notification config {id} of task {task_id} not found")]
    PushConfigNotFound { task_id: String, id: String },
    #[error("task {id} is {state} and cannot be canceled")]
    TaskNotCancelable { id: String, state: String },
    #[error("push notifications are not supported by agent {0}")]
    PushNotSupported(String),
    #[error("{0}")]
    UnsupportedOperation(String),
    #[error("{0}")]
    ContentTypeNotSupported(String),
    #[error("{0}")]
    InvalidAgentResponse(String),
    #[error("no extended agent card is configured")]
    ExtendedCardNotConfigured,
    /// A version the binding does not speak: the one asked for, and those it does.
    #[error("A2A version {0:?} is not supported; this binding speaks {1}")]
    VersionNotSupported(String, &'static str),
    #[error("{0}")]
    Parse(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("method {0:?} not found")]
    MethodNotFound(String),
    #[error("{0}")]
    InvalidParams(String),
    #[error("agent {0:?} not found")]
    AgentNotFound(String),
    #[error(
        "the tenant names namespace {namespace:?}, which this gateway does not serve (it serves: {served}; \
         gateway.namespaces lists them, [\"*\"] for any)"
    )]
    NamespaceNotFound { namespace: String, served: String },
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("missing or invalid credentials")]
    Unauthenticated,
    #[error("the credentials do not grant access to tenant {0:?}")]
    PermissionDenied(String),
    /// Refused for what the caller is, not its credentials (a web page's origin).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Unavailable(String),
    /// An external agent refused or failed a delegated task.
    #[error("{0}")]
    RemoteAgent(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Internal(String),
}

impl GatewayError {
    /// The A2A error name (`ErrorInfo.reason`).
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::TaskNotFound(_) | Self::PushConfigNotFound { .. } => "TASK_NOT_FOUND",
            Self::TaskNotCancelable { .. } => "TASK_NOT_CANCELABLE",
            Self::PushNotSupported(_) => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation(_) => "UNSUPPORTED_OPERATION",
            Self::ContentTypeNotSupported(_) => "CONTENT_TYPE_NOT_SUPPORTED",
            Self::InvalidAgentResponse(_) => "INVALID_AGENT_RESPONSE",
            Self::ExtendedCardNotConfigured => "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            Self::VersionNotSupported(..) => "VERSION_NOT_SUPPORTED",
            Self::Parse(_) => "PARSE_ERROR",
            Self::InvalidRequest(_) => "INVALID_REQUEST",
            Self::MethodNotFound(_) => "METHOD_NOT_FOUND",
            Self::InvalidParams(_) => "INVALID_PARAMS",
            Self::AgentNotFound(_) => "AGENT_NOT_FOUND",
            Self::NamespaceNotFound { .. } => "NAMESPACE_NOT_FOUND",
            Self::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::PermissionDenied(_) | Self::Forbidden(_) => "PERMISSION_DENIED",
            Self::Unavailable(_) => "UNAVAILABLE",
            Self::RemoteAgent(_) => "REMOTE_AGENT_ERROR",
            Self::Timeout(_) => "DEADLINE_EXCEEDED",
            Self::Internal(_) => "INTERNAL_ERROR",
        }
    }

    /// The JSON-RPC error code (spec §9.5).
    pub(crate) fn jsonrpc_code(&self) -> i32 {
        match self {
            Self::TaskNotFound(_) | Self::PushConfigNotFound { .. } => -32001,
            Self::TaskNotCancelable { .. } => -32002,
            Self::PushNotSupported(_) => -32003,
            Self::UnsupportedOperation(_) => -32004,
            Self::ContentTypeNotSupported(_) => -32005,
            Self::InvalidAgentResponse(_) => -32006,
            Self::ExtendedCardNotConfigured => -32007,
            Self::VersionNotSupported(..) => -32009,
            Self::Parse(_) => -32700,
            Self::InvalidRequest(_)
            | Self::PayloadTooLarge(_)
            | Self::Unauthenticated
            | Self::PermissionDenied(_)
            | Self::Forbidden(_) => -32600,
            Self::MethodNotFound(_) => -32601,
            Self::InvalidParams(_) | Self::AgentNotFound(_) | Self::NamespaceNotFound { .. } => -32602,
            Self::Unavailable(_) | Self::RemoteAgent(_) | Self::Timeout(_) | Self::Internal(_) => -32603,
        }
    }

    /// The gRPC code (spec 1.0.1 §10.6).
    pub(crate) fn grpc_code(&self) -> Code {
        match self {
            // A method is missing only from the JSON-RPC and HTTP+JSON
            // bindings (gRPC's own are all served): for a REST path, it is a
            // resource not found, and the body's status says so beside 404.
            Self::TaskNotFound(_)
            | Self::PushConfigNotFound { .. }
            | Self::AgentNotFound(_)
            | Self::NamespaceNotFound { .. }
            | Self::MethodNotFound(_) => Code::NotFound,
            Self::TaskNotCancelable { .. }
            | Self::PushNotSupported(_)
            | Self::UnsupportedOperation(_)
            | Self::ExtendedCardNotConfigured
            | Self::VersionNotSupported(..)
            | Self::RemoteAgent(_) => Code::FailedPrecondition,
            Self::ContentTypeNotSupported(_) | Self::Parse(_) | Self::InvalidRequest(_) | Self::InvalidParams(_) => {
                Code::InvalidArgument
            }
            Self::PayloadTooLarge(_) => Code::OutOfRange,
            Self::Unauthenticated => Code::Unauthenticated,
            Self::PermissionDenied(_) | Self::Forbidden(_) => Code::PermissionDenied,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Timeout(_) => Code::DeadlineExceeded,
            Self::InvalidAgentResponse(_) | Self::Internal(_) => Code::Internal,
        }
    }

    /// The HTTP status (spec 1.0.1 §11.6).
    pub(crate) fn http_status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            Self::TaskNotFound(_)
            | Self::PushConfigNotFound { .. }
            | Self::AgentNotFound(_)
            | Self::NamespaceNotFound { .. }
            | Self::MethodNotFound(_) => S::NOT_FOUND,
            Self::TaskNotCancelable { .. }
            | Self::PushNotSupported(_)
            | Self::UnsupportedOperation(_)
            | Self::ContentTypeNotSupported(_)
            | Self::ExtendedCardNotConfigured
            | Self::VersionNotSupported(..)
            | Self::Parse(_)
            | Self::InvalidRequest(_)
            | Self::InvalidParams(_) => S::BAD_REQUEST,
            Self::PayloadTooLarge(_) => S::PAYLOAD_TOO_LARGE,
            Self::Unauthenticated => S::UNAUTHORIZED,
            Self::PermissionDenied(_) | Self::Forbidden(_) => S::FORBIDDEN,
            Self::Unavailable(_) => S::SERVICE_UNAVAILABLE,
            Self::RemoteAgent(_) => S::BAD_GATEWAY,
            Self::Timeout(_) => S::GATEWAY_TIMEOUT,
            Self::InvalidAgentResponse(_) | Self::Internal(_) => S::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `ErrorInfo` detail, as ProtoJSON `Any`.
    pub(crate) fn error_info(&self) -> Value {
        json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": self.reason(),
            "domain": DOMAIN,
            "metadata": {},
        })
    }

    /// The JSON-RPC `error` member.
    pub(crate) fn jsonrpc_error(&self) -> Value {
        json!({ "code": self.jsonrpc_code(), "message": self.to_string(), "data": [self.error_info()] })
    }

    /// The HTTP+JSON error body (AIP-193 `google.rpc.Status`).
    pub(crate) fn rest_body(&self) -> Value {
        let status = self.http_status();
        json!({ "error": {
            "code": status.as_u16(),
            "status": grpc_code_name(self.grpc_code()),
            "message": self.to_string(),
            "details": [self.error_info()],
        }})
    }

    /// The gRPC status, with the `ErrorInfo` in `grpc-status-details-bin`.
    pub(crate) fn into_status(self) -> tonic::Status {
        use tonic_types::{ErrorDetails, StatusExt as _};
        let details = ErrorDetails::with_error_info(self.reason(), DOMAIN, std::collections::HashMap::new());
        tonic::Status::with_error_details(self.grpc_code(), self.to_string(), details)
    }

    /// What a task-store failure means to an A2A caller. `task_id` is the
    /// task the call was about, if any.
    pub(crate) fn from_taskstore(status: &tonic::Status, task_id: Option<&str>) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::NotFound => Self::TaskNotFound(task_id.unwrap_or_default().to_owned()),
            Code::InvalidArgument | Code::OutOfRange => Self::InvalidParams(message),
            Code::ResourceExhausted if chorus_runtime::server::refused_for_size(status) => Self::InvalidParams(message),
            Code::FailedPrecondition => Self::UnsupportedOperation(message),
            Code::ResourceExhausted => Self::Unavailable(message),
            // The task store answers every error of its own with a code:
            // Unknown is a connection that broke under the call.
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted | Code::Unknown => {
                Self::Unavailable(format!("the task store is unavailable: {message}"))
            }
            Code::Ok
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unimplemented
            | Code::Internal
            | Code::DataLoss
            | Code::Unauthenticated => Self::Internal(format!("task store: {message}")),
        }
    }
}

impl From<crate::delegate::DelegateError> for GatewayError {
    fn from(error: crate::delegate::DelegateError) -> Self {
        use crate::delegate::DelegateError as D;
        let message = error.to_string();
        match error {
            D::Http { .. } | D::Status { status: 500..=599, .. } => Self::Unavailable(message),
            // A refusal (its credentials, its card or path not found, ...).
            D::Status { status: 400..=499, .. } => Self::RemoteAgent(message),
            D::Status { .. } | D::Protocol { .. } => Self::InvalidAgentResponse(message),
            D::Remote { .. } | D::NoInterface { .. } | D::Canceled { .. } => Self::RemoteAgent(message),
            D::InvalidCredentials { .. } | D::Refused { .. } => Self::InvalidParams(message),
            D::Timeout { .. } => Self::Timeout(message),
        }
    }
}

impl From<GatewayError> for tonic::Status {
    fn from(error: GatewayError) -> Self {
        error.into_status()
    }
}

/// The canonical name of a gRPC code, as `google.rpc.Status` JSON spells it.
fn grpc_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_the_task_store_finds_too_large_is_the_callers_not_an_outage() {
        let too_large = tonic::Status::resource_exhausted(
            "the request is 9000 bytes; this server takes at most 4096 (server.max_message_bytes)",
        );
        assert!(matches!(GatewayError::from_taskstore(&too_large, None), GatewayError::InvalidParams(_)));
        let busy = tonic::Status::resource_exhausted("too many tasks queued for agent echo");
        assert!(matches!(GatewayError::from_taskstore(&busy, None), GatewayError::Unavailable(_)));
    }
}
