//! Hand-off: a task created for an agent whose worker waits on a claim
//! stream in this process goes to that worker straight from the create. The
//! create's own statement writes the task already claimed under the
//! worker's lease (`working`, with both events), and once it commits the
//! task is put on the stream: no wake-up, no claim read, no second write.
//!
//! A stream takes hand-offs only while it is caught up: its last claim read
//! found nothing more waiting for its agent, and no create since left a task
//! in the queue. So a new task never overtakes an older one still waiting
//! there (among creates that awaited each other; creates racing each other
//! have no order). Everything else — other processes' creates, requeued
//! tasks, workers at capacity — goes the usual way through the queue.
//!
//! Each stream counts the leases it holds (handed over or claimed, less what
//! finished here or ran out), so it never takes a hand-off beyond its
//! capacity; each claim read refreshes the count from the database, which
//! also sees what finished in another process. A stream that asked to be
//! told of cancellations is told, as the cancel commits here, of each task it
//! holds that was canceled.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use chorus_runtime::registry::{Registration, Registry};
use tokio::sync::mpsc::{OwnedPermit, Sender, UnboundedSender};
use tokio_util::sync::CancellationToken;

use crate::{
    domain::{ClaimRequest, Claimed, Handoff, WorkerLeases},
    error::Result,
};

type Key = (String, String);

/// The claim streams open in this process, by (namespace, agent).
#[derive(Debug, Clone, Default)]
pub(super) struct Streams(Registry<Key, Live>);

/// One open claim stream.
#[derive(Debug)]
pub(super) struct Live {
    request: ClaimRequest,
    sender: Sender<Result<Claimed>>,
    /// Where the ids of its tasks canceled here go, when the worker asked.
    canceled: Option<UnboundedSender<String>>,
    /// Cancelled when a newer stream of the same worker and agent opens here.
    replaced: CancellationToken,
    state: Mutex<LiveState>,
}

#[derive(Debug, Default)]
struct LiveState {
    /// The tasks leased to this worker, by id.
    held: HashMap<String, Held>,
    /// Hand-offs promised to creates still in their transaction.
    reserved: u32,
    /// The room a claim read found, held for its claim until it is made.
    claiming: u32,
    caught_up: bool,
    /// Creates that left this stream's agent a task in the queue.
    misses: u64,
    /// Claim reads begun so far.
    reads: u64,
}

/// A lease the stream counts.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// When the lease runs out (µs).
    until: i64,
    /// The claim reads begun when the stream learnt of it: a read begun
    /// later sees the lease in the database, if it is still held.
    known_at_read: u64,
}

/// A claim read under way: what it may rely on when it ends.
#[derive(Debug, Clone, Copy)]
pub(super) struct Read {
    number: u64,
    misses: u64,
}

impl LiveState {
    /// Leases held or promised, not counting those that ran out as last
    /// known. Those are kept until a claim read finds them ended: a lease
    /// renewed since is still the stream's, to tell of its cancel.
    fn in_flight(&self, now: i64) -> u32 {
        let held = self.held.values().filter(|held| held.until > now).count();
        u32::try_from(held).unwrap_or(u32::MAX).saturating_add(self.reserved).saturating_add(self.claiming)
    }

    fn hold(&mut self, task_id: String, until: i64) {
        let known_at_read = self.reads;
        self.held.insert(task_id, Held { until, known_at_read });
    }
}

/// A hand-off promised to a create: a place on the stream and under its
/// capacity, and the lease to create the task under. Dropped unused, it
/// gives both back.
#[derive(Debug)]
pub(super) struct Offer {
    live: Arc<Live>,
    permit: Option<OwnedPermit<Result<Claimed>>>,
    pub(super) handoff: Handoff,
}

impl Drop for Offer {
    fn drop(&mut self) {
        let mut state = self.live.state();
        state.reserved = state.reserved.saturating_sub(1);
    }
}

impl Offer {
    /// Puts the task, committed under this offer's lease, on the stream.
    /// Hands it back when the stream ended meanwhile: the task is leased to
    /// a worker that will not get it.
    pub(super) fn deliver(mut self, claimed: Claimed) -> Option<Claimed> {
        self.live.state().hold(claimed.task.id.clone(), claimed.lease_expires_at);
        match self.permit.take() {
            Some(permit) if !self.live.sender.is_closed() => {
                permit.send(Ok(claimed));
                None
            }
            _ => Some(claimed),
        }
    }
}

impl Live {
    fn state(&self) -> MutexGuard<'_, LiveState> {
        self.state.lock().expect("claim stream state lock poisoned")
    }

    /// Resolves once a newer stream of the same worker and agent replaced this one.
    pub(super) async fn replaced(&self) {
        self.replaced.cancelled().await;
    }

    pub(super) fn is_replaced(&self) -> bool {
        self.replaced.is_cancelled()
    }

    /// Starts a claim read.
    pub(super) fn begin_read(&self) -> Read {
        let mut state = self.state();
        state.reads += 1;
        Read { number: state.reads, misses: state.misses }
    }

    /// Takes the worker's leases as `read` found them and returns the room
    /// left under its capacity, which a read that found a task to claim
    /// keeps for that claim. Leases the stream learnt of before the read
    /// began and the read did not find have ended; those it learnt of since
    /// may have committed after the read's snapshot, so they still count.
    pub(super) fn room_after(&self, read: Read, leases: &WorkerLeases, now: i64) -> u32 {
        let mut state = self.state();
        state.held.retain(|id, held| {
            held.known_at_read >= read.number || leases.active.iter().any(|(active, _)| active == id)
        });
        for (id, until) in &leases.active {
            state
                .held
                .entry(id.clone())
                .and_modify(|held| held.until = held.until.max(*until))
                .or_insert(Held { until: *until, known_at_read: read.number });
        }
        let room = self.request.capacity.saturating_sub(state.in_flight(now));
        if leases.ready {
            // Kept from hand-offs until the claim is made: a create racing it
            // must not take the same room.
            state.claiming = room;
        }
        room
    }

    /// Counts the leases of tasks this stream claimed with the room its read found.
    pub(super) fn claimed(&self, claimed: &[Claimed]) {
        let mut state = self.state();
        state.claiming = 0;
        for claimed in claimed {
            state.hold(claimed.task.id.clone(), claimed.lease_expires_at);
        }
    }

    /// Room left under the capacity by the stream's own count.
    pub(super) fn room(&self, now: i64) -> u32 {
        self.request.capacity.saturating_sub(self.state().in_flight(now))
    }

    /// `read` left nothing claimable behind: the stream is caught up, unless
    /// a create missed it since the read began.
    pub(super) fn drained(&self, read: Read) {
        let mut state = self.state();
        if state.misses == read.misses {
            state.caught_up = true;
        }
    }

    /// Tasks of the stream's agent wait in the queue: it takes no hand-off
    /// until a read finds none left.
    pub(super) fn behind(&self) {
        let mut state = self.state();
        state.misses += 1;
        state.caught_up = false;
    }

    /// Leases held or promised, when this stream is caught up and has room
    /// on the stream and under its capacity.
    fn load(&self, now: i64) -> Option<u32> {
        let state = self.state();
        let in_flight = state.in_flight(now);
        let open = !self.is_replaced() && self.sender.capacity() > 0;
        (open && state.caught_up && in_flight < self.request.capacity).then_some(in_flight)
    }

    /// A promise of a hand-off from a stream [`Live::load`] found room on.
    /// Offers and misses go through the registry's lock, which the caller
    /// holds, so that room is still there.
    fn offer(self: &Arc<Self>, now: i64) -> Option<Offer> {
        let permit = self.sender.clone().try_reserve_owned().ok()?;
        self.state().reserved += 1;
        let handoff = Handoff {
            worker_id: self.request.worker_id.clone(),
            lease_id: uuid::Uuid::new_v4().to_string(),
            lease_expires_at: now.saturating_add(chorus_runtime::time::micros(self.request.lease)),
            lease: self.request.lease,
            max_retries: self.request.max_retries,
        };
        Some(Offer { live: Arc::clone(self), permit: Some(permit), handoff })
    }
}

impl Streams {
    /// Registers a stream feeding `sender`; it is not caught up until its
    /// first read says so. It replaces the worker's older streams for the
    /// agent here: a worker that reconnects before its old stream is seen
    /// closed has one stream, so one count of its leases under its capacity.
    pub(super) fn register(
        &self,
        request: ClaimRequest,
        sender: Sender<Result<Claimed>>,
        canceled: Option<UnboundedSender<String>>,
    ) -> Registration<Key, Live> {
        let key = (request.namespace.clone(), request.agent_id.clone());
        let worker_id = request.worker_id.clone();
        let live = Live { request, sender, canceled, replaced: CancellationToken::new(), state: Mutex::default() };
        self.0.register_after(key, live, |lives| {
            for older in lives.iter().filter(|older| older.request.worker_id == worker_id) {
                older.replaced.cancel();
            }
        })
    }

    /// A hand-off promised by the least loaded caught-up stream of the
    /// agent's workers here, if any has room.
    pub(super) fn offer(&self, namespace: &str, agent_id: &str, now: i64) -> Option<Offer> {
        let streams = self.0.lock();
        let lives = streams.get(&(namespace.to_owned(), agent_id.to_owned()))?;
        let (_, live) = lives.iter().filter_map(|live| Some((live.load(now)?, live))).min_by_key(|(load, _)| *load)?;
        live.offer(now)
    }

    /// A task of `agent_id` waits in the queue: its streams here are no
    /// longer caught up.
    pub(super) fn missed(&self, namespace: &str, agent_id: &str) {
        if let Some(lives) = self.0.lock().get(&(namespace.to_owned(), agent_id.to_owned())) {
            lives.iter().for_each(|live| live.behind());
        }
    }

    /// A lease on `task_id` ended here (the task finished, was `canceled`,
    /// or went back to the queue): its stream has room again, and is told of
    /// a cancel when it asked (the newest, when a stream replaced the one
    /// that handed the task out). True when a stream must read the queue
    /// for that room to be used: the lease was not held by a stream here, or
    /// its stream is not caught up.
    pub(super) fn released(&self, namespace: &str, agent_id: &str, task_id: &str, canceled: bool) -> bool {
        let streams = self.0.lock();
        let Some(lives) = streams.get(&(namespace.to_owned(), agent_id.to_owned())) else {
            return true;
        };
        let mut holder = None;
        for live in lives.iter().rev() {
            let mut state = live.state();
            if state.held.remove(task_id).is_some() && holder.is_none() {
                holder = Some((live, state.caught_up));
            }
        }
        let Some((live, caught_up)) = holder else { return true };
        if let Some(notices) = live.canceled.as_ref().filter(|_| canceled) {
            // A worker gone away needs no notice.
            let _ = notices.send(task_id.to_owned());
        }
        !caught_up
    }
}
