//! One closed set of error codes, mapped once to gRPC and to HTTP.
//!
//! Each service has its own `thiserror` enum and implements [`ServiceError`]
//! for it; [`into_status`] is then the only place a `tonic::Status` is built.

use http::StatusCode;
use tonic::Code;

/// What kind of failure an error is, independent of the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    /// A compare-and-set lost: the caller may re-read and try again.
    Aborted,
    ResourceExhausted,
    DeadlineExceeded,
    Unauthenticated,
    PermissionDenied,
    /// Retryable: the caller may try again later.
    Unavailable,
    Internal,
}

impl ErrorCode {
    pub fn grpc_code(self) -> Code {
        match self {
            Self::InvalidArgument => Code::InvalidArgument,
            Self::NotFound => Code::NotFound,
            Self::AlreadyExists => Code::AlreadyExists,
            Self::FailedPrecondition => Code::FailedPrecondition,
            Self::Aborted => Code::Aborted,
            Self::ResourceExhausted => Code::ResourceExhausted,
            Self::DeadlineExceeded => Code::DeadlineExceeded,
            Self::Unauthenticated => Code::Unauthenticated,
            Self::PermissionDenied => Code::PermissionDenied,
            Self::Unavailable => Code::Unavailable,
            Self::Internal => Code::Internal,
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Self::InvalidArgument => StatusCode::BAD_REQUEST,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::AlreadyExists => StatusCode::CONFLICT,
            Self::FailedPrecondition => StatusCode::BAD_REQUEST,
            Self::Aborted => StatusCode::CONFLICT,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A service's error type: it knows its code and, for invalid input, the field.
pub trait ServiceError: std::error::Error {
    fn error_code(&self) -> ErrorCode;

    /// The request field at fault, for `InvalidArgument` errors.
    fn field(&self) -> Option<&str> {
        None
    }

    /// A typed detail for the caller, sent in `grpc-status-details-bin`.
    fn detail(&self) -> Option<prost_types::Any> {
        None
    }

    /// Why the call failed, for a program to act on: sent as a
    /// `google.rpc.ErrorInfo` beside the message, which is for people.
    fn reason(&self) -> Option<Reason> {
        None
    }
}

/// A `google.rpc.ErrorInfo`: a stable reason in a service's domain, and
/// what it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// UPPER_SNAKE_CASE, never reworded: callers match on it.
    pub reason: &'static str,
    /// The service that gave it, e.g. `taskstore.chorus.dev`.
    pub domain: &'static str,
    /// The ids the error is about (`task_id`, `state`, ...).
    pub metadata: std::collections::HashMap<String, String>,
}

impl Reason {
    pub fn new(domain: &'static str, reason: &'static str) -> Self {
        Self { reason, domain, metadata: std::collections::HashMap::new() }
    }

    /// Adds `key` to the metadata.
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.metadata.insert(key.to_owned(), value.to_string());
        self
    }
}

/// `error` and what caused it, `: `-separated: the clients of HTTP and gRPC
/// (reqwest, tonic's transport) name the cause, such as a refused
/// connection, only among an error's sources. A cause the text says
/// already (an error that shows its source) is not said again.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

/// Converts a service error to a gRPC status: the one place this happens.
///
/// Internal errors are logged here, once, and their detail is not sent to the
/// caller. Otherwise the status carries, in `grpc-status-details-bin`, a
/// `google.rpc.BadRequest` naming the field of an `InvalidArgument`, a
/// `google.rpc.ErrorInfo` for an error with a [`Reason`], and the error's
/// own typed [detail](ServiceError::detail).
pub fn into_status<E: ServiceError>(error: E) -> tonic::Status {
    use tonic_types::pb;
    let code = error.error_code();
    if code == ErrorCode::Internal {
        tracing::error!(error = %error, "internal error");
        return tonic::Status::internal("internal error");
    }
    let message = error.to_string();
    let mut details = Vec::new();
    if let Some(field) = error.field() {
        let violation = pb::bad_request::FieldViolation {
            field: field.to_owned(),
            description: message.clone(),
            ..Default::default()
        };
        details.push(any("google.rpc.BadRequest", &pb::BadRequest { field_violations: vec![violation] }));
    }
    if let Some(Reason { reason, domain, metadata }) = error.reason() {
        let info = pb::ErrorInfo { reason: reason.to_owned(), domain: domain.to_owned(), metadata };
        details.push(any("google.rpc.ErrorInfo", &info));
    }
    details.extend(error.detail());
    if details.is_empty() {
        return tonic::Status::new(code.grpc_code(), message);
    }
    let status = pb::Status { code: code.grpc_code().into(), message: message.clone(), details };
    tonic::Status::with_details(code.grpc_code(), message, prost::Message::encode_to_vec(&status).into())
}

/// `message` packed as a `google.protobuf.Any` of the type `name`
/// (`chorus.hub.v1.StateConflict`, ...), for a [`ServiceError::detail`].
pub fn any(name: &str, message: &impl prost::Message) -> prost_types::Any {
    prost_types::Any { type_url: format!("type.googleapis.com/{name}"), value: message.encode_to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Demo {
        #[error("{field}: must not be empty")]
        Bad { field: String },
        #[error("database exploded: secret detail")]
        Db,
        #[error("lease of task {0} lost")]
        Lost(String),
        #[error("key {0} changed")]
        Changed(String),
    }

    impl ServiceError for Demo {
        fn error_code(&self) -> ErrorCode {
            match self {
                Self::Bad { .. } => ErrorCode::InvalidArgument,
                Self::Db => ErrorCode::Internal,
                Self::Lost(_) => ErrorCode::FailedPrecondition,
                Self::Changed(_) => ErrorCode::Aborted,
            }
        }
        fn field(&self) -> Option<&str> {
            match self {
                Self::Bad { field } => Some(field),
                Self::Db | Self::Lost(_) | Self::Changed(_) => None,
            }
        }
        fn reason(&self) -> Option<Reason> {
            match self {
                Self::Lost(task_id) => Some(Reason::new("demo.chorus.dev", "LEASE_LOST").with("task_id", task_id)),
                Self::Db => Some(Reason::new("demo.chorus.dev", "NEVER_SENT")),
                Self::Changed(key) => Some(Reason::new("demo.chorus.dev", "CHANGED").with("key", key)),
                Self::Bad { .. } => None,
            }
        }
        fn detail(&self) -> Option<prost_types::Any> {
            let Self::Changed(key) = self else { return None };
            Some(any("demo.Changed", &prost_types::Duration { seconds: key.len() as i64, nanos: 0 }))
        }
    }

    #[test]
    fn invalid_argument_names_the_field() {
        use tonic_types::StatusExt as _;
        let status = into_status(Demo::Bad { field: "task_id".into() });
        assert_eq!(status.code(), Code::InvalidArgument);
        let violations = status.get_details_bad_request().expect("bad request details");
        assert_eq!(violations.field_violations[0].field, "task_id");
    }

    #[test]
    fn a_reason_travels_as_error_info_beside_the_message() {
        use tonic_types::StatusExt as _;
        let status = into_status(Demo::Lost("t-1".into()));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "lease of task t-1 lost");
        let info = status.get_details_error_info().expect("error info");
        assert_eq!((info.reason.as_str(), info.domain.as_str()), ("LEASE_LOST", "demo.chorus.dev"));
        assert_eq!(info.metadata["task_id"], "t-1");
        assert!(into_status(Demo::Bad { field: "x".into() }).get_details_error_info().is_none());
    }

    #[test]
    fn a_typed_detail_travels_beside_the_error_info() {
        use tonic_types::StatusExt as _;
        let status = into_status(Demo::Changed("k-1".into()));
        let info = status.get_details_error_info().expect("error info");
        assert_eq!((info.reason.as_str(), info.metadata["key"].as_str()), ("CHANGED", "k-1"));
        let details: tonic_types::Status = prost::Message::decode(status.details()).unwrap();
        let types: Vec<&str> = details.details.iter().map(|any| any.type_url.as_str()).collect();
        assert_eq!(types, ["type.googleapis.com/google.rpc.ErrorInfo", "type.googleapis.com/demo.Changed"]);
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        use tonic_types::StatusExt as _;
        let status = into_status(Demo::Db);
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"));
        assert!(status.get_details_error_info().is_none(), "nor their reason");
    }

    #[test]
    fn codes_agree_between_grpc_and_http() {
        assert_eq!(ErrorCode::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(ErrorCode::Unavailable.grpc_code(), Code::Unavailable);
    }
}
