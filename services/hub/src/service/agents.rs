//! Discovery and topic subscriptions.

use chorus_runtime::time::now_micros;

use super::{Hub, keys};
use crate::{
    domain::{Agent, AgentQuery, Audience, Content, DiscoveryMode, MessageKind, Outgoing},
    error::Result,
    repository::Subscription,
};

/// The topic announcing agents (discovery mode `broadcast`).
pub const DISCOVERY_TOPIC: &str = "hub.discovery";

impl Hub {
    /// Registers or updates an agent; announces it when it asks to be.
    pub async fn register_agent(&self, mut agent: Agent) -> Result<Agent> {
        agent.last_seen_at = now_micros();
        let agent = self.repository.register_agent(agent).await?;
        self.announce(&agent).await;
        Ok(agent)
    }

    pub async fn heartbeat(&self, namespace: &str, agent_id: &str) -> Result<Agent> {
        let agent = self.repository.heartbeat(namespace, agent_id, now_micros()).await?;
        self.announce(&agent).await;
        Ok(agent)
    }

    /// Publishes an `agent.announced` message for an agent that asks for it,
    /// as a courtesy: the registration or heartbeat stands whether or not
    /// the announcement could go out (a listener's inbox may be full), and
    /// the next heartbeat announces again.
    async fn announce(&self, agent: &Agent) {
        if !agent.announce {
            return;
        }
        let payload = serde_json::json!({
            "id": agent.id,
            "agent_type": agent.agent_type,
            "capabilities": agent.capabilities,
            "metadata": agent.metadata,
        });
        let send = Outgoing {
            namespace: agent.namespace.clone(),
            sender: agent.id.clone(),
            audience: Audience::Topic(DISCOVERY_TOPIC.to_owned()),
            kind: MessageKind::Topic,
            content: Content {
                message_type: "agent.announced".to_owned(),
                payload: payload.to_string().into_bytes(),
                content_type: "application/json".to_owned(),
            },
            correlation_id: None,
            ttl: self.config.stale_after(),
            idempotency_key: None,
        };
        if let Err(error) = self.send(send).await {
            tracing::warn!(agent_id = %agent.id, %error, "agent.announced not published");
        }
    }

    pub async fn deregister_agent(&self, namespace: &str, agent_id: &str) -> Result<()> {
        self.repository.deregister_agent(namespace, agent_id).await?;
        self.wakeups.notify(&keys::inbox(namespace, agent_id));
        Ok(())
    }

    pub async fn get_agent(&self, namespace: &str, agent_id: &str) -> Result<Agent> {
        self.repository.get_agent(namespace, agent_id).await
    }

    /// The agents matching the query, by id.
    pub async fn discover(&self, query: &AgentQuery) -> Result<Vec<Agent>> {
        let now = now_micros();
        let agents = match query.mode {
            DiscoveryMode::Static => self.static_agents(&query.namespace, now),
            DiscoveryMode::Registry | DiscoveryMode::Broadcast => self.repository.list_agents(&query.namespace).await?,
        };
        Ok(agents.into_iter().filter(|agent| query.matches(agent, now)).collect())
    }

    /// The configured agents of a namespace, always heard from just now.
    fn static_agents(&self, namespace: &str, now: i64) -> Vec<Agent> {
        let mut agents: Vec<Agent> = self
            .config
            .static_agents
            .get(namespace)
            .into_iter()
            .flatten()
            .map(|agent| Agent {
                namespace: namespace.to_owned(),
                id: agent.id.clone(),
                agent_type: agent.agent_type.clone(),
                capabilities: agent.capabilities.clone(),
                agent_card: None,
                metadata: Default::default(),
                announce: false,
                registered_at: now,
                last_seen_at: now,
            })
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        agents
    }

    pub async fn subscribe(&self, namespace: &str, agent_id: &str, topic: &str) -> Result<Subscription> {
        self.repository.subscribe(namespace, agent_id, topic, now_micros()).await
    }

    pub async fn unsubscribe(&self, namespace: &str, agent_id: &str, topic: &str) -> Result<()> {
        self.repository.unsubscribe(namespace, agent_id, topic).await
    }

    pub async fn subscriptions(
        &self,
        namespace: &str,
        agent_id: Option<&str>,
        topic: Option<&str>,
    ) -> Result<Vec<Subscription>> {
        self.repository.subscriptions(namespace, agent_id, topic).await
    }
}
