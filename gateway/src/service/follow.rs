//! Following a task's watch: what a streaming or blocking call sees of it,
//! and when that ends.

use std::time::Duration;

use a2a::StreamResponse;
use futures_util::{Stream, StreamExt as _, stream};

use super::EventStream;
use crate::{
    convert::{is_interrupted, is_settled},
    error::Result,
};

/// How a stream treats a first snapshot of a task waiting for input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiting {
    /// It ends the stream: the turn that was followed is over.
    Ends,
    /// It does not: the caller subscribed to see what comes next (A2A
    /// §3.1.6: a subscription to any task not terminal ends at a terminal
    /// state; the TCK's STREAM-SUB-002 subscribes to one waiting for input).
    Continues,
}

/// How long a stream that ended on a final change is read on for its close.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// How far a followed stream has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Open,
    /// Settled: nothing more is read, and the watch is canceled.
    Settled,
    /// A final change came, after which the task store closes the watch:
    /// it is read on to that close (for at most [`CLOSE_WAIT`]) rather than
    /// canceled while the close is on its way. An HTTP/2 client that is sent
    /// frames for a stream it canceled refuses each, and after 1024 of them
    /// closes the connection, failing every call on it.
    Finished,
}

/// Ends `events` after the first terminal or interrupted state, or after an
/// error; a snapshot waiting for input ends it as `waiting` says.
pub(super) fn until_settled(
    events: impl Stream<Item = Result<StreamResponse>> + Send + 'static,
    waiting: Waiting,
) -> EventStream {
    Box::pin(stream::unfold((Box::pin(events), Progress::Open), move |(mut events, progress)| async move {
        match progress {
            Progress::Open => {}
            Progress::Settled => return None,
            Progress::Finished => {
                let _ = tokio::time::timeout(CLOSE_WAIT, async { while events.next().await.is_some() {} }).await;
                return None;
            }
        }
        let event = events.next().await?;
        let progress = match &event {
            Ok(StreamResponse::Task(task))
                if task.status.state.is_terminal()
                    || (waiting == Waiting::Ends && is_interrupted(&task.status.state)) =>
            {
                Progress::Settled
            }
            Ok(StreamResponse::StatusUpdate(update)) if update.status.state.is_terminal() => Progress::Finished,
            Ok(StreamResponse::StatusUpdate(update)) if is_settled(&update.status.state) => Progress::Settled,
            Ok(_) => Progress::Open,
            Err(_) => Progress::Settled,
        };
        Some((event, (events, progress)))
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use a2a::{TaskState, TaskStatus, TaskStatusUpdateEvent};

    use super::*;

    fn update(state: TaskState) -> Result<StreamResponse> {
        Ok(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: "t".to_owned(),
            context_id: "c".to_owned(),
            status: TaskStatus { state, message: None, timestamp: None },
            metadata: None,
        }))
    }

    /// The changes, then a close that records it was reached.
    fn watch(
        changes: Vec<Result<StreamResponse>>,
        closed: Arc<AtomicBool>,
    ) -> impl Stream<Item = Result<StreamResponse>> + Send + 'static {
        stream::iter(changes).chain(stream::poll_fn(move |_| {
            closed.store(true, Ordering::SeqCst);
            std::task::Poll::Ready(None)
        }))
    }

    #[tokio::test]
    async fn a_final_change_is_read_on_to_the_watch_close() {
        let closed = Arc::new(AtomicBool::new(false));
        let changes = vec![update(TaskState::Working), update(TaskState::Completed), update(TaskState::Working)];
        let seen: Vec<_> = until_settled(watch(changes, Arc::clone(&closed)), Waiting::Ends).collect().await;
        assert_eq!(seen.len(), 2, "the stream ends with the final change");
        assert!(closed.load(Ordering::SeqCst), "the watch was dropped before its close");
    }

    #[tokio::test]
    async fn an_interrupted_turn_ends_without_waiting_for_more() {
        let closed = Arc::new(AtomicBool::new(false));
        let pending = watch(vec![update(TaskState::Working), update(TaskState::InputRequired)], Arc::clone(&closed))
            .take(2)
            .chain(stream::pending());
        let seen =
            tokio::time::timeout(Duration::from_secs(5), until_settled(pending, Waiting::Ends).collect::<Vec<_>>())
                .await
                .expect("an input-required change ends the stream at once");
        assert_eq!(seen.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_stays_open_after_a_final_change_is_let_go() {
        let events = stream::iter(vec![update(TaskState::Failed)]).chain(stream::pending());
        let seen = tokio::time::timeout(CLOSE_WAIT * 2, until_settled(events, Waiting::Ends).collect::<Vec<_>>())
            .await
            .expect("given up on after CLOSE_WAIT");
        assert_eq!(seen.len(), 1);
    }
}
