//! The ACP bridge: chorus agents inside IDEs (Zed, JetBrains, Neovim, ...).
//!
//! `chorus acp --agent <id>` is an Agent Client Protocol v1 agent over stdio
//! (newline-delimited JSON-RPC; logs go to stderr) that an IDE launches; the
//! gateway serves the same protocol over WebSocket at `GET /acp` for remote
//! IDEs. Either way, one [`bridge::Bridge`] per connection maps ACP onto the
//! gateway's A2A API, as any A2A client would use it:
//!
//! | ACP | A2A |
//! |---|---|
//! | `session/new` (cwd, additionalDirectories, mcpServers) | a new context id, which *is* the session id |
//! | `session/prompt` | `SendStreamingMessage` in the context; the IDE context rides in every message's metadata under `acp/session` |
//! | `session/update` | the task's status messages and artifacts ([`turn`]) |
//! | `session/cancel` | `CancelTask`; the turn ends `cancelled` |
//! | `session/request_permission`, `fs/read_text_file` | an `input-required` task ([`ask`]), continued with the answer |
//! | `session/load`, `session/resume`, `session/list` | `ListTasks` by context ([`history`]) |
//! | `authenticate` (`chorus-token`) | the bearer token of every call |
//!
//! Only [`adapter`] touches the `agent-client-protocol` crate; the rest
//! speaks the bridge's own types ([`content`]).

mod adapter;
mod ask;
mod bridge;
mod content;
mod error;
mod history;
mod plan;
mod session;
mod turn;
mod upstream;
mod ws;

use std::sync::Arc;

pub use self::ask::{ALLOW, PERMISSION, READ_TEXT_FILE, REJECT};
pub use self::bridge::AUTH_METHOD;
pub use self::session::SESSION_METADATA;
pub use self::upstream::{TOKEN_ENV, bearer_token};
pub(crate) use self::ws::handle as websocket;

use self::ask::FileRequest;
use self::content::{ToolCall, Update};
use self::error::Result;

/// How a prompt turn ended (the ACP stop reasons the bridge uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    EndTurn,
    Refusal,
    Cancelled,
}

/// What the bridge asks of the IDE: implemented by the adapter over the
/// ACP connection.
#[async_trait::async_trait]
pub(crate) trait Ide: Send + Sync + 'static {
    /// Sends one `session/update`.
    fn update(&self, session_id: &str, update: Update) -> Result<()>;

    /// `session/request_permission` about `call` with [`ask::OPTIONS`]: the
    /// chosen option's id, or `None` when the IDE cancelled.
    async fn request_permission(&self, session_id: &str, call: ToolCall) -> Result<Option<String>>;

    /// `fs/read_text_file`.
    async fn read_text_file(&self, session_id: &str, request: &FileRequest) -> Result<String>;
}

/// Where `chorus acp` finds its agent.
#[derive(Debug, Clone)]
pub struct StdioOptions {
    /// The gateway's base URL (`http://127.0.0.1:7800`).
    pub gateway: String,
    /// The agent's id in the gateway's catalog.
    pub agent: String,
    /// Where the gateway token is (unset: `CHORUS_TOKEN`, if set).
    pub token_file: Option<std::path::PathBuf>,
    /// How long a turn whose gateway went away waits for it to come back.
    pub gateway_wait: std::time::Duration,
    /// Ends the connection as the IDE closing stdin does (SIGTERM, SIGINT).
    pub stop: tokio_util::sync::CancellationToken,
}

/// Serves ACP on stdin/stdout until the IDE closes stdin, or `stop` fires.
pub async fn serve_stdio(options: StdioOptions) -> std::result::Result<(), String> {
    crate::push::install_crypto_provider();
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .map_err(|error| format!("cannot build the HTTP client: {error}"))?;
    let tokens = upstream::TokenSource::FileOrEnv(options.token_file);
    let upstream =
        upstream::Upstream::new(http, &options.gateway, &options.agent, tokens).with_gateway_wait(options.gateway_wait);
    let bridge = Arc::new(bridge::Bridge::new(upstream));
    adapter::serve_stdio(bridge, options.stop).await.map_err(|error| format!("the ACP connection failed: {error}"))
}
