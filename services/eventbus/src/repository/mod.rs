//! The event bus's storage contract. One SQL implementation serves both
//! PostgreSQL and SQLite ([`sql::SqlEventRepository`]); the conformance
//! suite in `tests/conformance` runs against both.
//!
//! Every method is one transaction: it either commits everything it says or
//! changes nothing.

pub mod sql;

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    domain::{
        Claim, ClaimRequest, Delivery, DeliveryId, DeliveryPage, DeliveryQuery, EventPage, EventQuery, Expired,
        Handler, HandlerSpec, HandlerView, Nack, NewEvent, OpenedStream, Published, PurgeCursor, Purged, Replayed,
    },
    error::Result,
};

#[async_trait]
pub trait EventRepository: Send + Sync + std::fmt::Debug + 'static {
    /// Appends events in order, all or none, and creates their deliveries
    /// for every handler that takes them. Events whose idempotency key is
    /// already in the log (or earlier in the batch) are not appended again.
    async fn publish(&self, namespace: &str, events: Vec<NewEvent>, now: i64) -> Result<Vec<Published>>;

    /// A page of the log after a sequence.
    async fn read_events(&self, query: &EventQuery) -> Result<EventPage>;

    /// The namespace's latest sequence (0 before its first event).
    async fn head(&self, namespace: &str) -> Result<i64>;

    /// Registers or redefines a handler; rejects a cycle.
    async fn register_handler(&self, spec: HandlerSpec, now: i64) -> Result<Handler>;

    /// Removes a handler and all its deliveries.
    async fn deregister_handler(&self, namespace: &str, name: &str) -> Result<()>;

    /// A handler with its progress (without `consumers`, which the service knows).
    async fn get_handler(&self, namespace: &str, name: &str) -> Result<HandlerView>;

    /// Every handler of the namespace, in delivery order.
    async fn list_handlers(&self, namespace: &str) -> Result<Vec<HandlerView>>;

    /// Leases the handler's next ready deliveries to a consumer, in sequence
    /// order, up to its free capacity; settles what is due on the way
    /// (leases that ran out, skips).
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim>;

    /// Opens a new stream for `consumer_id`, which replaces its previous one:
    /// from now on that one's claims fail with `StreamSuperseded`. Renews and
    /// returns the deliveries still leased to the consumer above `after`
    /// (all when `None`), to send them again.
    async fn open_stream(
        &self,
        namespace: &str,
        handler: &str,
        consumer_id: &str,
        after: Option<i64>,
        now: i64,
    ) -> Result<OpenedStream>;

    /// Forgets a consumer's stream that ended, unless another replaced it.
    async fn close_stream(&self, namespace: &str, handler: &str, consumer_id: &str, stream: i64) -> Result<()>;

    /// Acks deliveries, all or none.
    async fn ack(&self, namespace: &str, ids: &[DeliveryId], now: i64) -> Result<()>;

    /// Records a failed attempt: a retry becomes due, or the delivery is
    /// dead-lettered (and FAIL-policy dependents skipped).
    async fn nack(&self, namespace: &str, id: &DeliveryId, nack: Nack, now: i64) -> Result<Delivery>;

    /// Extends an in-flight delivery's lease to `now + extension`; returns the
    /// new end (`extension` `None`: the handler's visibility timeout).
    /// Extends the lease of `attempt` (`None`: the current one).
    async fn extend(
        &self,
        namespace: &str,
        id: &DeliveryId,
        extension: Option<Duration>,
        attempt: Option<u32>,
        now: i64,
    ) -> Result<i64>;

    /// Settles up to `limit` leases that ran out before `now`.
    async fn expire(&self, now: i64, limit: u32) -> Result<Expired>;

    /// The deliveries not done yet (waiting, in flight, or failed and
    /// waiting to be retried; not dead letters) in the whole database, and
    /// when the oldest was created.
    async fn backlog(&self) -> Result<(u64, Option<i64>)>;

    async fn get_delivery(&self, namespace: &str, id: &DeliveryId) -> Result<Delivery>;

    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<DeliveryPage>;

    /// Moves dead-lettered deliveries of a handler (all, or `ids`) back to
    /// pending, and optionally the deliveries skipped because of them.
    async fn replay_dead_letters(
        &self,
        namespace: &str,
        handler: &str,
        ids: &[DeliveryId],
        rearm_skipped: bool,
        now: i64,
    ) -> Result<Replayed>;

    /// Delivers again every event the handler takes in `from..=to` (`to`
    /// `None`: the head), creating deliveries it never had.
    async fn replay(&self, namespace: &str, handler: &str, from: i64, to: Option<i64>, now: i64) -> Result<u64>;

    /// Deletes, with their deliveries, the events published at or before
    /// `published_before` (µs) that every handler has finished: each
    /// delivery acked or skipped, or dead-lettered at or before that time.
    /// Examines up to `limit` such events after `after`, in the order they
    /// were published; an event a handler still has to process stays.
    async fn purge(&self, published_before: i64, after: Option<&PurgeCursor>, limit: u32) -> Result<Purged>;
}
