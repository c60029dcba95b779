//! The outbox relay: every recorded change goes to the event bus, once.
//!
//! One relay at a time works for a database: it holds the lease on its row
//! in `taskstore_outbox`, which also keeps its cursor. A round renews the
//! lease, reads the events after the cursor, publishes them with one
//! `PublishBatch` per namespace, then saves the cursor. No transaction stays
//! open across the publish. Each bus event's idempotency key names its task
//! event, so a round repeated after a crash between publish and save appends
//! nothing: the bus drops the keys it already has.

mod bus_events;

use std::time::Duration;

use chorus_proto::eventbus::{NewEvent, PublishBatchRequest, event_bus_client::EventBusClient};
use chorus_runtime::{grpc::fitting, transport::Transport};
use tokio::{task::JoinHandle, time::Instant};

use self::bus_events::by_namespace;
use super::{TaskStore, keys, streams::HELD_BACK_RETRY};
use crate::{
    domain::{Cursor, now_micros},
    error::{Result, TaskStoreError},
};

/// The relay's row in `taskstore_outbox`.
const RELAY: &str = "eventbus";

/// Most events one `PublishBatch` takes.
const MAX_PUBLISH: usize = 1_000;
/// The most bytes of events one publish carries (one event larger goes
/// alone): under the 4 MiB a gRPC server takes by default, whatever the
/// number of events. A batch of large changes in one call would be refused
/// whole, round after round, and hold up every event after it.
const MAX_PUBLISH_BYTES: usize = 3 << 20;

/// The wait after a failed round, doubled per failure up to the ceiling.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl TaskStore {
    /// Makes the log's order hold on the database server it is on, before
    /// the service starts (see [`TaskRepository::align_log_clock`]).
    ///
    /// [`TaskRepository::align_log_clock`]: crate::repository::TaskRepository::align_log_clock
    pub async fn align_log_clock(&self) -> Result<()> {
        if let Some(offset) = self.repository.align_log_clock().await? {
            tracing::warn!(
                offset,
                "the task log's transaction ids are ahead of this PostgreSQL server's (was the database restored \
                 from another server?): new changes are numbered after them from now on"
            );
        }
        Ok(())
    }

    /// Publishes every change the store records to the event bus behind
    /// `client`, until shutdown; on first use from the start of the log.
    /// Every replica may run one: the one holding the relay's lease
    /// publishes, the others stand by to take over. `owner` names this
    /// replica in the lease, unique among live replicas and the same across
    /// its restarts (a restarted replica then takes its lease back at once
    /// instead of waiting for it to run out).
    pub fn spawn_outbox_relay(&self, client: EventBusClient<Transport>, owner: String) -> JoinHandle<()> {
        let mut relay = Relay { store: self.clone(), client, owner, leader: false, held: None };
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = relay.run() => {}
            }
            relay.release().await;
        })
    }
}

/// What a round found, which decides when the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Another replica holds the lease.
    Standby,
    /// It published a whole batch: more may wait.
    More,
    /// Committed events wait behind an older transaction (PostgreSQL).
    HeldBack,
    /// It published everything there was.
    CaughtUp,
}

/// A delay that doubles each time it is taken, up to a ceiling, until reset.
#[derive(Debug)]
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, next: first }
    }

    fn take(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}

struct Relay {
    store: TaskStore,
    client: EventBusClient<Transport>,
    /// This relay's name in the lease.
    owner: String,
    /// Whether the last round held the lease.
    leader: bool,
    /// The cursor as this relay last saved or read it, and when its lease
    /// was last renewed (before the renewing call), while it leads.
    held: Option<(Cursor, Instant)>,
}

impl Relay {
    /// How often the lease is renewed: idle, well before it runs out.
    fn renew(&self) -> Duration {
        self.store.config.poll_interval().min(self.store.config.outbox_lease() / 3)
    }

    async fn run(&mut self) {
        let renew = self.renew();
        let mut failures = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut held_back = Backoff::new(HELD_BACK_RETRY, renew);
        let mut bus_down_since = None;
        loop {
            // Created before the read, so a change committed meanwhile wakes it.
            let mut waiter = self.store.wakeups.waiter(keys::OUTBOX);
            let round = match self.round().await {
                Ok(round) => round,
                Err(error) => {
                    if matches!(error, TaskStoreError::EventBus(_)) {
                        let since = *bus_down_since.get_or_insert_with(Instant::now);
                        if self.leader && since.elapsed() >= self.store.config.outbox_lease() / 2 {
                            self.step_down(&error).await;
                            bus_down_since = None;
                            continue;
                        }
                    }
                    let delay = failures.take();
                    tracing::warn!(%error, retry_in_ms = delay.as_millis(), "outbox relay round failed");
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            bus_down_since = None;
            failures.reset();
            if round != Round::HeldBack {
                held_back.reset();
            }
            match round {
                Round::Standby => tokio::time::sleep(renew).await,
                Round::More => {}
                Round::HeldBack => tokio::time::sleep(held_back.take()).await,
                Round::CaughtUp => waiter.wait(renew).await,
            }
        }
    }

    /// Renews the lease unless a save renewed it lately, then publishes the
    /// events after the cursor and saves the cursor past them, which renews
    /// the lease too: under steady changes a round writes once.
    async fn round(&mut self) -> Result<Round> {
        let lease = self.store.config.outbox_lease();
        let cursor = match self.held {
            Some((cursor, renewed)) if self.leader && renewed.elapsed() < self.renew() => cursor,
            _ => {
                let renewing = Instant::now();
                let cursor =
                    self.store.repository.acquire_outbox_lease(RELAY, &self.owner, now_micros(), lease).await?;
                self.note_leadership(cursor);
                let Some(cursor) = cursor else {
                    // Another replica relays, and tells its own lag.
                    self.store.metrics.outbox_lag.get().set(0);
                    return Ok(Round::Standby);
                };
                self.held = Some((cursor, renewing));
                cursor
            }
        };
        let limit = self.store.config.outbox_batch_size();
        let batch = self.store.repository.read_outbox(cursor, limit).await?;
        // Until it is published, the first event read is the oldest waiting.
        let waited = batch.events.first().map_or(0, |event| (now_micros() - event.created_at).max(0) / 1_000_000);
        self.store.metrics.outbox_lag.get().set(waited);
        let next = match (batch.events.len() >= limit as usize, batch.held_back) {
            (true, _) => Round::More,
            (false, true) => Round::HeldBack,
            (false, false) => Round::CaughtUp,
        };
        let Some(last) = batch.events.last().map(|event| event.cursor) else {
            return Ok(next);
        };
        for (namespace, events) in by_namespace(&batch.events, self.store.config.outbox_max_payload_bytes)? {
            self.publish(namespace, events, lease).await?;
        }
        let renewing = Instant::now();
        let saved = self.store.repository.save_outbox_cursor(RELAY, &self.owner, last, now_micros(), lease).await;
        if let Err(error) = saved {
            self.held = None;
            return Err(error);
        }
        self.held = Some((last, renewing));
        if next == Round::CaughtUp {
            self.store.metrics.outbox_lag.get().set(0);
        }
        tracing::debug!(events = batch.events.len(), cursor = %last, "outbox relayed");
        Ok(next)
    }

    /// Hands the lease back on shutdown, so that another replica (or this
    /// one restarted elsewhere) takes over at once rather than after it
    /// runs out. Best effort: a lease not handed back still runs out.
    async fn release(&self) {
        if !self.leader {
            return;
        }
        let expire = self.store.repository.acquire_outbox_lease(RELAY, &self.owner, now_micros(), Duration::ZERO);
        match tokio::time::timeout(Duration::from_secs(1), expire).await {
            Ok(Ok(_)) => tracing::debug!(owner = %self.owner, "outbox relay handed its lease back"),
            Ok(Err(error)) => tracing::debug!(%error, "the outbox relay could not hand its lease back"),
            Err(_) => tracing::debug!("the outbox relay could not hand its lease back in time"),
        }
    }

    /// Hands the lease back after publishing has failed for half a lease,
    /// and stands by for a whole one: a replica that reaches its bus takes
    /// over meanwhile. Alone, this one takes the lease back after that.
    async fn step_down(&mut self, error: &TaskStoreError) {
        tracing::warn!(%error, owner = %self.owner, "the outbox relay cannot publish; it hands its lease to another replica");
        self.release().await;
        self.leader = false;
        self.held = None;
        tokio::time::sleep(self.store.config.outbox_lease()).await;
    }

    fn note_leadership(&mut self, cursor: Option<Cursor>) {
        let leader = cursor.is_some();
        if leader != self.leader {
            match cursor {
                Some(cursor) => tracing::info!(owner = %self.owner, %cursor, "outbox relay took the lease"),
                None => tracing::info!(owner = %self.owner, "outbox relay lost the lease to another replica"),
            }
        }
        self.leader = leader;
    }

    /// Publishes one namespace's events in order, at most [`MAX_PUBLISH`]
    /// and [`MAX_PUBLISH_BYTES`] per call. A call that outlasts the lease is
    /// given up.
    async fn publish(&mut self, namespace: String, mut events: Vec<NewEvent>, timeout: Duration) -> Result<()> {
        while !events.is_empty() {
            let rest = events.split_off(chunk_len(&events));
            let chunk = std::mem::replace(&mut events, rest);
            let mut request = tonic::Request::new(PublishBatchRequest { namespace: namespace.clone(), events: chunk });
            request.set_timeout(timeout);
            let response = tokio::time::timeout(timeout, self.client.publish_batch(request))
                .await
                .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("the publish outlasted the relay's lease")))
                .map_err(|status| TaskStoreError::EventBus(Box::new(status)))?;
            let duplicates = response.get_ref().results.iter().filter(|result| result.duplicate).count();
            if duplicates > 0 {
                tracing::debug!(%namespace, duplicates, "the event bus already had events of a repeated round");
            }
            // A repeated round's events were counted when first published.
            let relayed = response.get_ref().results.len() - duplicates;
            self.store.metrics.outbox_events_relayed.get().inc_by(relayed as u64);
        }
        Ok(())
    }
}

/// How many of `events`, from the first, one publish carries: at least one,
/// at most [`MAX_PUBLISH`], and no more than [`MAX_PUBLISH_BYTES`] together.
fn chunk_len(events: &[NewEvent]) -> usize {
    fitting(events.iter().take(MAX_PUBLISH).map(prost::Message::encoded_len), MAX_PUBLISH_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_carries_at_most_its_bytes_and_count_and_at_least_one_event() {
        let sized = |bytes: usize| NewEvent { payload: vec![b'x'; bytes], ..NewEvent::default() };
        let large: Vec<NewEvent> = (0..8).map(|_| sized(900_000)).collect();
        assert_eq!(chunk_len(&large), 3, "three fit in 3 MiB, a fourth does not");
        assert_eq!(chunk_len(&[sized(5 << 20)]), 1, "an event larger than a publish goes alone");
        let small: Vec<NewEvent> = (0..1_500).map(|_| sized(10)).collect();
        assert_eq!(chunk_len(&small), MAX_PUBLISH);
        assert_eq!(chunk_len(&small[..7]), 7);
    }

    #[test]
    fn backoff_doubles_up_to_its_ceiling_until_reset() {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let delays: Vec<u128> = (0..8).map(|_| backoff.take().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]);
        backoff.reset();
        assert_eq!(backoff.take(), FIRST_BACKOFF);
    }
}
