//! The bridge's one error type and its one mapping to ACP (JSON-RPC) codes.

use crate::delegate::DelegateError;

/// The ACP error codes the bridge answers with (schema `ErrorCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// -32602: the request's parameters are wrong.
    InvalidParams,
    /// -32603: the bridge or the gateway failed.
    Internal,
    /// -32000: the gateway needs credentials the bridge does not have.
    AuthRequired,
    /// -32002: no such session.
    ResourceNotFound,
}

impl Code {
    /// The JSON-RPC error code.
    pub(crate) fn value(self) -> i32 {
        match self {
            Self::InvalidParams => -32602,
            Self::Internal => -32603,
            Self::AuthRequired => -32000,
            Self::ResourceNotFound => -32002,
        }
    }
}

/// Why an ACP request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcpError {
    /// The request names a session this connection has not opened.
    #[error(
        "session {0} is not open on this connection (create it with session/new, or open it with session/load or session/resume)"
    )]
    UnknownSession(String),
    /// `session/load` or `session/resume` named a context with no task.
    #[error("there is no session {0} with agent {1}")]
    NoSuchSession(String, String),
    /// A parameter is invalid.
    #[error("{0}")]
    InvalidParams(String),
    /// A prompt arrived while the session's previous turn was still running.
    #[error("session {0} already has a prompt turn running; cancel it or wait for its stop reason")]
    Busy(String),
    /// The gateway needs credentials and the bridge has none it accepts.
    #[error("{0}")]
    AuthRequired(String),
    /// The gateway has no agent of that id.
    #[error("the gateway at {gateway} has no agent {agent} (GET {gateway}/a2a lists its agents)")]
    UnknownAgent {
        /// The agent `--agent` names.
        agent: String,
        /// The gateway's base URL.
        gateway: String,
    },
    /// The gateway could not be reached or answered with an error.
    #[error("the gateway failed: {0}")]
    Gateway(#[from] DelegateError),
    /// The gateway ended a stream before the task settled.
    #[error("the gateway closed the stream of task {0} before the task finished")]
    StreamEnded(String),
    /// The agent's task failed (or ended in a state ACP has no stop reason for).
    #[error("the agent's task {task_id} ended {state}: {reason}")]
    TaskEnded {
        /// The A2A task.
        task_id: String,
        /// Its final state, as A2A names it.
        state: &'static str,
        /// The agent's last status message, or a description.
        reason: String,
    },
    /// The IDE failed a request the bridge made to it.
    #[error("the client failed: {0}")]
    Client(String),
    /// The gateway went away mid-turn and did not come back in time.
    #[error(
        "the gateway did not answer again within {waited} s (--gateway-wait); task {task_id} may go on there, and \
         session/load shows how it went: {cause}"
    )]
    GatewayGone {
        /// The turn's task.
        task_id: String,
        /// How long the turn waited, in seconds.
        waited: u64,
        /// The last failure.
        cause: String,
    },
}

impl AcpError {
    /// The ACP error code of this error.
    pub(crate) fn code(&self) -> Code {
        match self {
            Self::UnknownSession(_) | Self::NoSuchSession(..) | Self::UnknownAgent { .. } => Code::ResourceNotFound,
            Self::InvalidParams(_) | Self::Busy(_) => Code::InvalidParams,
            Self::AuthRequired(_) => Code::AuthRequired,
            // The gateway refused the token (revoked, rotated): the IDE's
            // cue to authenticate again, whichever call met it.
            Self::Gateway(error) if error.refused_credentials() => Code::AuthRequired,
            // A prompt larger than the gateway takes: the IDE's to shorten.
            Self::Gateway(error) if error.too_large() => Code::InvalidParams,
            Self::Gateway(_)
            | Self::StreamEnded(_)
            | Self::TaskEnded { .. }
            | Self::Client(_)
            | Self::GatewayGone { .. } => Code::Internal,
        }
    }

    /// Whether the gateway may have gone away for a while (a restart, a
    /// deploy), rather than refused or failed the call for good.
    pub(crate) fn gateway_went_away(&self) -> bool {
        match self {
            Self::StreamEnded(_) => true,
            Self::Gateway(error) => error.unavailable(),
            _ => false,
        }
    }

    /// Structured details for the error's `data`, when there are any.
    pub(crate) fn data(&self) -> Option<serde_json::Value> {
        match self {
            Self::TaskEnded { task_id, state, .. } => Some(serde_json::json!({ "taskId": task_id, "state": state })),
            Self::GatewayGone { task_id, .. } => Some(serde_json::json!({ "taskId": task_id })),
            Self::UnknownSession(id) | Self::NoSuchSession(id, _) | Self::Busy(id) => {
                Some(serde_json::json!({ "sessionId": id }))
            }
            Self::UnknownAgent { agent, .. } => Some(serde_json::json!({ "agent": agent })),
            Self::InvalidParams(_)
            | Self::AuthRequired(_)
            | Self::Gateway(_)
            | Self::StreamEnded(_)
            | Self::Client(_) => None,
        }
    }
}

pub(crate) type Result<T, E = AcpError> = std::result::Result<T, E>;
