//! Long-lived streams: worker claims and task watches.
//!
//! Each stream is a task feeding a bounded channel; it ends when the client
//! goes away, the service shuts down, or (for a task watch) the task is done.

use std::time::Duration;

use chorus_runtime::{
    feed,
    wakeup::{Waiter, wait_any},
};
use tokio::sync::mpsc;
use tokio_stream::{
    Stream, StreamExt as _,
    wrappers::{ReceiverStream, UnboundedReceiverStream},
};

use super::{TaskStore, claims::ClaimStream, handoff::Live, keys};
use crate::{
    domain::{
        ClaimEvent, ClaimRequest, Claimed, Cursor, EventKind, EventQuery, Task, TaskCursor, TaskEvent, now_micros,
    },
    error::{Result, TaskStoreError},
};

/// Events read per query.
const EVENT_BATCH: u32 = 256;

/// How soon to read again when committed events wait behind an older transaction.
pub(super) const HELD_BACK_RETRY: Duration = Duration::from_millis(5);

/// What a watch of many tasks follows.
#[derive(Debug, Clone, Default)]
pub struct WatchFilter {
    pub agent_id: Option<String>,
    pub context_id: Option<String>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// After this cursor.
    After(Cursor),
    /// With the first event recorded.
    Beginning,
    /// With the events committed from about now on: from the oldest
    /// transaction still running, so a few events committed just before the
    /// call may come too (delivery is at least once, never lossy).
    Now,
}

fn ends_task(event: &TaskEvent) -> bool {
    event.kind == EventKind::StatusChanged && event.status.state.is_terminal()
}

impl TaskStore {
    /// Hands `request.agent_id`'s tasks to a worker as they become claimable,
    /// keeping at most `capacity` leased at once.
    pub fn claim_stream(&self, request: ClaimRequest) -> ClaimStream {
        self.open_claims(request, None)
    }

    /// As [`claim_stream`](Self::claim_stream), and tells the worker of each
    /// task of the stream canceled here, as the cancel commits.
    pub fn claim_stream_with_cancellations(
        &self,
        request: ClaimRequest,
    ) -> impl Stream<Item = Result<ClaimEvent>> + Send + 'static {
        let (notices, canceled) = mpsc::unbounded_channel();
        let claims = self
            .open_claims(request, Some(notices))
            .map(|claimed| claimed.map(|claimed| ClaimEvent::Claimed(Box::new(claimed))));
        claims.merge(UnboundedReceiverStream::new(canceled).map(|task_id| Ok(ClaimEvent::Canceled(task_id))))
    }

    fn open_claims(&self, mut request: ClaimRequest, canceled: Option<mpsc::UnboundedSender<String>>) -> ClaimStream {
        request.capacity = request.capacity.max(1);
        let (sender, receiver) = mpsc::channel(request.capacity as usize);
        let stream = ClaimStream::new(receiver, self.clone(), &request);
        request.lease = match self.lease_length(Some(request.lease)) {
            Ok(lease) => lease,
            Err(refused) => {
                // The stream's first item: the channel has room for it.
                let _ = sender.try_send(Err(refused));
                return stream;
            }
        };
        let store = self.clone();
        tokio::spawn(async move { store.feed_claims(request, sender, canceled).await });
        stream
    }

    async fn feed_claims(
        self,
        request: ClaimRequest,
        sender: mpsc::Sender<Result<Claimed>>,
        canceled: Option<mpsc::UnboundedSender<String>>,
    ) {
        let registration = self.streams.register(request.clone(), sender.clone(), canceled);
        let live = registration.live();
        loop {
            if live.is_replaced() {
                let replaced = TaskStoreError::StreamReplaced {
                    worker_id: request.worker_id.clone(),
                    agent_id: request.agent_id.clone(),
                };
                let _ = sender.send(Err(replaced)).await;
                return;
            }
            // Created before the read: a task becoming claimable, or one of
            // this worker's leases ending with its stream not caught up
            // (room freed, tasks waiting), wakes this key.
            let mut waiter = self.wakeups.waiter(&keys::claimable(&request.namespace, &request.agent_id));
            let (claimed, full) = match self.claim_round(&request, live).await {
                Ok(round) => round,
                Err(error) => {
                    let _ = sender.send(Err(error)).await;
                    return;
                }
            };
            let mut claimed = claimed.into_iter();
            while let Some(next) = claimed.next() {
                self.changed(&next.task);
                tracing::debug!(task_id = %next.task.id, worker_id = %request.worker_id, "task claimed");
                if let Err(unsent) = sender.send(Ok(next)).await {
                    // The worker went away as its tasks were claimed: those
                    // not sent go back to the queue rather than wait out the
                    // lease (those sent are the stream's to give back).
                    for unsent in unsent.0.ok().into_iter().chain(claimed) {
                        self.release(&request.namespace, &request.agent_id, &unsent).await;
                    }
                    return;
                }
                self.metrics.task_claims.get().inc();
            }
            // A full claim may have left more behind: claim again while
            // there is room (a lease ending wakes the stream when there is none).
            if full && live.room(now_micros()) > 0 {
                continue;
            }
            let going_on = tokio::select! {
                going_on = self.pause(&sender, std::slice::from_mut(&mut waiter), false) => going_on,
                () = live.replaced() => true,
            };
            if !going_on {
                return;
            }
        }
    }

    /// Reads the worker's leases and claims what fits under its capacity;
    /// true with the tasks when the claim filled the room (more may wait).
    async fn claim_round(&self, request: &ClaimRequest, live: &Live) -> Result<(Vec<Claimed>, bool)> {
        let read = live.begin_read();
        let leases = self.repository.worker_leases(&request.namespace, &request.worker_id, &request.agent_id).await?;
        let room = live.room_after(read, &leases, now_micros());
        if !leases.ready || live.is_replaced() {
            live.drained(read);
            return Ok((Vec::new(), false));
        }
        // Tasks wait that this read leaves in the queue (no room for them,
        // or a claim that filled the room may have left more): the stream
        // is behind, so a lease ending here makes it read the queue again,
        // and a create here does not hand a newer task over ahead of them.
        // Tasks another process queued reach the stream only this way.
        if room == 0 {
            live.behind();
            return Ok((Vec::new(), false));
        }
        let claimed = self.repository.claim_tasks(request, room).await?;
        live.claimed(&claimed);
        let full = claimed.len() == room as usize;
        if full {
            live.behind();
        } else {
            live.drained(read);
        }
        Ok((claimed, full))
    }

    /// The changes of one task after `after` (or from its first), but for
    /// those it has seen, ending with its final state. Fails at once when
    /// the task does not exist.
    pub async fn watch_task(
        &self,
        namespace: &str,
        task_id: &str,
        after: Option<TaskCursor>,
    ) -> Result<ReceiverStream<Result<TaskEvent>>> {
        self.repository.get_task(namespace, task_id, Some(0)).await?;
        let TaskCursor { after, seen } = after.unwrap_or_default();
        let (sender, receiver) = mpsc::channel(64);
        let store = self.clone();
        let query = EventQuery {
            namespace: namespace.to_owned(),
            task_id: Some(task_id.to_owned()),
            agent_id: None,
            context_id: None,
            after,
            limit: EVENT_BATCH,
        };
        tokio::spawn(async move { store.feed_task_events(query, seen, sender).await });
        Ok(ReceiverStream::new(receiver))
    }

    /// The task as it is now, a cursor after exactly the changes it
    /// includes, and the changes that follow. The task and the cursor are
    /// read in one snapshot.
    pub async fn watch_task_from_snapshot(
        &self,
        namespace: &str,
        task_id: &str,
    ) -> Result<(Task, Option<TaskCursor>, ReceiverStream<Result<TaskEvent>>)> {
        loop {
            if let Some((task, cursor)) = self.repository.snapshot_task(namespace, task_id).await? {
                let events = self.watch_task(namespace, task_id, cursor.clone()).await?;
                return Ok((task, cursor, events));
            }
            tokio::time::sleep(HELD_BACK_RETRY).await;
        }
    }

    async fn feed_task_events(
        self,
        mut query: EventQuery,
        mut seen: Vec<Cursor>,
        sender: mpsc::Sender<Result<TaskEvent>>,
    ) {
        let task_id = query.task_id.clone().unwrap_or_default();
        // A watch that starts after the task's final event would wait for
        // ever: once the log it could read is read, it checks that once. Any
        // later final event comes in a batch and ends the stream there.
        let mut end_checked = false;
        loop {
            let mut waiters = vec![self.wakeups.waiter(&keys::task(&query.namespace, &task_id))];
            let batch = match self.repository.read_events(&query).await {
                Ok(batch) => batch,
                Err(error) => {
                    let _ = sender.send(Err(error)).await;
                    return;
                }
            };
            let full_batch = batch.events.len() == EVENT_BATCH as usize;
            for event in batch.events {
                query.after = event.cursor;
                let last = ends_task(&event);
                let unseen = match seen.iter().position(|cursor| *cursor == event.cursor) {
                    Some(at) => {
                        seen.swap_remove(at);
                        false
                    }
                    None => true,
                };
                if (unseen && sender.send(Ok(event)).await.is_err()) || last {
                    return;
                }
            }
            if full_batch {
                continue;
            }
            if !batch.held_back && !end_checked {
                end_checked = true;
                if self.caught_up_with_finished_task(&query).await {
                    return;
                }
            }
            if !self.pause(&sender, &mut waiters, batch.held_back).await {
                return;
            }
        }
    }

    /// Whether a watch resumed after a task's final event: nothing is left.
    async fn caught_up_with_finished_task(&self, query: &EventQuery) -> bool {
        let latest = self.repository.latest_event(&query.namespace, query.task_id.as_deref()).await;
        matches!(latest, Ok(Some(event)) if ends_task(&event) && event.cursor <= query.after)
    }

    /// Every change in a namespace (optionally of one agent or context).
    pub async fn watch_tasks(
        &self,
        namespace: &str,
        filter: WatchFilter,
        start: WatchStart,
    ) -> Result<ReceiverStream<Result<TaskEvent>>> {
        let after = match start {
            WatchStart::After(cursor) => cursor,
            WatchStart::Beginning => Cursor::default(),
            WatchStart::Now => {
                self.repository.latest_event(namespace, None).await?.map(|event| event.cursor).unwrap_or_default()
            }
        };
        let query = EventQuery {
            namespace: namespace.to_owned(),
            task_id: None,
            agent_id: filter.agent_id,
            context_id: filter.context_id,
            after,
            limit: EVENT_BATCH,
        };
        let (sender, receiver) = mpsc::channel(256);
        let store = self.clone();
        tokio::spawn(async move { store.feed_namespace_events(query, sender).await });
        Ok(ReceiverStream::new(receiver))
    }

    async fn feed_namespace_events(self, mut query: EventQuery, sender: mpsc::Sender<Result<TaskEvent>>) {
        loop {
            let mut waiters = vec![self.wakeups.waiter(&keys::events(&query.namespace))];
            let batch = match self.repository.read_events(&query).await {
                Ok(batch) => batch,
                Err(error) => {
                    let _ = sender.send(Err(error)).await;
                    return;
                }
            };
            let full_batch = batch.events.len() == EVENT_BATCH as usize;
            for event in batch.events {
                query.after = event.cursor;
                if sender.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            if !full_batch && !self.pause(&sender, &mut waiters, batch.held_back).await {
                return;
            }
        }
    }

    /// Releases the claim of `claimed`, a task of `agent_id` that no worker
    /// received, and wakes the agent's other workers.
    pub(super) async fn release(&self, namespace: &str, agent_id: &str, claimed: &Claimed) {
        let (task_id, lease_id) = (claimed.task.id.as_str(), claimed.lease_id.as_str());
        match self.repository.release_claim(namespace, task_id, lease_id).await {
            Ok(released) => {
                tracing::debug!(task_id, released, "released a claim its worker did not receive");
                self.streams.missed(namespace, agent_id);
                self.wakeups.notify(&keys::claimable(namespace, agent_id));
            }
            Err(error) => tracing::warn!(task_id, %error, "cannot release a claim; its lease will expire"),
        }
    }

    /// Waits for a signal or the poll interval — briefly when committed
    /// events are `held_back` behind an older transaction, which signals
    /// nothing when it ends. Returns false when the stream should end: the
    /// client left, or the service is shutting down, which the client is
    /// told (UNAVAILABLE) so that it does not take the end for the last of
    /// the stream and opens it again.
    async fn pause<T>(&self, sender: &mpsc::Sender<Result<T>>, waiters: &mut [Waiter], held_back: bool) -> bool {
        let poll =
            if held_back { HELD_BACK_RETRY.min(self.config.poll_interval()) } else { self.config.poll_interval() };
        tokio::select! {
            () = self.shutdown.cancelled() => {
                feed::stopping(sender, TaskStoreError::ShuttingDown).await;
                false
            }
            () = sender.closed() => false,
            () = wait_any(waiters, poll) => true,
        }
    }
}
