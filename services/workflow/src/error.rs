//! The workflow service's one error type, and its one mapping to error codes.

use chorus_runtime::{
    error::{ErrorCode, ServiceError},
    storage::storage_error,
    validate::FieldViolation,
};

use crate::domain::Problem;

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error(transparent)]
    InvalidArgument(#[from] FieldViolation),
    #[error("{} is invalid: {}", .file, .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidDefinition { file: String, problems: Vec<Problem> },
    #[error("workflow {name} has no version {version}")]
    VersionNotFound { name: String, version: u32 },
    #[error("workflow {0} is not defined")]
    NotFound(String),
    #[error("run {0} not found")]
    RunNotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error(
        "idempotency key `{key}` is already used by run {run_id} of {workflow} v{version}, which {mismatch}; \
         reuse a key only to retry the same start"
    )]
    KeyInUse { key: String, run_id: String, workflow: String, version: u32, mismatch: String },
    #[error("this engine no longer holds run {0}")]
    LeaseLost(String),
    #[error("workflow {0} was changed concurrently; retry")]
    Conflict(String),
    #[error("cannot read {path}: {source}")]
    Folder { path: String, source: std::io::Error },
    #[error("the workflow service is shutting down; watch again (another replica, or this one once restarted)")]
    ShuttingDown,
    #[error("the database is unavailable, retry later: {0}")]
    Unavailable(sqlx::Error),
    #[error("storage error: {0}")]
    Storage(sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = WorkflowError> = std::result::Result<T, E>;

impl From<sqlx::Error> for WorkflowError {
    fn from(error: sqlx::Error) -> Self {
        storage_error(error, Self::Unavailable, Self::Storage)
    }
}

impl ServiceError for WorkflowError {
    fn error_code(&self) -> ErrorCode {
        match self {
            Self::InvalidArgument(_) | Self::InvalidDefinition { .. } => ErrorCode::InvalidArgument,
            Self::VersionNotFound { .. } | Self::NotFound(_) | Self::RunNotFound(_) => ErrorCode::NotFound,
            Self::KeyInUse { .. } => ErrorCode::AlreadyExists,
            Self::FailedPrecondition(_) => ErrorCode::FailedPrecondition,
            Self::Conflict(_) | Self::LeaseLost(_) => ErrorCode::Aborted,
            Self::Unavailable(_) | Self::ShuttingDown => ErrorCode::Unavailable,
            Self::Folder { .. } | Self::Storage(_) | Self::Corrupt(_) => ErrorCode::Internal,
        }
    }

    fn field(&self) -> Option<&str> {
        if let Self::InvalidArgument(violation) = self { Some(&violation.field) } else { None }
    }

    fn detail(&self) -> Option<prost_types::Any> {
        let Self::InvalidDefinition { problems, .. } = self else { return None };
        let detail = chorus_proto::workflow::ValidationProblems {
            problems: problems.iter().cloned().map(crate::grpc::problem_out).collect(),
        };
        Some(prost_types::Any {
            type_url: "type.googleapis.com/chorus.workflow.v1.ValidationProblems".into(),
            value: prost::Message::encode_to_vec(&detail),
        })
    }
}

impl From<WorkflowError> for tonic::Status {
    fn from(error: WorkflowError) -> Self {
        chorus_runtime::error::into_status(error)
    }
}
