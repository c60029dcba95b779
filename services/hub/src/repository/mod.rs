//! The hub's storage contract. One SQL implementation serves both PostgreSQL
//! and SQLite ([`sql::SqlHubRepository`]); the conformance suite in
//! `tests/conformance` runs against both.
//!
//! Every method is one transaction: it either commits everything it says or
//! changes nothing.

pub mod sql;

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::{
    domain::{Agent, Content, HandOff, InboxFilter, Lease, Message, Outgoing, Queued, StateEntry, StateWrite},
    error::Result,
};

/// A topic subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub agent_id: String,
    pub topic: String,
    pub subscribed_at: i64,
}

/// What a take from an inbox asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    pub namespace: String,
    pub agent_id: String,
    pub filter: InboxFilter,
    pub require_all: bool,
    pub max: u32,
    /// Most bytes the messages taken may add up to (see
    /// [`Message::answer_bytes`](crate::domain::Message::answer_bytes)); the
    /// first is taken whatever its size.
    pub max_bytes: usize,
    pub lease: Lease,
    /// Most messages the consumer may hold leased at once (streams).
    pub hold_limit: Option<u32>,
    /// The taking stream's number (streams): a take by a stream its
    /// consumer has since replaced fails with `StreamSuperseded`.
    pub stream: Option<i64>,
    pub now: i64,
}

/// A consumer's new inbox stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedStream {
    /// Its number: takes under an older one fail from now on.
    pub stream: i64,
    /// The messages still leased to the consumer above the stream's resume
    /// cursor, renewed, to send again.
    pub resent: Vec<Message>,
    /// Every message leased to the consumer now (those resent, and those it
    /// kept): their ids and lease ends.
    pub held: Vec<(String, i64)>,
}

/// What a take found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Leased, oldest first (possibly none).
    Messages(Vec<Message>),
    /// `require_all`: these senders have nothing matching yet; nothing leased.
    Missing(Vec<String>),
}

/// What the reaper cleared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    /// Keys that expired: (namespace, key).
    pub keys: Vec<(String, String)>,
    /// Rows removed (messages, inbox entries, delegations).
    pub removed: u64,
}

#[async_trait]
pub trait HubRepository: Send + Sync + std::fmt::Debug + 'static {
    /// Registers or updates an agent (keeping its first registration time);
    /// counts as a heartbeat.
    async fn register_agent(&self, agent: Agent) -> Result<Agent>;
    async fn heartbeat(&self, namespace: &str, agent_id: &str, now: i64) -> Result<Agent>;
    /// Removes an agent with its subscriptions and queued messages.
    async fn deregister_agent(&self, namespace: &str, agent_id: &str) -> Result<()>;
    async fn get_agent(&self, namespace: &str, agent_id: &str) -> Result<Agent>;
    /// Every registered agent of the namespace, by id.
    async fn list_agents(&self, namespace: &str) -> Result<Vec<Agent>>;

    async fn subscribe(&self, namespace: &str, agent_id: &str, topic: &str, now: i64) -> Result<Subscription>;
    /// Ends a subscription and drops the topic's messages queued for the agent.
    async fn unsubscribe(&self, namespace: &str, agent_id: &str, topic: &str) -> Result<()>;
    async fn subscriptions(
        &self,
        namespace: &str,
        agent_id: Option<&str>,
        topic: Option<&str>,
    ) -> Result<Vec<Subscription>>;

    /// Queues a message for its audience, all inboxes or none; returns what
    /// was queued and the recipients. A recipient in `hand_offs` gets its
    /// copy already leased (handed straight to a consumer's stream) while
    /// that stream is still the consumer's latest; a duplicate send leases
    /// nothing.
    async fn send(
        &self,
        send: &Outgoing,
        hand_offs: &BTreeMap<String, HandOff>,
        max_queue_depth: u32,
        now: i64,
    ) -> Result<Queued>;
    /// Leases available inbox messages matching a filter.
    async fn take(&self, take: &Take) -> Result<Taken>;
    /// Opens a new stream for `lease.consumer_id`, which replaces its
    /// previous one: from now on that one's takes fail with
    /// `StreamSuperseded`. Renews and returns the messages still leased to
    /// the consumer above `after` (all when `None`), to send them again, with
    /// every lease the consumer holds.
    async fn open_stream(
        &self,
        namespace: &str,
        agent_id: &str,
        lease: &Lease,
        after: Option<i64>,
        now: i64,
    ) -> Result<OpenedStream>;
    /// Forgets a consumer's stream that ended, unless another replaced it.
    async fn close_stream(&self, namespace: &str, agent_id: &str, consumer_id: &str, stream: i64) -> Result<()>;
    /// Removes acked messages from the agent's inbox; returns the ids that
    /// were not there as of `now` (an expired message is not).
    async fn ack(&self, namespace: &str, agent_id: &str, message_ids: &[String], now: i64) -> Result<Vec<String>>;
    /// Whether a message still waits in the recipient's inbox.
    /// How many messages wait in inboxes, neither acked nor expired at
    /// `now`, in the whole database.
    async fn inbox_depth(&self, now: i64) -> Result<u64>;

    async fn is_queued(&self, namespace: &str, recipient: &str, message_id: &str) -> Result<bool>;

    /// Records a Delegate call waiting for its reply.
    async fn open_delegation(
        &self,
        namespace: &str,
        correlation_id: &str,
        sender: &str,
        recipient: &str,
        expires_at: i64,
    ) -> Result<()>;
    /// Answers a waiting Delegate call; returns the reply.
    async fn reply(
        &self,
        namespace: &str,
        sender: &str,
        correlation_id: &str,
        content: Content,
        now: i64,
    ) -> Result<Message>;
    /// The reply to a Delegate call, once there is one.
    async fn delegation_reply(&self, namespace: &str, correlation_id: &str) -> Result<Option<Message>>;
    /// Ends a Delegate call: forgets it and withdraws its requests still queued.
    async fn close_delegation(&self, namespace: &str, correlation_id: &str) -> Result<()>;

    /// A key's row, live or not (deleted and expired keys keep theirs).
    async fn state_row(&self, namespace: &str, key: &str) -> Result<Option<StateEntry>>;
    /// Sets or deletes a key under its version rule; returns the row after.
    async fn write_state(&self, write: StateWrite, now: i64) -> Result<StateEntry>;
    /// Live keys with a prefix after `after`, in key order.
    async fn list_state(
        &self,
        namespace: &str,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
        now: i64,
    ) -> Result<Vec<StateEntry>>;

    /// Clears what expired before `now`: messages, delegations, state (which
    /// takes a new version).
    async fn expire(&self, now: i64, limit: u32) -> Result<Expired>;
}
