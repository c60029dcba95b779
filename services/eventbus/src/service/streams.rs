//! Long-lived streams: a handler's deliveries, and the log itself.
//!
//! Each stream is a task feeding a bounded channel; it ends when the client
//! goes away, the service shuts down, or the handler is deregistered.

use std::time::Duration;

use chorus_runtime::{
    feed::{self, forward},
    time::{now_micros, until},
    validate::FieldViolation,
    wakeup::wait_any,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{EventBus, keys};
use crate::{
    domain::{ClaimRequest, Delivery, Event, EventQuery, OpenedStream, Pattern},
    error::{EventBusError, Result},
};

/// Events read per query of a log stream.
const EVENT_BATCH: u32 = 256;

/// A consumer of one handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub namespace: String,
    pub handler: String,
    pub consumer_id: String,
    pub max_in_flight: u32,
    /// The highest sequence this consumer received on its previous stream:
    /// its leases at or below stay as they are, those above are sent again.
    /// `None`: every delivery leased to it is sent again.
    pub after: Option<i64>,
}

/// Counts an open stream of a handler while it lives.
struct ConsumerGuard {
    bus: EventBus,
    key: (String, String),
}

impl ConsumerGuard {
    fn new(bus: &EventBus, namespace: &str, handler: &str) -> Self {
        let key = (namespace.to_owned(), handler.to_owned());
        *bus.consumers.lock().expect("consumers lock poisoned").entry(key.clone()).or_default() += 1;
        Self { bus: bus.clone(), key }
    }
}

impl Drop for ConsumerGuard {
    fn drop(&mut self) {
        let mut consumers = self.bus.consumers.lock().expect("consumers lock poisoned");
        if let Some(count) = consumers.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                consumers.remove(&self.key);
            }
        }
    }
}

impl EventBus {
    /// Hands the handler's ready deliveries to one consumer as they become
    /// ready, starting with those still leased to it. Fails at once when the
    /// handler does not exist; ends with `HandlerNotFound` when it is
    /// deregistered.
    pub async fn subscribe(&self, subscription: Subscription) -> Result<ReceiverStream<Result<Delivery>>> {
        let Subscription { namespace, handler, consumer_id, after, .. } = &subscription;
        // Also the existence check: it fails for an unknown handler.
        let opened = self.repository.open_stream(namespace, handler, consumer_id, *after, now_micros()).await?;
        let (sender, receiver) = mpsc::channel(subscription.max_in_flight.max(1) as usize);
        let bus = self.clone();
        tokio::spawn(async move { bus.feed_deliveries(subscription, opened, sender).await });
        Ok(ReceiverStream::new(receiver))
    }

    /// Feeds the stream until it ends, then forgets it, unless a newer
    /// stream replaced it: the table holds the consumers' open streams, not
    /// every one there was.
    async fn feed_deliveries(
        self,
        subscription: Subscription,
        opened: OpenedStream,
        sender: mpsc::Sender<Result<Delivery>>,
    ) {
        let Subscription { namespace, handler, consumer_id, max_in_flight, .. } = subscription;
        let _guard = ConsumerGuard::new(&self, &namespace, &handler);
        let mut request = ClaimRequest {
            namespace,
            handler,
            consumer_id,
            stream: opened.stream,
            max_in_flight: max_in_flight.max(1),
            now: 0,
        };
        if forward(Ok(opened.resent), &sender).await {
            self.claim_until_done(&mut request, &sender).await;
        }
        let ClaimRequest { namespace, handler, consumer_id, stream, .. } = &request;
        if let Err(error) = self.repository.close_stream(namespace, handler, consumer_id, *stream).await {
            tracing::debug!(%error, "a closed stream's row stays");
        }
    }

    /// Claims and sends the handler's deliveries as they become ready, until
    /// the stream fails or its receiver goes, or the service shuts down.
    async fn claim_until_done(&self, request: &mut ClaimRequest, sender: &mpsc::Sender<Result<Delivery>>) {
        let mut waits_on: Vec<String> = Vec::new();
        loop {
            // Created before the read: a publish or registration, this
            // handler's own acks (room again) and those of the dependencies
            // its next delivery waits for (ready work) after it wake one of
            // these.
            let mut waiters: Vec<_> =
                [keys::namespace(&request.namespace), keys::progress(&request.namespace, &request.handler)]
                    .into_iter()
                    .chain(waits_on.iter().map(|dependency| keys::progress(&request.namespace, dependency)))
                    .map(|key| self.wakeups.waiter(&key))
                    .collect();
            request.now = now_micros();
            let claim = self.repository.claim(request).await;
            let next_due = claim.as_ref().ok().and_then(|claim| claim.next_due);
            // A claim takes everything ready up to the consumer's room, so
            // what it left is waiting for a signal (its own acks, a
            // dependency's, a publish) or a retry falling due. When it waits
            // for a dependency the waiters above do not cover, that one's ack
            // may have come before its waiter: claim again, with its waiter.
            let mut again = false;
            if let Ok(claim) = &claim
                && claim.waits_on != waits_on
            {
                again = claim.waits_on.iter().any(|dependency| !waits_on.contains(dependency));
                waits_on.clone_from(&claim.waits_on);
            }
            if let Ok(claim) = &claim {
                self.metrics.eventbus_deliveries.get().inc_by(claim.deliveries.len() as u64);
                self.dead_lettered(&request.namespace, claim.dead_lettered);
            }
            if !forward(claim.map(|claim| claim.deliveries), sender).await {
                return;
            }
            if again {
                continue;
            }
            let mut poll = self.config.poll_interval();
            if let Some(due) = next_due {
                let until_due = until(now_micros(), due);
                poll = poll.min(until_due.max(Duration::from_millis(1)));
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return feed::stopping(sender, EventBusError::ShuttingDown).await,
                () = sender.closed() => return,
                () = wait_any(&mut waiters, poll) => {}
            }
        }
    }

    /// The log after `after` (`None`: from the head as of now), then every
    /// event as it is committed.
    pub async fn stream_events(
        &self,
        namespace: &str,
        after: Option<i64>,
        types: Vec<Pattern>,
    ) -> Result<ReceiverStream<Result<Event>>> {
        let after = match after {
            Some(after) => after,
            None => self.repository.head(namespace).await?,
        };
        let query = EventQuery { namespace: namespace.to_owned(), after, types, limit: EVENT_BATCH };
        let (sender, receiver) = mpsc::channel(EVENT_BATCH as usize);
        let bus = self.clone();
        tokio::spawn(async move { bus.feed_events(query, sender).await });
        Ok(ReceiverStream::new(receiver))
    }

    async fn feed_events(self, mut query: EventQuery, sender: mpsc::Sender<Result<Event>>) {
        loop {
            let mut waiter = self.wakeups.waiter(&keys::namespace(&query.namespace));
            let page = match self.repository.read_events(&query).await {
                Ok(page) => page,
                Err(error) => {
                    let _ = sender.send(Err(error)).await;
                    return;
                }
            };
            // The log ends before the sequence asked for: its database was
            // reset or restored, and the sequences after it will be new
            // events the caller would never see.
            if page.head < query.after {
                let message = format!(
                    "is {}, past the last event of the log ({}): the log was reset or restored",
                    query.after, page.head
                );
                let _ = sender
                    .send(Err(EventBusError::InvalidArgument(FieldViolation::new("after_sequence", message))))
                    .await;
                return;
            }
            let caught_up = page.next_after >= page.head;
            query.after = page.next_after;
            for event in page.events {
                if sender.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            if caught_up {
                tokio::select! {
                    () = self.shutdown.cancelled() => return feed::stopping(&sender, EventBusError::ShuttingDown).await,
                    () = sender.closed() => return,
                    () = waiter.wait(self.config.poll_interval()) => {}
                }
            }
        }
    }
}
