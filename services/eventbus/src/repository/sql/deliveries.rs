//! Deliveries: claims, acks, nacks, leases running out, replays, reads.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use chorus_runtime::{
    storage::{padded_len, placeholders},
    time::micros,
};
use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::{SqlEventRepository, head, load_handlers, participants, rows};
use crate::{
    domain::{
        Claim, ClaimRequest, Delivery, DeliveryId, DeliveryPage, DeliveryQuery, DeliveryState, Handler, Handlers, Nack,
        Replayed, Verdict, ancestors, settle, verdict,
    },
    error::{EventBusError, Result},
};

const UNFINISHED: &str = "state IN ('pending', 'in_flight', 'failed')";

/// The predicate of the partial index `eventbus_deliveries_unfinished`,
/// word for word: SQLite uses a partial index only for queries that repeat
/// its condition, and does not infer it from a narrower one.
const INDEXED: &str = "state IN ('pending', 'in_flight', 'failed', 'dead_lettered')";

/// Deliveries joined with their events.
macro_rules! joined {
    () => {
        concat!(
            "SELECT ",
            rows::delivery_columns!(),
            ", ",
            rows::event_columns!("e."),
            " FROM eventbus_deliveries d JOIN eventbus_events e ON e.namespace = d.namespace AND e.sequence = d.sequence"
        )
    };
}

macro_rules! with_events {
    ($where:expr) => {
        concat!(joined!(), " WHERE ", $where)
    };
}

impl SqlEventRepository {
    pub(super) async fn claim_deliveries(&self, request: &ClaimRequest) -> Result<Claim> {
        let ClaimRequest { namespace, handler: name, consumer_id, max_in_flight, now } = request;
        let now = *now;
        let mut tx = self.begin().await?;
        if self.postgres() {
            // A claim's commit need not wait for the disk: a lease lost in a
            // crash only means a redelivery, and what else a claim settles
            // (expired leases, skips) is derived again by the next one.
            sqlx::query("SELECT set_config('synchronous_commit', 'off', true)").execute(&mut *tx).await?;
        }
        let lock =
            format!("SELECT name FROM eventbus_handlers WHERE namespace = $1 AND name = $2{}", self.for_update());
        let found: Option<String> =
            sqlx::query_scalar(AssertSqlSafe(lock)).bind(namespace).bind(name).fetch_optional(&mut *tx).await?;
        if found.is_none() {
            return Err(EventBusError::HandlerNotFound(name.clone()));
        }
        let handlers = load_handlers(&mut tx, namespace).await?;
        let handler = &handlers[name];
        let held: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM eventbus_deliveries WHERE namespace = $1 AND handler = $2 AND {INDEXED} \
             AND state = 'in_flight' AND consumer_id = $3 AND visible_until > $4"
        )))
        .bind(namespace)
        .bind(name)
        .bind(consumer_id)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let mut capacity = i64::from(*max_in_flight) - held;
        let mut claim = Claim { waits_on: ancestors(&handlers, name), ..Claim::default() };
        if capacity <= 0 {
            tx.commit().await?;
            return Ok(claim);
        }
        self.expire_handler_leases(&mut tx, &handlers, namespace, name, now).await?;
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
            let siblings = match (claim.waits_on.is_empty(), sequences.first(), sequences.last()) {
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
                    Verdict::Wait => break 'scan,
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

    /// Counts the attempts whose lease ran out among a handler's in-flight
    /// deliveries as failed (the reaper does the same for every handler).
    async fn expire_handler_leases(
        &self,
        conn: &mut AnyConnection,
        handlers: &Handlers,
        namespace: &str,
        name: &str,
        now: i64,
    ) -> Result<()> {
        let expired: Vec<(i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT sequence, attempt FROM eventbus_deliveries WHERE namespace = $1 AND handler = $2 AND {INDEXED} \
             AND state = 'in_flight' AND visible_until <= $3 ORDER BY sequence{}",
            self.on_postgres(" FOR UPDATE SKIP LOCKED")
        )))
        .bind(namespace)
        .bind(name)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?;
        for (sequence, attempt) in expired {
            let id = DeliveryId { sequence, handler: name.to_owned() };
            let attempt = u32::try_from(attempt).unwrap_or(u32::MAX);
            self.fail_attempt(conn, handlers, namespace, &id, attempt, "lease expired", None, false, now).await?;
        }
        Ok(())
    }

    /// Records a failed attempt of an unfinished delivery: a retry after the
    /// backoff (or `retry_delay`), or the dead letter when attempts ran out
    /// (or `dead_letter`), skipping FAIL-policy dependents. Returns the new state.
    #[expect(clippy::too_many_arguments, reason = "one row's whole failure, from three callers")]
    async fn fail_attempt(
        &self,
        conn: &mut AnyConnection,
        handlers: &Handlers,
        namespace: &str,
        id: &DeliveryId,
        attempt: u32,
        error: &str,
        retry_delay: Option<Duration>,
        dead_letter: bool,
        now: i64,
    ) -> Result<DeliveryState> {
        let retry = handlers.get(&id.handler).map(|handler: &Handler| handler.retry);
        let dead = dead_letter || retry.is_none_or(|retry| attempt >= retry.max_attempts);
        if dead {
            sqlx::query(
                "UPDATE eventbus_deliveries SET state = 'dead_lettered', last_error = $4, visible_until = NULL, \
                 next_attempt_at = NULL, finished_at = $5, updated_at = $5 \
                 WHERE namespace = $1 AND sequence = $2 AND handler = $3",
            )
            .bind(namespace)
            .bind(id.sequence)
            .bind(&id.handler)
            .bind(error)
            .bind(now)
            .execute(&mut *conn)
            .await?;
            settle_event(conn, handlers, namespace, id.sequence, now).await?;
            return Ok(DeliveryState::DeadLettered);
        }
        let delay = retry_delay.unwrap_or_else(|| retry.map(|retry| retry.backoff(attempt)).unwrap_or_default());
        sqlx::query(
            "UPDATE eventbus_deliveries SET state = 'failed', last_error = $4, visible_until = NULL, \
             next_attempt_at = $5, updated_at = $6 WHERE namespace = $1 AND sequence = $2 AND handler = $3",
        )
        .bind(namespace)
        .bind(id.sequence)
        .bind(&id.handler)
        .bind(error)
        .bind(now + micros(delay))
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Ok(DeliveryState::Failed)
    }

    pub(super) async fn reclaim_deliveries(
        &self,
        namespace: &str,
        handler: &str,
        consumer_id: &str,
        after: Option<i64>,
        now: i64,
    ) -> Result<Vec<Delivery>> {
        let mut tx = self.begin().await?;
        let handlers = load_handlers(&mut tx, namespace).await?;
        let definition = handlers.get(handler).ok_or_else(|| EventBusError::HandlerNotFound(handler.to_owned()))?;
        let sequences: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
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
        let mut sequences = sequences;
        sequences.sort_unstable();
        let deliveries = deliveries_with_events(&mut tx, namespace, handler, &sequences).await?;
        tx.commit().await?;
        Ok(deliveries)
    }

    pub(super) async fn ack_deliveries(&self, namespace: &str, ids: &[DeliveryId], now: i64) -> Result<()> {
        let ids: BTreeSet<&DeliveryId> = ids.iter().collect();
        let mut tx = self.begin().await?;
        // One statement per handler, its sequences padded to a power of two
        // so that the statement's text (and plan) is reused.
        let mut by_handler: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for id in &ids {
            by_handler.entry(id.handler.as_str()).or_default().push(id.sequence);
        }
        let mut acked = Vec::with_capacity(ids.len());
        for (handler, sequences) in &by_handler {
            let bound = padded_len(sequences.len());
            let sql = format!(
                "UPDATE eventbus_deliveries SET state = 'acked', visible_until = NULL, next_attempt_at = NULL, \
                 finished_at = $2, updated_at = $2 WHERE namespace = $1 AND handler = $3 AND {UNFINISHED} \
                 AND sequence IN ({}) RETURNING sequence",
                placeholders(4, bound)
            );
            let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql)).bind(namespace).bind(now).bind(*handler);
            let last = sequences[sequences.len() - 1];
            for sequence in sequences.iter().copied().chain(std::iter::repeat(last)).take(bound) {
                query = query.bind(sequence);
            }
            acked.extend(query.fetch_all(&mut *tx).await?);
        }
        if acked.len() < ids.len() {
            // Some were not unfinished: already acked (fine), gone, or failed for good.
            for id in &ids {
                let state: Option<String> = sqlx::query_scalar(
                    "SELECT state FROM eventbus_deliveries WHERE namespace = $1 AND sequence = $2 AND handler = $3",
                )
                .bind(namespace)
                .bind(id.sequence)
                .bind(&id.handler)
                .fetch_optional(&mut *tx)
                .await?;
                let state: DeliveryState = match state {
                    None => return Err(EventBusError::DeliveryNotFound((*id).clone())),
                    Some(state) => state.parse().map_err(EventBusError::Corrupt)?,
                };
                if matches!(state, DeliveryState::Skipped | DeliveryState::DeadLettered) {
                    return Err(EventBusError::DeliveryFinished { id: (*id).clone(), state, action: "acked" });
                }
            }
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn nack_delivery(
        &self,
        namespace: &str,
        id: &DeliveryId,
        nack: Nack,
        now: i64,
    ) -> Result<Delivery> {
        let mut tx = self.begin().await?;
        let current = lock_delivery(&mut tx, namespace, id, self.for_update()).await?;
        match current.state {
            DeliveryState::InFlight => {}
            state @ (DeliveryState::Acked | DeliveryState::Skipped | DeliveryState::DeadLettered) => {
                return Err(EventBusError::DeliveryFinished { id: id.clone(), state, action: "nacked" });
            }
            state @ (DeliveryState::Pending | DeliveryState::Failed) => {
                return Err(EventBusError::NotInFlight { id: id.clone(), state, action: "nacked" });
            }
        }
        let handlers = load_handlers(&mut tx, namespace).await?;
        self.fail_attempt(
            &mut tx,
            &handlers,
            namespace,
            id,
            current.attempt,
            &nack.error,
            nack.retry_delay,
            nack.dead_letter,
            now,
        )
        .await?;
        let delivery = lock_delivery(&mut tx, namespace, id, "").await?;
        tx.commit().await?;
        Ok(delivery)
    }

    pub(super) async fn extend_delivery(
        &self,
        namespace: &str,
        id: &DeliveryId,
        extension: Option<Duration>,
        now: i64,
    ) -> Result<i64> {
        let mut tx = self.begin().await?;
        let current = lock_delivery(&mut tx, namespace, id, self.for_update()).await?;
        if current.state != DeliveryState::InFlight {
            return Err(EventBusError::NotInFlight { id: id.clone(), state: current.state, action: "extended" });
        }
        let extension = match extension {
            Some(extension) => extension,
            None => {
                let handlers = load_handlers(&mut tx, namespace).await?;
                handlers.get(&id.handler).map(|h| h.retry.visibility_timeout).unwrap_or_default()
            }
        };
        let until = now + micros(extension);
        sqlx::query(
            "UPDATE eventbus_deliveries SET visible_until = $4, updated_at = $5 \
             WHERE namespace = $1 AND sequence = $2 AND handler = $3",
        )
        .bind(namespace)
        .bind(id.sequence)
        .bind(&id.handler)
        .bind(until)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(until)
    }

    pub(super) async fn expire_leases(&self, now: i64, limit: u32) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let skip_locked = if self.postgres() { " FOR UPDATE SKIP LOCKED" } else { "" };
        let sql = format!(
            "SELECT namespace, sequence, handler, attempt FROM eventbus_deliveries \
             WHERE {INDEXED} AND state = 'in_flight' AND visible_until <= $1 ORDER BY visible_until \
             LIMIT $2{skip_locked}"
        );
        let expired = sqlx::query(AssertSqlSafe(sql)).bind(now).bind(i64::from(limit)).fetch_all(&mut *tx).await?;
        let mut namespaces = BTreeSet::new();
        let mut handlers_of = std::collections::BTreeMap::new();
        for row in &expired {
            let namespace: String = row.try_get("namespace")?;
            if !handlers_of.contains_key(&namespace) {
                handlers_of.insert(namespace.clone(), load_handlers(&mut tx, &namespace).await?);
            }
            let id = DeliveryId { sequence: row.try_get("sequence")?, handler: row.try_get("handler")? };
            let attempt = u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(u32::MAX);
            self.fail_attempt(
                &mut tx,
                &handlers_of[&namespace],
                &namespace,
                &id,
                attempt,
                "lease expired",
                None,
                false,
                now,
            )
            .await?;
            namespaces.insert(namespace);
        }
        tx.commit().await?;
        Ok(namespaces.into_iter().collect())
    }

    pub(super) async fn delivery(&self, namespace: &str, id: &DeliveryId) -> Result<Delivery> {
        let row = sqlx::query(with_events!("d.namespace = $1 AND d.sequence = $2 AND d.handler = $3"))
            .bind(namespace)
            .bind(id.sequence)
            .bind(&id.handler)
            .fetch_optional(self.db.pool())
            .await?
            .ok_or_else(|| EventBusError::DeliveryNotFound(id.clone()))?;
        rows::decode_delivery(&row, true)
    }

    pub(super) async fn deliveries(&self, query: &DeliveryQuery) -> Result<DeliveryPage> {
        let states = if query.states.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = query.states.iter().map(|state| format!("'{}'", state.as_str())).collect();
            format!(" AND d.state IN ({})", names.join(", "))
        };
        let sql = format!(
            "{} WHERE d.namespace = $1 AND ($2 = '' OR d.handler = $2) AND ($3 = 0 OR d.sequence = $3) \
             AND (d.sequence > $4 OR (d.sequence = $4 AND d.handler > $5)){states} \
             ORDER BY d.sequence, d.handler LIMIT $6",
            joined!()
        );
        let after = query.after.clone().unwrap_or(DeliveryId { sequence: 0, handler: String::new() });
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(&query.namespace)
            .bind(query.handler.as_deref().unwrap_or_default())
            .bind(query.sequence.unwrap_or(0))
            .bind(after.sequence)
            .bind(&after.handler)
            .bind(i64::from(query.limit))
            .fetch_all(self.db.pool())
            .await?;
        let deliveries =
            rows.iter().map(|row| rows::decode_delivery(row, query.include_events)).collect::<Result<Vec<_>>>()?;
        let next =
            (deliveries.len() >= query.limit as usize).then(|| deliveries.last().map(|d| d.id.clone())).flatten();
        Ok(DeliveryPage { deliveries, next })
    }

    pub(super) async fn replay_dead(
        &self,
        namespace: &str,
        handler: &str,
        ids: &[DeliveryId],
        rearm_skipped: bool,
        now: i64,
    ) -> Result<Replayed> {
        let mut tx = self.begin().await?;
        let handlers = load_handlers(&mut tx, namespace).await?;
        if !handlers.contains_key(handler) {
            return Err(EventBusError::HandlerNotFound(handler.to_owned()));
        }
        for id in ids {
            let current = lock_delivery(&mut tx, namespace, id, self.for_update()).await?;
            if id.handler != handler || current.state != DeliveryState::DeadLettered {
                return Err(EventBusError::NotDeadLettered { id: id.clone(), handler: handler.to_owned() });
            }
        }
        let sequences: Vec<i64> = match ids {
            [] => {
                sqlx::query_scalar(
                    "SELECT sequence FROM eventbus_deliveries WHERE namespace = $1 AND handler = $2 \
                 AND state = 'dead_lettered' ORDER BY sequence",
                )
                .bind(namespace)
                .bind(handler)
                .fetch_all(&mut *tx)
                .await?
            }
            ids => ids.iter().map(|id| id.sequence).collect(),
        };
        let mut replayed = Replayed::default();
        for sequence in sequences {
            rearm(&mut tx, namespace, sequence, handler, now).await?;
            replayed.replayed += 1;
            if rearm_skipped {
                let mut causes = vec![handler.to_owned()];
                while let Some(cause) = causes.pop() {
                    let rearmed: Vec<String> = sqlx::query_scalar(
                        "UPDATE eventbus_deliveries SET state = 'pending', attempt = 0, skip_handler = NULL, \
                         skip_message = NULL, finished_at = NULL, updated_at = $4 \
                         WHERE namespace = $1 AND sequence = $2 AND state = 'skipped' AND skip_handler = $3 \
                         RETURNING handler",
                    )
                    .bind(namespace)
                    .bind(sequence)
                    .bind(&cause)
                    .bind(now)
                    .fetch_all(&mut *tx)
                    .await?;
                    replayed.rearmed += rearmed.len() as u64;
                    causes.extend(rearmed);
                }
            }
        }
        tx.commit().await?;
        Ok(replayed)
    }

    pub(super) async fn replay_range(
        &self,
        namespace: &str,
        handler: &str,
        from: i64,
        to: Option<i64>,
        now: i64,
    ) -> Result<u64> {
        let mut tx = self.begin().await?;
        let handlers = load_handlers(&mut tx, namespace).await?;
        if !handlers.contains_key(handler) {
            return Err(EventBusError::HandlerNotFound(handler.to_owned()));
        }
        let last = match to {
            Some(to) => to,
            None => head(&mut tx, namespace).await?,
        };
        let reset = sqlx::query(
            "UPDATE eventbus_deliveries SET state = 'pending', attempt = 0, consumer_id = NULL, visible_until = NULL, \
             next_attempt_at = NULL, skip_handler = NULL, skip_message = NULL, finished_at = NULL, updated_at = $5 \
             WHERE namespace = $1 AND handler = $2 AND sequence >= $3 AND sequence <= $4",
        )
        .bind(namespace)
        .bind(handler)
        .bind(from)
        .bind(last)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let created = self.fan_out(&mut tx, namespace, Some(handler), from, last, now).await?;
        tx.commit().await?;
        Ok(reset.rows_affected() + created)
    }
}

/// Skips the deliveries of one event whose FAIL-policy dependencies failed.
async fn settle_event(
    conn: &mut AnyConnection,
    handlers: &Handlers,
    namespace: &str,
    sequence: i64,
    now: i64,
) -> Result<()> {
    let mut events = participants(conn, namespace, sequence, sequence).await?;
    let Some(participants) = events.get_mut(&sequence) else { return Ok(()) };
    for (handler, reason) in settle(handlers, participants) {
        sqlx::query(
            "UPDATE eventbus_deliveries SET state = 'skipped', skip_handler = $4, skip_message = $5, \
             visible_until = NULL, next_attempt_at = NULL, finished_at = $6, updated_at = $6 \
             WHERE namespace = $1 AND sequence = $2 AND handler = $3",
        )
        .bind(namespace)
        .bind(sequence)
        .bind(&handler)
        .bind(&reason.handler)
        .bind(&reason.message)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Moves one delivery back to pending with its attempts reset.
async fn rearm(conn: &mut AnyConnection, namespace: &str, sequence: i64, handler: &str, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE eventbus_deliveries SET state = 'pending', attempt = 0, consumer_id = NULL, visible_until = NULL, \
         next_attempt_at = NULL, finished_at = NULL, updated_at = $4 \
         WHERE namespace = $1 AND sequence = $2 AND handler = $3",
    )
    .bind(namespace)
    .bind(sequence)
    .bind(handler)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// One delivery without its event, locked with `lock` (`""` or ` FOR UPDATE`).
async fn lock_delivery(conn: &mut AnyConnection, namespace: &str, id: &DeliveryId, lock: &str) -> Result<Delivery> {
    let sql = format!(
        "SELECT {} FROM eventbus_deliveries d WHERE d.namespace = $1 AND d.sequence = $2 AND d.handler = $3{lock}",
        rows::delivery_columns!()
    );
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(namespace)
        .bind(id.sequence)
        .bind(&id.handler)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| EventBusError::DeliveryNotFound(id.clone()))?;
    rows::decode_delivery(&row, false)
}

/// The handler's deliveries of these events, with the events, in order (one
/// key range scan between the lowest and the highest, filtered here).
async fn deliveries_with_events(
    conn: &mut AnyConnection,
    namespace: &str,
    handler: &str,
    sequences: &[i64],
) -> Result<Vec<Delivery>> {
    let (Some(first), Some(last)) = (sequences.iter().min(), sequences.iter().max()) else {
        return Ok(Vec::new());
    };
    let wanted: BTreeSet<i64> = sequences.iter().copied().collect();
    let rows = sqlx::query(concat!(
        with_events!("d.namespace = $1 AND d.handler = $2 AND d.sequence >= $3 AND d.sequence <= $4"),
        " ORDER BY d.sequence"
    ))
    .bind(namespace)
    .bind(handler)
    .bind(*first)
    .bind(*last)
    .fetch_all(&mut *conn)
    .await?;
    let mut deliveries = Vec::with_capacity(wanted.len());
    for row in rows {
        let sequence: i64 = row.try_get("d_sequence")?;
        if wanted.contains(&sequence) {
            deliveries.push(rows::decode_delivery(&row, true)?);
        }
    }
    Ok(deliveries)
}
