//! The one place that touches the `agent-client-protocol` SDK: an ACP v1
//! agent connection whose handlers call the [`Bridge`], and the [`Ide`] the
//! bridge calls back through.
//!
//! The SDK's dispatch loop waits for each handler, so handlers only do
//! bounded work; a prompt turn (which waits for the IDE's answers to
//! permission and file requests, and for `session/cancel`) runs in a task of
//! its own, and answers its request from there.

mod convert;

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, AuthMethodAgent, AuthenticateRequest, AuthenticateResponse, CancelNotification,
    Implementation, InitializeRequest, InitializeResponse, ListSessionsRequest, LoadSessionRequest,
    LoadSessionResponse, McpCapabilities, NewSessionRequest, NewSessionResponse, PromptCapabilities, PromptRequest,
    PromptResponse, ReadTextFileRequest, RequestPermissionOutcome, RequestPermissionRequest, ResumeSessionRequest,
    ResumeSessionResponse, SessionAdditionalDirectoriesCapabilities, SessionCapabilities, SessionListCapabilities,
    SessionNotification, SessionResumeCapabilities,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Agent, Client, JsonRpcResponse, on_receive_notification, on_receive_request};
use futures_util::StreamExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio_util::task::TaskTracker;

use super::ask::FileRequest;
use super::bridge::{AUTH_METHOD, Bridge};
use super::content::{ToolCall, Update};
use super::error::{AcpError, Result};
use super::session::SessionContext;
use super::{Ide, StopReason};

/// How long a closing connection waits for its turns to cancel their tasks.
const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// Serves ACP over stdin/stdout until stdin closes or `stop` fires, which
/// ends the connection the same way.
pub(super) async fn serve_stdio(
    bridge: Arc<Bridge>,
    stop: tokio_util::sync::CancellationToken,
) -> std::result::Result<(), agent_client_protocol::Error> {
    let outgoing = futures_util::sink::unfold(tokio::io::stdout(), |mut stdout, line: String| async move {
        stdout.write_all(line.as_bytes()).await?;
        stdout.write_all(b"\n").await?;
        stdout.flush().await?;
        Ok::<_, std::io::Error>(stdout)
    });
    let incoming = stdin_lines()
        .map_err(|error| agent_client_protocol::Error::internal_error().data(format!("cannot read stdin: {error}")))?
        .take_until(stop.cancelled_owned());
    serve_frames(bridge, Box::pin(outgoing), incoming).await
}

/// The lines of stdin, read on a thread of their own: a read cannot be
/// cancelled, and one on the runtime's blocking pool would hold the process
/// after a signal until the IDE wrote or closed stdin.
fn stdin_lines() -> std::io::Result<tokio_stream::wrappers::ReceiverStream<std::io::Result<String>>> {
    use std::io::BufRead as _;
    let (lines, received) = tokio::sync::mpsc::channel(16);
    std::thread::Builder::new().name("acp-stdin".to_owned()).spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut line = Vec::new();
            let read = match stdin.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => Ok(lossy_line(&line)),
                Err(error) => Err(error),
            };
            let failed = read.is_err();
            if lines.blocking_send(read).is_err() || failed {
                return;
            }
        }
    })?;
    Ok(tokio_stream::wrappers::ReceiverStream::new(received))
}

/// A line of stdin without its end, its bytes that are not UTF-8 replaced
/// (U+FFFD): it gets the parse error of any malformed line (or, in a JSON
/// string, is read so), where the SDK's own stdio ended the whole
/// connection, every session's turn with it.
fn lossy_line(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

/// Serves ACP over newline-free JSON text frames (one JSON-RPC message per
/// frame), as the WebSocket endpoint carries them (and stdio, a line each).
/// When the IDE's side ends, running turns are cancelled (their A2A tasks
/// with them, but for those waiting for an answer): the bridge learns it
/// before the connection fails the requests waiting on the IDE, so that a
/// turn tells the IDE going away from the IDE failing its question.
pub(super) async fn serve_frames<Out, In>(
    bridge: Arc<Bridge>,
    outgoing: Out,
    incoming: In,
) -> std::result::Result<(), agent_client_protocol::Error>
where
    Out: futures_util::Sink<String, Error = std::io::Error> + Send + 'static,
    In: futures_util::Stream<Item = std::io::Result<String>> + Send + 'static,
{
    let ended = Arc::clone(&bridge);
    let ended = futures_util::stream::once(async move { ended.close() }).filter_map(|()| std::future::ready(None));
    let transport = agent_client_protocol::Lines::new(outgoing, incoming.chain(ended));
    let turns = TaskTracker::new();
    let served = connection(Arc::clone(&bridge), turns.clone()).connect_to(transport).await;
    bridge.close();
    turns.close();
    if tokio::time::timeout(CLOSE_GRACE, turns.wait()).await.is_err() {
        tracing::warn!("turns still running after the connection closed");
    }
    served
}

/// Answers a request with `result`.
fn reply<T: JsonRpcResponse>(
    responder: Responder<T>,
    result: Result<T>,
) -> std::result::Result<(), agent_client_protocol::Error> {
    match result {
        Ok(response) => responder.respond(response),
        Err(error) => {
            tracing::debug!(%error, "acp request failed");
            responder.respond_with_error(convert::error(&error))
        }
    }
}

fn connection(
    bridge: Arc<Bridge>,
    turns: TaskTracker,
) -> agent_client_protocol::v1::Builder<
    Agent,
    impl agent_client_protocol::HandleDispatchFrom<Client>,
    impl agent_client_protocol::RunWithConnectionTo<Client>,
    impl agent_client_protocol::HandleConnectionClose<Client>,
> {
    let (init, auth, new, load, resume, list, prompt, cancel) = (
        Arc::clone(&bridge),
        Arc::clone(&bridge),
        Arc::clone(&bridge),
        Arc::clone(&bridge),
        Arc::clone(&bridge),
        Arc::clone(&bridge),
        Arc::clone(&bridge),
        bridge,
    );
    Agent
        .v1()
        .name("chorus")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                let info = init.initialize(request.client_capabilities.fs.read_text_file).await;
                responder.respond(initialize_response(info.needs_token))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: AuthenticateRequest, responder, _cx| {
                let result = auth.authenticate(&request.method_id.0).await.map(|()| AuthenticateResponse::new());
                reply(responder, result)
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                let servers = convert::mcp_servers(&request.mcp_servers);
                let result = match SessionContext::new(request.cwd, request.additional_directories, servers) {
                    Ok(context) => new.new_session(context).await.map(NewSessionResponse::new),
                    Err(error) => Err(error),
                };
                reply(responder, result)
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx| {
                let servers = convert::mcp_servers(&request.mcp_servers);
                let ide = Connection { cx };
                let result = match SessionContext::new(request.cwd, request.additional_directories, servers) {
                    Ok(context) => load.load_session(&request.session_id.0, context, &ide).await,
                    Err(error) => Err(error),
                };
                reply(responder, result.map(|()| LoadSessionResponse::new()))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ResumeSessionRequest, responder, _cx| {
                let servers = convert::mcp_servers(&request.mcp_servers);
                let result = match SessionContext::new(request.cwd, request.additional_directories, servers) {
                    Ok(context) => resume.resume_session(&request.session_id.0, context).await,
                    Err(error) => Err(error),
                };
                reply(responder, result.map(|()| ResumeSessionResponse::new()))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ListSessionsRequest, responder, _cx| {
                let result = list.list_sessions(request.cwd).await.map(convert::sessions_out);
                reply(responder, result)
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx| {
                let bridge = Arc::clone(&prompt);
                let ide: Arc<dyn Ide> = Arc::new(Connection { cx });
                let blocks = request.prompt.into_iter().map(convert::content_in).collect();
                turns.spawn(async move {
                    let result = bridge.prompt(&request.session_id.0, blocks, ide).await;
                    let result = result.map(|stop: StopReason| PromptResponse::new(convert::stop_out(stop)));
                    if let Err(error) = reply(responder, result) {
                        tracing::debug!(%error, "cannot answer session/prompt: the connection is gone");
                    }
                });
                Ok(())
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                cancel.cancel(&notification.session_id.0);
                Ok(())
            },
            on_receive_notification!(),
        )
}

fn initialize_response(needs_token: bool) -> InitializeResponse {
    let capabilities = AgentCapabilities::new()
        .load_session(true)
        .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
        .mcp_capabilities(McpCapabilities::new().http(true).sse(true))
        .session_capabilities(
            SessionCapabilities::new()
                .list(SessionListCapabilities::new())
                .resume(SessionResumeCapabilities::new())
                .additional_directories(SessionAdditionalDirectoriesCapabilities::new()),
        );
    let methods = if needs_token {
        let method = AuthMethodAgent::new(AUTH_METHOD, "chorus gateway token").description(format!(
            "The bearer token of the chorus gateway, read from chorus acp --token-file or {}",
            super::TOKEN_ENV
        ));
        vec![AuthMethod::Agent(method)]
    } else {
        Vec::new()
    };
    InitializeResponse::new(ProtocolVersion::V1)
        .agent_capabilities(capabilities)
        .auth_methods(methods)
        .agent_info(Implementation::new("chorus", env!("CARGO_PKG_VERSION")).title("chorus".to_owned()))
}

/// The IDE, over the ACP connection.
#[derive(Debug, Clone)]
struct Connection {
    cx: ConnectionTo<Client>,
}

fn client_error(error: &agent_client_protocol::Error) -> AcpError {
    AcpError::Client(error.to_string())
}

#[async_trait::async_trait]
impl Ide for Connection {
    fn update(&self, session_id: &str, update: Update) -> Result<()> {
        let notification = SessionNotification::new(session_id.to_owned(), convert::update_out(update));
        self.cx.send_notification(notification).map_err(|error| client_error(&error))
    }

    async fn request_permission(&self, session_id: &str, call: ToolCall) -> Result<Option<String>> {
        let request = RequestPermissionRequest::new(
            session_id.to_owned(),
            convert::permission_call(call),
            convert::permission_options(),
        );
        let response = self.cx.send_request(request).block_task().await.map_err(|error| client_error(&error))?;
        Ok(match response.outcome {
            RequestPermissionOutcome::Selected(selected) => Some(selected.option_id.0.to_string()),
            RequestPermissionOutcome::Cancelled => None,
            _ => None,
        })
    }

    async fn read_text_file(&self, session_id: &str, request: &FileRequest) -> Result<String> {
        let read = ReadTextFileRequest::new(session_id.to_owned(), request.path.clone())
            .line(request.line)
            .limit(request.limit);
        let response = self.cx.send_request(read).block_task().await.map_err(|error| client_error(&error))?;
        Ok(response.content)
    }
}
