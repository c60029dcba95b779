//! The SendMessage load: `clients` virtual clients, one tokio task each,
//! sharing one HTTP/1.1 client whose pool keeps a connection per virtual
//! client alive; each sends its next call as soon as the last is answered
//! (closed loop). A call counts when it is answered inside the measured
//! window, which follows the warm-up; its latency runs from sending the
//! request to reading the whole response.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tokio::{task::JoinSet, time::Instant};

use crate::{
    cpu::{CpuSnapshot, CpuUsage},
    load::Window,
    stats::LatencySummary,
};

/// The chorus agent the load talks to: the built-in echo worker's.
pub(crate) const GATEWAY_AGENT: &str = "echo";

/// Longest a call may take before it counts as an error.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The state a blocking SendMessage to an echo agent ends in.
const COMPLETED: &str = "TASK_STATE_COMPLETED";

/// One client count against one server.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    pub(crate) clients: usize,
    pub(crate) seconds: f64,
    /// Calls answered with a completed task inside the window.
    pub(crate) requests: u64,
    pub(crate) requests_per_sec: f64,
    /// Calls that failed inside the window: transport errors, HTTP errors,
    /// JSON-RPC errors, or a task not completed. Not in the latencies.
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// Of the successful calls.
    pub(crate) latency: LatencySummary,
    pub(crate) cpu: CpuUsage,
}

/// What one virtual client saw inside the window.
#[derive(Debug, Default)]
struct Tally {
    micros: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
}

/// Runs the load and sums it up, sampling CPU over the window.
pub(crate) async fn run(
    url: &str,
    server_pid: u32,
    clients: usize,
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<Point> {
    let client = http_client(clients)?;
    let url: Arc<str> = url.into();
    let start = Instant::now() + warmup;
    let window = Window { start, end: start + measure };
    // Unique messageIds across runs and servers: a repeated one would
    // continue (or replay) an earlier task.
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let mut tasks = JoinSet::new();
    for index in 0..clients {
        tasks.spawn(virtual_client(client.clone(), Arc::clone(&url), format!("bench-{run_id}-{index}"), window));
    }
    tokio::time::sleep_until(window.start).await;
    let bench_pid = std::process::id();
    let before = CpuSnapshot::take(Some(server_pid), bench_pid)?;
    tokio::time::sleep_until(window.end).await;
    let cpu = before.usage_until(&CpuSnapshot::take(Some(server_pid), bench_pid)?);
    let mut total = Tally::default();
    while let Some(joined) = tasks.join_next().await {
        let tally = joined.context("a virtual client panicked")?;
        total.micros.extend(tally.micros);
        total.errors += tally.errors;
        total.first_error = total.first_error.or(tally.first_error);
    }
    let seconds = measure.as_secs_f64();
    let requests = total.micros.len() as u64;
    Ok(Point {
        clients,
        seconds,
        requests,
        requests_per_sec: requests as f64 / seconds,
        errors: total.errors,
        first_error: total.first_error,
        latency: LatencySummary::from_micros(total.micros),
        cpu,
    })
}

/// An HTTP/1.1 client (as the a2a-sdk's uvicorn speaks) keeping up to
/// `connections` idle keep-alive connections; no proxy.
pub(crate) fn http_client(connections: usize) -> anyhow::Result<reqwest::Client> {
    // reqwest needs a TLS provider to build, even for plain HTTP; an error
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .http1_only()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(connections)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("cannot build the HTTP client")
}

/// Calls until the window ends.
async fn virtual_client(client: reqwest::Client, url: Arc<str>, prefix: String, window: Window) -> Tally {
    let mut tally = Tally::default();
    for sequence in 0u64.. {
        let body = send_message(sequence, &format!("{prefix}-{sequence}"), "hello");
        let started = Instant::now();
        let outcome = tokio::time::timeout(CALL_TIMEOUT, call(&client, &url, body)).await;
        let answered = Instant::now();
        if window.contains(answered) {
            match outcome {
                Ok(Ok(())) => tally.micros.push(answered.duration_since(started).as_micros() as u64),
                Ok(Err(error)) => tally.error(error),
                Err(_) => tally.error(format!("no answer within {CALL_TIMEOUT:?}")),
            }
        }
        if answered >= window.end {
            break;
        }
    }
    tally
}

impl Tally {
    fn error(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }
}

/// A JSON-RPC `SendMessage` of a user text (no configuration: blocking).
pub(crate) fn send_message(id: u64, message_id: &str, text: &str) -> String {
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "SendMessage",
        "params": { "message": { "messageId": message_id, "role": "ROLE_USER", "parts": [{ "text": text }] } },
    })
    .to_string()
}

/// One blocking SendMessage; a completed task is a success.
async fn call(client: &reqwest::Client, url: &str, body: String) -> Result<(), String> {
    let task = rpc(client, url, body).await?;
    if task.status.state == COMPLETED { Ok(()) } else { Err(format!("task {} is {}", task.id, task.status.state)) }
}

/// A JSON-RPC call answered with a task.
pub(crate) async fn rpc(client: &reqwest::Client, url: &str, body: String) -> Result<TaskReply, String> {
    let response = a2a_post(client, url, body).send().await.map_err(|error| chain(&error))?;
    let status = response.status();
    let bytes = response.bytes().await.map_err(|error| chain(&error))?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes[..bytes.len().min(200)])));
    }
    let reply: Reply = serde_json::from_slice(&bytes).map_err(|error| format!("unexpected answer: {error}"))?;
    match (reply.result, reply.error) {
        (Some(Answer { task: Some(task) }), _) => Ok(task),
        (_, Some(error)) => Err(format!("JSON-RPC error {}: {}", error.code, error.message)),
        _ => Err("the answer is not a task".to_owned()),
    }
}

/// A JSON-RPC POST in A2A 1.0.
pub(crate) fn a2a_post(client: &reqwest::Client, url: &str, body: String) -> reqwest::RequestBuilder {
    client.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").header("A2A-Version", "1.0").body(body)
}

/// An error and its causes, on one line.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The parts of a JSON-RPC answer the load reads.
#[derive(Debug, Deserialize)]
struct Reply {
    result: Option<Answer>,
    error: Option<RpcError>,
}

#[derive(Debug, Deserialize)]
struct Answer {
    task: Option<TaskReply>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TaskReply {
    pub(crate) id: String,
    pub(crate) status: TaskStatus,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TaskStatus {
    pub(crate) state: String,
}

#[derive(Debug, Deserialize)]
struct RpcError {
    code: i64,
    message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_message_is_a_one_point_o_call_with_the_message_id() {
        let body: serde_json::Value = serde_json::from_str(&send_message(7, "m-1", "hi")).expect("JSON");
        assert_eq!(body["method"], "SendMessage");
        assert_eq!(body["id"], 7);
        assert_eq!(body["params"]["message"]["messageId"], "m-1");
        assert_eq!(body["params"]["message"]["role"], "ROLE_USER");
        assert_eq!(body["params"]["message"]["parts"][0]["text"], "hi");
    }

    #[test]
    fn answers_parse_to_tasks_or_errors() {
        let task = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t","status":{"state":"TASK_STATE_COMPLETED"},"history":[]}}}"#;
        let reply: Reply = serde_json::from_str(task).expect("a task");
        let task = reply.result.and_then(|answer| answer.task).expect("a task");
        assert_eq!((task.id.as_str(), task.status.state.as_str()), ("t", COMPLETED));
        let error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no"}}"#;
        let reply: Reply = serde_json::from_str(error).expect("an error");
        assert!(reply.result.is_none());
        assert_eq!(reply.error.map(|error| error.code), Some(-32001));
    }
}
