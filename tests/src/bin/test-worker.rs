//! A worker process for end-to-end tests, built on chorus-worker.
//!
//! `test-worker --server URL --agent ID [--mode complete|hang] [--lease-ms N]
//! [--max-retries N] [--capacity N] [--namespace NS] [--worker-id ID]`
//!
//! - `complete`: completes each task with its text reversed, as the final
//!   message and as an artifact named after the worker id (so a test can tell
//!   which worker did the work);
//! - `hang`: claims tasks and never finishes them; the lease is renewed until
//!   the process is killed.
//!
//! Prints `test-worker connected` on stdout once connected; logs go to stderr.

use std::time::Duration;

use chorus_runtime::telemetry::{self, TelemetryConfig};
use chorus_worker::{Reply, TaskContext, Worker, text_artifact};
use clap::{Parser, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "test-worker", about = "A chorus worker for end-to-end tests")]
struct Args {
    /// The task store to work for.
    #[arg(long, env = "TEST_WORKER_SERVER")]
    server: String,
    #[arg(long, env = "TEST_WORKER_AGENT", default_value = "reverser")]
    agent: String,
    #[arg(long, env = "TEST_WORKER_MODE", value_enum, default_value = "complete")]
    mode: Mode,
    #[arg(long, env = "TEST_WORKER_NAMESPACE", default_value = chorus_worker::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The lease asked for, in milliseconds.
    #[arg(long, env = "TEST_WORKER_LEASE_MS", default_value_t = 30_000)]
    lease_ms: u64,
    #[arg(long, env = "TEST_WORKER_MAX_RETRIES", default_value_t = 0)]
    max_retries: u32,
    #[arg(long, env = "TEST_WORKER_CAPACITY", default_value_t = 1)]
    capacity: u32,
    /// Default: `test-worker-<uuid>`.
    #[arg(long, env = "TEST_WORKER_ID")]
    worker_id: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    Complete,
    Hang,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let telemetry = telemetry::init("test-worker", &TelemetryConfig::default())?;
    let worker_id = args.worker_id.unwrap_or_else(|| format!("test-worker-{}", uuid::Uuid::new_v4().simple()));
    let client = chorus_worker::connect(&args.server).await?;
    println!("test-worker connected to {}", args.server);
    let worker = Worker::new(client, args.agent)
        .namespace(args.namespace)
        .worker_id(worker_id.clone())
        .lease(Duration::from_millis(args.lease_ms))
        .max_retries(args.max_retries)
        .capacity(args.capacity);
    let shutdown = chorus_worker::shutdown_on_signal();
    let ran = match args.mode {
        Mode::Complete => {
            let handler = move |task: TaskContext| {
                let worker_id = worker_id.clone();
                async move { Ok(reversed(&task, &worker_id)) }
            };
            worker.run(handler, shutdown).await
        }
        Mode::Hang => worker.run(hang, shutdown).await,
    };
    telemetry.shutdown().await;
    Ok(ran?)
}

fn reversed(task: &TaskContext, worker_id: &str) -> Reply {
    let text: String = task.text().chars().rev().collect();
    Reply::text(text.clone()).with_artifact(text_artifact(worker_id, text))
}

/// Never finishes: the worker keeps renewing the lease until the process ends.
async fn hang(task: TaskContext) -> Result<Reply, chorus_worker::HandlerError> {
    tracing::info!(task_id = %task.id(), "hanging on to the task");
    std::future::pending().await
}
