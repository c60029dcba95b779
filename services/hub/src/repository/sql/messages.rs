//! Messages: queueing into inboxes, leasing out of them, acks.

use std::collections::BTreeMap;

use chorus_runtime::{
    storage::{Backend, DbErrorKind, classify},
    time::micros,
};
use sqlx::{Any, AnyConnection, AssertSqlSafe, any::AnyArguments, query::Query};

pub(super) type AnyQuery<'q> = Query<'q, Any, AnyArguments>;

use super::{SqlHubRepository, Tx, placeholders, rows};
use crate::{
    domain::{
        Audience, HandOff, InboxFilter, Lease, MESSAGE_OVERHEAD_BYTES, Message, Outgoing, Queued, Selection, Sent,
        select,
    },
    error::{HubError, Result},
    repository::{Take, Taken},
};

impl SqlHubRepository {
    /// The next message sequence.
    pub(super) async fn next_sequence(&self, tx: &mut Tx) -> Result<i64> {
        let sql = if self.postgres() {
            "SELECT nextval('hub_message_sequence')"
        } else {
            "UPDATE hub_message_sequence SET value = value + 1 WHERE id = 1 RETURNING value"
        };
        Ok(sqlx::query_scalar(sql).fetch_one(&mut **tx).await?)
    }

    pub(super) async fn queue(
        &self,
        send: &Outgoing,
        hand_offs: &BTreeMap<String, HandOff>,
        max_queue_depth: u32,
        now: i64,
    ) -> Result<Queued> {
        match self.queue_once(send, hand_offs, max_queue_depth, now).await {
            // A concurrent send with the same idempotency key committed
            // first: this one is its duplicate, which a second pass finds.
            Err(HubError::Storage(error))
                if send.idempotency_key.is_some() && classify(&error) == DbErrorKind::UniqueViolation =>
            {
                self.queue_once(send, hand_offs, max_queue_depth, now).await
            }
            outcome => outcome,
        }
    }

    async fn queue_once(
        &self,
        send: &Outgoing,
        hand_offs: &BTreeMap<String, HandOff>,
        max_queue_depth: u32,
        now: i64,
    ) -> Result<Queued> {
        if self.postgres() {
            return self.queue_in_one_statement(send, hand_offs, max_queue_depth, now).await;
        }
        let mut tx = self.begin().await?;
        let namespace = &send.namespace;
        if let Some(key) = &send.idempotency_key {
            let sql =
                format!("SELECT {} FROM hub_messages WHERE namespace = $1 AND idempotency_key = $2", rows::EARLIER);
            let earlier = sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(key).fetch_optional(&mut *tx).await?;
            if let Some(row) = earlier {
                return Ok(Queued::duplicate(rows::decode_duplicate(&row, "", send)?));
            }
        }
        let recipients = self.recipients(&mut tx, send).await?;
        let leases = current_hand_offs(&mut tx, namespace, hand_offs, &recipients).await?;
        check_depth(&mut tx, namespace, &recipients, max_queue_depth, now).await?;
        let sequence = self.next_sequence(&mut tx).await?;
        let message_id = uuid::Uuid::now_v7().to_string();
        let expires_at = now.saturating_add(micros(send.ttl));
        let topic = send.topic();
        let insert = sqlx::query(
            "INSERT INTO hub_messages (namespace, id, sender, kind, topic, type, payload, content_type, \
             correlation_id, sent_at, expires_at, idempotency_key, sequence, recipients, audience) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        );
        bind_message(insert, send, &message_id, now, expires_at)
            .bind(sequence)
            .bind(i64::try_from(recipients.len()).unwrap_or(i64::MAX))
            .bind(send.audience_key())
            .execute(&mut *tx)
            .await?;
        // Each row's recipient and lease (consumer, deadline, hand-outs).
        for chunk in recipients.chunks(1000) {
            let values: Vec<String> = (0..chunk.len())
                .map(|n| {
                    let first = 10 + 4 * n;
                    format!(
                        "($1, ${first}, $2, $3, $4, $5, $6, $7, $8, $9, ${}, ${}, ${})",
                        first + 1,
                        first + 2,
                        first + 3
                    )
                })
                .collect();
            let sql = format!(
                "INSERT INTO hub_inbox (namespace, recipient, sequence, message_id, kind, sender, type, topic, \
                 correlation_id, expires_at, consumer_id, ack_deadline, attempt) VALUES {}",
                values.join(", ")
            );
            let mut query = sqlx::query(AssertSqlSafe(sql))
                .bind(namespace)
                .bind(sequence)
                .bind(&message_id)
                .bind(send.kind.as_str())
                .bind(&send.sender)
                .bind(&send.content.message_type)
                .bind(topic)
                .bind(&send.correlation_id)
                .bind(expires_at);
            for recipient in chunk {
                let lease = leases.get(recipient.as_str());
                query = query
                    .bind(recipient)
                    .bind(lease.map(|lease| lease.consumer_id.as_str()))
                    .bind(lease.map(|lease| lease.until))
                    .bind(i64::from(lease.is_some()));
            }
            query.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        let count = u32::try_from(recipients.len()).unwrap_or(u32::MAX);
        let sent = Sent { message_id, sequence, recipients: count, expires_at, duplicate: false };
        Ok(Queued { sent, handed_off: leases.into_keys().map(str::to_owned).collect(), recipients })
    }

    /// Who a send reaches; an unregistered single recipient is an error.
    async fn recipients(&self, tx: &mut Tx, send: &Outgoing) -> Result<Vec<String>> {
        let namespace = &send.namespace;
        let found: Vec<String> = match &send.audience {
            Audience::Topic(topic) => {
                sqlx::query_scalar(
                    "SELECT agent_id FROM hub_subscriptions WHERE namespace = $1 AND topic = $2 AND agent_id <> $3 \
                     ORDER BY agent_id",
                )
                .bind(namespace)
                .bind(topic)
                .bind(&send.sender)
                .fetch_all(&mut **tx)
                .await?
            }
            Audience::Agent(recipient) => {
                let known: Option<String> =
                    sqlx::query_scalar("SELECT id FROM hub_agents WHERE namespace = $1 AND id = $2")
                        .bind(namespace)
                        .bind(recipient)
                        .fetch_optional(&mut **tx)
                        .await?;
                vec![known.ok_or_else(|| HubError::AgentNotFound(recipient.clone()))?]
            }
            Audience::Everyone { agent_type } => {
                sqlx::query_scalar(
                    "SELECT id FROM hub_agents WHERE namespace = $1 AND id <> $2 AND ($3 = '' OR agent_type = $3) \
                     ORDER BY id",
                )
                .bind(namespace)
                .bind(&send.sender)
                .bind(agent_type.as_deref().unwrap_or_default())
                .fetch_all(&mut **tx)
                .await?
            }
        };
        Ok(found)
    }

    pub(super) async fn take_messages(&self, take: &Take) -> Result<Taken> {
        if self.postgres() && !take.require_all {
            return self.lease_in_one_statement(take).await.map(Taken::Messages);
        }
        let mut tx = self.begin_lease().await?;
        self.check_stream(&mut tx, take).await?;
        let mut max = take.max;
        if let Some(limit) = take.hold_limit {
            let held: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM hub_inbox WHERE namespace = $1 AND recipient = $2 AND consumer_id = $3 \
                 AND ack_deadline > $4 AND expires_at > $4",
            )
            .bind(&take.namespace)
            .bind(&take.agent_id)
            .bind(&take.lease.consumer_id)
            .bind(take.now)
            .fetch_one(&mut *tx)
            .await?;
            max = max.min(u32::try_from(i64::from(limit) - held).unwrap_or_default());
            if max == 0 {
                return Ok(Taken::Messages(Vec::new()));
            }
        }
        let filter = &take.filter;
        let conditions = filter_conditions(filter, 4);
        let scan = if take.require_all { 10_000 } else { i64::from(max) };
        let sql = format!(
            "SELECT {} FROM hub_inbox i JOIN hub_messages m ON m.namespace = i.namespace AND m.id = i.message_id \
             WHERE i.namespace = $1 AND i.recipient = $2 AND i.expires_at > $3 \
             AND (i.ack_deadline IS NULL OR i.ack_deadline <= $3){conditions} ORDER BY i.sequence LIMIT {scan}{}",
            rows::inbox_columns!(),
            self.db.on_postgres(" FOR UPDATE OF i SKIP LOCKED")
        );
        let query = sqlx::query(AssertSqlSafe(sql)).bind(&take.namespace).bind(&take.agent_id).bind(take.now);
        let query = bind_filter(query, filter);
        let available =
            query.fetch_all(&mut *tx).await?.iter().map(rows::decode_message).collect::<Result<Vec<_>>>()?;
        let chosen = match select(&available, filter, take.require_all, max as usize, take.max_bytes) {
            Selection::Missing(senders) => return Ok(Taken::Missing(senders)),
            Selection::Take(chosen) => chosen,
        };
        let mut messages: Vec<Message> =
            available.into_iter().filter(|message| chosen.contains(&message.sequence)).collect();
        lease(&mut tx, &take.namespace, &take.agent_id, &chosen, &take.lease).await?;
        for message in &mut messages {
            message.attempt += 1;
            message.ack_deadline = Some(take.lease.until);
        }
        tx.commit().await?;
        Ok(Taken::Messages(messages))
    }

    /// PostgreSQL: picks, leases and returns the next messages in one
    /// statement (one round trip, committed without waiting for the disk).
    /// A stream's take first shares the lock of its consumer's row, which
    /// opening a stream takes to replace the number: a stream opened before
    /// the take leaves another number, which leases nothing (and the take,
    /// finding nothing, says why); one opened after it waits for the take's
    /// commit and then sends its leases again.
    async fn lease_in_one_statement(&self, take: &Take) -> Result<Vec<Message>> {
        let held = match take.hold_limit {
            Some(_) => {
                "(SELECT COUNT(*) FROM hub_inbox h WHERE h.namespace = $1 AND h.recipient = $2 \
                 AND h.consumer_id = $4 AND h.ack_deadline > $3 AND h.expires_at > $3)"
            }
            None => "0",
        };
        let hold_limit = i64::from(take.hold_limit.unwrap_or(take.max));
        let conditions = filter_conditions(&take.filter, 10);
        let sql = format!(
            "WITH fence AS (SELECT stream FROM hub_consumers WHERE namespace = $1 AND agent_id = $2 \
             AND consumer_id = $4 FOR SHARE), \
             candidates AS (SELECT i.sequence, i.message_id FROM hub_inbox i WHERE i.namespace = $1 \
             AND i.recipient = $2 AND i.expires_at > $3 AND (i.ack_deadline IS NULL OR i.ack_deadline <= $3) \
             AND ($8 IS NULL OR NOT EXISTS (SELECT 1 FROM fence WHERE fence.stream <> $8)){conditions} \
             ORDER BY i.sequence LIMIT LEAST($6, GREATEST(0, $7 - {held})) FOR UPDATE SKIP LOCKED), \
             picked AS (SELECT sequence FROM (SELECT c.sequence, ROW_NUMBER() OVER (ORDER BY c.sequence) AS n, \
             SUM(octet_length(m.payload) + {MESSAGE_OVERHEAD_BYTES}) OVER (ORDER BY c.sequence) AS bytes \
             FROM candidates c JOIN hub_messages m ON m.namespace = $1 AND m.id = c.message_id) sized \
             WHERE n = 1 OR bytes <= $9), \
             relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) \
             UPDATE hub_inbox i SET consumer_id = $4, ack_deadline = $5, attempt = i.attempt + 1 \
             FROM picked, relaxed, hub_messages m \
             WHERE i.namespace = $1 AND i.recipient = $2 AND i.sequence = picked.sequence \
             AND m.namespace = i.namespace AND m.id = i.message_id RETURNING {}",
            rows::inbox_columns!()
        );
        let query = sqlx::query(AssertSqlSafe(sql))
            .bind(&take.namespace)
            .bind(&take.agent_id)
            .bind(take.now)
            .bind(&take.lease.consumer_id)
            .bind(take.lease.until)
            .bind(i64::from(take.max))
            .bind(hold_limit)
            .bind(take.stream)
            .bind(i64::try_from(take.max_bytes).unwrap_or(i64::MAX));
        let mut connection = self.db.acquire().await?;
        let rows = bind_filter(query, &take.filter).fetch_all(&mut *connection).await?;
        if rows.is_empty() {
            self.check_stream(&mut connection, take).await?;
        }
        let mut messages = rows.iter().map(rows::decode_message).collect::<Result<Vec<_>>>()?;
        messages.sort_by_key(|message| message.sequence);
        Ok(messages)
    }

    /// Removes the messages acked; returns those that were not in the inbox
    /// as of `now`: never there, acked before, or expired (not yet reaped,
    /// they go too).
    pub(super) async fn remove_acked(
        &self,
        namespace: &str,
        agent_id: &str,
        ids: &[String],
        now: i64,
    ) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // The ids as one JSON array: the same statement for any number. On
        // PostgreSQL its commit does not wait for the disk: an ack lost in a
        // database crash only hands its message out again (at least once).
        let sql = format!(
            "{}DELETE FROM hub_inbox{} WHERE namespace = $1 AND recipient = $2 AND message_id IN ({}) \
             RETURNING message_id, expires_at",
            self.db.on_postgres("WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)) "),
            self.db.on_postgres(" USING relaxed"),
            self.db.backend().json_elements("$3", "TEXT")
        );
        let query = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(agent_id)
            .bind(rows::to_json(&ids));
        let removed = query.fetch_all(&mut *self.db.acquire().await?).await?;
        let live: Vec<&str> =
            removed.iter().filter(|(_, expires_at)| *expires_at > now).map(|(id, _)| id.as_str()).collect();
        Ok(ids.iter().filter(|id| !live.contains(&id.as_str())).cloned().collect())
    }

    pub(super) async fn queued(&self, namespace: &str, recipient: &str, message_id: &str) -> Result<bool> {
        let found: Option<i64> = sqlx::query_scalar(
            "SELECT sequence FROM hub_inbox WHERE namespace = $1 AND message_id = $2 AND recipient = $3",
        )
        .bind(namespace)
        .bind(message_id)
        .bind(recipient)
        .fetch_optional(&mut *self.db.acquire().await?)
        .await?;
        Ok(found.is_some())
    }
}

/// Binds a message's own columns as `$1`–`$12`: namespace, id, sender, kind,
/// topic, type, payload, content type, correlation id, sent at, expires at,
/// idempotency key.
pub(super) fn bind_message<'q>(
    query: AnyQuery<'q>,
    send: &'q Outgoing,
    message_id: &'q str,
    now: i64,
    expires_at: i64,
) -> AnyQuery<'q> {
    query
        .bind(&send.namespace)
        .bind(message_id)
        .bind(&send.sender)
        .bind(send.kind.as_str())
        .bind(send.topic())
        .bind(&send.content.message_type)
        .bind(&send.content.payload)
        .bind(&send.content.content_type)
        .bind(&send.correlation_id)
        .bind(now)
        .bind(expires_at)
        .bind(&send.idempotency_key)
}

/// The leases of the hand-offs to recipients whose stream is still their
/// consumer's latest: one replaced meanwhile, in another process, takes
/// nothing more. One read, whatever the number of hand-offs (SQLite; the
/// PostgreSQL send checks in its own statement).
async fn current_hand_offs<'a>(
    tx: &mut Tx,
    namespace: &str,
    hand_offs: &'a BTreeMap<String, HandOff>,
    recipients: &[String],
) -> Result<BTreeMap<&'a str, &'a Lease>> {
    let offered: Vec<(&String, &HandOff)> =
        hand_offs.iter().filter(|(agent_id, _)| recipients.contains(agent_id)).collect();
    if offered.is_empty() {
        return Ok(BTreeMap::new());
    }
    let agents: Vec<&String> = offered.iter().map(|(agent_id, _)| *agent_id).collect();
    let sql = format!(
        "SELECT agent_id, consumer_id, stream FROM hub_consumers WHERE namespace = $1 AND agent_id IN ({})",
        Backend::Sqlite.json_elements("$2", "TEXT")
    );
    let streams: Vec<(String, String, i64)> =
        sqlx::query_as(AssertSqlSafe(sql)).bind(namespace).bind(rows::to_json(&agents)).fetch_all(&mut **tx).await?;
    let latest = |agent_id: &str, hand_off: &HandOff| {
        streams.iter().any(|(agent, consumer, stream)| {
            agent == agent_id && *consumer == hand_off.lease.consumer_id && *stream == hand_off.stream
        })
    };
    Ok(offered
        .into_iter()
        .filter(|(agent_id, hand_off)| latest(agent_id, hand_off))
        .map(|(agent_id, hand_off)| (agent_id.as_str(), &hand_off.lease))
        .collect())
}

/// The filter's conditions on the inbox row `i`, numbered from `$first`.
fn filter_conditions(filter: &InboxFilter, first: usize) -> String {
    let mut conditions = String::new();
    let mut next = first;
    for (column, count) in [
        ("sender", filter.senders.len()),
        ("type", filter.types.len()),
        ("kind", filter.kinds.len()),
        ("topic", filter.topics.len()),
    ] {
        if count > 0 {
            conditions.push_str(&format!(" AND i.{column} IN ({})", placeholders(next, count)));
            next += count;
        }
    }
    conditions
}

/// Binds the values of [`filter_conditions`], in its order.
fn bind_filter<'q>(mut query: AnyQuery<'q>, filter: &'q InboxFilter) -> AnyQuery<'q> {
    for value in filter.senders.iter().chain(&filter.types) {
        query = query.bind(value);
    }
    for kind in &filter.kinds {
        query = query.bind(kind.as_str());
    }
    for topic in &filter.topics {
        query = query.bind(topic);
    }
    query
}

/// Fails with `QueueFull` when any recipient's inbox already holds
/// `max_queue_depth` live messages. Concurrent sends do not wait for each
/// other here (that would serialize every publish to shared subscribers), so
/// under concurrency an inbox can pass the limit by at most the number of
/// sends in flight; nothing is ever dropped.
async fn check_depth(
    conn: &mut AnyConnection,
    namespace: &str,
    recipients: &[String],
    max_queue_depth: u32,
    now: i64,
) -> Result<()> {
    for chunk in recipients.chunks(500) {
        let sql = format!(
            "SELECT recipient FROM hub_inbox WHERE namespace = $1 AND expires_at > $2 AND recipient IN ({}) \
             GROUP BY recipient HAVING COUNT(*) >= $3 LIMIT 1",
            placeholders(4, chunk.len())
        );
        let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(now)
            .bind(i64::from(max_queue_depth));
        for recipient in chunk {
            query = query.bind(recipient);
        }
        if let Some(recipient) = query.fetch_optional(&mut *conn).await? {
            return Err(HubError::QueueFull { recipient, depth: max_queue_depth });
        }
    }
    Ok(())
}

/// Leases inbox rows to a consumer, counting the hand-out.
async fn lease(
    conn: &mut AnyConnection,
    namespace: &str,
    agent_id: &str,
    sequences: &[i64],
    lease: &Lease,
) -> Result<()> {
    for chunk in sequences.chunks(500) {
        let sql = format!(
            "UPDATE hub_inbox SET consumer_id = $3, ack_deadline = $4, attempt = attempt + 1 \
             WHERE namespace = $1 AND recipient = $2 AND sequence IN ({})",
            placeholders(5, chunk.len())
        );
        let mut query =
            sqlx::query(AssertSqlSafe(sql)).bind(namespace).bind(agent_id).bind(&lease.consumer_id).bind(lease.until);
        for sequence in chunk {
            query = query.bind(*sequence);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}
