//! Boots a hub on a fresh database: SQLite always, PostgreSQL when
//! `CHORUS_TEST_POSTGRES_URL` is set (then a failure to connect fails the test).

use std::{sync::Arc, time::Duration};

use chorus_hub::{
    Hub, HubConfig,
    config::StaticAgent,
    domain::{Agent, Audience, Content, InboxFilter, Message, MessageKind, Outgoing, Sent},
    repository::sql::SqlHubRepository,
    service::{Receive, Received},
};
use chorus_runtime::{storage::Db, testing::TestDatabase, wakeup::Wakeups};
use tokio_util::sync::CancellationToken;

pub(crate) const NS: &str = "team-a";

pub(crate) struct Harness {
    pub(crate) hub: Hub,
    /// The hub's database, for tests of its repository alone.
    pub(crate) db: Db,
    pub(crate) shutdown: CancellationToken,
    _database: TestDatabase,
}

/// Short timings so TTLs, leases and staleness show within a test.
pub(crate) fn test_config() -> HubConfig {
    HubConfig {
        max_queue_depth: 5,
        stale_after_ms: 300,
        default_ack_timeout_ms: 2_000,
        reaper_interval_ms: 50,
        poll_interval_ms: 200,
        max_payload_bytes: 1024,
        static_agents: [(
            NS.to_owned(),
            vec![StaticAgent { id: "oracle".into(), agent_type: "model".into(), capabilities: vec!["answer".into()] }],
        )]
        .into(),
        ..HubConfig::default()
    }
}

impl Harness {
    pub(crate) async fn start(database: TestDatabase) -> Self {
        let db = database.open(&[&chorus_hub::MIGRATIONS]).await;
        let shutdown = CancellationToken::new();
        let hub =
            Hub::new(Arc::new(SqlHubRepository::new(db.clone())), Wakeups::new(), test_config(), shutdown.clone());
        hub.spawn_reaper();
        Self { hub, db, shutdown, _database: database }
    }

    /// Registers agent `id` of `agent_type` in [`NS`].
    pub(crate) async fn agent(&self, id: &str, agent_type: &str) -> Agent {
        self.agent_in(NS, id, agent_type, &[]).await
    }

    pub(crate) async fn agent_in(&self, namespace: &str, id: &str, agent_type: &str, capabilities: &[&str]) -> Agent {
        self.hub
            .register_agent(Agent {
                namespace: namespace.into(),
                id: id.into(),
                agent_type: agent_type.into(),
                capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
                agent_card: None,
                metadata: Default::default(),
                announce: false,
                registered_at: 0,
                last_seen_at: 0,
            })
            .await
            .expect("register")
    }

    /// A direct message of `message_type` from `sender` to `recipient` in [`NS`].
    pub(crate) async fn direct(&self, sender: &str, recipient: &str, message_type: &str) -> Sent {
        self.hub
            .send(outgoing(sender, Audience::Agent(recipient.into()), MessageKind::Direct, message_type))
            .await
            .expect("send")
    }

    /// A direct message from `sender` to `recipient`, or why it was refused.
    pub(crate) async fn direct_result(&self, sender: &str, recipient: &str) -> chorus_hub::error::Result<Sent> {
        self.hub.send(outgoing(sender, Audience::Agent(recipient.into()), MessageKind::Direct, "x")).await
    }

    /// Receives for `agent` in [`NS`], waiting at most `timeout`.
    pub(crate) async fn receive(
        &self,
        agent: &str,
        filter: InboxFilter,
        require_all: bool,
        timeout: Duration,
    ) -> Received {
        self.hub
            .receive(Receive {
                namespace: NS.into(),
                agent_id: agent.into(),
                filter,
                require_all,
                max: 100,
                max_bytes: usize::MAX,
                timeout,
                ack_timeout: Duration::from_secs(2),
            })
            .await
            .expect("receive")
    }

    /// Everything waiting for `agent` now, acked.
    pub(crate) async fn drain(&self, agent: &str) -> Vec<Message> {
        let received = self.receive(agent, InboxFilter::default(), false, Duration::ZERO).await;
        let ids: Vec<String> = received.messages.iter().map(|m| m.id.clone()).collect();
        if !ids.is_empty() {
            self.hub.ack(NS, agent, &ids).await.expect("ack");
        }
        received.messages
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub(crate) fn content(message_type: &str) -> Content {
    Content {
        message_type: message_type.into(),
        payload: br#"{"n":1}"#.to_vec(),
        content_type: "application/json".into(),
    }
}

pub(crate) fn outgoing(sender: &str, audience: Audience, kind: MessageKind, message_type: &str) -> Outgoing {
    Outgoing {
        namespace: NS.into(),
        sender: sender.into(),
        audience,
        kind,
        content: content(message_type),
        correlation_id: None,
        ttl: Duration::from_secs(60),
        idempotency_key: None,
    }
}

pub(crate) fn senders(values: &[&str]) -> InboxFilter {
    InboxFilter { senders: values.iter().map(|v| (*v).to_owned()).collect(), ..InboxFilter::default() }
}

pub(crate) fn types_of(messages: &[Message]) -> Vec<&str> {
    messages.iter().map(|m| m.content.message_type.as_str()).collect()
}

/// Runs each listed test against SQLite and, when configured, PostgreSQL.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        chorus_runtime::backend_suite!(crate::harness::Harness::start; $($test),*);
    };
}
pub(crate) use conformance;
