//! The hub's records: agents, messages and inboxes, shared state.

use std::{collections::BTreeMap, fmt, str::FromStr, time::Duration};

/// What a message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    pub message_type: String,
    pub payload: Vec<u8>,
    pub content_type: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MessageKind {
    Topic,
    Direct,
    Broadcast,
    /// A Delegate request, answered with Reply.
    Request,
    /// A Reply, as Delegate returns it; never queued.
    Reply,
}

impl MessageKind {
    pub const ALL: [Self; 5] = [Self::Topic, Self::Direct, Self::Broadcast, Self::Request, Self::Reply];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Topic => "topic",
            Self::Direct => "direct",
            Self::Broadcast => "broadcast",
            Self::Request => "request",
            Self::Reply => "reply",
        }
    }
}

impl FromStr for MessageKind {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == value).ok_or_else(|| format!("unknown kind {value:?}"))
    }
}

/// Who a send goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audience {
    /// Every current subscriber of the topic but the sender.
    Topic(String),
    /// One registered agent.
    Agent(String),
    /// Every registered agent (of one type) but the sender.
    Everyone { agent_type: Option<String> },
}

/// A message to queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub namespace: String,
    pub sender: String,
    pub audience: Audience,
    pub kind: MessageKind,
    pub content: Content,
    pub correlation_id: Option<String>,
    pub ttl: Duration,
    pub idempotency_key: Option<String>,
}

impl Outgoing {
    /// The topic of a topic publish.
    pub fn topic(&self) -> Option<&str> {
        match &self.audience {
            Audience::Topic(topic) => Some(topic),
            Audience::Agent(_) | Audience::Everyone { .. } => None,
        }
    }

    /// Whom the message goes to, as a retry under its idempotency key must
    /// name them again: `agent:<id>`, `everyone:<type>` or `topic:<topic>`.
    pub fn audience_key(&self) -> String {
        match &self.audience {
            Audience::Topic(topic) => format!("topic:{topic}"),
            Audience::Agent(agent) => format!("agent:{agent}"),
            Audience::Everyone { agent_type } => format!("everyone:{}", agent_type.as_deref().unwrap_or_default()),
        }
    }

    /// Whether `filter` takes this message.
    pub fn passes(&self, filter: &InboxFilter) -> bool {
        filter.admits(&self.sender, &self.content.message_type, self.kind, self.topic())
    }

    /// The message as `recipient`'s inbox holds it once queued as `sent` at
    /// `sent_at`, handed out under `lease`.
    pub fn leased_to(&self, sent: &Sent, recipient: &str, sent_at: i64, lease: &Lease) -> Message {
        Message {
            id: sent.message_id.clone(),
            sequence: sent.sequence,
            kind: self.kind,
            sender: self.sender.clone(),
            recipient: recipient.to_owned(),
            topic: self.topic().map(str::to_owned),
            content: self.content.clone(),
            correlation_id: self.correlation_id.clone(),
            sent_at,
            expires_at: sent.expires_at,
            attempt: 1,
            ack_deadline: Some(lease.until),
        }
    }
}

/// What a send queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub message_id: String,
    pub sequence: i64,
    pub recipients: u32,
    pub expires_at: i64,
    pub duplicate: bool,
}

/// A send's copy for one recipient, handed straight to the consumer's
/// stream numbered `stream` under `lease`: written leased only while that
/// stream is still the consumer's latest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOff {
    pub lease: Lease,
    pub stream: i64,
}

/// What a send queued, whom it reached, and those of them whose copy went
/// leased to the stream it was handed to (the others wait in the inbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub sent: Sent,
    pub recipients: Vec<String>,
    pub handed_off: Vec<String>,
}

impl Queued {
    /// A retry of a send already queued: it reached no one again.
    pub fn duplicate(sent: Sent) -> Self {
        Self { sent, recipients: Vec::new(), handed_off: Vec::new() }
    }
}

/// A message as one recipient holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub sequence: i64,
    pub kind: MessageKind,
    pub sender: String,
    pub recipient: String,
    pub topic: Option<String>,
    pub content: Content,
    pub correlation_id: Option<String>,
    pub sent_at: i64,
    pub expires_at: i64,
    /// Hand-outs so far, this one included; 0 when not handed out.
    pub attempt: u32,
    pub ack_deadline: Option<i64>,
}

/// Which inbox messages a receive takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxFilter {
    /// Empty: any sender.
    pub senders: Vec<String>,
    /// Empty: any type.
    pub types: Vec<String>,
    /// Empty: any kind.
    pub kinds: Vec<MessageKind>,
    /// Empty: any topic.
    pub topics: Vec<String>,
}

impl InboxFilter {
    pub fn matches(&self, message: &Message) -> bool {
        self.admits(&message.sender, &message.content.message_type, message.kind, message.topic.as_deref())
    }

    /// Whether a message from `sender` of this type, kind and topic passes.
    pub fn admits(&self, sender: &str, message_type: &str, kind: MessageKind, topic: Option<&str>) -> bool {
        let any_or = |list: &[String], value: &str| list.is_empty() || list.iter().any(|item| item == value);
        any_or(&self.senders, sender)
            && any_or(&self.types, message_type)
            && (self.kinds.is_empty() || self.kinds.contains(&kind))
            && (self.topics.is_empty() || topic.is_some_and(|topic| any_or(&self.topics, topic)))
    }
}

/// A lease on inbox messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub consumer_id: String,
    pub until: i64,
}

impl Lease {
    /// `consumer_id`'s lease from `now` until its ack is due.
    pub fn for_ack(consumer_id: &str, now: i64, ack_timeout: Duration) -> Self {
        Self {
            consumer_id: consumer_id.to_owned(),
            until: now.saturating_add(chorus_runtime::time::micros(ack_timeout)),
        }
    }
}

/// A registered agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub namespace: String,
    pub id: String,
    pub agent_type: String,
    pub capabilities: Vec<String>,
    /// An A2A agent card, a JSON object.
    pub agent_card: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub announce: bool,
    pub registered_at: i64,
    pub last_seen_at: i64,
}

impl Agent {
    pub fn status(&self, now: i64, stale_after: Duration) -> AgentStatus {
        let silent = chorus_runtime::time::until(self.last_seen_at, now);
        if silent > stale_after { AgentStatus::Stale } else { AgentStatus::Active }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentStatus {
    Active,
    Stale,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryMode {
    Registry,
    Static,
    Broadcast,
}

/// What Discover looks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentQuery {
    pub namespace: String,
    pub capabilities: Vec<String>,
    pub agent_type: Option<String>,
    pub status: Option<AgentStatus>,
    pub stale_after: Duration,
    pub mode: DiscoveryMode,
}

impl AgentQuery {
    pub fn matches(&self, agent: &Agent, now: i64) -> bool {
        self.capabilities.iter().all(|wanted| agent.capabilities.contains(wanted))
            && self.agent_type.as_ref().is_none_or(|wanted| &agent.agent_type == wanted)
            && self.status.is_none_or(|wanted| agent.status(now, self.stale_after) == wanted)
            && (self.mode != DiscoveryMode::Broadcast || agent.announce)
    }
}

/// What a key's latest write was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateChangeKind {
    Set,
    Deleted,
    Expired,
}

impl StateChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Set => "set",
            Self::Deleted => "deleted",
            Self::Expired => "expired",
        }
    }
}

impl FromStr for StateChangeKind {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        [Self::Set, Self::Deleted, Self::Expired]
            .into_iter()
            .find(|kind| kind.as_str() == value)
            .ok_or_else(|| format!("unknown state change {value:?}"))
    }
}

/// A key as of its latest write. `value` is `None` unless `change` is `Set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub namespace: String,
    pub key: String,
    pub value: Option<Vec<u8>>,
    pub content_type: String,
    pub version: i64,
    pub change: StateChangeKind,
    pub updated_by: String,
    pub updated_at: i64,
    pub expires_at: Option<i64>,
}

impl StateEntry {
    /// Whether the key holds a value at `now`.
    pub fn is_live(&self, now: i64) -> bool {
        self.change == StateChangeKind::Set && self.expires_at.is_none_or(|at| at > now)
    }

    /// The version a conditional write compares with: 0 when absent.
    pub fn current_version(&self, now: i64) -> i64 {
        if self.is_live(now) { self.version } else { 0 }
    }
}

/// A write of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    pub namespace: String,
    pub key: String,
    /// `None`: delete.
    pub value: Option<(Vec<u8>, String)>,
    /// `Some(0)`: only if absent; `Some(n)`: only if at version n.
    pub expected_version: Option<i64>,
    pub ttl: Option<Duration>,
    pub updated_by: String,
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
