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
}

/// Converts a service error to a gRPC status: the one place this happens.
///
/// Internal errors are logged here, once, and their detail is not sent to the
/// caller; `InvalidArgument` carries a `google.rpc.BadRequest` naming the field.
pub fn into_status<E: ServiceError>(error: E) -> tonic::Status {
    let code = error.error_code();
    if code == ErrorCode::Internal {
        tracing::error!(error = %error, "internal error");
        return tonic::Status::internal("internal error");
    }
    let message = error.to_string();
    if let Some(detail) = error.detail() {
        let status =
            tonic_types::Status { code: code.grpc_code().into(), message: message.clone(), details: vec![detail] };
        return tonic::Status::with_details(code.grpc_code(), message, prost::Message::encode_to_vec(&status).into());
    }
    match error.field() {
        Some(field) => {
            let mut details = tonic_types::ErrorDetails::new();
            details.add_bad_request_violation(field, message.clone());
            use tonic_types::StatusExt as _;
            tonic::Status::with_error_details(code.grpc_code(), message, details)
        }
        None => tonic::Status::new(code.grpc_code(), message),
    }
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
    }

    impl ServiceError for Demo {
        fn error_code(&self) -> ErrorCode {
            match self {
                Self::Bad { .. } => ErrorCode::InvalidArgument,
                Self::Db => ErrorCode::Internal,
            }
        }
        fn field(&self) -> Option<&str> {
            match self {
                Self::Bad { field } => Some(field),
                Self::Db => None,
            }
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
    fn internal_errors_hide_their_detail() {
        let status = into_status(Demo::Db);
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"));
    }

    #[test]
    fn codes_agree_between_grpc_and_http() {
        assert_eq!(ErrorCode::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(ErrorCode::Unavailable.grpc_code(), Code::Unavailable);
    }
}
