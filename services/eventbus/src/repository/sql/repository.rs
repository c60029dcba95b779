//! [`EventRepository`] for [`SqlEventRepository`]: delegation to the modules
//! that hold each part.

use std::time::Duration;

use async_trait::async_trait;

use super::SqlEventRepository;
use crate::{
    domain::{
        Claim, ClaimRequest, Delivery, DeliveryId, DeliveryPage, DeliveryQuery, EventPage, EventQuery, Expired,
        Handler, HandlerSpec, HandlerView, Nack, NewEvent, OpenedStream, Published, PurgeCursor, Purged, Replayed,
    },
    error::Result,
    repository::EventRepository,
};

#[async_trait]
impl EventRepository for SqlEventRepository {
    async fn publish(&self, namespace: &str, events: Vec<NewEvent>, now: i64) -> Result<Vec<Published>> {
        self.publish_events(namespace, events, now).await
    }

    async fn read_events(&self, query: &EventQuery) -> Result<EventPage> {
        self.read_log(query).await
    }

    async fn head(&self, namespace: &str) -> Result<i64> {
        let mut conn = self.db.read().await?;
        super::head(&mut conn, namespace).await
    }

    async fn register_handler(&self, spec: HandlerSpec, now: i64) -> Result<Handler> {
        self.register(spec, now).await
    }

    async fn deregister_handler(&self, namespace: &str, name: &str) -> Result<()> {
        self.deregister(namespace, name).await
    }

    async fn get_handler(&self, namespace: &str, name: &str) -> Result<HandlerView> {
        self.handler_view(namespace, name).await
    }

    async fn list_handlers(&self, namespace: &str) -> Result<Vec<HandlerView>> {
        self.handler_views(namespace).await
    }

    async fn claim(&self, request: &ClaimRequest) -> Result<Claim> {
        self.claim_deliveries(request).await
    }

    async fn open_stream(
        &self,
        namespace: &str,
        handler: &str,
        consumer_id: &str,
        after: Option<i64>,
        now: i64,
    ) -> Result<OpenedStream> {
        self.open_consumer_stream(namespace, handler, consumer_id, after, now).await
    }

    async fn close_stream(&self, namespace: &str, handler: &str, consumer_id: &str, stream: i64) -> Result<()> {
        self.close_consumer_stream(namespace, handler, consumer_id, stream).await
    }

    async fn ack(&self, namespace: &str, ids: &[DeliveryId], now: i64) -> Result<()> {
        self.ack_deliveries(namespace, ids, now).await
    }

    async fn nack(&self, namespace: &str, id: &DeliveryId, nack: Nack, now: i64) -> Result<Delivery> {
        self.nack_delivery(namespace, id, nack, now).await
    }

    async fn extend(
        &self,
        namespace: &str,
        id: &DeliveryId,
        extension: Option<Duration>,
        attempt: Option<u32>,
        now: i64,
    ) -> Result<i64> {
        self.extend_delivery(namespace, id, extension, attempt, now).await
    }

    async fn expire(&self, now: i64, limit: u32) -> Result<Expired> {
        self.expire_leases(now, limit).await
    }

    async fn backlog(&self) -> Result<(u64, Option<i64>)> {
        let (open, oldest): (i64, Option<i64>) = sqlx::query_as(
            "SELECT COUNT(*), MIN(created_at) FROM eventbus_deliveries \
             WHERE finished_at IS NULL AND state <> 'dead_lettered'",
        )
        .fetch_one(&mut *self.db.read().await?)
        .await?;
        Ok((u64::try_from(open).unwrap_or_default(), oldest))
    }

    async fn get_delivery(&self, namespace: &str, id: &DeliveryId) -> Result<Delivery> {
        self.delivery(namespace, id).await
    }

    async fn list_deliveries(&self, query: &DeliveryQuery) -> Result<DeliveryPage> {
        self.deliveries(query).await
    }

    async fn replay_dead_letters(
        &self,
        namespace: &str,
        handler: &str,
        ids: &[DeliveryId],
        rearm_skipped: bool,
        now: i64,
    ) -> Result<Replayed> {
        self.replay_dead(namespace, handler, ids, rearm_skipped, now).await
    }

    async fn replay(&self, namespace: &str, handler: &str, from: i64, to: Option<i64>, now: i64) -> Result<u64> {
        self.replay_range(namespace, handler, from, to, now).await
    }

    async fn purge(&self, published_before: i64, after: Option<&PurgeCursor>, limit: u32) -> Result<Purged> {
        self.purge_events(published_before, after, limit).await
    }
}
