//! Replays: dead letters back to pending (with the dependents skipped
//! because of them), and a handler's events again from a sequence.

use sqlx::{AnyConnection, AssertSqlSafe};

use super::{
    SqlEventRepository,
    deliveries::{INDEXED, lock_delivery},
    head, load_handlers,
};
use crate::{
    domain::{DeliveryId, DeliveryState, Replayed},
    error::{EventBusError, Result},
};

impl SqlEventRepository {
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
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT sequence FROM eventbus_deliveries WHERE namespace = $1 AND handler = $2 \
                     AND {INDEXED} AND state = 'dead_lettered' ORDER BY sequence"
                )))
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
