//! Delegations: a Delegate call waiting for the reply with its correlation
//! id, and the Reply that answers it.

use sqlx::{AssertSqlSafe, Row as _};

use super::SqlHubRepository;
use crate::{
    domain::{Content, Message, MessageKind},
    error::{HubError, Result},
};

impl SqlHubRepository {
    pub(super) async fn begin_delegation(
        &self,
        namespace: &str,
        correlation_id: &str,
        sender: &str,
        recipient: &str,
        expires_at: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO hub_delegations (namespace, correlation_id, sender, recipient, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(namespace)
        .bind(correlation_id)
        .bind(sender)
        .bind(recipient)
        .bind(expires_at)
        .execute(&mut *self.db.acquire().await?)
        .await?;
        Ok(())
    }

    pub(super) async fn answer(
        &self,
        namespace: &str,
        sender: &str,
        correlation_id: &str,
        content: Content,
        now: i64,
    ) -> Result<Message> {
        let mut tx = self.begin().await?;
        let sql = format!(
            "SELECT sender, recipient, reply_id, expires_at FROM hub_delegations \
             WHERE namespace = $1 AND correlation_id = $2{}",
            self.db.on_postgres(" FOR UPDATE")
        );
        let row = sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(correlation_id).fetch_optional(&mut *tx).await?;
        let Some(row) = row else { return Err(HubError::NoPendingRequest(correlation_id.to_owned())) };
        let recipient: String = row.try_get("recipient")?;
        if recipient != sender {
            return Err(HubError::NotTheRecipient { correlation_id: correlation_id.to_owned(), recipient });
        }
        let answered: Option<String> = row.try_get("reply_id")?;
        let expires_at: i64 = row.try_get("expires_at")?;
        if answered.is_some() || expires_at <= now {
            return Err(HubError::NoPendingRequest(correlation_id.to_owned()));
        }
        let sequence = self.next_sequence(&mut tx).await?;
        let reply = Message {
            id: uuid::Uuid::now_v7().to_string(),
            sequence,
            kind: MessageKind::Reply,
            sender: sender.to_owned(),
            recipient: row.try_get("sender")?,
            topic: None,
            content,
            correlation_id: Some(correlation_id.to_owned()),
            sent_at: now,
            expires_at,
            attempt: 0,
            ack_deadline: None,
        };
        sqlx::query(
            "UPDATE hub_delegations SET reply_id = $3, reply_sequence = $4, reply_type = $5, reply_payload = $6, \
             reply_content_type = $7, replied_at = $8 WHERE namespace = $1 AND correlation_id = $2",
        )
        .bind(namespace)
        .bind(correlation_id)
        .bind(&reply.id)
        .bind(sequence)
        .bind(&reply.content.message_type)
        .bind(&reply.content.payload)
        .bind(&reply.content.content_type)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        // The request is answered: it need not be handed out again.
        sqlx::query(
            "DELETE FROM hub_inbox WHERE namespace = $1 AND recipient = $2 AND kind = 'request' AND correlation_id = $3",
        )
        .bind(namespace)
        .bind(sender)
        .bind(correlation_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(reply)
    }

    pub(super) async fn reply_of(&self, namespace: &str, correlation_id: &str) -> Result<Option<Message>> {
        let row = sqlx::query(
            "SELECT sender, recipient, expires_at, reply_id, reply_sequence, reply_type, reply_payload, \
             reply_content_type, replied_at FROM hub_delegations \
             WHERE namespace = $1 AND correlation_id = $2 AND reply_id IS NOT NULL",
        )
        .bind(namespace)
        .bind(correlation_id)
        .fetch_optional(&mut *self.db.acquire().await?)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Message {
            id: row.try_get("reply_id")?,
            sequence: row.try_get("reply_sequence")?,
            kind: MessageKind::Reply,
            sender: row.try_get("recipient")?,
            recipient: row.try_get("sender")?,
            topic: None,
            content: Content {
                message_type: row.try_get("reply_type")?,
                payload: row.try_get("reply_payload")?,
                content_type: row.try_get("reply_content_type")?,
            },
            correlation_id: Some(correlation_id.to_owned()),
            sent_at: row.try_get("replied_at")?,
            expires_at: row.try_get("expires_at")?,
            attempt: 0,
            ack_deadline: None,
        }))
    }

    pub(super) async fn end_delegation(&self, namespace: &str, correlation_id: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let recipient: Option<String> = sqlx::query_scalar(
            "DELETE FROM hub_delegations WHERE namespace = $1 AND correlation_id = $2 RETURNING recipient",
        )
        .bind(namespace)
        .bind(correlation_id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(recipient) = recipient {
            sqlx::query(
                "DELETE FROM hub_inbox WHERE namespace = $1 AND recipient = $2 AND kind = 'request' \
                 AND correlation_id = $3",
            )
            .bind(namespace)
            .bind(recipient)
            .bind(correlation_id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
