//! The load: N workers, each a separate connection that owns agent `bench-i`
//! and one ClaimTasks stream (capacity 1), looping CreateTask → receive the
//! ClaimedTask → CompleteTask.
//!
//! A round trip counts when it completes inside the measured window, which
//! follows the warm-up; its latency runs from the start of CreateTask to the
//! acknowledgement of CompleteTask.

use std::{future::Future, time::Duration};

use anyhow::{Context as _, bail};
use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use tokio::{task::JoinSet, time::Instant};
use tonic::{
    Streaming,
    transport::{Channel, Endpoint},
};

use crate::stats::LatencySummary;

/// The namespace every benchmark task lives in.
const NAMESPACE: &str = "bench";

/// Longest any single step may take before the run is declared broken.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// When round trips count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

impl Window {
    pub(crate) fn contains(&self, at: Instant) -> bool {
        at >= self.start && at < self.end
    }
}

/// One measured round trip, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Sample {
    total: u64,
    create: u64,
    claim: u64,
    complete: u64,
}

/// What one worker did: its measured samples and every round trip it made.
#[derive(Debug)]
struct Finished {
    samples: Vec<Sample>,
    all_round_trips: u64,
}

/// What the load measured.
#[derive(Debug, Clone)]
pub(crate) struct LoadResult {
    /// Round trips completed inside the window.
    pub(crate) round_trips: u64,
    /// Round trips completed at all: warm-up, window and the last ones after it.
    pub(crate) all_round_trips: u64,
    pub(crate) seconds: f64,
    pub(crate) latency: LatencySummary,
    /// CreateTask call; ClaimedTask arrival after it; CompleteTask call.
    pub(crate) create: LatencySummary,
    pub(crate) claim: LatencySummary,
    pub(crate) complete: LatencySummary,
}

/// Workers running against one server.
#[derive(Debug)]
pub(crate) struct Load {
    workers: JoinSet<anyhow::Result<Finished>>,
    finished: Vec<Finished>,
    pub(crate) window: Window,
}

impl Load {
    /// Connects `clients` workers to `endpoint` and opens their streams,
    /// then starts them: warm-up, then the measured window.
    pub(crate) async fn start(
        endpoint: &str,
        clients: usize,
        warmup: Duration,
        measure: Duration,
    ) -> anyhow::Result<Self> {
        let mut ready = Vec::with_capacity(clients);
        for index in 0..clients {
            ready.push(Worker::connect(endpoint, index, clients).await?);
        }
        let start = Instant::now() + warmup;
        let window = Window { start, end: start + measure };
        let mut workers = JoinSet::new();
        for worker in ready {
            workers.spawn(worker.run(window));
        }
        Ok(Self { workers, finished: Vec::with_capacity(clients), window })
    }

    /// Sleeps until `at`, failing as soon as a worker fails.
    pub(crate) async fn wait_until(&mut self, at: Instant) -> anyhow::Result<()> {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(at) => return Ok(()),
                joined = self.workers.join_next() => match joined {
                    Some(joined) => self.finished.push(joined.context("a load worker panicked")??),
                    None => {
                        tokio::time::sleep_until(at).await;
                        return Ok(());
                    }
                },
            }
        }
    }

    /// Waits for every worker to finish its last round trip and sums up.
    pub(crate) async fn finish(mut self) -> anyhow::Result<LoadResult> {
        while let Some(joined) = self.workers.join_next().await {
            self.finished.push(joined.context("a load worker panicked")??);
        }
        let all_round_trips = self.finished.iter().map(|finished| finished.all_round_trips).sum();
        let samples: Vec<Sample> = self.finished.into_iter().flat_map(|finished| finished.samples).collect();
        let summary = |part: fn(&Sample) -> u64| LatencySummary::from_micros(samples.iter().map(part).collect());
        Ok(LoadResult {
            round_trips: samples.len() as u64,
            all_round_trips,
            seconds: self.window.end.duration_since(self.window.start).as_secs_f64(),
            latency: summary(|sample| sample.total),
            create: summary(|sample| sample.create),
            claim: summary(|sample| sample.claim),
            complete: summary(|sample| sample.complete),
        })
    }
}

/// One worker: a connection, an agent and its claim stream.
struct Worker {
    client: TaskStoreClient<Channel>,
    claims: Streaming<pb::ClaimedTask>,
    agent_id: String,
}

impl Worker {
    async fn connect(endpoint: &str, index: usize, clients: usize) -> anyhow::Result<Self> {
        let mut client = TaskStoreClient::new(connect(endpoint).await?);
        let agent_id = format!("bench-{index}");
        let request = pb::ClaimTasksRequest {
            namespace: NAMESPACE.to_owned(),
            agent_id: agent_id.clone(),
            worker_id: format!("{agent_id}-of-{clients}"),
            capacity: 1,
            lease: None,
            max_retries: 0,
            notify_cancellations: false,
            fresh_start: false,
        };
        let claims = call("ClaimTasks", client.claim_tasks(request)).await?;
        Ok(Self { client, claims, agent_id })
    }

    async fn run(mut self, window: Window) -> anyhow::Result<Finished> {
        let mut finished = Finished { samples: Vec::new(), all_round_trips: 0 };
        while Instant::now() < window.end {
            let (done, sample) =
                self.round_trip().await.with_context(|| format!("round trip of agent {}", self.agent_id))?;
            finished.all_round_trips += 1;
            if window.contains(done) {
                finished.samples.push(sample);
            }
        }
        Ok(finished)
    }

    /// Returns when the round trip completed and its timings.
    async fn round_trip(&mut self) -> anyhow::Result<(Instant, Sample)> {
        let started = Instant::now();
        let created = call("CreateTask", self.client.create_task(self.create_request())).await?;
        let created_at = Instant::now();
        let claimed = tokio::time::timeout(STEP_TIMEOUT, self.claims.message())
            .await
            .with_context(|| format!("no ClaimedTask within {STEP_TIMEOUT:?}"))?
            .context("the ClaimTasks stream failed")?
            .context("the ClaimTasks stream ended")?;
        let claimed_at = Instant::now();
        let claimed_id = claimed.task.as_ref().map(|task| task.id.as_str()).unwrap_or_default();
        if claimed_id != created.id {
            bail!("claimed task {claimed_id:?}, expected the one just created ({})", created.id);
        }
        let request = pb::CompleteTaskRequest {
            namespace: NAMESPACE.to_owned(),
            task_id: created.id,
            lease_id: claimed.lease_id,
            message: None,
            artifacts: Vec::new(),
            brief: true,
        };
        let completed = call("CompleteTask", self.client.complete_task(request)).await?;
        let done = Instant::now();
        let state = completed.status.map(|status| status.state);
        if state != Some(pb::TaskState::Completed as i32) {
            bail!("CompleteTask left the task in state {state:?}");
        }
        let micros = |from: Instant, to: Instant| to.duration_since(from).as_micros() as u64;
        let sample = Sample {
            total: micros(started, done),
            create: micros(started, created_at),
            claim: micros(created_at, claimed_at),
            complete: micros(claimed_at, done),
        };
        Ok((done, sample))
    }

    fn create_request(&self) -> pb::CreateTaskRequest {
        let part = pb::Part { content: Some(pb::part::Content::Text("ping".to_owned())), ..Default::default() };
        let message = pb::Message {
            message_id: uuid::Uuid::new_v4().to_string(),
            role: pb::Role::User as i32,
            parts: vec![part],
            ..Default::default()
        };
        pb::CreateTaskRequest {
            namespace: NAMESPACE.to_owned(),
            agent_id: self.agent_id.clone(),
            message: Some(message),
            ..Default::default()
        }
    }
}

/// A connection of its own to `endpoint`.
pub(crate) async fn connect(endpoint: &str) -> anyhow::Result<Channel> {
    Endpoint::from_shared(endpoint.to_owned())
        .with_context(|| format!("bad endpoint {endpoint}"))?
        .connect_timeout(STEP_TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))
}

/// One gRPC call, bounded by [`STEP_TIMEOUT`].
pub(crate) async fn call<T>(
    name: &str,
    response: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> anyhow::Result<T> {
    let response = tokio::time::timeout(STEP_TIMEOUT, response)
        .await
        .with_context(|| format!("{name} took longer than {STEP_TIMEOUT:?}"))?
        .with_context(|| format!("{name} failed"))?;
    Ok(response.into_inner())
}
