//! Registered agents and topic subscriptions.

use super::{SqlHubRepository, rows};
use crate::{
    domain::Agent,
    error::{HubError, Result},
    repository::Subscription,
};

impl SqlHubRepository {
    pub(super) async fn upsert_agent(&self, agent: Agent) -> Result<Agent> {
        let row = sqlx::query(concat!(
            "INSERT INTO hub_agents (",
            rows::agent_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) ON CONFLICT (namespace, id) DO UPDATE SET \
             agent_type = excluded.agent_type, capabilities = excluded.capabilities, \
             agent_card = excluded.agent_card, metadata = excluded.metadata, announce = excluded.announce, \
             last_seen_at = excluded.last_seen_at RETURNING ",
            rows::agent_columns!()
        ))
        .bind(&agent.namespace)
        .bind(&agent.id)
        .bind(&agent.agent_type)
        .bind(rows::to_json(&agent.capabilities))
        .bind(&agent.agent_card)
        .bind(rows::to_json(&agent.metadata))
        .bind(i64::from(agent.announce))
        .bind(agent.last_seen_at)
        .fetch_one(&mut *self.db.acquire().await?)
        .await?;
        rows::decode_agent(&row)
    }

    pub(super) async fn touch_agent(&self, namespace: &str, agent_id: &str, now: i64) -> Result<Agent> {
        let row = sqlx::query(concat!(
            "UPDATE hub_agents SET last_seen_at = $3 WHERE namespace = $1 AND id = $2 RETURNING ",
            rows::agent_columns!()
        ))
        .bind(namespace)
        .bind(agent_id)
        .bind(now)
        .fetch_optional(&mut *self.db.acquire().await?)
        .await?
        .ok_or_else(|| HubError::AgentNotFound(agent_id.to_owned()))?;
        rows::decode_agent(&row)
    }

    pub(super) async fn remove_agent(&self, namespace: &str, agent_id: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let removed = sqlx::query("DELETE FROM hub_agents WHERE namespace = $1 AND id = $2")
            .bind(namespace)
            .bind(agent_id)
            .execute(&mut *tx)
            .await?;
        if removed.rows_affected() == 0 {
            return Err(HubError::AgentNotFound(agent_id.to_owned()));
        }
        for sql in [
            "DELETE FROM hub_subscriptions WHERE namespace = $1 AND agent_id = $2",
            "DELETE FROM hub_inbox WHERE namespace = $1 AND recipient = $2",
            "DELETE FROM hub_consumers WHERE namespace = $1 AND agent_id = $2",
        ] {
            sqlx::query(sql).bind(namespace).bind(agent_id).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn agent(&self, namespace: &str, agent_id: &str) -> Result<Agent> {
        let row = sqlx::query(concat!(
            "SELECT ",
            rows::agent_columns!(),
            " FROM hub_agents WHERE namespace = $1 AND id = $2"
        ))
        .bind(namespace)
        .bind(agent_id)
        .fetch_optional(&mut *self.db.read().await?)
        .await?
        .ok_or_else(|| HubError::AgentNotFound(agent_id.to_owned()))?;
        rows::decode_agent(&row)
    }

    pub(super) async fn agents(&self, namespace: &str) -> Result<Vec<Agent>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            rows::agent_columns!(),
            " FROM hub_agents WHERE namespace = $1 ORDER BY id"
        ))
        .bind(namespace)
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        rows.iter().map(rows::decode_agent).collect()
    }

    pub(super) async fn add_subscription(
        &self,
        namespace: &str,
        agent_id: &str,
        topic: &str,
        now: i64,
    ) -> Result<Subscription> {
        let mut tx = self.begin().await?;
        let known: Option<String> = sqlx::query_scalar("SELECT id FROM hub_agents WHERE namespace = $1 AND id = $2")
            .bind(namespace)
            .bind(agent_id)
            .fetch_optional(&mut *tx)
            .await?;
        if known.is_none() {
            return Err(HubError::AgentNotFound(agent_id.to_owned()));
        }
        let subscribed_at: i64 = sqlx::query_scalar(
            "INSERT INTO hub_subscriptions (namespace, topic, agent_id, subscribed_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (namespace, topic, agent_id) DO UPDATE SET subscribed_at = hub_subscriptions.subscribed_at \
             RETURNING subscribed_at",
        )
        .bind(namespace)
        .bind(topic)
        .bind(agent_id)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Subscription { agent_id: agent_id.to_owned(), topic: topic.to_owned(), subscribed_at })
    }

    pub(super) async fn remove_subscription(&self, namespace: &str, agent_id: &str, topic: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        for sql in [
            "DELETE FROM hub_subscriptions WHERE namespace = $1 AND agent_id = $2 AND topic = $3",
            "DELETE FROM hub_inbox WHERE namespace = $1 AND recipient = $2 AND kind = 'topic' AND topic = $3",
        ] {
            sqlx::query(sql).bind(namespace).bind(agent_id).bind(topic).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn list_subscriptions(
        &self,
        namespace: &str,
        agent_id: Option<&str>,
        topic: Option<&str>,
    ) -> Result<Vec<Subscription>> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT agent_id, topic, subscribed_at FROM hub_subscriptions WHERE namespace = $1 \
             AND ($2 = '' OR agent_id = $2) AND ($3 = '' OR topic = $3) ORDER BY topic, agent_id",
        )
        .bind(namespace)
        .bind(agent_id.unwrap_or_default())
        .bind(topic.unwrap_or_default())
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(agent_id, topic, subscribed_at)| Subscription { agent_id, topic, subscribed_at })
            .collect())
    }
}
