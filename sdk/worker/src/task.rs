//! One claimed task, from claim to completion: the handler runs in its own
//! tokio task while the lease is renewed beside it.

use std::{
    any::Any,
    collections::HashMap,
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::Duration,
};

use chorus_proto::taskstore::{ClaimedTask, ReleaseTaskRequest, RenewLeaseRequest, Task};
use chorus_runtime::metrics::Metrics;
use tokio::{
    sync::OwnedSemaphorePermit,
    task::{JoinHandle, JoinSet},
    time::{Instant, MissedTickBehavior},
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, error, info, warn};

use crate::{Client, HandlerError, Reply, TaskContext};

/// What every task of one worker shares.
pub(crate) struct Runner<H> {
    pub(crate) client: Client,
    pub(crate) namespace: String,
    pub(crate) agent_id: String,
    pub(crate) lease: Duration,
    pub(crate) handler: H,
    /// The tasks being handled, by id.
    pub(crate) handling: Mutex<HashMap<String, Handling>>,
    /// Where the tasks' outcomes are counted.
    pub(crate) metrics: Metrics,
    /// The worker's shutdown: handlers may see it begin.
    pub(crate) shutdown: CancellationToken,
    /// Fired when the shutdown's grace is over: the handlers still running
    /// are told ([`TaskContext::cancelled`]), given [`WIND_DOWN`], and their
    /// tasks handed back.
    pub(crate) abandon: CancellationToken,
    /// The retries the worker claims with: with none, a retryable error
    /// fails its task, and the first one is warned of.
    pub(crate) max_retries: u32,
    pub(crate) warned_no_retries: AtomicBool,
    /// How long a handler may take (see [`Worker::task_timeout`](crate::Worker::task_timeout)).
    pub(crate) task_timeout: Option<Duration>,
}

/// How long a handler told of its task's end may take to wind down before it
/// is aborted.
pub(crate) const WIND_DOWN: Duration = Duration::from_secs(1);

/// A task being handled.
pub(crate) struct Handling {
    /// What its claim stream's notice of a cancel fires.
    told: CancellationToken,
    lease_id: String,
}

impl<H> Runner<H> {
    /// Counts a task done with so.
    pub(crate) fn count(&self, outcome: &str) {
        self.metrics.worker_tasks.with([outcome]).inc();
    }

    /// The tasks being handled, and their leases.
    pub(crate) fn in_flight(&self) -> Vec<(String, String)> {
        let handling = self.handling.lock().unwrap_or_else(PoisonError::into_inner);
        handling.iter().map(|(task_id, handling)| (task_id.clone(), handling.lease_id.clone())).collect()
    }

    /// Hands a task the worker will not finish back to the queue, where
    /// another worker takes it at once, its attempt not counted. One that
    /// ended meanwhile, or waits on a question, is left as it is.
    pub(crate) async fn hand_back(&self, task_id: String, lease_id: String) {
        let request = ReleaseTaskRequest {
            namespace: self.namespace.clone(),
            task_id,
            lease_id,
            reason: "the worker shut down before finishing it".to_owned(),
            retry_after: None,
            brief: true,
            others_first: false,
        };
        match self.client.clone().release_task(request.clone()).await {
            Ok(_) => {
                self.count("handed_back");
                info!(task_id = %request.task_id, "task handed back to the queue");
            }
            Err(status) => debug!(task_id = %request.task_id, error = %status, "task not handed back"),
        }
    }
}

/// Why the worker stopped holding a task before its handler finished.
enum LeaseEnd {
    /// The task was canceled on the server.
    Canceled,
    /// The server no longer knows this lease.
    Lost(tonic::Status),
    /// No renewal succeeded for a whole lease period.
    Expired,
}

impl<H, F> Runner<H>
where
    H: Fn(TaskContext) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
{
    /// Spawns the handling of `claimed` into `tasks`, inside its own
    /// `handle_task` span that continues the trace of the task's creator.
    /// The permit is held until the task is done with.
    pub(crate) fn start(self: &Arc<Self>, claimed: ClaimedTask, permit: OwnedSemaphorePermit, tasks: &mut JoinSet<()>) {
        let ClaimedTask { task, lease_id, trace_context, .. } = claimed;
        let Some(task) = task else {
            warn!(lease_id = %lease_id, "claimed task without a task, skipped");
            return;
        };
        let span = tracing::info_span!("handle_task", task_id = %task.id, agent_id = %self.agent_id);
        chorus_runtime::telemetry::set_parent_from_headers(&span, &trace_context);
        let runner = Arc::clone(self);
        let handling = async move {
            runner.handle(task, lease_id).await;
            drop(permit);
        };
        tasks.spawn(handling.instrument(span));
    }

    /// The claim stream says `task_id` was canceled: its handler is told at
    /// once, without waiting for the next renewal to say so.
    pub(crate) fn canceled(&self, task_id: &str) {
        if let Some(handling) = self.handling.lock().unwrap_or_else(PoisonError::into_inner).get(task_id) {
            handling.told.cancel();
        }
    }

    /// Runs the handler while renewing the lease, then completes or fails the
    /// task, or abandons it when the lease ends first. Dropping this future
    /// (worker shutdown) aborts the handler and abandons the task.
    async fn handle(self: Arc<Self>, task: Task, lease_id: String) {
        let told = CancellationToken::new();
        let handling = Handling { told: told.clone(), lease_id: lease_id.clone() };
        let _listed = Listed::new(&self.handling, task.id.clone(), handling);
        let _busy = self.metrics.worker_tasks_in_flight.get().hold();
        self.work(task, lease_id, told).await;
    }

    /// [`handle`](Self::handle) of a task whose cancel `told` fires when its
    /// claim stream tells of it.
    async fn work(self: &Arc<Self>, task: Task, lease_id: String, told: CancellationToken) {
        let span = tracing::Span::current();
        debug!("task claimed");
        let cancel = CancellationToken::new();
        let abandon = cancel.clone().drop_guard();
        let ctx = TaskContext::new(
            task,
            lease_id,
            self.namespace.clone(),
            self.client.clone(),
            [cancel.clone(), self.shutdown.clone()],
            span.clone(),
        );
        let runner = Arc::clone(self);
        let handler_ctx = ctx.clone();
        let handler_run = async move { (runner.handler)(handler_ctx).await };
        let mut handler = AbortOnDrop(tokio::spawn(handler_run.instrument(span)));

        let joined = tokio::select! {
            joined = &mut handler.0 => joined,
            end = async { tokio::select! {
                end = self.keep_lease(&ctx) => end,
                () = told.cancelled() => LeaseEnd::Canceled,
            } } => {
                log_lease_end(&end);
                self.count(if matches!(end, LeaseEnd::Canceled) { "canceled" } else { "lease_lost" });
                cancel.cancel();
                // Let the handler see `cancelled()` and wind down; its result is ignored.
                let _ = tokio::time::timeout(renewal_period(self.lease), &mut handler.0).await;
                return;
            }
            () = self.abandon.cancelled() => {
                // The worker shuts down: the task is handed back (see `drain`).
                self.wind_down(&ctx, &cancel, &mut handler.0).await;
                return;
            }
            limit = overdue(self.task_timeout) => {
                // Told, given a moment, then failed as worth another try.
                self.wind_down(&ctx, &cancel, &mut handler.0).await;
                let limit = chorus_runtime::time::humanize(limit);
                warn!(limit, "the handler overran the worker's task_timeout");
                Ok(Err(HandlerError::retryable(format!("the handler did not finish within {limit} (task_timeout)"))))
            }
        };
        abandon.disarm();
        match joined {
            Ok(Ok(reply)) => self.complete(&ctx, reply).await,
            Ok(Err(error)) if error.is_rejected() => self.reject(&ctx, error.to_string()).await,
            Ok(Err(error)) => match error.handed_back_for() {
                Some(after) => self.release(&ctx, error.to_string(), after).await,
                None => {
                    debug!(error = %error, retry = error.is_retryable(), "handler failed");
                    if error.is_retryable() && self.max_retries == 0 && !self.warned_no_retries.swap(true, Relaxed) {
                        warn!(
                            "a handler asked for a retry, but this worker claims with max_retries 0: the task fails \
                             (set Worker::max_retries)"
                        );
                    }
                    let retry = error.is_retryable().then(|| error.retry_after().unwrap_or_default());
                    self.fail(&ctx, error.to_string(), retry).await;
                }
            },
            Err(join_error) => match join_error.try_into_panic() {
                Ok(payload) => {
                    let reason = format!("handler panicked: {}", panic_message(payload.as_ref()));
                    error!(reason = %reason, "handler panicked");
                    self.fail(&ctx, reason, None).await;
                }
                Err(_) => debug!("handler cancelled, task abandoned"),
            },
        }
    }

    /// Tells the handler its task is ended ([`TaskContext::cancelled`]) and
    /// gives it [`WIND_DOWN`] to stop, the lease kept meanwhile.
    async fn wind_down<T>(&self, ctx: &TaskContext, cancel: &CancellationToken, handler: &mut JoinHandle<T>) {
        cancel.cancel();
        tokio::select! {
            _ = tokio::time::timeout(WIND_DOWN, handler) => {}
            _ = self.keep_lease(ctx) => {}
        }
    }

    /// Renews the lease every third of its length; returns only when the
    /// worker must stop working on the task.
    async fn keep_lease(&self, ctx: &TaskContext) -> LeaseEnd {
        let period = renewal_period(self.lease);
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut renewed_at = Instant::now();
        loop {
            let due = ticks.tick().await;
            let late = due.elapsed();
            if late > period / 2 {
                warn!(
                    task_id = %ctx.id(),
                    late_ms = late.as_millis(),
                    "a lease renewal ran late: is a handler blocking the runtime's threads? (run blocking work \
                     with tokio::task::spawn_blocking)"
                );
            }
            let request = RenewLeaseRequest {
                namespace: self.namespace.clone(),
                task_id: ctx.id().to_owned(),
                lease_id: ctx.lease_id().to_owned(),
                lease: prost_duration(self.lease),
            };
            let mut client = self.client.clone();
            let renewed = tokio::time::timeout(period, client.renew_lease(request)).await;
            match renewed {
                Ok(Ok(response)) if response.get_ref().canceled => return LeaseEnd::Canceled,
                Ok(Ok(_)) => renewed_at = Instant::now(),
                Ok(Err(status)) if lease_lost(&status) => return LeaseEnd::Lost(status),
                Ok(Err(status)) => {
                    warn!(task_id = %ctx.id(), error = %status, "lease renewal failed");
                }
                Err(_) => warn!(task_id = %ctx.id(), "lease renewal timed out"),
            }
            if renewed_at.elapsed() >= self.lease {
                return LeaseEnd::Expired;
            }
        }
    }
}

/// A task listed among those being handled while this lives.
struct Listed<'a> {
    tasks: &'a Mutex<HashMap<String, Handling>>,
    task_id: String,
}

impl<'a> Listed<'a> {
    fn new(tasks: &'a Mutex<HashMap<String, Handling>>, task_id: String, handling: Handling) -> Self {
        tasks.lock().unwrap_or_else(PoisonError::into_inner).insert(task_id.clone(), handling);
        Self { tasks, task_id }
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.task_id);
    }
}

/// Aborts the handler when the task's handling is dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn log_lease_end(end: &LeaseEnd) {
    match end {
        LeaseEnd::Canceled => info!("task canceled on the server, abandoned"),
        LeaseEnd::Lost(status) => warn!(error = %status, "task lease lost, task abandoned"),
        LeaseEnd::Expired => warn!("task lease not renewed in time, task abandoned"),
    }
}

/// Completes once `limit` has passed, with it; never without one.
async fn overdue(limit: Option<Duration>) -> Duration {
    match limit {
        Some(limit) => {
            tokio::time::sleep(limit).await;
            limit
        }
        None => std::future::pending().await,
    }
}

/// Renewals happen three times per lease.
pub(crate) fn renewal_period(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// The lease duration on the wire; `None` (the server's default) when it does
/// not fit, which the worker's validation already rules out.
pub(crate) fn prost_duration(lease: Duration) -> Option<chorus_proto::prost_types::Duration> {
    chorus_proto::prost_types::Duration::try_from(lease).ok()
}

/// The server no longer holds the lease: renewing again cannot help.
pub(crate) fn lease_lost(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::FailedPrecondition | tonic::Code::NotFound)
}

/// The text of a panic payload (`panic!` makes a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        return (*text).to_owned();
    }
    if let Some(text) = payload.downcast_ref::<String>() {
        return text.clone();
    }
    "non-text panic payload".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_message_reads_str_and_string_payloads() {
        let payload: Box<dyn Any + Send> = Box::new("boom");
        assert_eq!(panic_message(payload.as_ref()), "boom");
        let payload: Box<dyn Any + Send> = Box::new(format!("boom {}", 2));
        assert_eq!(panic_message(payload.as_ref()), "boom 2");
        let payload: Box<dyn Any + Send> = Box::new(7_u8);
        assert_eq!(panic_message(payload.as_ref()), "non-text panic payload");
    }

    #[test]
    fn renewals_happen_three_times_per_lease() {
        assert_eq!(renewal_period(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(renewal_period(Duration::ZERO), Duration::from_millis(1));
    }

    #[test]
    fn only_a_missing_lease_counts_as_lost() {
        assert!(lease_lost(&tonic::Status::failed_precondition("lease")));
        assert!(lease_lost(&tonic::Status::not_found("task")));
        assert!(!lease_lost(&tonic::Status::unavailable("down")));
    }
}
