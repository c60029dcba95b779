//! The streaming-memory point: `streams` tasks of chorus's built-in `tck`
//! agent that wait for input (messageId prefix `tck-input-required`), then
//! one JSON-RPC `SubscribeToTask` SSE stream on each, every stream on its
//! own HTTP/1.1 connection; such a stream stays open until the task changes.
//! chorus's RSS (`VmRSS` of `/proc/PID/status`) is read before the streams
//! open and while they all are, then they are closed.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::{
    sync::{Semaphore, mpsc},
    task::JoinSet,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::send::{a2a_post, chain, http_client, rpc, send_message};

/// The built-in agent whose tasks can wait for input.
const TCK_AGENT: &str = "tck";
/// The messageId prefix that makes its task wait for input.
const INPUT_REQUIRED: &str = "tck-input-required";
const INPUT_REQUIRED_STATE: &str = "TASK_STATE_INPUT_REQUIRED";
/// Concurrent SendMessage calls creating the tasks.
const CREATORS: usize = 16;
/// Streams being opened at once (until their first event).
const OPENING: usize = 100;
/// Longest a stream may take to open and send its first event.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long every stream is held open before RSS is read.
const HOLD: Duration = Duration::from_secs(2);
/// RSS reads while the streams are open (the largest counts), 250 ms apart.
const OPEN_READS: usize = 5;
/// Pause for chorus to settle before the readings without streams.
const SETTLE: Duration = Duration::from_secs(2);

/// What holding the streams cost chorus.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StreamsResult {
    pub(crate) streams: usize,
    /// Streams that answered 200 and sent the task as their first event.
    pub(crate) opened: usize,
    pub(crate) failed: usize,
    /// Streams chorus ended before they were released.
    pub(crate) ended_early: usize,
    pub(crate) first_error: Option<String>,
    /// From the first stream asked for to the last one opened.
    pub(crate) open_seconds: f64,
    /// In MB (10^6 bytes): before the streams opened (the tasks existing),
    /// the largest of the reads while all were open, after they closed.
    pub(crate) rss_before_mb: f64,
    pub(crate) rss_open_mb: f64,
    pub(crate) rss_closed_mb: f64,
    pub(crate) growth_mb: f64,
    /// growth ÷ streams opened, in KB (10^3 bytes).
    pub(crate) per_stream_kb: f64,
    /// chorus's open file descriptors at the same three moments.
    pub(crate) fds_before: usize,
    pub(crate) fds_open: usize,
    pub(crate) fds_closed: usize,
}

/// How one stream ended.
#[derive(Debug, PartialEq, Eq)]
enum Held {
    Failed,
    Released,
    EndedEarly,
}

/// Runs the point against `chorus dev` at `endpoint` whose pid is `pid`.
pub(crate) async fn run(endpoint: &str, pid: u32, streams: usize) -> anyhow::Result<StreamsResult> {
    let url: Arc<str> = format!("{endpoint}/a2a/{TCK_AGENT}").into();
    eprintln!("gateway, streams: {streams} {TCK_AGENT} tasks waiting for input…");
    let ids = create_tasks(&url, streams).await?;
    tokio::time::sleep(SETTLE).await;
    let before = Probe::read(pid)?;
    eprintln!("gateway, streams: {streams} SubscribeToTask streams, each on its own HTTP/1.1 connection…");
    let client = http_client(0)?;
    let release = CancellationToken::new();
    let gate = Arc::new(Semaphore::new(OPENING));
    let (opened_tx, mut opened_rx) = mpsc::channel(streams);
    let mut holders = JoinSet::new();
    let started = Instant::now();
    for (index, task_id) in ids.into_iter().enumerate() {
        let stream = Stream { client: client.clone(), url: Arc::clone(&url), index, task_id };
        holders.spawn(stream.hold(Arc::clone(&gate), opened_tx.clone(), release.clone()));
    }
    drop(opened_tx);
    let (mut opened, mut failed, mut first_error) = (0, 0, None);
    // The holders keep their senders while they hold: count the answers.
    while opened + failed < streams {
        let Some(outcome) = opened_rx.recv().await else { break };
        match outcome {
            Ok(()) => opened += 1,
            Err(error) => {
                failed += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    let open_seconds = started.elapsed().as_secs_f64();
    eprintln!("gateway, streams: {opened} open ({failed} failed) in {open_seconds:.1} s; holding them…");
    tokio::time::sleep(HOLD).await;
    let mut open = Probe::read(pid)?;
    for _ in 1..OPEN_READS {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let again = Probe::read(pid)?;
        open = Probe { rss_kb: open.rss_kb.max(again.rss_kb), fds: open.fds.max(again.fds) };
    }
    release.cancel();
    let mut ended_early = 0;
    while let Some(joined) = holders.join_next().await {
        if joined.context("a stream holder panicked")? == Held::EndedEarly {
            ended_early += 1;
        }
    }
    tokio::time::sleep(SETTLE).await;
    let closed = Probe::read(pid)?;
    let growth_mb = mb(open.rss_kb) - mb(before.rss_kb);
    Ok(StreamsResult {
        streams,
        opened,
        failed,
        ended_early,
        first_error,
        open_seconds,
        rss_before_mb: mb(before.rss_kb),
        rss_open_mb: mb(open.rss_kb),
        rss_closed_mb: mb(closed.rss_kb),
        growth_mb,
        per_stream_kb: growth_mb * 1000.0 / opened.max(1) as f64,
        fds_before: before.fds,
        fds_open: open.fds,
        fds_closed: closed.fds,
    })
}

/// Creates `count` tasks waiting for input; their ids.
async fn create_tasks(url: &Arc<str>, count: usize) -> anyhow::Result<Vec<String>> {
    let client = http_client(CREATORS)?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let next = Arc::new(AtomicUsize::new(0));
    let mut creators = JoinSet::new();
    for _ in 0..CREATORS.min(count) {
        let (client, url, next, run_id) = (client.clone(), Arc::clone(url), Arc::clone(&next), run_id.clone());
        creators.spawn(async move {
            let mut ids = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return Ok::<_, anyhow::Error>(ids);
                }
                let body = send_message(index as u64, &format!("{INPUT_REQUIRED}-{run_id}-{index}"), "wait");
                let task = rpc(&client, &url, body).await.map_err(anyhow::Error::msg).context("SendMessage")?;
                if task.status.state != INPUT_REQUIRED_STATE {
                    bail!("task {} is {}, not {INPUT_REQUIRED_STATE}", task.id, task.status.state);
                }
                ids.push(task.id);
            }
        });
    }
    let mut ids = Vec::with_capacity(count);
    while let Some(joined) = creators.join_next().await {
        ids.extend(joined.context("a task creator panicked")??);
    }
    Ok(ids)
}

/// One stream to open and hold.
struct Stream {
    client: reqwest::Client,
    url: Arc<str>,
    index: usize,
    task_id: String,
}

impl Stream {
    /// Opens the stream (one of [`OPENING`] at a time), says whether it
    /// opened, and holds it until `release`.
    async fn hold(
        self,
        gate: Arc<Semaphore>,
        opened: mpsc::Sender<Result<(), String>>,
        release: CancellationToken,
    ) -> Held {
        let permit = gate.acquire_owned().await;
        let response = match tokio::time::timeout(OPEN_TIMEOUT, self.open()).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return failed(&opened, error).await,
            Err(_) => return failed(&opened, format!("no first event within {OPEN_TIMEOUT:?}")).await,
        };
        drop(permit);
        let _ = opened.send(Ok(())).await;
        self.keep(response, release).await
    }

    /// Subscribes and reads up to the first event: the task, still waiting.
    async fn open(&self) -> Result<reqwest::Response, String> {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.index,
            "method": "SubscribeToTask",
            "params": { "id": self.task_id },
        });
        let mut response = a2a_post(&self.client, &self.url, body.to_string())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|error| chain(&error))?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let mut first = Vec::new();
        while !first.windows(2).any(|pair| pair == b"\n\n") {
            match response.chunk().await.map_err(|error| chain(&error))? {
                Some(chunk) => first.extend_from_slice(&chunk),
                None => return Err("the stream ended before its first event".to_owned()),
            }
        }
        let event = String::from_utf8_lossy(&first);
        if !event.contains(INPUT_REQUIRED_STATE) {
            return Err(format!("unexpected first event: {}", event.chars().take(200).collect::<String>()));
        }
        Ok(response)
    }

    /// Reads (keep-alive comments) until `release`, or until chorus ends it.
    async fn keep(&self, mut response: reqwest::Response, release: CancellationToken) -> Held {
        loop {
            tokio::select! {
                () = release.cancelled() => return Held::Released,
                chunk = response.chunk() => match chunk {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return Held::EndedEarly,
                },
            }
        }
    }
}

async fn failed(opened: &mpsc::Sender<Result<(), String>>, error: String) -> Held {
    let _ = opened.send(Err(error)).await;
    Held::Failed
}

/// What `/proc` says about a process.
#[derive(Debug, Clone, Copy)]
struct Probe {
    rss_kb: u64,
    fds: usize,
}

impl Probe {
    fn read(pid: u32) -> anyhow::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        let rss_kb = parse_rss_kb(&status).with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .with_context(|| format!("cannot list /proc/{pid}/fd"))?
            .count();
        Ok(Self { rss_kb, fds })
    }
}

/// `VmRSS` in kB (KiB) from `/proc/PID/status`.
fn parse_rss_kb(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// KiB to MB (10^6 bytes).
fn mb(kib: u64) -> f64 {
    kib as f64 * 1024.0 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_comes_from_the_vmrss_line() {
        let status = "Name:\tchorus\nVmPeak:\t  9000 kB\nVmRSS:\t   51200 kB\nThreads:\t4\n";
        assert_eq!(parse_rss_kb(status), Some(51_200));
        assert_eq!(parse_rss_kb("Name:\tchorus\n"), None);
        assert!((mb(1000) - 1.024).abs() < 1e-9);
    }

    #[test]
    fn this_process_can_be_probed() {
        let probe = Probe::read(std::process::id()).expect("a probe");
        assert!(probe.rss_kb > 0 && probe.fds > 0);
    }
}
