//! Outbound A2A 1.0 client: how the gateway delegates a task to an external
//! A2A agent (the `a2a_delegate` tool) and proxies `remote` agents.
//!
//! [`A2aClient`] discovers an agent through its card, picks a JSON-RPC or
//! HTTP+JSON interface for protocol version 1.0 ([`pick_interface`]), and
//! speaks `SendMessage`, `SendStreamingMessage` (SSE), `GetTask` and
//! `CancelTask` on either binding, with `A2A-Version: 1.0` on every call.
//! [`A2aClient::delegate`] is the high-level operation: send one message and
//! wait, within a deadline, until the remote task is terminal or interrupted.

mod client;
mod run;
mod sse;
mod wire;

#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

use a2a::{AgentCard, Message, Task};
use chorus_runtime::egress::EgressGuard;

use crate::config::DelegateConfig;

pub(crate) use client::{A2aClient, pick_interface};

/// The wire binding of an [`Endpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// JSON-RPC 2.0 over HTTP (`protocolBinding: "JSONRPC"`).
    JsonRpc,
    /// HTTP+JSON, the REST binding (`protocolBinding: "HTTP+JSON"`).
    HttpJson,
}

/// One interface of a remote agent, chosen from its card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The interface URL: the JSON-RPC endpoint, or the REST base URL.
    pub(crate) url: String,
    /// How to talk to `url`.
    pub(crate) binding: Binding,
    /// The interface's tenant; copied into every request (spec §8.3.2).
    pub(crate) tenant: Option<String>,
}

/// Credentials presented to the remote agent on every request.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credentials {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// An API key sent in the named header.
    ApiKey {
        /// Header name, such as `X-API-Key`.
        header: String,
        /// The key itself.
        value: String,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Self::ApiKey { header, .. } => write!(f, "ApiKey {{ header: {header:?}, value: <redacted> }}"),
        }
    }
}

/// Where [`A2aClient::delegate`] sends a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DelegateTarget {
    /// The agent's base URL (its card is at `{base_url}/.well-known/agent-card.json`),
    /// or the full URL of its agent card.
    pub(crate) base_url: String,
    /// The tenant every request names, whatever the card's interface says:
    /// the namespace a delegation to the gateway's own agents acts in.
    pub(crate) tenant: Option<String>,
}

impl DelegateTarget {
    /// A target reached through `base_url`.
    pub(crate) fn new(base_url: impl Into<String>) -> Self {
        Self { base_url: base_url.into(), tenant: None }
    }

    /// How to reach the agent whose `card` this is (see [`pick_interface`]).
    pub(crate) fn endpoint(&self, card: &AgentCard) -> Result<Endpoint, DelegateError> {
        let mut endpoint = pick_interface(card)?;
        if self.tenant.is_some() {
            endpoint.tenant.clone_from(&self.tenant);
        }
        Ok(endpoint)
    }
}

/// What a delegation ended with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DelegateOutcome {
    /// The remote task, in a terminal state (completed, failed, canceled,
    /// rejected) or an interrupted one (input-required, auth-required).
    Task(Task),
    /// The agent answered directly with a message and created no task.
    Message(Message),
}

/// Why a call to a remote A2A agent failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DelegateError {
    /// The HTTP exchange failed (DNS, connect, TLS, reset, a broken body, ...).
    #[error("the request to the A2A agent at {url} failed: {}", chorus_runtime::error::with_causes(source))]
    Http {
        /// The URL that was called.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The agent answered with an HTTP error that carries no A2A error.
    #[error("the A2A agent at {url} answered HTTP {status}: {body}")]
    Status {
        /// The URL that was called.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// The agent's address may not be called (the SSRF guard).
    #[error("the A2A agent at {url} may not be called: {reason}")]
    Refused {
        /// The URL that was refused.
        url: String,
        /// Which address, and the settings that would allow it.
        reason: String,
    },
    /// The agent answered with something that is not valid A2A 1.0.
    #[error("the A2A agent at {url} sent an invalid response: {detail}")]
    Protocol {
        /// The URL that was called.
        url: String,
        /// What was wrong with the response.
        detail: String,
    },
    /// The agent rejected the request with an A2A error.
    ///
    /// `code` is the JSON-RPC error code (`-32001` task not found, ...). An
    /// HTTP+JSON error is mapped to the same code through its `ErrorInfo`
    /// reason; when it has none, `code` is the HTTP status.
    #[error("the A2A agent returned error {code}: {message}")]
    Remote {
        /// The A2A / JSON-RPC error code.
        code: i32,
        /// The agent's error message.
        message: String,
    },
    /// The agent card offers no interface this client can use.
    #[error(
        "the agent card offers no JSON-RPC or HTTP+JSON interface for A2A 1.0 (it offers: {})",
        if offered.is_empty() { "nothing".to_owned() } else { offered.join(", ") }
    )]
    NoInterface {
        /// The interfaces the card lists, as `BINDING version`.
        offered: Vec<String>,
    },
    /// The configured credentials cannot be sent as HTTP headers.
    #[error("the credentials for the A2A agent are not a valid HTTP header: {detail}")]
    InvalidCredentials {
        /// What is wrong (never the secret itself).
        detail: String,
    },
    /// The remote task did not finish before the deadline.
    #[error("{}", timeout_message(task_id.as_deref()))]
    Timeout {
        /// The remote task, when the agent had created one; it was asked to cancel.
        task_id: Option<String>,
    },
    /// The caller gave up on the delegation; the remote task was asked to cancel.
    #[error("the delegation was canceled{}", task_id.as_deref().map(|id| format!(" (remote task {id} was asked to cancel)")).unwrap_or_default())]
    Canceled { task_id: Option<String> },
}

impl DelegateError {
    /// Whether the agent could not be reached or could not answer for now:
    /// the connection failed or broke, a 5xx, or an internal error (a
    /// gateway that is stopping ends its streams with one).
    pub(crate) fn unavailable(&self) -> bool {
        matches!(self, Self::Http { .. } | Self::Status { status: 500..=599, .. } | Self::Remote { code: -32603, .. })
    }

    /// Whether the agent refused the request as too large (HTTP 413).
    pub(crate) fn too_large(&self) -> bool {
        matches!(self, Self::Status { status: 413, .. } | Self::Remote { code: 413, .. })
    }

    /// Whether the agent refused the caller's credentials (HTTP 401 or 403).
    pub(crate) fn refused_credentials(&self) -> bool {
        matches!(self, Self::Status { status: 401 | 403, .. } | Self::Remote { code: 401 | 403, .. })
    }
}

fn timeout_message(task_id: Option<&str>) -> String {
    match task_id {
        Some(id) => format!("the remote A2A task {id} did not finish in time; it was asked to cancel"),
        None => "the A2A agent did not answer in time; no remote task was created".to_owned(),
    }
}

/// The SSRF guard of delegations: `settings`' policy, and the host names of
/// the gateway's `own` base URLs (their IP literals are exempt by origin, in
/// [`A2aClient::guarded`]; a name resolves before its port is known).
pub(crate) fn egress_guard(settings: &DelegateConfig, own: &[&str]) -> EgressGuard {
    let mut allowed = settings.allowed_hosts.clone();
    let hosts = own.iter().filter_map(|url| Some(reqwest::Url::parse(url).ok()?.host_str()?.to_owned()));
    allowed.extend(hosts.filter(|host| !host.starts_with('[') && host.parse::<std::net::IpAddr>().is_err()));
    EgressGuard::new(
        settings.allow_private,
        &allowed,
        "set gateway.delegate.allow_private or list the host in gateway.delegate.allowed_hosts to allow it",
    )
}

/// Defaults of [`A2aClient`].
const DEFAULT_CARD_TTL: Duration = Duration::from_secs(60);
const DEFAULT_POLL_INITIAL: Duration = Duration::from_millis(250);
const DEFAULT_POLL_MAX: Duration = Duration::from_secs(5);
