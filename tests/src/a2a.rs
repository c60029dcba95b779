//! A2A as an external agent speaks it to the gateway of a `chorus` server:
//! JSON-RPC and HTTP+JSON over reqwest (SSE streams read to their end), the
//! gRPC binding's official client, and a webhook that records the push
//! notifications it is sent.
//!
//! Everything asserts what a caller sees on the wire: JSON as
//! `serde_json::Value`, not the gateway's own types.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use a2a_pb::proto::a2a_service_client::A2aServiceClient;
use axum::{Router, body::Bytes, extract::State, http::HeaderMap, routing::post};
use chorus_proto::taskstore::{ListTasksRequest, task_store_client::TaskStoreClient};
use futures_util::StreamExt as _;
use reqwest::{Method, RequestBuilder, StatusCode, header::CONTENT_TYPE};
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::mpsc, task::JoinHandle};
use tonic::transport::Channel;

use crate::{DEADLINE, Server};

/// The header (and gRPC metadata) naming the protocol version.
pub const VERSION: &str = "A2A-Version";
/// The ErrorInfo domain of every A2A error.
pub const DOMAIN: &str = "a2a-protocol.org";
const ERROR_INFO: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// An A2A 1.0 caller of one gateway (every request says `A2A-Version: 1.0`
/// unless the test builds it by hand).
#[derive(Debug, Clone)]
pub struct A2a {
    http: reqwest::Client,
    base: String,
}

impl A2a {
    /// A caller of `server`'s gateway.
    pub fn new(server: &Server) -> Self {
        Self::at(server.url())
    }

    /// A caller of the gateway at `base` (`http://host:port`).
    pub fn at(base: &str) -> Self {
        // reqwest is built without a TLS provider of its own; plain HTTP
        // needs none, but building a client wants one installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().timeout(DEADLINE).build();
        let http = http.unwrap_or_else(|error| panic!("cannot build an HTTP client: {error}"));
        Self { http, base: base.trim_end_matches('/').to_owned() }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `GET {base}{path}`, no A2A headers (agent cards are public).
    pub fn get(&self, path: &str) -> RequestBuilder {
        self.http.get(format!("{}{path}", self.base))
    }

    /// `POST {base}/a2a/{agent}` with the JSON-RPC request `body`.
    pub fn rpc_body(&self, agent: &str, body: &Value) -> RequestBuilder {
        self.http.post(format!("{}/a2a/{agent}", self.base)).header(VERSION, "1.0").json(body)
    }

    /// A JSON-RPC call of `method` on `agent`, not sent yet.
    pub fn rpc(&self, agent: &str, method: &str, params: Value) -> RequestBuilder {
        self.rpc_body(agent, &rpc_request(method, params))
    }

    /// An HTTP+JSON request of `agent`: `{base}/a2a/{agent}/rest/{path}`.
    pub fn rest(&self, method: Method, agent: &str, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}/a2a/{agent}/rest/{path}", self.base)).header(VERSION, "1.0")
    }

    /// Calls `method` and returns its result; panics on an error answer.
    pub async fn call(&self, agent: &str, method: &str, params: Value) -> Value {
        let (status, body) = json(self.rpc(agent, method, params)).await;
        assert_eq!(status, StatusCode::OK, "{method}: {body:#}");
        assert_eq!(body["jsonrpc"], "2.0", "{method}: {body:#}");
        assert_eq!(body["id"], REQUEST_ID, "{method}: the id is echoed: {body:#}");
        match body.get("result") {
            Some(result) if body.get("error").is_none() => result.clone(),
            _ => panic!("{method} failed: {body:#}"),
        }
    }

    /// Calls `method`, which must fail, and returns the JSON-RPC `error`.
    pub async fn call_error(&self, agent: &str, method: &str, params: Value) -> Value {
        rpc_error(self.rpc(agent, method, params)).await
    }

    /// A blocking `SendMessage` of `message` to `agent`; returns the task.
    pub async fn send(&self, agent: &str, message: Value) -> Value {
        let result = self.call(agent, "SendMessage", json!({ "message": message })).await;
        match result.get("task") {
            Some(task) => task.clone(),
            None => panic!("SendMessage answered no task: {result:#}"),
        }
    }

    /// How many tasks the default namespace holds, of every agent: read from
    /// the task store, as an agent's A2A endpoint lists only its own.
    pub async fn task_count(&self) -> u64 {
        let endpoint = Channel::from_shared(self.base.clone()).unwrap_or_else(|error| panic!("{error}"));
        let channel = endpoint.connect().await.unwrap_or_else(|error| panic!("cannot reach the task store: {error}"));
        let request = ListTasksRequest { namespace: "default".to_owned(), page_size: 1, ..ListTasksRequest::default() };
        let page = TaskStoreClient::new(channel).list_tasks(request).await;
        page.unwrap_or_else(|status| panic!("ListTasks: {status:?}")).into_inner().total_size.into()
    }

    /// A gRPC client of the gateway's `lf.a2a.v1.A2AService`.
    pub async fn grpc(server: &Server) -> A2aServiceClient<Channel> {
        A2aServiceClient::new(server.channel().await)
    }
}

/// The id of every JSON-RPC request [`A2a::rpc`] builds.
pub const REQUEST_ID: &str = "req-1";

/// A JSON-RPC 2.0 request.
pub fn rpc_request(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": REQUEST_ID, "method": method, "params": params })
}

/// A user message with one text part.
pub fn message(message_id: &str, text: &str) -> Value {
    json!({ "messageId": message_id, "role": "ROLE_USER", "parts": [{ "text": text }] })
}

/// `prefix` made unique, for the tck agent's messageId-keyed scenarios.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4())
}

/// A task's state (`TASK_STATE_…`).
pub fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or_else(|| panic!("no status.state in {task:#}"))
}

/// The text of the first part of a message.
pub fn text(message: &Value) -> &str {
    message["parts"][0]["text"].as_str().unwrap_or_else(|| panic!("no text part in {message:#}"))
}

/// Sends `request` and reads its JSON answer.
pub async fn json(request: RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap_or_else(|error| panic!("request failed: {error}"));
    let status = response.status();
    let bytes = response.bytes().await.unwrap_or_else(|error| panic!("reading the body failed: {error}"));
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|error| panic!("HTTP {status}: not JSON ({error}): {}", String::from_utf8_lossy(&bytes)));
    (status, body)
}

/// Sends a JSON-RPC `request` that must fail in a 200, and returns its `error`.
pub async fn rpc_error(request: RequestBuilder) -> Value {
    let (status, body) = json(request).await;
    assert_eq!(status, StatusCode::OK, "a JSON-RPC error travels in a 200: {body:#}");
    assert!(body.get("result").is_none(), "an error answer has no result: {body:#}");
    assert_eq!(body["jsonrpc"], "2.0", "{body:#}");
    body.get("error").cloned().unwrap_or_else(|| panic!("no error in {body:#}"))
}

/// Asserts a JSON-RPC `error` has `code` and one ErrorInfo with `reason`.
#[track_caller]
pub fn assert_rpc_error(error: &Value, code: i64, reason: &str) {
    assert_eq!(error["code"], code, "{error:#}");
    assert!(error["message"].as_str().is_some_and(|message| !message.is_empty()), "a message: {error:#}");
    assert_error_info(&error["data"], reason);
}

/// Asserts an HTTP+JSON error answer: `status`, and the AIP-193 body
/// (`{"error":{code,status,message,details:[ErrorInfo]}}`) with `reason`.
#[track_caller]
pub fn assert_rest_error(status: StatusCode, body: &Value, expected: StatusCode, reason: &str) {
    assert_eq!(status, expected, "{body:#}");
    let error = &body["error"];
    assert_eq!(error["code"], expected.as_u16(), "{body:#}");
    assert!(error["status"].as_str().is_some_and(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_')));
    assert!(error["message"].as_str().is_some_and(|message| !message.is_empty()), "a message: {body:#}");
    assert_error_info(&error["details"], reason);
}

/// Asserts `details` (a JSON-RPC `error.data` or a REST `error.details`)
/// is one ErrorInfo with `reason`.
#[track_caller]
pub fn assert_error_info(details: &Value, reason: &str) {
    let Some([info]) = details.as_array().map(Vec::as_slice) else {
        panic!("one ErrorInfo detail expected: {details:#}");
    };
    assert_eq!(info["@type"], ERROR_INFO, "{details:#}");
    assert_eq!(info["reason"], reason, "{details:#}");
    assert_eq!(info["domain"], DOMAIN, "{details:#}");
}

/// Asserts a gRPC call failed with `code` and an ErrorInfo with `reason`.
#[track_caller]
pub fn assert_grpc_error<T: std::fmt::Debug>(outcome: Result<T, tonic::Status>, code: tonic::Code, reason: &str) {
    use tonic_types::StatusExt as _;
    let status = outcome.expect_err(&format!("the call must fail with {code:?}"));
    assert_eq!(status.code(), code, "{status:?}");
    let info = status.get_details_error_info();
    let info = info.unwrap_or_else(|| panic!("no google.rpc.ErrorInfo in {status:?}"));
    assert_eq!((info.reason.as_str(), info.domain.as_str()), (reason, DOMAIN), "{status:?}");
}

/// Sends a streaming `request` and reads its SSE events until the server
/// closes the stream; returns each event's `data` as JSON.
///
/// # Panics
/// When the answer is not a 200 event stream, or it does not end within
/// [`DEADLINE`].
pub async fn events(request: RequestBuilder) -> Vec<Value> {
    let response = request.send().await.unwrap_or_else(|error| panic!("stream request failed: {error}"));
    let status = response.status();
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
    let content_type = content_type.unwrap_or_default().to_owned();
    if status != StatusCode::OK || !content_type.starts_with("text/event-stream") {
        let body = response.text().await.unwrap_or_default();
        panic!("expected a 200 event stream, got HTTP {status} ({content_type}): {body}");
    }
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.unwrap_or_else(|error| panic!("the stream broke after {events:#?}: {error}"));
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                events.extend(sse_data(&event));
            }
        }
    })
    .await;
    if read.is_err() {
        panic!("the stream did not end within {DEADLINE:?}; events so far: {events:#?}");
    }
    assert!(buffer.trim().is_empty(), "the stream ended inside an event: {buffer:?}");
    events
}

/// The JSON `data` of one SSE event; `None` for a comment (keep-alive).
fn sse_data(event: &str) -> Option<Value> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| data.strip_prefix(' ').unwrap_or(data))
        .collect();
    if data.is_empty() {
        return None;
    }
    let data = data.join("\n");
    Some(serde_json::from_str(&data).unwrap_or_else(|error| panic!("SSE data is not JSON ({error}): {data}")))
}

/// What a 1.0 `StreamResponse` is, for comparing sequences: `task SUBMITTED`,
/// `status WORKING`, `artifact`, `message`.
pub fn describe(event: &Value) -> String {
    let short = |state: &Value| state.as_str().unwrap_or("?").trim_start_matches("TASK_STATE_").to_owned();
    if let Some(task) = event.get("task") {
        format!("task {}", short(&task["status"]["state"]))
    } else if let Some(update) = event.get("statusUpdate") {
        format!("status {}", short(&update["status"]["state"]))
    } else if event.get("artifactUpdate").is_some() {
        "artifact".to_owned()
    } else if event.get("message").is_some() {
        "message".to_owned()
    } else {
        panic!("not a StreamResponse: {event:#}")
    }
}

/// A gRPC request saying `a2a-version: 1.0`.
pub fn grpc_request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("a2a-version", tonic::metadata::MetadataValue::from_static("1.0"));
    request
}

/// Writes `text` as `chorus.toml` in `dir`: a sandbox's processes run there,
/// and `chorus` reads `./chorus.toml` at start.
pub fn write_chorus_toml(dir: &std::path::Path, text: &str) -> PathBuf {
    let path = dir.join("chorus.toml");
    std::fs::write(&path, text).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    path
}

/// One push notification as the webhook received it.
#[derive(Debug, Clone)]
pub struct Notification {
    pub headers: HeaderMap,
    pub body: Value,
}

impl Notification {
    /// A header's value, `""` when absent.
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or_default()
    }
}

/// A webhook on `127.0.0.1:0` that records every POST to `/hook` (and
/// answers 200); stopped when dropped.
#[derive(Debug)]
pub struct Webhook {
    address: SocketAddr,
    received: mpsc::UnboundedReceiver<Notification>,
    /// Every notification read so far, for failure messages.
    seen: Vec<Notification>,
    server: JoinHandle<()>,
}

impl Webhook {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await;
        let listener = listener.unwrap_or_else(|error| panic!("cannot bind the webhook: {error}"));
        let address = listener.local_addr().unwrap_or_else(|error| panic!("webhook address: {error}"));
        let (sender, received) = mpsc::unbounded_channel();
        let app = Router::new().route("/hook", post(record)).with_state(sender);
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                eprintln!("the webhook stopped: {error}");
            }
        });
        Self { address, received, seen: Vec::new(), server }
    }

    /// `http://127.0.0.1:PORT/hook`.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.address)
    }

    /// The next notification.
    ///
    /// # Panics
    /// When none arrives within [`DEADLINE`].
    pub async fn next(&mut self) -> Notification {
        match tokio::time::timeout(DEADLINE, self.received.recv()).await {
            Ok(Some(notification)) => {
                self.seen.push(notification.clone());
                notification
            }
            Ok(None) => panic!("the webhook stopped"),
            Err(_) => panic!("no push notification within {DEADLINE:?}; received before: {:#?}", self.seen),
        }
    }

    /// Asserts nothing more arrives for `quiet`.
    pub async fn assert_quiet(&mut self, quiet: Duration) {
        if let Ok(Some(notification)) = tokio::time::timeout(quiet, self.received.recv()).await {
            panic!("an unexpected push notification: {notification:#?}");
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn record(State(sender): State<mpsc::UnboundedSender<Notification>>, headers: HeaderMap, body: Bytes) {
    let body = serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
    let _ = sender.send(Notification { headers, body });
}

/// A local address that takes connections and never answers, while the
/// task lives: a hung webhook or service.
pub async fn silent_address() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|error| panic!("cannot bind: {error}"));
    let address = listener.local_addr().unwrap_or_else(|error| panic!("address: {error}"));
    let held = tokio::spawn(async move {
        let mut connections = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            connections.push(connection);
        }
    });
    (address, held)
}

/// An address nothing listens on (bound, then released).
pub async fn dead_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await;
    let listener = listener.unwrap_or_else(|error| panic!("cannot bind: {error}"));
    listener.local_addr().unwrap_or_else(|error| panic!("address: {error}"))
}

/// A `chorus.toml` catalog of the worker `echo` (the default agent) and
/// `id` (named `name`), a `remote` agent proxying the A2A agent at `url`.
pub fn echo_and_remote_catalog(id: &str, name: &str, url: &str) -> String {
    let echo = "[gateway]\ndefault_agent = \"echo\"\n\n[[gateway.agents]]\nid = \"echo\"\nname = \"Echo\"\n\
                description = \"Echoes what it is told\"\nkind = \"worker\"\n";
    format!("{echo}{}", remote_agent(id, name, url))
}

/// A catalog entry: `id` (named `name`), a `remote` agent proxying the A2A agent at `url`.
pub fn remote_agent(id: &str, name: &str, url: &str) -> String {
    format!(
        "\n[[gateway.agents]]\nid = \"{id}\"\nname = \"{name}\"\ndescription = \"An external A2A agent, proxied\"\n\
         kind = \"remote\"\nurl = \"{url}\"\n"
    )
}
