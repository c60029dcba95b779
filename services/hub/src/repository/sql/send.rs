//! PostgreSQL: a send in one statement, committed on its own. The same
//! steps as the transaction SQLite runs (an earlier send with the key, the
//! recipients, the depth check, the message and its inbox rows), in one
//! round trip instead of seven: a send's latency is mostly round trips.

use std::collections::BTreeMap;

use chorus_runtime::time::micros;
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row as _};

use super::{SqlHubRepository, messages::bind_message, rows};
use crate::{
    domain::{Audience, HandOff, Outgoing, Queued, Sent},
    error::{HubError, Result},
};

/// A hand-off's lease, as the statement reads it.
#[derive(Serialize)]
struct LeaseRow<'a> {
    agent_id: &'a str,
    consumer_id: &'a str,
    until: i64,
    stream: i64,
}

impl SqlHubRepository {
    pub(super) async fn queue_in_one_statement(
        &self,
        send: &Outgoing,
        hand_offs: &BTreeMap<String, HandOff>,
        max_queue_depth: u32,
        now: i64,
    ) -> Result<Queued> {
        // Who the send reaches; the audience's own value, if any, is $16
        // ($15 is the audience as recorded).
        // Their rows stay locked until the send commits: an unsubscribe or a
        // deregistration waits for it, then drops what it queued; one that
        // committed first leaves its rows out, though this statement's
        // snapshot still holds them.
        let (recipients, audience) = match &send.audience {
            Audience::Topic(_) => (
                "SELECT agent_id AS recipient FROM hub_subscriptions WHERE namespace = $1 AND topic = $5 \
                 AND agent_id <> $3 FOR KEY SHARE",
                None,
            ),
            Audience::Agent(recipient) => (
                "SELECT id AS recipient FROM hub_agents WHERE namespace = $1 AND id = $16 FOR KEY SHARE",
                Some(recipient.as_str()),
            ),
            Audience::Everyone { agent_type } => (
                "SELECT id AS recipient FROM hub_agents WHERE namespace = $1 AND id <> $3 \
                 AND ($16 = '' OR agent_type = $16) FOR KEY SHARE",
                Some(agent_type.as_deref().unwrap_or_default()),
            ),
        };
        let sql = format!(
            "WITH recipients AS ({recipients}), \
             earlier AS (SELECT {earlier} FROM hub_messages WHERE namespace = $1 AND idempotency_key = $12), \
             too_full AS (SELECT i.recipient FROM hub_inbox i WHERE i.namespace = $1 AND i.expires_at > $10 \
               AND i.recipient IN (SELECT recipient FROM recipients) GROUP BY i.recipient HAVING COUNT(*) >= $13 \
               LIMIT 1), \
             next AS (SELECT nextval('hub_message_sequence') AS sequence WHERE NOT EXISTS (SELECT 1 FROM earlier) \
               AND NOT EXISTS (SELECT 1 FROM too_full) AND ({reached})), \
             message AS (INSERT INTO hub_messages (namespace, id, sequence, kind, sender, topic, type, payload, \
               content_type, correlation_id, sent_at, expires_at, idempotency_key, recipients, audience) \
               SELECT $1, $2, next.sequence, $4, $3, $5, $6, $7, $8, $9, $10, $11, $12, \
               (SELECT COUNT(*) FROM recipients), $15 FROM next RETURNING sequence), \
             current AS (SELECT l.agent_id, l.consumer_id, l.until \
               FROM jsonb_to_recordset(CAST($14 AS jsonb)) AS l(agent_id TEXT, consumer_id TEXT, until BIGINT, \
               stream BIGINT) JOIN hub_consumers c ON c.namespace = $1 AND c.agent_id = l.agent_id \
               AND c.consumer_id = l.consumer_id AND c.stream = l.stream FOR SHARE OF c), \
             queued AS (INSERT INTO hub_inbox (namespace, recipient, sequence, message_id, kind, sender, type, topic, \
               correlation_id, expires_at, consumer_id, ack_deadline, attempt) \
               SELECT $1, r.recipient, message.sequence, $2, $4, $3, $6, $5, $9, $11, l.consumer_id, l.until, \
               CASE WHEN l.consumer_id IS NULL THEN 0 ELSE 1 END \
               FROM message CROSS JOIN recipients r LEFT JOIN current l ON l.agent_id = r.recipient \
               RETURNING recipient, consumer_id) \
             SELECT (SELECT sequence FROM message) AS sequence, \
               CAST((SELECT json_agg(recipient ORDER BY recipient) FROM queued) AS TEXT) AS queued, \
               CAST((SELECT json_agg(recipient ORDER BY recipient) FROM queued WHERE consumer_id IS NOT NULL) \
               AS TEXT) AS handed_off, \
               (SELECT recipient FROM too_full) AS too_full, \
               earlier.id AS earlier_id, earlier.sequence AS earlier_sequence, \
               earlier.recipients AS earlier_recipients, earlier.expires_at AS earlier_expires_at, \
               earlier.kind AS earlier_kind, earlier.sender AS earlier_sender, earlier.topic AS earlier_topic, \
               earlier.type AS earlier_type, earlier.payload AS earlier_payload, \
               earlier.content_type AS earlier_content_type, earlier.correlation_id AS earlier_correlation_id, \
               earlier.audience AS earlier_audience \
             FROM (SELECT 1) AS one LEFT JOIN earlier ON TRUE",
            earlier = rows::EARLIER,
            // A direct message needs its recipient registered.
            reached =
                if matches!(send.audience, Audience::Agent(_)) { "EXISTS (SELECT 1 FROM recipients)" } else { "TRUE" },
        );
        let message_id = uuid::Uuid::now_v7().to_string();
        let expires_at = now.saturating_add(micros(send.ttl));
        let leases: Vec<LeaseRow<'_>> = hand_offs
            .iter()
            .map(|(agent_id, hand_off)| LeaseRow {
                agent_id,
                consumer_id: &hand_off.lease.consumer_id,
                until: hand_off.lease.until,
                stream: hand_off.stream,
            })
            .collect();
        let query = bind_message(sqlx::query(AssertSqlSafe(sql)), send, &message_id, now, expires_at)
            .bind(i64::from(max_queue_depth))
            .bind(rows::to_json(&leases))
            .bind(send.audience_key());
        let query = match audience {
            Some(value) => query.bind(value),
            None => query,
        };
        let row = query.fetch_one(&mut *self.db.acquire().await?).await?;
        if row.try_get::<Option<String>, _>("earlier_id")?.is_some() {
            return Ok(Queued::duplicate(rows::decode_duplicate(&row, "earlier_", send)?));
        }
        if let Some(recipient) = row.try_get::<Option<String>, _>("too_full")? {
            return Err(HubError::QueueFull { recipient, depth: max_queue_depth });
        }
        let sequence = match (row.try_get::<Option<i64>, _>("sequence")?, &send.audience) {
            (Some(sequence), _) => sequence,
            (None, Audience::Agent(recipient)) => return Err(HubError::AgentNotFound(recipient.clone())),
            (None, Audience::Topic(_) | Audience::Everyone { .. }) => {
                return Err(HubError::Corrupt("a send to a topic or everyone queued no message".into()));
            }
        };
        let names = |column: &str| -> Result<Vec<String>> {
            match row.try_get::<Option<String>, _>(column)? {
                Some(names) => rows::from_json("queued recipients", &names),
                None => Ok(Vec::new()),
            }
        };
        let (recipients, handed_off) = (names("queued")?, names("handed_off")?);
        let count = u32::try_from(recipients.len()).unwrap_or(u32::MAX);
        let sent = Sent { message_id, sequence, recipients: count, expires_at, duplicate: false };
        Ok(Queued { sent, recipients, handed_off })
    }
}
