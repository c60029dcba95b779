//! Deliveries after their claim: acks, nacks, extensions, leases running
//! out, reads; and the helpers claims and replays share.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use chorus_runtime::{
    storage::{padded_len, placeholders},
    time::micros,
    validate::FieldViolation,
};
use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::{SqlEventRepository, load_handlers, participants, rows};
use crate::{
    domain::{
        Delivery, DeliveryId, DeliveryPage, DeliveryQuery, DeliveryState, Expired, Handler, Handlers, Nack, settle,
    },
    error::{EventBusError, Result},
};

pub(super) const UNFINISHED: &str = "state IN ('pending', 'in_flight', 'failed')";

/// The predicate of the partial index `eventbus_deliveries_open` (pending,
/// in flight, failed and dead-lettered deliveries), word for word: SQLite
/// uses a partial index only for queries that repeat its condition.
pub(super) const INDEXED: &str = "finished_at IS NULL";

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
    /// Records a failed attempt of an unfinished delivery: a retry after the
    /// backoff (or `retry_delay`), or the dead letter when attempts ran out
    /// (or `dead_letter`), skipping FAIL-policy dependents. Returns the new state.
    #[expect(clippy::too_many_arguments, reason = "one row's whole failure, from three callers")]
    pub(super) async fn fail_attempt(
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
                 next_attempt_at = NULL, updated_at = $5 \
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

    pub(super) async fn ack_deliveries(&self, namespace: &str, ids: &[DeliveryId], now: i64) -> Result<()> {
        let ids: BTreeSet<&DeliveryId> = ids.iter().collect();
        let mut tx = self.begin().await?;
        // One statement per handler, its sequences padded to a power of two
        // so that the statement's text (and plan) is reused. The range and
        // the open index's predicate keep the plan a range scan of that
        // index even while the table's statistics still say it is empty (a
        // new database, before its first ANALYZE).
        let mut by_handler: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for id in &ids {
            by_handler.entry(id.handler.as_str()).or_default().push(id.sequence);
        }
        let mut acked = Vec::with_capacity(ids.len());
        for (handler, sequences) in &by_handler {
            let bound = padded_len(sequences.len());
            let sql = format!(
                "UPDATE eventbus_deliveries SET state = 'acked', visible_until = NULL, next_attempt_at = NULL, \
                 finished_at = $2, updated_at = $2 WHERE namespace = $1 AND handler = $3 AND {INDEXED} \
                 AND {UNFINISHED} AND sequence >= $4 AND sequence <= $5 AND sequence IN ({}) RETURNING sequence",
                placeholders(6, bound)
            );
            let (first, last) = (sequences[0], sequences[sequences.len() - 1]);
            let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .bind(namespace)
                .bind(now)
                .bind(*handler)
                .bind(first)
                .bind(last);
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
        current_attempt(id, current.attempt, nack.attempt, "nacked")?;
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
        attempt: Option<u32>,
        now: i64,
    ) -> Result<i64> {
        let mut tx = self.begin().await?;
        let current = lock_delivery(&mut tx, namespace, id, self.for_update()).await?;
        if current.state != DeliveryState::InFlight {
            return Err(EventBusError::NotInFlight { id: id.clone(), state: current.state, action: "extended" });
        }
        current_attempt(id, current.attempt, attempt, "extended")?;
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

    pub(super) async fn expire_leases(&self, now: i64, limit: u32) -> Result<Expired> {
        let mut tx = self.begin().await?;
        let skip_locked = self.db.on_postgres(" FOR UPDATE SKIP LOCKED");
        let sql = format!(
            "SELECT namespace, sequence, handler, attempt FROM eventbus_deliveries \
             WHERE {INDEXED} AND state = 'in_flight' AND visible_until <= $1 ORDER BY visible_until \
             LIMIT $2{skip_locked}"
        );
        let expired = sqlx::query(AssertSqlSafe(sql)).bind(now).bind(i64::from(limit)).fetch_all(&mut *tx).await?;
        let mut namespaces = BTreeSet::new();
        let mut dead_lettered = 0;
        let mut handlers_of = std::collections::BTreeMap::new();
        for row in &expired {
            let namespace: String = row.try_get("namespace")?;
            if !handlers_of.contains_key(&namespace) {
                handlers_of.insert(namespace.clone(), load_handlers(&mut tx, &namespace).await?);
            }
            let id = DeliveryId { sequence: row.try_get("sequence")?, handler: row.try_get("handler")? };
            let attempt = u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(u32::MAX);
            let state = self
                .fail_attempt(
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
            dead_lettered += u64::from(state == DeliveryState::DeadLettered);
            namespaces.insert(namespace);
        }
        tx.commit().await?;
        Ok(Expired { namespaces: namespaces.into_iter().collect(), dead_lettered })
    }

    pub(super) async fn delivery(&self, namespace: &str, id: &DeliveryId) -> Result<Delivery> {
        let row = sqlx::query(with_events!("d.namespace = $1 AND d.sequence = $2 AND d.handler = $3"))
            .bind(namespace)
            .bind(id.sequence)
            .bind(&id.handler)
            .fetch_optional(&mut *self.db.read().await?)
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
            .fetch_all(&mut *self.db.read().await?)
            .await?;
        let deliveries =
            rows.iter().map(|row| rows::decode_delivery(row, query.include_events)).collect::<Result<Vec<_>>>()?;
        let next =
            (deliveries.len() >= query.limit as usize).then(|| deliveries.last().map(|d| d.id.clone())).flatten();
        Ok(DeliveryPage { deliveries, next })
    }
}

/// Skips the deliveries of one event whose FAIL-policy dependencies failed.
pub(super) async fn settle_event(
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

/// One delivery without its event, locked with `lock` (`""` or ` FOR UPDATE`).
pub(super) async fn lock_delivery(
    conn: &mut AnyConnection,
    namespace: &str,
    id: &DeliveryId,
    lock: &str,
) -> Result<Delivery> {
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

/// The handler's open (just leased) deliveries of these events, with the
/// events, in order: one range scan of the open index between the lowest
/// and the highest, filtered here.
pub(super) async fn deliveries_with_events(
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
        with_events!(
            "d.namespace = $1 AND d.handler = $2 AND d.finished_at IS NULL AND d.sequence >= $3 AND d.sequence <= $4"
        ),
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

/// Refuses a call about `asked`, an attempt that is not the delivery's
/// `current` one: an attempt that is over (its lease ran out, or it was
/// nacked) must not fail or extend the one after it, and one never made is
/// the caller's mistake.
fn current_attempt(id: &DeliveryId, current: u32, asked: Option<u32>, action: &'static str) -> Result<()> {
    match asked {
        Some(attempt) if attempt > current => Err(EventBusError::InvalidArgument(FieldViolation::new(
            "attempt",
            format!("delivery {id} is at attempt {current}; there is no attempt {attempt}"),
        ))),
        Some(attempt) if attempt != current => {
            Err(EventBusError::AttemptOver { id: id.clone(), attempt, current, action })
        }
        _ => Ok(()),
    }
}
