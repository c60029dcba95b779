//! The worker's errors and the error a handler returns.

use std::fmt;

use chorus_runtime::transport;

/// Why the worker, or a call a [`TaskContext`](crate::TaskContext) made, failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The task store URL is invalid or nothing answers there.
    #[error("cannot connect to the task store at {url}: {}", innermost(source))]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// A call to the task store failed: its message, and what cut it off
    /// (a refused connection, ...). [`reason`](Self::reason) is the
    /// refusal's reason, for a program to act on.
    #[error("task store call failed: {}", refusal(.0))]
    Transport(tonic::Status),
    /// The task store refused the claim stream for good (bad request,
    /// unauthenticated, ...): reconnecting would not help.
    #[error("claim stream refused: {}", refusal(.0))]
    Stream(tonic::Status),
    /// The worker was configured with a value it cannot run with.
    #[error("invalid worker configuration: {0}")]
    Config(&'static str),
}

impl From<tonic::Status> for WorkerError {
    fn from(status: tonic::Status) -> Self {
        Self::Transport(status)
    }
}

impl WorkerError {
    /// The task store's answer, for an error that is one.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Transport(status) | Self::Stream(status) => Some(status),
            Self::Connect { .. } | Self::Config(_) => None,
        }
    }

    /// The reason of the refusal's `google.rpc.ErrorInfo` (`LEASE_LOST`,
    /// `TASK_FINISHED`, ...; the proto lists them), for a program to act on.
    pub fn reason(&self) -> Option<String> {
        use tonic_types::StatusExt as _;
        self.status().and_then(|status| status.get_details_error_info()).map(|info| info.reason)
    }
}

/// A refusal as a person reads it: its message and, for a call cut off on
/// its way, the innermost cause (`Connection refused (os error 111)`), not
/// the status's code and debug text.
fn refusal(status: &tonic::Status) -> String {
    let cause = std::error::Error::source(status).map(innermost);
    match cause {
        Some(cause) if !status.message().contains(&cause) => format!("{}: {cause}", status.message()),
        _ => status.message().to_owned(),
    }
}

/// The last cause of `error`'s chain (itself when it has none).
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut last = error;
    while let Some(cause) = last.source() {
        last = cause;
    }
    last.to_string()
}

/// A handler's failure: the task fails with this error's text as the reason,
/// is requeued when the error is [retryable](HandlerError::retryable) and
/// the agent has retries left, ends `REJECTED` when the handler
/// [rejected](HandlerError::rejected) it, or goes back to the queue, its
/// attempt not counted, when the handler [handed it back](HandlerError::handed_back).
///
/// Any `std::error::Error` converts into a `HandlerError`, so handlers can
/// use `?`: a fatal one, except that a task-store call refused as
/// UNAVAILABLE (the task store is restarting, or out of reach) is retryable.
/// Such a call changed nothing, and the task is worth another attempt.
#[derive(Debug)]
pub struct HandlerError {
    message: String,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Fatal,
    /// Requeued, claimable again once the pause (if any) has passed.
    Retryable(Option<std::time::Duration>),
    Rejected,
    /// Released, claimable again once the pause has passed.
    HandedBack(std::time::Duration),
}

impl HandlerError {
    /// An error that retrying will not fix: the task ends `FAILED`.
    pub fn fatal(message: impl fmt::Display) -> Self {
        Self { message: message.to_string(), kind: Kind::Fatal }
    }

    /// A transient error: the task store requeues the task while the agent's
    /// `max_retries` last.
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self { message: message.to_string(), kind: Kind::Retryable(None) }
    }

    /// A transient error worth trying again once `after` has passed (an
    /// upstream that is briefly down, a rate limit): the task is requeued
    /// while the agent's `max_retries` last, and no worker claims it sooner.
    pub fn retryable_after(message: impl fmt::Display, after: std::time::Duration) -> Self {
        Self { message: message.to_string(), kind: Kind::Retryable(Some(after)) }
    }

    /// The agent can't or won't do this task: it ends `REJECTED` with
    /// `reason` as its status message (A2A lets an agent decide so after it
    /// started, or while it waits for input).
    pub fn rejected(reason: impl fmt::Display) -> Self {
        Self { message: reason.to_string(), kind: Kind::Rejected }
    }

    /// This worker cannot take the task now (a resource it needs is busy, it
    /// is draining): the task goes back to the queue, its attempt not
    /// counted whatever the agent's retries, for any other worker at once,
    /// and for this one once `after` has passed, so that it is not handed
    /// the task straight back.
    pub fn handed_back(reason: impl fmt::Display, after: std::time::Duration) -> Self {
        Self { message: reason.to_string(), kind: Kind::HandedBack(after) }
    }

    /// How long a task the handler [handed back](Self::handed_back) waits
    /// before a worker may claim it; `None` for any other error.
    pub fn handed_back_for(&self) -> Option<std::time::Duration> {
        match self.kind {
            Kind::HandedBack(after) => Some(after),
            Kind::Fatal | Kind::Retryable(_) | Kind::Rejected => None,
        }
    }

    /// Whether the task should be requeued.
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, Kind::Retryable(_))
    }

    /// How long the requeued task waits before a worker may claim it again.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self.kind {
            Kind::Retryable(after) => after,
            Kind::Fatal | Kind::Rejected | Kind::HandedBack(_) => None,
        }
    }

    /// Whether the handler rejected the task.
    pub fn is_rejected(&self) -> bool {
        self.kind == Kind::Rejected
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E> From<E> for HandlerError
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        let message = chorus_runtime::error::with_causes(&error);
        if cut_off(&error) { Self::retryable(message) } else { Self::fatal(message) }
    }
}

/// Whether `error` is a task-store call cut off on its way: refused as
/// UNAVAILABLE, or its connection could not be made or broke under it.
fn cut_off(error: &(dyn std::error::Error + 'static)) -> bool {
    let status = match error.downcast_ref::<WorkerError>() {
        Some(WorkerError::Transport(status)) => Some(status),
        _ => error.downcast_ref::<tonic::Status>(),
    };
    status.is_some_and(transport::cut_off)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_mark_makes_a_fatal_error_with_the_source_chain() {
        let error = WorkerError::Transport(tonic::Status::invalid_argument("no such field"));
        let converted = HandlerError::from(error);
        assert!(!converted.is_retryable());
        assert!(converted.to_string().starts_with("task store call failed"));
        assert!(converted.to_string().contains("no such field"));
        let io = std::io::Error::other("disk full");
        assert!(!HandlerError::from(io).is_retryable());
    }

    #[test]
    fn a_task_store_out_of_reach_makes_a_retryable_error() {
        let shutting_down = WorkerError::Transport(tonic::Status::unavailable("the task store is shutting down"));
        assert!(HandlerError::from(shutting_down).is_retryable());
        assert!(HandlerError::from(tonic::Status::unavailable("tcp connect error")).is_retryable());
        assert!(!HandlerError::from(tonic::Status::failed_precondition("lease lost")).is_retryable());
        // A task store killed under the call: the transport's own status.
        let mut broken = tonic::Status::unknown("h2 protocol error: stream closed because of a broken pipe");
        broken.set_source(std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        assert!(HandlerError::from(WorkerError::Transport(broken)).is_retryable());
    }

    #[test]
    fn a_refusal_reads_as_its_message_once_with_what_cut_it_off() {
        let refused = WorkerError::from(tonic::Status::failed_precondition("task t is canceled"));
        assert_eq!(HandlerError::from(refused).to_string(), "task store call failed: task t is canceled");
        let mut broken = tonic::Status::unavailable("tcp connect error");
        broken.set_source(std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert_eq!(
            HandlerError::from(WorkerError::Transport(broken)).to_string(),
            "task store call failed: tcp connect error: connection refused"
        );
    }

    #[test]
    fn a_refusal_names_its_reason() {
        use tonic_types::{ErrorDetails, StatusExt as _};
        let details = ErrorDetails::with_error_info("LEASE_LOST", "taskstore.chorus.dev", []);
        let status = tonic::Status::with_error_details(tonic::Code::FailedPrecondition, "lease gone", details);
        assert_eq!(WorkerError::from(status).reason().as_deref(), Some("LEASE_LOST"));
        assert_eq!(WorkerError::from(tonic::Status::unavailable("down")).reason(), None);
    }

    #[test]
    fn retryable_and_fatal_keep_their_message() {
        assert!(HandlerError::retryable("busy").is_retryable());
        assert_eq!(HandlerError::fatal("bad input").to_string(), "bad input");
    }

    #[test]
    fn a_rejection_is_neither_retried_nor_a_failure() {
        let rejected = HandlerError::rejected("not my job");
        assert!(rejected.is_rejected() && !rejected.is_retryable());
        assert_eq!(rejected.to_string(), "not my job");
        assert!(!HandlerError::fatal("bad input").is_rejected());
    }
}
