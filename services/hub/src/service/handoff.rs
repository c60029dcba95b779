//! Hand-off: a message for an agent whose inbox stream runs in this process
//! goes to that stream straight from the send. The send's own transaction
//! writes its inbox row already leased to the stream's consumer, and once it
//! commits the message is put on the stream: no wake-up, no read, no second
//! write.
//!
//! A stream takes hand-offs only while it is caught up: its last read found
//! nothing more waiting for it, and no send since left it a message in the
//! inbox. So a message never overtakes an older one still waiting there for
//! the same stream (among sends that awaited each other; sends racing each
//! other have no order). Everything else — other processes' sends,
//! redeliveries after a lease ran out, streams at their limit — goes the
//! usual way through the inbox.
//!
//! Each stream counts the leases it holds (what it was handed, took or was
//! sent again, less what was acked here or ran out), starting from the
//! database's count, so it never takes a hand-off beyond `max_in_flight`.
//! Acks made in another process are not seen here: they leave the count high,
//! which only sends messages the usual way until those leases run out.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard},
};

use chorus_runtime::registry::{Registration, Registry};
use tokio::sync::{
    Notify,
    mpsc::{OwnedPermit, Sender},
};

use super::messaging::Inbox;
use crate::{
    domain::{Audience, HandOff, Message, Outgoing},
    error::Result,
};

type Key = (String, String);

/// The inbox streams open in this process, by (namespace, agent).
#[derive(Debug, Clone, Default)]
pub(super) struct Streams(Registry<Key, Live>);

/// One open inbox stream.
#[derive(Debug)]
pub(super) struct Live {
    inbox: Inbox,
    sender: Sender<Result<Message>>,
    state: Mutex<LiveState>,
    /// Signalled when the last hand-off promised by this stream settles.
    offers_ended: Notify,
}

#[derive(Debug, Default)]
struct LiveState {
    /// The messages leased to this consumer, by id, with their lease's end.
    held: HashMap<String, i64>,
    /// Hand-offs promised to sends still in their transaction.
    reserved: u32,
    caught_up: bool,
    /// Sends that left this stream a message in the inbox.
    misses: u64,
    /// Its consumer opened another stream here: it takes no more hand-offs
    /// (its next take fails, which ends it).
    superseded: bool,
    /// Its number, once opened.
    stream: Option<i64>,
}

impl LiveState {
    /// Leases held or promised, forgetting those that ran out.
    fn in_flight(&mut self, now: i64) -> u32 {
        self.held.retain(|_, until| *until > now);
        u32::try_from(self.held.len()).unwrap_or(u32::MAX).saturating_add(self.reserved)
    }
}

/// A hand-off promised to a send: a place on the stream and in its limit.
/// Dropped unused, it gives both back.
#[derive(Debug)]
pub(super) struct Offer {
    live: Arc<Live>,
    permit: Option<OwnedPermit<Result<Message>>>,
    pub(super) hand_off: HandOff,
}

impl Drop for Offer {
    fn drop(&mut self) {
        let mut state = self.live.state();
        state.reserved = state.reserved.saturating_sub(1);
        if state.reserved == 0 {
            self.live.offers_ended.notify_waiters();
        }
    }
}

impl Offer {
    /// Puts the message, committed leased to this stream, on it.
    pub(super) fn deliver(mut self, message: Message) {
        self.live.state().held.insert(message.id.clone(), self.hand_off.lease.until);
        // A stream that ended meanwhile leaves the message leased to its
        // consumer: the consumer's next stream sends it again, or it goes
        // out again when the lease runs out.
        if let Some(permit) = self.permit.take() {
            permit.send(Ok(message));
        }
    }
}

impl Live {
    fn state(&self) -> MutexGuard<'_, LiveState> {
        self.state.lock().expect("inbox stream state lock poisoned")
    }

    /// The stream was opened under `stream`: it may take hand-offs once
    /// caught up.
    pub(super) fn opened(&self, stream: i64) {
        self.state().stream = Some(stream);
    }

    /// Counts leases this stream now holds: taken, sent again, or held
    /// from before it opened.
    pub(super) fn hold(&self, leases: impl IntoIterator<Item = (String, i64)>) {
        self.state().held.extend(leases);
    }

    /// Returns once no send holds a hand-off promised by this stream: each
    /// such send has committed its message leased to the consumer, or
    /// failed. A stream replacing this one waits for that before it takes
    /// back the consumer's leases, so none of those messages is missed.
    pub(super) async fn offers_settled(&self) {
        loop {
            let ended = self.offers_ended.notified();
            if self.state().reserved == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Room left under `max_in_flight`.
    pub(super) fn room(&self, now: i64) -> u32 {
        self.inbox.max_in_flight.saturating_sub(self.state().in_flight(now))
    }

    /// Sends so far that left this stream a message in the inbox; taken
    /// before a read, for [`Live::drained`].
    pub(super) fn misses(&self) -> u64 {
        self.state().misses
    }

    /// The read that began after `misses` took everything there was: the
    /// stream is caught up, unless a send missed it since.
    pub(super) fn drained(&self, misses: u64) {
        let mut state = self.state();
        if state.misses == misses {
            state.caught_up = true;
        }
    }

    /// A send left this stream a message in the inbox.
    fn missed(&self) {
        let mut state = self.state();
        state.misses += 1;
        state.caught_up = false;
    }

    /// A promise of a hand-off of `send`, when this stream is caught up, its
    /// filter takes the message and it has room on the stream and under its
    /// limit.
    fn offer(self: &Arc<Self>, send: &Outgoing, now: i64) -> Option<Offer> {
        if !send.passes(&self.inbox.filter) {
            return None;
        }
        let mut state = self.state();
        let stream = state.stream?;
        if state.superseded || !state.caught_up || state.in_flight(now) >= self.inbox.max_in_flight {
            return None;
        }
        let permit = self.sender.clone().try_reserve_owned().ok()?;
        state.reserved += 1;
        drop(state);
        let hand_off = HandOff { lease: self.inbox.lease(now), stream };
        Some(Offer { live: Arc::clone(self), permit: Some(permit), hand_off })
    }
}

impl Streams {
    /// Registers a stream feeding `sender`; it is not caught up until its
    /// first read says so. It replaces the consumer's other streams here,
    /// which take no more hand-offs: they are returned, for the new stream to
    /// wait until their promised hand-offs settled.
    pub(super) fn register(
        &self,
        inbox: Inbox,
        sender: Sender<Result<Message>>,
    ) -> (Registration<Key, Live>, Vec<Arc<Live>>) {
        let key = (inbox.namespace.clone(), inbox.agent_id.clone());
        let replaced: Vec<Arc<Live>> = self.0.lock().get(&key).map_or_else(Vec::new, |lives| {
            lives.iter().filter(|live| live.inbox.consumer_id == inbox.consumer_id).cloned().collect()
        });
        for live in &replaced {
            live.state().superseded = true;
        }
        let live = Live { inbox, sender, state: Mutex::default(), offers_ended: Notify::new() };
        (self.0.register(key, live), replaced)
    }

    /// Hand-offs of `send` promised by caught-up streams, at most one per
    /// agent, for every agent the send may reach (which the send itself
    /// decides).
    pub(super) fn offers(&self, send: &Outgoing, now: i64) -> BTreeMap<String, Offer> {
        let streams = self.0.lock();
        let candidates: Vec<&Vec<Arc<Live>>> = match &send.audience {
            Audience::Agent(agent_id) => streams.get(&(send.namespace.clone(), agent_id.clone())).into_iter().collect(),
            Audience::Topic(_) | Audience::Everyone { .. } => streams
                .iter()
                .filter(|((namespace, agent_id), _)| *namespace == send.namespace && *agent_id != send.sender)
                .map(|(_, lives)| lives)
                .collect(),
        };
        let mut offers = BTreeMap::new();
        for lives in candidates {
            if let Some(offer) = lives.iter().find_map(|live| live.offer(send, now)) {
                offers.insert(offer.live.inbox.agent_id.clone(), offer);
            }
        }
        offers
    }

    /// The send reached `agent_id` without a hand-off: its streams here are
    /// no longer caught up.
    pub(super) fn missed(&self, namespace: &str, agent_id: &str) {
        if let Some(lives) = self.0.lock().get(&(namespace.to_owned(), agent_id.to_owned())) {
            lives.iter().for_each(|live| live.missed());
        }
    }

    /// Acks made here: the streams that held the messages have room again.
    /// True when a stream must read the inbox for that room to be used (it
    /// is not caught up), or when a message was not held by a stream here.
    pub(super) fn acked(&self, namespace: &str, agent_id: &str, message_ids: &[String]) -> bool {
        let streams = self.0.lock();
        let Some(lives) = streams.get(&(namespace.to_owned(), agent_id.to_owned())) else {
            return true;
        };
        let mut wake = false;
        for id in message_ids {
            let holder = lives.iter().find(|live| {
                let mut state = live.state();
                let held = state.held.remove(id).is_some();
                wake |= held && !state.caught_up;
                held
            });
            wake |= holder.is_none();
        }
        wake
    }
}
