//! The worker: claims tasks for one agent and runs a handler on each.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use chorus_proto::taskstore::{ClaimTasksRequest, ClaimedTask};
use chorus_runtime::metrics::Metrics;
use tokio::{
    sync::Semaphore,
    task::{JoinError, JoinSet},
};
use tokio_util::sync::CancellationToken;
use tonic::codec::Streaming;
use tracing::{debug, error, info, warn};

use crate::{
    Client, HandlerError, Reply, TaskContext, WorkerError,
    backoff::{Backoff, next_jittered},
    task::{Runner, WIND_DOWN, prost_duration},
};

/// The namespace a worker claims from unless told otherwise.
pub const DEFAULT_NAMESPACE: &str = "default";
/// How long each lease lasts unless told otherwise; renewed every third of it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const DEFAULT_RECONNECT_INITIAL: Duration = Duration::from_millis(100);
/// A worker comes back within about this long of its task store: a refused
/// connection costs either side little, and tasks wait meanwhile.
const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(2);

/// A worker for one agent: claims that agent's tasks and runs a handler on
/// each, up to `capacity` at once.
///
/// Built with [`Worker::new`] and the setters below, started with [`Worker::run`].
#[derive(Debug, Clone)]
pub struct Worker {
    client: Client,
    namespace: String,
    agent_id: String,
    worker_id: String,
    capacity: u32,
    lease: Duration,
    max_retries: u32,
    reconnect_initial: Duration,
    reconnect_max: Duration,
    shutdown_grace: Duration,
    task_timeout: Option<Duration>,
    metrics: Metrics,
}

/// How one claim stream ended.
enum StreamEnd {
    Shutdown,
    Broken,
}

impl Worker {
    /// A worker for `agent_id` with the defaults: namespace `"default"`,
    /// worker id `"{agent_id}-{uuid}"`, capacity 1, 30 s leases, no retries.
    pub fn new(client: Client, agent_id: impl Into<String>) -> Self {
        let agent_id = agent_id.into();
        let worker_id = format!("{agent_id}-{}", uuid::Uuid::new_v4());
        Self {
            client,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            agent_id,
            worker_id,
            capacity: 1,
            lease: DEFAULT_LEASE,
            max_retries: 0,
            reconnect_initial: DEFAULT_RECONNECT_INITIAL,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            shutdown_grace: Duration::ZERO,
            task_timeout: None,
            metrics: Metrics::default(),
        }
    }

    /// Counts into `metrics` (the `chorus_worker_*` series: its tasks by
    /// outcome, those in flight, its open claim stream), for a server that
    /// serves them on `/metrics`. Default: counted nowhere anyone reads.
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The namespace to claim tasks from.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// This worker process's identity; its leases belong to it. An id kept
    /// across restarts (a pod's name, say) lets a restarted worker take up
    /// at once the tasks its previous process held: [`run`](Self::run)'s
    /// first claim has them requeued instead of waiting out their leases.
    /// No two live processes may share one.
    #[must_use]
    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Self {
        self.worker_id = worker_id.into();
        self
    }

    /// How many tasks are handled at once (at least 1).
    #[must_use]
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// How long each lease lasts; the worker renews it every third of that.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How many times the task store requeues a task whose lease expired or
    /// whose handler failed with a [retryable](HandlerError::retryable)
    /// error (default 0: such an error fails the task like a fatal one, and
    /// the worker warns once). The last claim's value holds for the agent's
    /// tasks, so every worker of an agent should set the same.
    #[must_use]
    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// Reconnection delays after the claim stream breaks: doubling from
    /// `initial` up to `max` (defaults 100 ms and 2 s), with jitter.
    #[must_use]
    pub fn reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.reconnect_initial = initial;
        self.reconnect_max = max;
        self
    }

    /// How long [`run`](Self::run) lets in-flight tasks finish after shutdown
    /// before abandoning them (default zero: at once). Handlers see the
    /// shutdown begin ([`TaskContext::shutting_down`]); those still running
    /// when the grace is over are told ([`TaskContext::cancelled`]), aborted
    /// a second later, and their tasks handed back to the queue for another
    /// worker, their attempts not counted.
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How long a handler may work on a task (default: as long as it
    /// takes). One that overruns is told ([`TaskContext::cancelled`]),
    /// aborted a second later, and its task failed as
    /// [retryable](HandlerError::retryable), "the handler did not finish
    /// within …", so that a hung call (a model, an upstream) does not hold a
    /// slot, and the task's creator, forever.
    #[must_use]
    pub fn task_timeout(mut self, limit: Duration) -> Self {
        self.task_timeout = Some(limit);
        self
    }

    /// The agent this worker works for.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// This worker's id.
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// Claims tasks and runs `handler` on each until `shutdown` is cancelled.
    ///
    /// A handler's `Ok` completes the task, its `Err` (or panic) fails it. A
    /// broken claim stream is reopened with capped exponential backoff; tasks
    /// in flight carry on meanwhile. Returns `Ok` after `shutdown`, or an
    /// error when the configuration is invalid or the task store refuses the
    /// claim stream for good.
    pub async fn run<H, F>(self, handler: H, shutdown: CancellationToken) -> Result<(), WorkerError>
    where
        H: Fn(TaskContext) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
    {
        let request = self.claim_request()?;
        let runner = Arc::new(Runner {
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            agent_id: self.agent_id.clone(),
            lease: self.lease,
            handler,
            handling: Mutex::default(),
            metrics: self.metrics.clone(),
            shutdown: shutdown.clone(),
            abandon: CancellationToken::new(),
            max_retries: self.max_retries,
            warned_no_retries: std::sync::atomic::AtomicBool::new(false),
            task_timeout: self.task_timeout,
        });
        let mut tasks = JoinSet::new();
        let ended = self.claim_loop(&request, &runner, &mut tasks, &shutdown).await;
        drain(tasks, self.shutdown_grace, &runner).await;
        ended
    }

    fn claim_request(&self) -> Result<ClaimTasksRequest, WorkerError> {
        if self.agent_id.is_empty() {
            return Err(WorkerError::Config("agent id is empty"));
        }
        if self.namespace.is_empty() {
            return Err(WorkerError::Config("namespace is empty"));
        }
        if self.worker_id.is_empty() {
            return Err(WorkerError::Config("worker id is empty"));
        }
        if self.capacity == 0 {
            return Err(WorkerError::Config("capacity must be at least 1"));
        }
        if self.reconnect_initial.is_zero() {
            return Err(WorkerError::Config("reconnect backoff must be positive"));
        }
        let Some(lease) = prost_duration(self.lease).filter(|_| !self.lease.is_zero()) else {
            return Err(WorkerError::Config("lease must be positive and finite"));
        };
        Ok(ClaimTasksRequest {
            namespace: self.namespace.clone(),
            agent_id: self.agent_id.clone(),
            worker_id: self.worker_id.clone(),
            capacity: self.capacity,
            lease: Some(lease),
            max_retries: self.max_retries,
            notify_cancellations: true,
            fresh_start: false,
        })
    }

    async fn claim_loop<H, F>(
        &self,
        request: &ClaimTasksRequest,
        runner: &Arc<Runner<H>>,
        tasks: &mut JoinSet<()>,
        shutdown: &CancellationToken,
    ) -> Result<(), WorkerError>
    where
        H: Fn(TaskContext) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
    {
        let permits = usize::try_from(self.capacity).unwrap_or(usize::MAX);
        let capacity = Arc::new(Semaphore::new(permits.min(Semaphore::MAX_PERMITS)));
        let mut backoff = Backoff::new(self.reconnect_initial, self.reconnect_max);
        // Until a stream opens, this process holds no task: what the worker
        // id still holds is a previous process's, which the store requeues.
        let mut fresh_start = true;
        // An outage is said once, when it starts, not at every attempt.
        let mut unavailable = false;
        loop {
            let mut client = self.client.clone();
            let request = ClaimTasksRequest { fresh_start, ..request.clone() };
            let opened = tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                opened = client.claim_tasks(request) => opened,
            };
            match opened {
                Ok(stream) => {
                    fresh_start = false;
                    unavailable = false;
                    backoff.reset();
                    info!(agent_id = %self.agent_id, worker_id = %self.worker_id, "claiming tasks");
                    let stream = stream.into_inner();
                    let _open = self.metrics.worker_claim_streams.get().hold();
                    match pump(stream, runner, &capacity, tasks, shutdown).await? {
                        StreamEnd::Shutdown => return Ok(()),
                        StreamEnd::Broken => {}
                    }
                }
                Err(status) if refused_for_good(&status) => {
                    error!(agent_id = %self.agent_id, error = %status, "claim stream refused");
                    return Err(WorkerError::Stream(status));
                }
                Err(status) if unavailable => {
                    debug!(agent_id = %self.agent_id, error = status.message(), "claim stream still unavailable");
                }
                Err(status) => {
                    unavailable = true;
                    warn!(agent_id = %self.agent_id, error = status.message(), "claim stream unavailable; retrying");
                }
            }
            reap(tasks);
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(next_jittered(&mut backoff)) => {}
            }
        }
    }
}

/// Hands every claimed task to the runner, never more than `capacity` at once.
async fn pump<H, F>(
    mut stream: Streaming<ClaimedTask>,
    runner: &Arc<Runner<H>>,
    capacity: &Arc<Semaphore>,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<StreamEnd, WorkerError>
where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
{
    loop {
        // Read on at capacity too: a cancel of a running task comes this way.
        let received = tokio::select! {
            () = shutdown.cancelled() => return Ok(StreamEnd::Shutdown),
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                log_join(joined);
                continue;
            }
            received = stream.message() => received,
        };
        match received {
            Ok(Some(notice)) if !notice.canceled_task_id.is_empty() => runner.canceled(&notice.canceled_task_id),
            Ok(Some(claimed)) => {
                // The server's room and ours differ only while a canceled
                // task's handler winds down, which is bounded.
                let permit = tokio::select! {
                    () = shutdown.cancelled() => return Ok(StreamEnd::Shutdown),
                    permit = Arc::clone(capacity).acquire_owned() => permit,
                };
                // The semaphore is never closed.
                let Ok(permit) = permit else {
                    return Ok(StreamEnd::Shutdown);
                };
                runner.start(claimed, permit, tasks);
            }
            Ok(None) => {
                info!(agent_id = %runner.agent_id, "claim stream ended");
                return Ok(StreamEnd::Broken);
            }
            Err(status) if refused_for_good(&status) => {
                error!(agent_id = %runner.agent_id, error = %status, "claim stream refused");
                return Err(WorkerError::Stream(status));
            }
            // A task store that stops (the whole stack, or one replica)
            // ends its streams so: the worker is stopping too, or reconnects.
            Err(_) if shutdown.is_cancelled() => return Ok(StreamEnd::Shutdown),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                info!(agent_id = %runner.agent_id, error = %status.message(), "claim stream closed by the task store");
                return Ok(StreamEnd::Broken);
            }
            Err(status) => {
                warn!(agent_id = %runner.agent_id, error = %status, "claim stream broke");
                return Ok(StreamEnd::Broken);
            }
        }
    }
}

/// Errors reconnecting would not help. ABORTED ends a stream that a newer
/// stream of the same worker id replaced: another worker runs under this
/// one's id, and the two would only keep replacing each other.
fn refused_for_good(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::InvalidArgument
            | tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::Unimplemented
            | tonic::Code::Aborted
    )
}

/// Collects the tasks that are done, so the set does not grow while the
/// stream reconnects.
fn reap(tasks: &mut JoinSet<()>) {
    while let Some(joined) = tasks.try_join_next() {
        log_join(joined);
    }
}

fn log_join(joined: Result<(), JoinError>) {
    if let Err(join_error) = joined
        && join_error.is_panic()
    {
        error!(error = %join_error, "task handling panicked");
    }
}

/// Lets in-flight tasks finish for `grace`, then abandons the rest: their
/// contexts are cancelled, their handlers given [`WIND_DOWN`] and aborted,
/// and the tasks handed back to the queue for another worker, their attempts
/// not counted (one waiting on a question too: the next worker asks it
/// again).
async fn drain<H>(mut tasks: JoinSet<()>, grace: Duration, runner: &Runner<H>) {
    if !tasks.is_empty() && !grace.is_zero() {
        info!(count = tasks.len(), ?grace, "shutting down: letting the tasks in flight finish");
    }
    let _ = tokio::time::timeout(grace, join_all(&mut tasks)).await;
    if tasks.is_empty() {
        return;
    }
    info!(count = tasks.len(), "abandoning in-flight tasks: handing them back to the queue");
    let abandoned = runner.in_flight();
    runner.abandon.cancel();
    let _ = tokio::time::timeout(WIND_DOWN + Duration::from_millis(100), join_all(&mut tasks)).await;
    tasks.shutdown().await;
    let handed_back = abandoned.into_iter().map(|(task_id, lease_id)| runner.hand_back(task_id, lease_id));
    futures_util::future::join_all(handed_back).await;
}

async fn join_all(tasks: &mut JoinSet<()>) {
    while let Some(joined) = tasks.join_next().await {
        log_join(joined);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lazy_client() -> Client {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        crate::client_from_channel(channel)
    }

    #[tokio::test]
    async fn defaults_make_a_valid_claim() {
        let worker = Worker::new(lazy_client(), "echo");
        assert!(worker.id().starts_with("echo-"));
        let request = worker.claim_request().expect("defaults are valid");
        assert_eq!(request.namespace, "default");
        assert_eq!(request.capacity, 1);
        assert_eq!(request.max_retries, 0);
        assert_eq!(request.lease.map(|lease| lease.seconds), Some(30));
    }

    #[tokio::test]
    async fn invalid_configuration_is_refused_before_any_call() {
        let token = CancellationToken::new();
        let handler = |_: TaskContext| async { Ok(Reply::new()) };
        let zero = Worker::new(lazy_client(), "echo").capacity(0);
        let refused = zero.run(handler, token.clone()).await;
        assert!(matches!(refused, Err(WorkerError::Config(_))), "{refused:?}");
        let no_agent = Worker::new(lazy_client(), "").run(handler, token).await;
        assert!(matches!(no_agent, Err(WorkerError::Config(_))), "{no_agent:?}");
    }

    #[test]
    fn only_permanent_codes_stop_the_worker() {
        assert!(refused_for_good(&tonic::Status::unauthenticated("key")));
        assert!(!refused_for_good(&tonic::Status::unavailable("down")));
        assert!(!refused_for_good(&tonic::Status::internal("bug")));
    }
}
