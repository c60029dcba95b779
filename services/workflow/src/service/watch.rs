//! Watching a run: its stored events after a cursor, then each write of
//! this process as it is committed, until the event that finishes the run,
//! or the process stops.

use futures_util::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Workflows, feed::Subscription, runs::WATCH_POLL};
use crate::{
    domain::{RunChange, RunEvent},
    error::{Result, WorkflowError},
    repository::EventPage,
};

/// The most events one read of a watch takes.
const WATCH_BATCH: u32 = 256;

impl Workflows {
    /// A run's events after `after` (0: from the first), then each as it is
    /// committed, until the event that finishes the run.
    pub async fn watch_run(
        &self,
        namespace: &str,
        run_id: &str,
        after: i64,
    ) -> Result<impl Stream<Item = Result<RunEvent>> + use<>> {
        // Subscribed before the first read, so no write falls between the two.
        let feed = self.feed.subscribe(run_id);
        // The first read also tells whether the namespace has the run.
        let first = self.runs.events(namespace, run_id, after, WATCH_BATCH).await?;
        if first.revision.is_none() {
            return Err(WorkflowError::RunNotFound(run_id.to_owned()));
        }
        let (sender, receiver) = mpsc::channel(64);
        let (namespace, run_id) = (namespace.to_owned(), run_id.to_owned());
        let (workflows, shutdown) = (self.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = follow(workflows, feed, namespace, run_id, after, first, &sender) => {}
                () = shutdown.cancelled() => chorus_runtime::feed::stopping(&sender, WorkflowError::ShuttingDown).await,
            }
        });
        Ok(ReceiverStream::new(receiver))
    }
}

/// Feeds a watch: the run's events from the database (the first page, read
/// after `cursor`, comes with the call), then this process's writes of it
/// while each continues the revision last seen, reading again on a gap, or
/// when none came for a while.
async fn follow(
    workflows: Workflows,
    mut feed: Subscription,
    namespace: String,
    run_id: String,
    mut cursor: i64,
    first: EventPage,
    sender: &mpsc::Sender<Result<RunEvent>>,
) {
    let ends =
        |events: &[RunEvent]| events.iter().any(|e| e.change == RunChange::RunStateChanged && e.state.is_finished());
    let mut first = Some(first);
    loop {
        let page = match first.take() {
            Some(page) => Ok(page),
            None => workflows.runs.events(&namespace, &run_id, cursor, WATCH_BATCH).await,
        };
        let (full, mut seen, events) = match page {
            Ok(page) => (page.events.len() == WATCH_BATCH as usize, page.revision, Ok(page.events)),
            Err(error) => (false, None, Err(error)),
        };
        let ended = events.as_deref().is_ok_and(ends);
        if let Ok(events) = &events {
            cursor = events.last().map_or(cursor, |e| e.cursor);
        }
        if !chorus_runtime::feed::forward(events, sender).await || ended {
            return;
        }
        if full {
            // More wait: the revision read is not yet the watch's.
            continue;
        }
        if seen.is_none() {
            // The run is gone (purged): nothing will be written; poll anyway.
            tokio::select! {
                () = tokio::time::sleep(WATCH_POLL) => {}
                () = sender.closed() => return,
            }
        }
        while let Some(revision) = seen {
            let fed = tokio::select! {
                fed = tokio::time::timeout(WATCH_POLL, feed.next()) => fed,
                () = sender.closed() => return,
            };
            let Ok(Some(fed)) = fed else { break };
            if fed.revision <= revision {
                continue;
            }
            if fed.revision != revision + 1 {
                break;
            }
            let events: Vec<RunEvent> = fed.events.iter().filter(|e| e.cursor > cursor).cloned().collect();
            let ended = ends(&events);
            cursor = events.last().map_or(cursor, |e| e.cursor);
            if !chorus_runtime::feed::forward(Ok(events), sender).await || ended {
                return;
            }
            seen = Some(fed.revision);
        }
    }
}
