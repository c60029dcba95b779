//! The event bus service: the repository plus what storage alone cannot do
//! — waiting for work, waking waiters after commits, expiring leases, and
//! running handlers inside the process.
//!
//! Every write goes through the repository (one transaction) and is then
//! announced on [`Wakeups`] under the namespace's key, so streams re-read at
//! once; they also poll, so a lost signal only delays.

mod handler;
mod reaper;
mod streams;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use chorus_runtime::{metrics::Metrics, time::now_micros, wakeup::Wakeups};
use tokio_util::sync::CancellationToken;

pub use self::{
    handler::{EventHandler, HandlerFailure},
    streams::Subscription,
};
use crate::{
    config::EventBusConfig,
    domain::{
        Delivery, DeliveryId, DeliveryPage, DeliveryQuery, DeliveryState, EventPage, EventQuery, Handler, HandlerSpec,
        HandlerView, Nack, NewEvent, Published, Replayed,
    },
    error::Result,
    repository::EventRepository,
};

/// The event bus. Cheap to clone.
#[derive(Debug, Clone)]
pub struct EventBus {
    repository: Arc<dyn EventRepository>,
    wakeups: Wakeups,
    config: Arc<EventBusConfig>,
    shutdown: CancellationToken,
    /// Open Subscribe streams per (namespace, handler), in this process.
    consumers: Arc<Mutex<HashMap<(String, String), u32>>>,
    /// Where deliveries and dead letters are counted.
    metrics: Metrics,
}

/// Wake-up keys: who waits for what.
mod keys {
    /// Writes that can give any handler of the namespace work: publishes,
    /// registrations, replays, expired leases.
    pub(super) fn namespace(namespace: &str) -> String {
        format!("eventbus/{namespace}")
    }

    /// A handler finished (or failed) deliveries: its consumers have room
    /// again, and the handlers after it may have work.
    pub(super) fn progress(namespace: &str, handler: &str) -> String {
        format!("eventbus/{namespace}/progress/{handler}")
    }
}

impl EventBus {
    /// `shutdown` ends every stream and handler the service has running.
    pub fn new(
        repository: Arc<dyn EventRepository>,
        wakeups: Wakeups,
        config: EventBusConfig,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            repository,
            wakeups,
            config: Arc::new(config),
            shutdown,
            consumers: Arc::default(),
            metrics: Metrics::default(),
        }
    }

    /// Counts into `metrics` (the server's) instead of a set of its own.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn config(&self) -> &EventBusConfig {
        &self.config
    }

    fn changed(&self, namespace: &str) {
        self.wakeups.notify(&keys::namespace(namespace));
    }

    fn progressed(&self, namespace: &str, handler: &str) {
        self.wakeups.notify(&keys::progress(namespace, handler));
    }

    /// Counts deliveries a nack or a claim dead-lettered, and wakes the
    /// namespace: they may have skipped dependents further down, whose own
    /// dependents wait for them, not for the handler that failed.
    fn dead_lettered(&self, namespace: &str, count: u64) {
        if count > 0 {
            self.metrics.eventbus_dead_letters.get().inc_by(count);
            self.changed(namespace);
        }
    }

    /// Appends events to the namespace's log, in order, all or none.
    pub async fn publish(&self, namespace: &str, events: Vec<NewEvent>) -> Result<Vec<Published>> {
        let published = self.repository.publish(namespace, events, now_micros()).await?;
        if published.iter().any(|p| !p.duplicate) {
            self.changed(namespace);
        }
        Ok(published)
    }

    pub async fn read_events(&self, query: &EventQuery) -> Result<EventPage> {
        self.repository.read_events(query).await
    }

    pub async fn register_handler(&self, spec: HandlerSpec) -> Result<Handler> {
        let handler = self.repository.register_handler(spec, now_micros()).await?;
        self.changed(&handler.namespace);
        tracing::info!(namespace = %handler.namespace, handler = %handler.name, after = ?handler.after, "handler registered");
        Ok(handler)
    }

    pub async fn deregister_handler(&self, namespace: &str, name: &str) -> Result<()> {
        self.repository.deregister_handler(namespace, name).await?;
        self.changed(namespace);
        tracing::info!(namespace, handler = name, "handler deregistered");
        Ok(())
    }

    pub async fn get_handler(&self, namespace: &str, name: &str) -> Result<HandlerView> {
        let mut view = self.repository.get_handler(namespace, name).await?;
        view.stats.consumers = self.consumer_count(namespace, name);
        Ok(view)
    }

    /// Every handler of the namespace, in delivery order.
    pub async fn list_handlers(&self, namespace: &str) -> Result<Vec<HandlerView>> {
        let mut views = self.repository.list_handlers(namespace).await?;
        for view in &mut views {
            view.stats.consumers = self.consumer_count(namespace, &view.handler.name);
        }
        Ok(views)
    }

    pub async fn ack(&self, namespace: &str, ids: &[DeliveryId]) -> Result<()> {
        self.repository.ack(namespace, ids, now_micros()).await?;
        let handlers: std::collections::BTreeSet<&str> = ids.iter().map(|id| id.handler.as_str()).collect();
        handlers.into_iter().for_each(|handler| self.progressed(namespace, handler));
        Ok(())
    }

    pub async fn nack(&self, namespace: &str, id: &DeliveryId, nack: Nack) -> Result<Delivery> {
        let delivery = self.repository.nack(namespace, id, nack, now_micros()).await?;
        self.progressed(namespace, &id.handler);
        self.dead_lettered(namespace, u64::from(delivery.state == DeliveryState::DeadLettered));
        Ok(delivery)
    }

    /// Extends the lease of `attempt` (`None`: the current one); returns its
    /// new end.
    pub async fn extend(
        &self,
        namespace: &str,
        id: &DeliveryId,
        extension: Option<Duration>,
        attempt: Option<u32>,
    ) -> Result<i64> {
        self.repository.extend(namespace, id, extension, attempt, now_micros()).await
    }

    pub async fn get_delivery(&self, namespace: &str, id: &DeliveryId) -> Result<Delivery> {
        self.repository.get_delivery(namespace, id).await
    }

    pub async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<DeliveryPage> {
        self.repository.list_deliveries(query).await
    }

    pub async fn replay_dead_letters(
        &self,
        namespace: &str,
        handler: &str,
        ids: &[DeliveryId],
        rearm_skipped: bool,
    ) -> Result<Replayed> {
        let replayed =
            self.repository.replay_dead_letters(namespace, handler, ids, rearm_skipped, now_micros()).await?;
        self.changed(namespace);
        Ok(replayed)
    }

    pub async fn replay(&self, namespace: &str, handler: &str, from: i64, to: Option<i64>) -> Result<u64> {
        let replayed = self.repository.replay(namespace, handler, from, to, now_micros()).await?;
        self.changed(namespace);
        Ok(replayed)
    }

    fn consumer_count(&self, namespace: &str, handler: &str) -> u32 {
        let consumers = self.consumers.lock().expect("consumers lock poisoned");
        consumers.get(&(namespace.to_owned(), handler.to_owned())).copied().unwrap_or_default()
    }
}
