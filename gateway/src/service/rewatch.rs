//! Task-store calls that outlive the task store's restarts. A watch that
//! breaks before the task's final change (the replica it was on shuts down
//! or is unreachable) is opened again after the last change it gave, so
//! whoever follows the task misses nothing and sees nothing twice; an await,
//! a read, is made again until its timeout.

use std::time::Duration;

use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use chorus_runtime::transport::{self, Transport};
use futures_util::{Stream, stream};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};

use crate::{convert, error::GatewayError};

/// The first pause before opening a broken watch again; it doubles per
/// failed attempt up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(2);
/// How long a broken watch is tried again before its error is given.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);
/// Why a watch ends as the gateway stops.
const STOPPING: &str =
    "the gateway is shutting down; subscribe to the task again (another gateway, or this one once restarted)";

struct Watch {
    tasks: TaskStoreClient<Transport>,
    /// The gateway's shutdown: the watch ends, for its caller to call again.
    stopping: CancellationToken,
    namespace: String,
    task_id: String,
    /// The last change given (empty: none yet, or the request's own start).
    cursor: String,
    events: Option<Streaming<pb::TaskEvent>>,
    /// Whether the current watch has given anything yet.
    fresh: bool,
    finished: bool,
}

/// The changes `request` watches, reopened after the last one given whenever
/// the watch breaks or ends early; ends after the task's final change, or
/// with the error of a watch that cannot be reopened. Fails when the watch
/// cannot be opened at all (the task does not exist, or the task store stays
/// out of reach).
pub(super) async fn watch(
    mut tasks: TaskStoreClient<Transport>,
    request: pb::WatchTaskRequest,
    stopping: CancellationToken,
) -> Result<impl Stream<Item = Result<pb::TaskEvent, GatewayError>> + Send + use<>, Status> {
    let events = open(&mut tasks, request.clone(), tokio::time::Instant::now()).await?;
    let watch = Watch {
        tasks,
        stopping,
        namespace: request.namespace.clone(),
        task_id: request.task_id.clone(),
        cursor: request.after_cursor.clone(),
        events: Some(events),
        fresh: true,
        finished: false,
    };
    Ok(stream::unfold(watch, |mut watch| async move {
        let item = watch.next().await?;
        Some((item, watch))
    }))
}

/// Opens `request`'s watch, trying again while the task store cannot answer
/// and [`GIVE_UP_AFTER`] has not passed `since`.
async fn open(
    tasks: &mut TaskStoreClient<Transport>,
    request: pb::WatchTaskRequest,
    since: tokio::time::Instant,
) -> Result<Streaming<pb::TaskEvent>, Status> {
    let mut pauses = pauses();
    loop {
        match tasks.watch_task(request.clone()).await {
            Ok(events) => return Ok(events.into_inner()),
            Err(status) if worth_reopening(&status) && since.elapsed() < GIVE_UP_AFTER => {
                tokio::time::sleep(pauses.next().unwrap_or(LONGEST_PAUSE)).await;
            }
            Err(status) => return Err(status),
        }
    }
}

impl Watch {
    /// The next change, or, once the gateway is stopping, UNAVAILABLE (its
    /// caller subscribes again, to another gateway or this one restarted).
    async fn next(&mut self) -> Option<Result<pb::TaskEvent, GatewayError>> {
        let stopping = self.stopping.clone();
        tokio::select! {
            biased;
            next = self.next_change() => {
                next.map(|change| change.map_err(|status| GatewayError::from_taskstore(&status, Some(&self.task_id))))
            }
            () = stopping.cancelled() => {
                self.finished = true;
                Some(Err(GatewayError::Unavailable(STOPPING.to_owned())))
            }
        }
    }

    async fn next_change(&mut self) -> Option<Result<pb::TaskEvent, Status>> {
        let mut broken_since = None;
        loop {
            if self.finished {
                return None;
            }
            let Some(events) = self.events.as_mut() else {
                if let Err(status) = self.reopen(&mut broken_since).await {
                    self.finished = true;
                    return Some(Err(status));
                }
                continue;
            };
            match events.message().await {
                Ok(Some(event)) => {
                    self.fresh = false;
                    if !event.cursor.is_empty() {
                        self.cursor.clone_from(&event.cursor);
                    }
                    self.finished = convert::ends_task(&event);
                    return Some(Ok(event));
                }
                // A watch reopened after the task's last change ends at once:
                // nothing more will come.
                Ok(None) if self.fresh && broken_since.is_some() => return None,
                Ok(None) => {
                    tracing::debug!(task_id = %self.task_id, "the task store ended a watch early; opening it again");
                    self.events = None;
                }
                Err(status) if worth_reopening(&status) => {
                    tracing::debug!(task_id = %self.task_id, error = %status.message(), "a watch broke; opening it again");
                    self.events = None;
                }
                Err(status) => {
                    self.finished = true;
                    return Some(Err(status));
                }
            }
        }
    }

    /// Opens the watch again after the cursor, after a pause, until it
    /// opens or has been broken for [`GIVE_UP_AFTER`].
    async fn reopen(&mut self, broken_since: &mut Option<tokio::time::Instant>) -> Result<(), Status> {
        let since = *broken_since.get_or_insert_with(tokio::time::Instant::now);
        tokio::time::sleep(FIRST_PAUSE).await;
        let request = pb::WatchTaskRequest {
            namespace: self.namespace.clone(),
            task_id: self.task_id.clone(),
            after_cursor: self.cursor.clone(),
            snapshot: false,
        };
        self.events = Some(open(&mut self.tasks, request, since).await?);
        self.fresh = true;
        Ok(())
    }
}

/// Whether a call's failure may pass: the task store went away or is going,
/// or the connection to it broke, and this or another replica may answer
/// soon.
pub(crate) fn worth_reopening(status: &Status) -> bool {
    transport::cut_off(status) || matches!(status.code(), Code::Unknown | Code::Cancelled)
}

/// `request` (its timeout set here), made again while the task store cannot
/// answer and `timeout` has not passed: the task goes on meanwhile, and a
/// call that failed would leave its caller to start it again.
pub(super) async fn await_task(
    mut tasks: TaskStoreClient<Transport>,
    mut request: pb::AwaitTaskRequest,
    timeout: Duration,
) -> Result<pb::AwaitTaskResponse, Status> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pauses = pauses();
    loop {
        request.timeout = prost_types::Duration::try_from(deadline - tokio::time::Instant::now()).ok();
        let status = match tasks.await_task(request.clone()).await {
            Ok(settled) => return Ok(settled.into_inner()),
            Err(status) => status,
        };
        let pause = pauses.next().unwrap_or(LONGEST_PAUSE);
        if !worth_reopening(&status) || tokio::time::Instant::now() + pause >= deadline {
            return Err(status);
        }
        tracing::debug!(task_id = %request.id, error = %status.message(), "a blocking wait broke; waiting again");
        tokio::time::sleep(pause).await;
    }
}

/// The pauses between attempts: from [`FIRST_PAUSE`], doubling up to [`LONGEST_PAUSE`].
fn pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(FIRST_PAUSE), |pause| Some((*pause * 2).min(LONGEST_PAUSE)))
}
