//! The ACP bridge's cost: the first-chunk latency of a prompt sent through
//! `chorus acp` (ACP over stdio → the gateway's A2A streaming → the `echo`
//! worker) beside the same prompt sent straight to the gateway as A2A
//! `SendStreamingMessage`, both against one `chorus dev`.
//!
//! The first chunk is the first content the agent produced: the first
//! `session/update` through the bridge, the first artifact event of the A2A
//! stream directly (the event that update is made from). Prompts run one at
//! a time, alternating between the two paths, after a warm-up.

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use futures_util::StreamExt as _;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout, Command},
};

/// The goal: the bridge adds less than this at the median.
pub(crate) const GOAL_P50_MS: f64 = 2.0;
const WARMUP: usize = 20;
const DEADLINE: Duration = Duration::from_secs(30);

/// First-chunk latencies of one path, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latencies {
    pub(crate) samples: usize,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
}

impl Latencies {
    fn of(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples.get(index).copied().unwrap_or(f64::NAN)
        };
        Self { samples: samples.len(), p50_ms: at(0.5), p90_ms: at(0.9), p99_ms: at(0.99) }
    }
}

/// The scenario's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AcpReport {
    pub(crate) bridge: Latencies,
    pub(crate) direct: Latencies,
    /// Bridge p50 minus direct p50.
    pub(crate) added_p50_ms: f64,
    pub(crate) goal_p50_ms: f64,
    pub(crate) met: bool,
}

impl std::fmt::Display for AcpReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, l: &Latencies| {
            writeln!(f, "{name:<28} {:>8.2} {:>8.2} {:>8.2} {:>8}", l.p50_ms, l.p90_ms, l.p99_ms, l.samples)
        };
        writeln!(f, "first-chunk latency (ms)          p50      p90      p99  samples")?;
        row(f, "chorus acp → gateway → echo", &self.bridge)?;
        row(f, "A2A stream → gateway → echo", &self.direct)?;
        let verdict = if self.met { "met" } else { "missed" };
        writeln!(f, "the bridge adds {:.2} ms at p50 (goal < {:.0} ms: {verdict})", self.added_p50_ms, self.goal_p50_ms)
    }
}

/// Runs `samples` prompts on each path against `chorus dev` at `gateway`,
/// with `binary` as `chorus acp`.
pub(crate) async fn run(binary: &Path, gateway: &str, samples: usize) -> anyhow::Result<AcpReport> {
    let mut bridge = Bridge::start(binary, gateway).await?;
    let direct = Direct::new(gateway)?;
    let (mut through_bridge, mut straight) = (Vec::new(), Vec::new());
    for round in 0..WARMUP + samples {
        let via_bridge = bridge.first_chunk(round).await?;
        let via_a2a = direct.first_chunk(round).await?;
        if round >= WARMUP {
            through_bridge.push(via_bridge.as_secs_f64() * 1e3);
            straight.push(via_a2a.as_secs_f64() * 1e3);
        }
    }
    bridge.stop().await;
    let (bridge, direct) = (Latencies::of(through_bridge), Latencies::of(straight));
    let added_p50_ms = bridge.p50_ms - direct.p50_ms;
    Ok(AcpReport { bridge, direct, added_p50_ms, goal_p50_ms: GOAL_P50_MS, met: added_p50_ms < GOAL_P50_MS })
}

/// `chorus acp --agent echo`, with one session open.
struct Bridge {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    session: String,
    next_id: u64,
}

impl Bridge {
    async fn start(binary: &Path, gateway: &str) -> anyhow::Result<Self> {
        let mut child = Command::new(binary)
            .args(["acp", "--agent", "echo", "--gateway", gateway])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {} acp", binary.display()))?;
        let stdin = child.stdin.take().context("stdin is piped")?;
        let stdout = BufReader::new(child.stdout.take().context("stdout is piped")?).lines();
        let mut bridge = Self { child, stdin, stdout, session: String::new(), next_id: 0 };
        bridge.call("initialize", json!({ "protocolVersion": 1, "clientCapabilities": {} })).await?;
        let cwd = std::env::current_dir()?;
        let created = bridge.call("session/new", json!({ "cwd": cwd, "mcpServers": [] })).await?;
        bridge.session = created["sessionId"].as_str().context("session/new answered no sessionId")?.to_owned();
        Ok(bridge)
    }

    async fn send(&mut self, method: &str, params: Value) -> anyhow::Result<u64> {
        self.next_id += 1;
        let line = json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params }).to_string();
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        Ok(self.next_id)
    }

    async fn next(&mut self) -> anyhow::Result<Value> {
        let line = tokio::time::timeout(DEADLINE, self.stdout.next_line()).await.context("chorus acp went quiet")??;
        let line = line.context("chorus acp closed its stdout")?;
        Ok(serde_json::from_str(&line)?)
    }

    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.send(method, params).await?;
        loop {
            let message = self.next().await?;
            if message["id"] == id && message.get("method").is_none() {
                return message.get("result").cloned().with_context(|| format!("{method} failed: {message}"));
            }
        }
    }

    /// One prompt: the time to its first `session/update`, then the rest of the turn.
    async fn first_chunk(&mut self, round: usize) -> anyhow::Result<Duration> {
        let prompt =
            json!({ "sessionId": self.session, "prompt": [{ "type": "text", "text": format!("bench {round}") }] });
        let started = Instant::now();
        let id = self.send("session/prompt", prompt).await?;
        let mut first = None;
        loop {
            let message = self.next().await?;
            if message["method"] == "session/update" && first.is_none() {
                first = Some(started.elapsed());
            }
            if message["id"] == id && message.get("method").is_none() {
                if message["result"]["stopReason"] != "end_turn" {
                    bail!("the prompt did not end its turn: {message}");
                }
                return first.context("the turn sent no update");
            }
        }
    }

    async fn stop(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(DEADLINE, self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
        }
    }
}

/// `SendStreamingMessage` to the gateway's echo agent.
struct Direct {
    http: reqwest::Client,
    url: String,
    context: String,
}

impl Direct {
    fn new(gateway: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder().build()?;
        Ok(Self { http, url: format!("{gateway}/a2a/echo"), context: uuid::Uuid::new_v4().to_string() })
    }

    /// One prompt: the time to the first artifact event, then the rest of the stream.
    async fn first_chunk(&self, round: usize) -> anyhow::Result<Duration> {
        let message = json!({
            "messageId": uuid::Uuid::new_v4().to_string(),
            "contextId": self.context,
            "role": "ROLE_USER",
            "parts": [{ "text": format!("bench {round}") }],
        });
        let body = json!({ "jsonrpc": "2.0", "id": round, "method": "SendStreamingMessage", "params": { "message": message } });
        let started = Instant::now();
        let response = self.http.post(&self.url).header("A2A-Version", "1.0").json(&body).send().await?;
        let mut bytes = response.error_for_status()?.bytes_stream();
        let (mut buffer, mut first) = (String::new(), None);
        while let Some(chunk) = tokio::time::timeout(DEADLINE, bytes.next()).await.context("the stream went quiet")? {
            buffer.push_str(&String::from_utf8_lossy(&chunk?));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                let data = event.lines().filter_map(|line| line.strip_prefix("data:")).collect::<String>();
                if first.is_none() && data.contains("\"artifactUpdate\"") {
                    first = Some(started.elapsed());
                }
            }
        }
        first.context("the stream carried no artifact")
    }
}
