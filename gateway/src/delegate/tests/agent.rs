//! A tiny A2A 1.0 agent on `127.0.0.1:0` for the client tests: agent card,
//! JSON-RPC (`SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`)
//! and HTTP+JSON (`message:send`, `message:stream`, `tasks/{id}`,
//! `tasks/{id}:cancel`). It records every call. What it does depends on the
//! message text: `hello` completes with an echo artifact, `slow` works until
//! canceled, `poll` completes on the second `GetTask`, `question` needs
//! input, `chat` answers with a message, `refuse` is an A2A error, and
//! `crash` streams a task and then an error. A message that continues a task
//! answers it: the agent sends the task as it stands first (still waiting on
//! its question, as the JS SDK's agents must), then completes it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use a2a::{
    Artifact, JsonRpcId, JsonRpcRequest, Message, Part, Role, SendMessageRequest, StreamResponse, Task,
    TaskArtifactUpdateEvent, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use futures_util::{StreamExt, stream};
use serde_json::{Value, json};

/// Which interfaces the card lists and what it declares.
#[derive(Debug, Clone, Copy)]
pub(super) struct Setup {
    pub(super) streaming: bool,
    pub(super) jsonrpc: bool,
    pub(super) tenant: Option<&'static str>,
}

/// One request the agent received.
#[derive(Debug, Clone)]
pub(super) struct Call {
    /// The JSON-RPC method, or `VERB /path?query` for HTTP+JSON.
    pub(super) method: String,
    pub(super) headers: HeaderMap,
    /// JSON-RPC `params`, or the HTTP+JSON body (`Null` for a `GET`).
    pub(super) params: Value,
}

/// A running agent.
#[derive(Debug)]
pub(super) struct Agent {
    pub(super) base_url: String,
    pub(super) state: Arc<AgentState>,
}

#[derive(Debug)]
pub(super) struct AgentState {
    base_url: String,
    setup: Setup,
    pub(super) card_hits: AtomicUsize,
    calls: Mutex<Vec<Call>>,
    tasks: Mutex<HashMap<String, (Task, usize)>>,
}

/// Starts an agent; the listener is bound before this returns.
pub(super) async fn start(setup: Setup) -> Agent {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base_url = format!("http://{}", listener.local_addr().expect("address"));
    let state = Arc::new(AgentState {
        base_url: base_url.clone(),
        setup,
        card_hits: AtomicUsize::new(0),
        calls: Mutex::default(),
        tasks: Mutex::default(),
    });
    let app = Router::new()
        .route("/.well-known/agent-card.json", get(card))
        .route("/rpc", post(rpc))
        .route("/rest/{*path}", any(rest))
        .route("/legacy/.well-known/agent-card.json", get(legacy_card))
        .route("/broken", post(|| async { (StatusCode::BAD_GATEWAY, "<html>upstream is down</html>") }))
        .route("/garbage", post(|| async { ([(header::CONTENT_TYPE, "application/json")], "{not json") }))
        .with_state(Arc::clone(&state));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Agent { base_url, state }
}

impl AgentState {
    /// Every call received so far, in order.
    pub(super) fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls").clone()
    }

    /// The agent's view of task `id`.
    pub(super) fn task(&self, id: &str) -> Option<Task> {
        self.tasks.lock().expect("tasks").get(id).map(|(task, _)| task.clone())
    }

    fn record(&self, method: String, headers: &HeaderMap, params: Value) {
        self.calls.lock().expect("calls").push(Call { method, headers: headers.clone(), params });
    }

    fn set_state(&self, id: &str, state: TaskState) {
        if let Some((task, _)) = self.tasks.lock().expect("tasks").get_mut(id) {
            task.status.state = state;
        }
    }

    /// Runs `SendMessage`: a task or a direct message, or an A2A error.
    fn send(&self, request: &SendMessageRequest) -> Result<StreamResponse, (i32, String)> {
        let text = request.message.text().unwrap_or_default().to_owned();
        if let Some(id) = &request.message.task_id {
            let mut tasks = self.tasks.lock().expect("tasks");
            let (task, polls_left) = tasks.get_mut(id).ok_or_else(|| not_found(id))?;
            let as_it_stands = task.clone();
            task.artifacts = Some(vec![echo(&text)]);
            *polls_left = 1;
            return Ok(StreamResponse::Task(as_it_stands));
        }
        let state = match text.as_str() {
            "chat" => return Ok(StreamResponse::Message(Message::new(Role::Agent, vec![Part::text("hi there")]))),
            "refuse" => return Err((-32004, "this agent refuses the request".to_owned())),
            "hello" => TaskState::Completed,
            "question" => TaskState::InputRequired,
            _ => TaskState::Working,
        };
        let mut task = Task {
            id: uuid::Uuid::new_v4().to_string(),
            context_id: request.message.context_id.clone().unwrap_or_else(|| "ctx-1".to_owned()),
            status: TaskStatus { state, message: None, timestamp: None },
            artifacts: None,
            history: Some(vec![request.message.clone()]),
            metadata: None,
        };
        if text == "hello" {
            task.artifacts = Some(vec![echo(&text)]);
        }
        let polls_left = if text == "poll" { 2 } else { usize::MAX };
        self.tasks.lock().expect("tasks").insert(task.id.clone(), (task.clone(), polls_left));
        Ok(StreamResponse::Task(task))
    }

    fn get(&self, id: &str) -> Result<Task, (i32, String)> {
        let mut tasks = self.tasks.lock().expect("tasks");
        let (task, polls_left) = tasks.get_mut(id).ok_or_else(|| not_found(id))?;
        *polls_left = polls_left.saturating_sub(1);
        if *polls_left == 0 {
            task.status.state = TaskState::Completed;
        }
        Ok(task.clone())
    }

    fn cancel(&self, id: &str) -> Result<Task, (i32, String)> {
        self.set_state(id, TaskState::Canceled);
        self.task(id).ok_or_else(|| not_found(id))
    }

    /// The SSE body of a streaming send, framed for `binding_id` (JSON-RPC
    /// id, or `None` for HTTP+JSON).
    fn stream(self: &Arc<Self>, request: &SendMessageRequest, rpc_id: Option<JsonRpcId>) -> Response {
        let text = request.message.text().unwrap_or_default().to_owned();
        let events = match self.send(request) {
            Ok(StreamResponse::Task(task)) if request.message.task_id.is_some() => {
                self.set_state(&task.id, TaskState::Completed);
                script(&task, &text, TaskState::Completed)
            }
            Ok(StreamResponse::Task(mut task)) => {
                let final_state = task.status.state.clone();
                task.status.state = TaskState::Submitted;
                task.artifacts = None;
                self.set_state(&task.id, final_state.clone());
                script(&task, &text, final_state)
            }
            Ok(message) => vec![Ok(message)],
            Err(error) => return error_response(rpc_id.as_ref(), error),
        };
        let frames: Vec<Bytes> = events.iter().enumerate().flat_map(|(n, e)| frame(rpc_id.as_ref(), e, n)).collect();
        let scripted = stream::iter(frames).then(|chunk| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, Infallible>(chunk)
        });
        let body = if text == "slow" {
            Body::from_stream(scripted.chain(self.keep_alives()))
        } else {
            Body::from_stream(scripted)
        };
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    }

    /// Keep-alive comments until the client goes away.
    fn keep_alives(&self) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
        stream::repeat(()).then(|()| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(Bytes::from_static(b": keep-alive\n\n"))
        })
    }
}

/// The events streamed for a task that ends in `final_state`.
fn script(task: &Task, text: &str, final_state: TaskState) -> Vec<Result<StreamResponse, (i32, String)>> {
    let status = |state| {
        Ok(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            status: TaskStatus { state, message: None, timestamp: None },
            metadata: None,
        }))
    };
    let mut events = vec![Ok(StreamResponse::Task(task.clone())), status(TaskState::Working)];
    match text {
        "hello" => events.push(Ok(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: task.id.clone(),
            context_id: task.context_id.clone(),
            artifact: echo(text),
            append: None,
            last_chunk: Some(true),
            metadata: None,
        }))),
        "crash" => events.push(Err((-32603, "the agent crashed".to_owned()))),
        _ => {}
    }
    if final_state != TaskState::Working {
        events.push(status(final_state));
    }
    events
}

fn echo(text: &str) -> Artifact {
    Artifact {
        artifact_id: "echo".to_owned(),
        name: Some("echo".to_owned()),
        description: None,
        parts: vec![Part::text(text)],
        metadata: None,
        extensions: None,
    }
}

/// One SSE event as chunks split mid-line; alternates LF and CRLF line ends,
/// spreads every third event (from the second) over several `data:` lines
/// and adds comments.
fn frame(rpc_id: Option<&JsonRpcId>, event: &Result<StreamResponse, (i32, String)>, n: usize) -> Vec<Bytes> {
    let payload = match (rpc_id, event) {
        (Some(id), Ok(event)) => json!({"jsonrpc": "2.0", "id": id, "result": event}),
        (Some(id), Err((code, message))) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
        (None, Ok(event)) => json!(event),
        (None, Err((code, message))) => {
            json!({"error": {"code": 500, "status": "INTERNAL", "message": message, "details": [
            {"@type": a2a::ERROR_INFO_TYPE, "reason": a2a::error_reason(*code), "domain": "a2a-protocol.org"}]}})
        }
    };
    let end = if n.is_multiple_of(2) { "\n" } else { "\r\n" };
    let text = if n % 3 == 1 { serde_json::to_string_pretty(&payload) } else { serde_json::to_string(&payload) };
    let data: String = text.expect("json").lines().map(|line| format!("data: {line}{end}")).collect();
    let whole = format!(": event {n}{end}{data}{end}");
    let (head, tail) = whole.split_at(whole.len() / 2);
    vec![Bytes::from(head.to_owned()), Bytes::from(tail.to_owned())]
}

fn not_found(id: &str) -> (i32, String) {
    (-32001, format!("task not found: {id}"))
}

/// An A2A error as a JSON-RPC error answer, or an HTTP+JSON `google.rpc.Status`.
fn error_response(rpc_id: Option<&JsonRpcId>, (code, message): (i32, String)) -> Response {
    if let Some(id) = rpc_id {
        return axum::Json(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message,
            "data": [{"@type": a2a::ERROR_INFO_TYPE, "reason": a2a::error_reason(code), "domain": "a2a-protocol.org"}]}}))
        .into_response();
    }
    let status = if code == -32001 { StatusCode::NOT_FOUND } else { StatusCode::BAD_REQUEST };
    let body = json!({"error": {"code": status.as_u16(), "status": "FAILED_PRECONDITION", "message": message,
        "details": [{"@type": a2a::ERROR_INFO_TYPE, "reason": a2a::error_reason(code), "domain": "a2a-protocol.org"}]}});
    (status, axum::Json(body)).into_response()
}

fn version_ok(headers: &HeaderMap) -> bool {
    headers.get("a2a-version").and_then(|v| v.to_str().ok()) == Some("1.0")
}

async fn card(State(agent): State<Arc<AgentState>>) -> axum::Json<Value> {
    agent.card_hits.fetch_add(1, Ordering::SeqCst);
    let base = &agent.base_url;
    let tenant = agent.setup.tenant;
    let mut interfaces =
        vec![json!({"url": format!("{base}/v03"), "protocolBinding": "JSONRPC", "protocolVersion": "0.3"})];
    if agent.setup.jsonrpc {
        interfaces.push(json!({"url": format!("{base}/rpc"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0", "tenant": tenant}));
    }
    interfaces.push(json!({"url": format!("{base}/rest"), "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0", "tenant": tenant}));
    axum::Json(json!({
        "name": "Echo Agent", "description": "Echoes text", "version": "1.0.0",
        "supportedInterfaces": interfaces,
        "capabilities": {"streaming": agent.setup.streaming, "pushNotifications": false},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": [{"id": "echo", "name": "Echo", "description": "Echo text", "tags": ["echo"]}]
    }))
}

/// An A2A 0.3 card: one `url`, no `supportedInterfaces`.
async fn legacy_card() -> axum::Json<Value> {
    axum::Json(json!({
        "name": "Old Agent", "description": "0.3", "version": "1", "url": "http://old/", "protocolVersion": "0.3",
        "capabilities": {}, "defaultInputModes": [], "defaultOutputModes": [], "skills": []
    }))
}

async fn rpc(State(agent): State<Arc<AgentState>>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<JsonRpcRequest>(&body) else {
        return error_response(Some(&JsonRpcId::Null), (-32700, "parse error".to_owned()));
    };
    let params = request.params.clone().unwrap_or(Value::Null);
    agent.record(request.method.clone(), &headers, params.clone());
    let id = request.id;
    if !version_ok(&headers) {
        return error_response(Some(&id), (-32009, "A2A version '0.3' is not supported".to_owned()));
    }
    let task_id = || params["id"].as_str().unwrap_or_default().to_owned();
    let result = match request.method.as_str() {
        "SendStreamingMessage" => return agent.stream(&parse(&params), Some(id)),
        "SendMessage" => agent.send(&parse(&params)).map(|r| json!(r)),
        "GetTask" => agent.get(&task_id()).map(|t| json!(t)),
        "CancelTask" => agent.cancel(&task_id()).map(|t| json!(t)),
        other => Err((-32601, format!("method not found: {other}"))),
    };
    match result {
        Ok(result) => axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response(),
        Err(error) => error_response(Some(&id), error),
    }
}

async fn rest(State(agent): State<Arc<AgentState>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.expect("body");
    let params = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    let target = parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
    agent.record(format!("{} {target}", parts.method), &parts.headers, params.clone());
    if !version_ok(&parts.headers) {
        return error_response(None, (-32009, "A2A version '0.3' is not supported".to_owned()));
    }
    let prefix = match agent.setup.tenant {
        Some(tenant) => format!("/rest/{tenant}/"),
        None => "/rest/".to_owned(),
    };
    let Some(path) = parts.uri.path().strip_prefix(&prefix) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let result = match path.split_once('/') {
        None if path == "message:stream" => return agent.stream(&parse(&params), None),
        None if path == "message:send" => agent.send(&parse(&params)).map(|r| json!(r)),
        Some(("tasks", id)) => match id.strip_suffix(":cancel") {
            Some(id) => agent.cancel(id).map(|t| json!(t)),
            None => agent.get(id).map(|t| json!(t)),
        },
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    match result {
        Ok(result) => ([(header::CONTENT_TYPE, "application/a2a+json")], result.to_string()).into_response(),
        Err(error) => error_response(None, error),
    }
}

fn parse(params: &Value) -> SendMessageRequest {
    serde_json::from_value(params.clone()).expect("a SendMessageRequest")
}
