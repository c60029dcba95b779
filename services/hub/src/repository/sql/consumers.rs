//! Consumers' inbox streams: a new stream of a consumer replaces its previous
//! one and takes back the leases the consumer still holds; a take by a
//! replaced stream leases nothing.

use sqlx::{AnyConnection, AssertSqlSafe};

use super::{SqlHubRepository, placeholders, rows};
use crate::{
    domain::{Lease, Message},
    error::{HubError, Result},
    repository::{OpenedStream, Take},
};

impl SqlHubRepository {
    pub(super) async fn open_consumer_stream(
        &self,
        namespace: &str,
        agent_id: &str,
        lease: &Lease,
        after: Option<i64>,
        now: i64,
    ) -> Result<OpenedStream> {
        let mut tx = self.begin().await?;
        // Drawn, not counted: a count would start again once the row went.
        // Replacing the number takes the row's lock, whose share every take
        // of a stream holds: the leases below include those of takes that
        // committed before, and takes after see the new number.
        let stream = uuid::Uuid::new_v4().as_u64_pair().0.cast_signed();
        sqlx::query(
            "INSERT INTO hub_consumers (namespace, agent_id, consumer_id, stream) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (namespace, agent_id, consumer_id) DO UPDATE SET stream = excluded.stream",
        )
        .bind(namespace)
        .bind(agent_id)
        .bind(&lease.consumer_id)
        .bind(stream)
        .execute(&mut *tx)
        .await?;
        let sequences: Vec<i64> = sqlx::query_scalar(
            "UPDATE hub_inbox SET ack_deadline = $4, attempt = attempt + 1 WHERE namespace = $1 AND recipient = $2 \
             AND consumer_id = $3 AND ack_deadline > $5 AND expires_at > $5 AND sequence > $6 RETURNING sequence",
        )
        .bind(namespace)
        .bind(agent_id)
        .bind(&lease.consumer_id)
        .bind(lease.until)
        .bind(now)
        .bind(after.unwrap_or(0))
        .fetch_all(&mut *tx)
        .await?;
        let mut resent: Vec<Message> = Vec::with_capacity(sequences.len());
        for chunk in sequences.chunks(500) {
            let sql = format!(
                "SELECT {} FROM hub_inbox i JOIN hub_messages m ON m.namespace = i.namespace AND m.id = i.message_id \
                 WHERE i.namespace = $1 AND i.recipient = $2 AND i.sequence IN ({}) ORDER BY i.sequence",
                rows::inbox_columns!(),
                placeholders(3, chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(agent_id);
            for sequence in chunk {
                query = query.bind(*sequence);
            }
            for row in query.fetch_all(&mut *tx).await? {
                resent.push(rows::decode_message(&row)?);
            }
        }
        // Everything the consumer holds now: what was just renewed, and what
        // it kept (at or below `after`).
        let held = sqlx::query_as(
            "SELECT message_id, ack_deadline FROM hub_inbox WHERE namespace = $1 AND recipient = $2 \
             AND consumer_id = $3 AND ack_deadline > $4 AND expires_at > $4 ORDER BY sequence",
        )
        .bind(namespace)
        .bind(agent_id)
        .bind(&lease.consumer_id)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        resent.sort_by_key(|message| message.sequence);
        Ok(OpenedStream { stream, resent, held })
    }

    pub(super) async fn close_consumer_stream(
        &self,
        namespace: &str,
        agent_id: &str,
        consumer_id: &str,
        stream: i64,
    ) -> Result<()> {
        sqlx::query(
            "DELETE FROM hub_consumers WHERE namespace = $1 AND agent_id = $2 AND consumer_id = $3 AND stream = $4",
        )
        .bind(namespace)
        .bind(agent_id)
        .bind(consumer_id)
        .bind(stream)
        .execute(&mut *self.db.acquire().await?)
        .await?;
        Ok(())
    }

    /// Fails with [`StreamSuperseded`](HubError::StreamSuperseded) when the
    /// take is a stream's and its consumer opened another since (no row: no
    /// stream of the consumer is open elsewhere). On PostgreSQL it shares
    /// the row's lock for the rest of a transaction, as
    /// `lease_in_one_statement` does.
    pub(super) async fn check_stream(&self, connection: &mut AnyConnection, take: &Take) -> Result<()> {
        let Some(stream) = take.stream else { return Ok(()) };
        let sql = format!(
            "SELECT stream FROM hub_consumers WHERE namespace = $1 AND agent_id = $2 AND consumer_id = $3{}",
            self.db.on_postgres(" FOR SHARE")
        );
        let latest: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(&take.namespace)
            .bind(&take.agent_id)
            .bind(&take.lease.consumer_id)
            .fetch_optional(&mut *connection)
            .await?;
        match latest {
            Some(latest) if latest != stream => Err(HubError::StreamSuperseded(take.lease.consumer_id.clone())),
            _ => Ok(()),
        }
    }
}
