//! The workflow service's one error type, and its one mapping to error codes.

use chorus_runtime::{
    error::{ErrorCode, Reason, ServiceError, any},
    storage::storage_error,
    validate::FieldViolation,
};

use crate::domain::{Disabled, Problem};

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
    #[error("workflow {workflow} is disabled{}; enable it to start runs", disabled_by(.disabled))]
    Disabled { workflow: String, disabled: Disabled },
    #[error("run {0} not found")]
    RunNotFound(String),
    #[error("run {run_id} is already {state}")]
    RunFinished { run_id: String, state: &'static str },
    #[error("step {step_id} has not been reached yet in run {run_id}")]
    GateNotReached { run_id: String, step_id: String },
    #[error("gate {step_id} is not waiting for a decision (it is {state})")]
    GateNotWaiting { step_id: String, state: String },
    #[error("gate {step_id} waits in iteration {waiting}, not {asked}")]
    GateIteration { step_id: String, waiting: u32, asked: u32 },
    #[error(
        "idempotency key `{key}` is already used by run {run_id} of {workflow} v{version}, which {mismatch}; \
         reuse a key only to retry the same start"
    )]
    KeyInUse { key: String, run_id: String, workflow: String, version: u32, mismatch: String },
    #[error(
        "signal id `{signal_id}` of run {run_id} was sent already with {mismatch}; reuse an id only to retry the \
         same signal"
    )]
    SignalIdInUse { signal_id: String, run_id: String, mismatch: &'static str },
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

/// ` by <who> (<why>)`, as far as the record says.
fn disabled_by(disabled: &Disabled) -> String {
    let by = if disabled.by.is_empty() { String::new() } else { format!(" by {}", disabled.by) };
    let reason = if disabled.reason.is_empty() { String::new() } else { format!(" ({})", disabled.reason) };
    format!("{by}{reason}")
}

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
            Self::KeyInUse { .. } | Self::SignalIdInUse { .. } => ErrorCode::AlreadyExists,
            Self::RunFinished { .. }
            | Self::GateNotReached { .. }
            | Self::GateNotWaiting { .. }
            | Self::GateIteration { .. }
            | Self::Disabled { .. } => ErrorCode::FailedPrecondition,
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
        Some(any("chorus.workflow.v1.ValidationProblems", &detail))
    }

    fn reason(&self) -> Option<Reason> {
        let reason = |name| Reason::new(DOMAIN, name);
        let gate = |name, step_id: &str| reason(name).with("step_id", step_id);
        Some(match self {
            Self::InvalidArgument(_) | Self::Folder { .. } | Self::Storage(_) | Self::Corrupt(_) => return None,
            Self::InvalidDefinition { file, .. } => reason("INVALID_DEFINITION").with("file", file),
            Self::VersionNotFound { name, version } => {
                reason("VERSION_NOT_FOUND").with("workflow", name).with("version", version)
            }
            Self::NotFound(name) => reason("WORKFLOW_NOT_FOUND").with("workflow", name),
            Self::Disabled { workflow, disabled } => reason("WORKFLOW_DISABLED")
                .with("workflow", workflow)
                .with("disabled_by", &disabled.by)
                .with("reason", &disabled.reason),
            Self::RunNotFound(run_id) => reason("RUN_NOT_FOUND").with("run_id", run_id),
            Self::RunFinished { run_id, state } => reason("RUN_FINISHED").with("run_id", run_id).with("state", state),
            Self::GateNotReached { run_id, step_id } => gate("GATE_NOT_REACHED", step_id).with("run_id", run_id),
            Self::GateNotWaiting { step_id, state } => gate("GATE_NOT_WAITING", step_id).with("state", state),
            Self::GateIteration { step_id, waiting, .. } => {
                gate("GATE_ITERATION_MISMATCH", step_id).with("iteration", waiting)
            }
            Self::KeyInUse { key, run_id, .. } => reason("REQUEST_KEY_IN_USE").with("key", key).with("run_id", run_id),
            Self::SignalIdInUse { signal_id, run_id, .. } => {
                reason("SIGNAL_ID_IN_USE").with("signal_id", signal_id).with("run_id", run_id)
            }
            Self::LeaseLost(run_id) => reason("LEASE_LOST").with("run_id", run_id),
            Self::Conflict(name) => reason("CONCURRENT_CHANGE").with("workflow", name),
            Self::ShuttingDown => reason("SHUTTING_DOWN"),
            Self::Unavailable(_) => reason("DATABASE_UNAVAILABLE"),
        })
    }
}

/// The domain of the workflow service's `google.rpc.ErrorInfo` reasons.
pub const DOMAIN: &str = "workflow.chorus.dev";

impl From<WorkflowError> for tonic::Status {
    fn from(error: WorkflowError) -> Self {
        chorus_runtime::error::into_status(error)
    }
}
