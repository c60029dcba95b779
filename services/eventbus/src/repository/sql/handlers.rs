//! Handler registration and inspection.

use std::collections::BTreeMap;

use chorus_runtime::{time, validate::FieldViolation};
use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::{SqlEventRepository, deliveries::INDEXED, head, load_handlers, rows};
use crate::{
    domain::{DeliveryState, Handler, HandlerSpec, HandlerStats, HandlerView, Handlers, find_cycle, topological_order},
    error::{EventBusError, Result},
};

fn millis(duration: std::time::Duration) -> i64 {
    time::micros(duration) / 1_000
}

impl SqlEventRepository {
    pub(super) async fn register(&self, spec: HandlerSpec, now: i64) -> Result<Handler> {
        let mut tx = self.begin().await?;
        // Publishers hold this lock until they commit: the handler takes
        // exactly the events committed after `head`.
        let head = self.lock_head(&mut tx, &spec.namespace).await?;
        let mut handlers = load_handlers(&mut tx, &spec.namespace).await?;
        let existing = handlers.remove(&spec.name);
        if let Some(path) = find_cycle(&handlers, &spec.name, &spec.after) {
            return Err(EventBusError::Cycle { name: spec.name, path });
        }
        if let Some(after) = spec.start_after.filter(|&after| existing.is_none() && after > head) {
            return Err(EventBusError::InvalidArgument(FieldViolation::new(
                "start_after_sequence",
                format!(
                    "is {after}, past the last event of the log ({head}): a handler starts after an event there is"
                ),
            )));
        }
        let types: Vec<&str> = spec.event_types.iter().map(|pattern| pattern.as_str()).collect();
        let handler = Handler {
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            event_types: spec.event_types.clone(),
            after: spec.after.clone(),
            failure_policy: spec.failure_policy,
            retry: spec.retry,
            start_sequence: existing
                .as_ref()
                .map_or_else(|| spec.start_after.map_or(head, |after| after.max(0)) + 1, |h| h.start_sequence),
            created_at: existing.as_ref().map_or(now, |h| h.created_at),
            updated_at: now,
        };
        sqlx::query(
            "INSERT INTO eventbus_handlers (namespace, name, event_types, after_handlers, failure_policy, \
             max_attempts, initial_backoff_ms, max_backoff_ms, visibility_timeout_ms, start_sequence, created_at, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (namespace, name) DO UPDATE SET event_types = excluded.event_types, \
             after_handlers = excluded.after_handlers, failure_policy = excluded.failure_policy, \
             max_attempts = excluded.max_attempts, initial_backoff_ms = excluded.initial_backoff_ms, \
             max_backoff_ms = excluded.max_backoff_ms, visibility_timeout_ms = excluded.visibility_timeout_ms, \
             updated_at = excluded.updated_at",
        )
        .bind(&handler.namespace)
        .bind(&handler.name)
        .bind(rows::to_json(&types))
        .bind(rows::to_json(&handler.after))
        .bind(handler.failure_policy.as_str())
        .bind(i64::from(handler.retry.max_attempts))
        .bind(millis(handler.retry.initial_backoff))
        .bind(millis(handler.retry.max_backoff))
        .bind(millis(handler.retry.visibility_timeout))
        .bind(handler.start_sequence)
        .bind(handler.created_at)
        .bind(handler.updated_at)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM eventbus_handler_types WHERE namespace = $1 AND handler = $2")
            .bind(&handler.namespace)
            .bind(&handler.name)
            .execute(&mut *tx)
            .await?;
        let matchers: std::collections::BTreeSet<String> =
            handler.event_types.iter().map(|pattern| self.matcher(pattern)).collect();
        for matcher in matchers {
            sqlx::query("INSERT INTO eventbus_handler_types (namespace, handler, matcher) VALUES ($1, $2, $3)")
                .bind(&handler.namespace)
                .bind(&handler.name)
                .bind(matcher)
                .execute(&mut *tx)
                .await?;
        }
        if existing.is_none() && handler.start_sequence <= head {
            self.fan_out(&mut tx, &handler.namespace, Some(&handler.name), handler.start_sequence, head, now).await?;
        }
        tx.commit().await?;
        Ok(handler)
    }

    pub(super) async fn deregister(&self, namespace: &str, name: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let removed = sqlx::query("DELETE FROM eventbus_handlers WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if removed.rows_affected() == 0 {
            return Err(EventBusError::HandlerNotFound(name.to_owned()));
        }
        for table in ["eventbus_handler_types", "eventbus_deliveries", "eventbus_consumers"] {
            sqlx::query(AssertSqlSafe(format!("DELETE FROM {table} WHERE namespace = $1 AND handler = $2")))
                .bind(namespace)
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn handler_view(&self, namespace: &str, name: &str) -> Result<HandlerView> {
        let mut conn = self.db.read().await?;
        let handlers = load_handlers(&mut conn, namespace).await?;
        let handler = handlers.get(name).ok_or_else(|| EventBusError::HandlerNotFound(name.to_owned()))?;
        let mut stats = stats(&mut conn, namespace, Some(name)).await?;
        let head = head(&mut conn, namespace).await?;
        Ok(view(&handlers, handler, stats.remove(name).unwrap_or_default(), head))
    }

    pub(super) async fn handler_views(&self, namespace: &str) -> Result<Vec<HandlerView>> {
        let mut conn = self.db.read().await?;
        let handlers = load_handlers(&mut conn, namespace).await?;
        let mut stats = stats(&mut conn, namespace, None).await?;
        let head = head(&mut conn, namespace).await?;
        Ok(topological_order(&handlers)
            .iter()
            .map(|name| view(&handlers, &handlers[name], stats.remove(name).unwrap_or_default(), head))
            .collect())
    }
}

/// Counts of unfinished deliveries and the lowest open sequence, per handler.
#[derive(Debug, Default)]
struct Open {
    stats: HandlerStats,
    lowest_open: Option<i64>,
}

async fn stats(conn: &mut AnyConnection, namespace: &str, handler: Option<&str>) -> Result<BTreeMap<String, Open>> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT handler, state, COUNT(*) AS count, MIN(sequence) AS lowest FROM eventbus_deliveries \
         WHERE namespace = $1 AND ($2 = '' OR handler = $2) AND {INDEXED} GROUP BY handler, state"
    )))
    .bind(namespace)
    .bind(handler.unwrap_or_default())
    .fetch_all(&mut *conn)
    .await?;
    let mut open: BTreeMap<String, Open> = BTreeMap::new();
    for row in rows {
        let entry = open.entry(row.try_get("handler")?).or_default();
        let count = u64::try_from(row.try_get::<i64, _>("count")?).unwrap_or_default();
        let state: String = row.try_get("state")?;
        let state: DeliveryState = state.parse().map_err(EventBusError::Corrupt)?;
        match state {
            DeliveryState::Pending => entry.stats.pending = count,
            DeliveryState::InFlight => entry.stats.in_flight = count,
            DeliveryState::Failed => entry.stats.failed = count,
            DeliveryState::DeadLettered => entry.stats.dead_lettered = count,
            DeliveryState::Acked | DeliveryState::Skipped => {}
        }
        if !state.is_finished() {
            let lowest: i64 = row.try_get("lowest")?;
            entry.lowest_open = Some(entry.lowest_open.map_or(lowest, |l| l.min(lowest)));
        }
    }
    Ok(open)
}

fn view(handlers: &Handlers, handler: &Handler, open: Open, head: i64) -> HandlerView {
    let finished_through = open.lowest_open.map_or(head, |lowest| lowest - 1);
    HandlerView {
        unresolved_after: handler.after.iter().filter(|name| !handlers.contains_key(*name)).cloned().collect(),
        stats: HandlerStats { finished_through, lag: head - finished_through, ..open.stats },
        handler: handler.clone(),
    }
}
