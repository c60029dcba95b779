//! [`HubRepository`] for [`SqlHubRepository`]: delegation to the modules
//! that hold each part.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::SqlHubRepository;
use crate::{
    domain::{Agent, Content, HandOff, Lease, Message, Outgoing, Queued, StateEntry, StateWrite},
    error::Result,
    repository::{Expired, HubRepository, OpenedStream, Subscription, Take, Taken},
};

#[async_trait]
impl HubRepository for SqlHubRepository {
    async fn register_agent(&self, agent: Agent) -> Result<Agent> {
        self.upsert_agent(agent).await
    }

    async fn heartbeat(&self, namespace: &str, agent_id: &str, now: i64) -> Result<Agent> {
        self.touch_agent(namespace, agent_id, now).await
    }

    async fn deregister_agent(&self, namespace: &str, agent_id: &str) -> Result<()> {
        self.remove_agent(namespace, agent_id).await
    }

    async fn get_agent(&self, namespace: &str, agent_id: &str) -> Result<Agent> {
        self.agent(namespace, agent_id).await
    }

    async fn list_agents(&self, namespace: &str) -> Result<Vec<Agent>> {
        self.agents(namespace).await
    }

    async fn subscribe(&self, namespace: &str, agent_id: &str, topic: &str, now: i64) -> Result<Subscription> {
        self.add_subscription(namespace, agent_id, topic, now).await
    }

    async fn unsubscribe(&self, namespace: &str, agent_id: &str, topic: &str) -> Result<()> {
        self.remove_subscription(namespace, agent_id, topic).await
    }

    async fn subscriptions(
        &self,
        namespace: &str,
        agent_id: Option<&str>,
        topic: Option<&str>,
    ) -> Result<Vec<Subscription>> {
        self.list_subscriptions(namespace, agent_id, topic).await
    }

    async fn send(
        &self,
        send: &Outgoing,
        hand_offs: &BTreeMap<String, HandOff>,
        max_queue_depth: u32,
        now: i64,
    ) -> Result<Queued> {
        self.queue(send, hand_offs, max_queue_depth, now).await
    }

    async fn take(&self, take: &Take) -> Result<Taken> {
        self.take_messages(take).await
    }

    async fn open_stream(
        &self,
        namespace: &str,
        agent_id: &str,
        lease: &Lease,
        after: Option<i64>,
        now: i64,
    ) -> Result<OpenedStream> {
        self.open_consumer_stream(namespace, agent_id, lease, after, now).await
    }

    async fn close_stream(&self, namespace: &str, agent_id: &str, consumer_id: &str, stream: i64) -> Result<()> {
        self.close_consumer_stream(namespace, agent_id, consumer_id, stream).await
    }

    async fn ack(&self, namespace: &str, agent_id: &str, message_ids: &[String], now: i64) -> Result<Vec<String>> {
        self.remove_acked(namespace, agent_id, message_ids, now).await
    }

    async fn inbox_depth(&self, now: i64) -> Result<u64> {
        let depth: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM hub_inbox WHERE expires_at > $1")
            .bind(now)
            .fetch_one(&mut *self.db.read().await?)
            .await?;
        Ok(u64::try_from(depth).unwrap_or_default())
    }

    async fn is_queued(&self, namespace: &str, recipient: &str, message_id: &str) -> Result<bool> {
        self.queued(namespace, recipient, message_id).await
    }

    async fn open_delegation(
        &self,
        namespace: &str,
        correlation_id: &str,
        sender: &str,
        recipient: &str,
        expires_at: i64,
    ) -> Result<()> {
        self.begin_delegation(namespace, correlation_id, sender, recipient, expires_at).await
    }

    async fn reply(
        &self,
        namespace: &str,
        sender: &str,
        correlation_id: &str,
        content: Content,
        now: i64,
    ) -> Result<Message> {
        self.answer(namespace, sender, correlation_id, content, now).await
    }

    async fn delegation_reply(&self, namespace: &str, correlation_id: &str) -> Result<Option<Message>> {
        self.reply_of(namespace, correlation_id).await
    }

    async fn close_delegation(&self, namespace: &str, correlation_id: &str) -> Result<()> {
        self.end_delegation(namespace, correlation_id).await
    }

    async fn state_row(&self, namespace: &str, key: &str) -> Result<Option<StateEntry>> {
        self.read_state(namespace, key).await
    }

    async fn write_state(&self, write: StateWrite, now: i64) -> Result<StateEntry> {
        self.store_state(write, now).await
    }

    async fn list_state(
        &self,
        namespace: &str,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
        now: i64,
    ) -> Result<Vec<StateEntry>> {
        self.live_keys(namespace, prefix, after, limit, now).await
    }

    async fn expire(&self, now: i64, limit: u32) -> Result<Expired> {
        self.clear_expired(now, limit).await
    }
}
