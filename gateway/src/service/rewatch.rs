//! A task-store watch that outlives the task store's restarts: when the
//! watch breaks before the task's final change (the replica it was on shuts
//! down or is unreachable), it is opened again after the last change it
//! gave, so whoever follows the task misses nothing and sees nothing twice.

use std::time::Duration;

use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use chorus_runtime::transport::Transport;
use futures_util::{Stream, stream};
use tonic::{Code, Status, Streaming};

use crate::convert;

/// The first pause before opening a broken watch again; it doubles per
/// failed attempt up to [`LONGEST_PAUSE`].
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(100);
pub(super) const LONGEST_PAUSE: Duration = Duration::from_secs(2);
/// How long a broken watch is tried again before its error is given.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

struct Watch {
    tasks: TaskStoreClient<Transport>,
    namespace: String,
    task_id: String,
    /// The last change given (empty: none yet, or the request's own start).
    cursor: String,
    events: Option<Streaming<pb::TaskEvent>>,
    /// Whether the current watch has given anything yet.
    fresh: bool,
    finished: bool,
}

/// The changes of `events` (opened with `request`), reopened after the last
/// one given whenever the watch breaks or ends early; ends after the task's
/// final change, or with the error of a watch that cannot be reopened.
pub(super) fn resumable(
    tasks: TaskStoreClient<Transport>,
    request: &pb::WatchTaskRequest,
    events: Streaming<pb::TaskEvent>,
) -> impl Stream<Item = Result<pb::TaskEvent, Status>> + Send + use<> {
    let watch = Watch {
        tasks,
        namespace: request.namespace.clone(),
        task_id: request.task_id.clone(),
        cursor: request.after_cursor.clone(),
        events: Some(events),
        fresh: true,
        finished: false,
    };
    stream::unfold(watch, |mut watch| async move {
        let item = watch.next().await?;
        Some((item, watch))
    })
}

impl Watch {
    async fn next(&mut self) -> Option<Result<pb::TaskEvent, Status>> {
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

    /// Opens the watch again after the cursor, pausing between attempts,
    /// until it opens or has been broken for [`GIVE_UP_AFTER`].
    async fn reopen(&mut self, broken_since: &mut Option<tokio::time::Instant>) -> Result<(), Status> {
        let since = *broken_since.get_or_insert_with(tokio::time::Instant::now);
        let mut pause = FIRST_PAUSE;
        loop {
            tokio::time::sleep(pause).await;
            let request = pb::WatchTaskRequest {
                namespace: self.namespace.clone(),
                task_id: self.task_id.clone(),
                after_cursor: self.cursor.clone(),
                snapshot: false,
            };
            match self.tasks.watch_task(request).await {
                Ok(events) => {
                    self.events = Some(events.into_inner());
                    self.fresh = true;
                    return Ok(());
                }
                Err(status) if worth_reopening(&status) && since.elapsed() < GIVE_UP_AFTER => {
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
                Err(status) => return Err(status),
            }
        }
    }
}

/// Whether a watch's failure may pass: the task store went away or is
/// going, and this or another replica may answer soon.
pub(super) fn worth_reopening(status: &Status) -> bool {
    matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled)
}
