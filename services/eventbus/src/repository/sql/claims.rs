//! Claims: a handler's next ready deliveries, leased to one consumer in
//! sequence order, and a consumer's new stream, which takes back the leases
//! the consumer still holds.

use chorus_runtime::time::micros;
use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::{
    SqlEventRepository,
    deliveries::{INDEXED, deliveries_with_events, settle_event},
    load_handlers, participants,
};
use crate::{
    domain::{Claim, ClaimRequest, DeliveryId, DeliveryState, Handlers, OpenedStream, Verdict, verdict},
    error::{EventBusError, Result},
};

impl SqlEventRepository {
    pub(super) async fn claim_deliveries(&self, request: &ClaimRequest) -> Result<Claim> {
        let ClaimRequest { namespace, handler: name, consumer_id, stream, max_in_flight, now } = request;
        let now = *now;
        if let Some(waits_on) = self.first_in_line_waits(namespace, name, now).await? {
            return Ok(Claim { waits_on, ..Claim::default() });
        }
        // A claim's commit need not wait for the disk: a lease lost in a crash
        // only means a redelivery, and what else a claim settles (expired
        // leases, skips) is derived again by the next one.
        let mut tx = self.db.begin_relaxed().await?;
        // The handler's lock, which opening a stream takes too: a stream
        // opened after this claim sees its leases, and one opened before it
        // left another number than this claim's (no row: no stream of the
        // consumer is open elsewhere). The number is read after the lock, in
        // a statement of its own: on PostgreSQL a statement that waited for
        // the lock still sees the rows it joins as they were before the wait,
        // and would miss a stream opened meanwhile.
        self.lock_handler(&mut tx, namespace, name).await?;
        let latest: Option<i64> = sqlx::query_scalar(
            "SELECT stream FROM eventbus_consumers WHERE namespace = $1 AND handler = $2 AND consumer_id = $3",
        )
        .bind(namespace)
        .bind(name)
        .bind(consumer_id)
        .fetch_optional(&mut *tx)
        .await?;
        if latest.is_some_and(|latest| latest != *stream) {
            return Err(EventBusError::StreamSuperseded(consumer_id.clone()));
        }
        let handlers = load_handlers(&mut tx, namespace).await?;
        let handler = &handlers[name];
        // One pass over the handler's leases: this consumer's live ones
        // count against its room; any that ran out are failed attempts first.
        let (held, expired): (Option<i64>, Option<i64>) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT SUM(CASE WHEN consumer_id = $3 AND visible_until > $4 THEN 1 ELSE 0 END), \
             SUM(CASE WHEN visible_until <= $4 THEN 1 ELSE 0 END) FROM eventbus_deliveries \
             WHERE namespace = $1 AND handler = $2 AND {INDEXED} AND state = 'in_flight'"
        )))
        .bind(namespace)
        .bind(name)
        .bind(consumer_id)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let mut capacity = i64::from(*max_in_flight) - held.unwrap_or_default();
        let mut claim = Claim::default();
        if capacity <= 0 {
            tx.commit().await?;
            return Ok(claim);
        }
        if expired.unwrap_or_default() > 0 {
            claim.dead_lettered = self.expire_handler_leases(&mut tx, &handlers, namespace, name, now).await?;
        }
        // Only pending and retrying deliveries are candidates; in-flight ones
        // neither go again nor hold the others back. Nothing is locked here:
        // the handler lock keeps other claims out, and the lease below only
        // takes rows still in the state they were read in.
        let mut leased = Vec::new();
        let mut after = 0;
        'scan: while capacity > 0 {
            let sql = format!(
                "SELECT sequence, state, next_attempt_at FROM eventbus_deliveries \
                 WHERE namespace = $1 AND handler = $2 AND {INDEXED} AND state IN ('pending', 'failed') \
                 AND sequence > $3 ORDER BY sequence LIMIT $4"
            );
            let rows = sqlx::query(AssertSqlSafe(sql))
                .bind(namespace)
                .bind(name)
                .bind(after)
                .bind(capacity)
                .fetch_all(&mut *tx)
                .await?;
            let full = rows.len() as i64 >= capacity;
            let sequences: Vec<i64> = rows.iter().map(|row| row.try_get("sequence")).collect::<Result<_, _>>()?;
            let siblings = match (handler.after.is_empty(), sequences.first(), sequences.last()) {
                (false, Some(first), Some(last)) => participants(&mut tx, namespace, *first, *last).await?,
                _ => Default::default(),
            };
            for row in &rows {
                let sequence: i64 = row.try_get("sequence")?;
                after = sequence;
                if let Some(due) = row.try_get::<Option<i64>, _>("next_attempt_at")?
                    && due > now
                {
                    claim.next_due = Some(due);
                    break 'scan;
                }
                let ready = match siblings.get(&sequence) {
                    Some(participants) => verdict(&handlers, name, participants),
                    None => Verdict::Ready,
                };
                match ready {
                    Verdict::Ready => {
                        leased.push(sequence);
                        capacity -= 1;
                        if capacity == 0 {
                            break 'scan;
                        }
                    }
                    Verdict::Wait(dependencies) => {
                        claim.waits_on = dependencies;
                        break 'scan;
                    }
                    Verdict::Skip(_) => settle_event(&mut tx, &handlers, namespace, sequence, now).await?,
                }
            }
            if !full {
                break;
            }
        }
        if let (Some(first), Some(last)) = (leased.first(), leased.last()) {
            // Between the first and the last chosen, every row still pending
            // or due is chosen: the scan stopped at the first that was not.
            let visible_until = now + micros(handler.retry.visibility_timeout);
            let taken: Vec<i64> = sqlx::query_scalar(
                "UPDATE eventbus_deliveries SET state = 'in_flight', attempt = attempt + 1, consumer_id = $3, \
                 visible_until = $4, next_attempt_at = NULL, updated_at = $5 \
                 WHERE namespace = $1 AND handler = $2 AND sequence >= $6 AND sequence <= $7 \
                 AND (state = 'pending' OR (state = 'failed' AND next_attempt_at <= $5)) RETURNING sequence",
            )
            .bind(namespace)
            .bind(name)
            .bind(consumer_id)
            .bind(visible_until)
            .bind(now)
            .bind(*first)
            .bind(*last)
            .fetch_all(&mut *tx)
            .await?;
            // What an ack, a replay or a skip changed meanwhile is not leased.
            claim.deliveries = deliveries_with_events(&mut tx, namespace, name, &taken).await?;
        }
        tx.commit().await?;
        Ok(claim)
    }

    /// The dependencies the first delivery in the handler's line waits for,
    /// when it waits, so a claim would lease nothing: a read, where a claim
    /// writes under the handler's lock. `None`: claim (also when a lease in
    /// the line ran out, which the claim settles).
    async fn first_in_line_waits(&self, namespace: &str, name: &str, now: i64) -> Result<Option<Vec<String>>> {
        let mut conn = self.db.read().await?;
        let handlers = load_handlers(&mut conn, namespace).await?;
        if handlers.get(name).is_none_or(|handler| handler.after.is_empty()) {
            return Ok(None);
        }
        let first: Option<(i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT sequence, state FROM eventbus_deliveries WHERE namespace = $1 AND handler = $2 AND {INDEXED} \
             AND (state IN ('pending', 'failed') OR (state = 'in_flight' AND visible_until <= $3)) \
             ORDER BY sequence LIMIT 1"
        )))
        .bind(namespace)
        .bind(name)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        let Some((sequence, _)) = first.filter(|(_, state)| state != DeliveryState::InFlight.as_str()) else {
            return Ok(None);
        };
        let participants = participants(&mut conn, namespace, sequence, sequence).await?;
        Ok(participants.get(&sequence).and_then(|event| match verdict(&handlers, name, event) {
            Verdict::Wait(dependencies) => Some(dependencies),
            Verdict::Ready | Verdict::Skip(_) => None,
        }))
    }

    /// Counts the attempts whose lease ran out among a handler's in-flight
    /// deliveries as failed (the reaper does the same for every handler).
    async fn expire_handler_leases(
        &self,
        conn: &mut AnyConnection,
        handlers: &Handlers,
        namespace: &str,
        name: &str,
        now: i64,
    ) -> Result<u64> {
        let expired: Vec<(i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT sequence, attempt FROM eventbus_deliveries WHERE namespace = $1 AND handler = $2 AND {INDEXED} \
             AND state = 'in_flight' AND visible_until <= $3 ORDER BY sequence{}",
            self.db.on_postgres(" FOR UPDATE SKIP LOCKED")
        )))
        .bind(namespace)
        .bind(name)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        let mut dead_lettered = 0;
        for (sequence, attempt) in expired {
            let id = DeliveryId { sequence, handler: name.to_owned() };
            let attempt = u32::try_from(attempt).unwrap_or(u32::MAX);
            let state =
                self.fail_attempt(conn, handlers, namespace, &id, attempt, "lease expired", None, false, now).await?;
            dead_lettered += u64::from(state == DeliveryState::DeadLettered);
        }
        Ok(dead_lettered)
    }

    pub(super) async fn open_consumer_stream(
        &self,
        namespace: &str,
        handler: &str,
        consumer_id: &str,
        after: Option<i64>,
        now: i64,
    ) -> Result<OpenedStream> {
        let mut tx = self.begin().await?;
        // The handler's lock, which every claim takes first.
        self.lock_handler(&mut tx, namespace, handler).await?;
        let handlers = load_handlers(&mut tx, namespace).await?;
        let definition = &handlers[handler];
        // Drawn, not counted: a count would start again once the row went.
        let stream = uuid::Uuid::new_v4().as_u64_pair().0.cast_signed();
        sqlx::query(
            "INSERT INTO eventbus_consumers (namespace, handler, consumer_id, stream) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (namespace, handler, consumer_id) DO UPDATE SET stream = excluded.stream",
        )
        .bind(namespace)
        .bind(handler)
        .bind(consumer_id)
        .bind(stream)
        .execute(&mut *tx)
        .await?;
        let mut sequences: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE eventbus_deliveries SET visible_until = $5, updated_at = $6 WHERE namespace = $1 AND handler = $2 \
             AND {INDEXED} AND consumer_id = $3 AND state = 'in_flight' AND sequence > $4 AND visible_until > $6 \
             RETURNING sequence"
        )))
        .bind(namespace)
        .bind(handler)
        .bind(consumer_id)
        .bind(after.unwrap_or(0))
        .bind(now + micros(definition.retry.visibility_timeout))
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        sequences.sort_unstable();
        let resent = deliveries_with_events(&mut tx, namespace, handler, &sequences).await?;
        tx.commit().await?;
        Ok(OpenedStream { stream, resent })
    }

    /// Locks handler `name` for the rest of the transaction (on SQLite, the
    /// one writer is the lock); [`HandlerNotFound`](EventBusError::HandlerNotFound)
    /// when there is none.
    async fn lock_handler(&self, tx: &mut AnyConnection, namespace: &str, name: &str) -> Result<()> {
        let lock =
            format!("SELECT name FROM eventbus_handlers WHERE namespace = $1 AND name = $2{}", self.for_update());
        let found = sqlx::query(AssertSqlSafe(lock)).bind(namespace).bind(name).fetch_optional(&mut *tx).await?;
        found.map(drop).ok_or_else(|| EventBusError::HandlerNotFound(name.to_owned()))
    }

    pub(super) async fn close_consumer_stream(
        &self,
        namespace: &str,
        handler: &str,
        consumer_id: &str,
        stream: i64,
    ) -> Result<()> {
        sqlx::query(
            "DELETE FROM eventbus_consumers WHERE namespace = $1 AND handler = $2 AND consumer_id = $3 AND stream = $4",
        )
        .bind(namespace)
        .bind(handler)
        .bind(consumer_id)
        .bind(stream)
        .execute(&mut *self.db.acquire().await?)
        .await?;
        Ok(())
    }
}
