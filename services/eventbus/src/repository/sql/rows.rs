//! Row decoding and the column lists that go with it.

use std::collections::BTreeMap;

use sqlx::{Row as _, any::AnyRow};

use crate::{
    domain::{Delivery, DeliveryId, DeliveryState, Event, Handler, Participant, Pattern, RetryPolicy, SkipReason},
    error::{EventBusError, Result},
};

macro_rules! event_columns {
    ($prefix:literal) => {
        concat!(
            $prefix,
            "namespace, ",
            $prefix,
            "sequence, ",
            $prefix,
            "type, ",
            $prefix,
            "source, ",
            $prefix,
            "subject, ",
            $prefix,
            "payload, ",
            $prefix,
            "content_type, ",
            $prefix,
            "attributes, ",
            $prefix,
            "idempotency_key, ",
            $prefix,
            "time, ",
            $prefix,
            "published_at"
        )
    };
}

macro_rules! delivery_columns {
    () => {
        "d.namespace AS d_namespace, d.sequence AS d_sequence, d.handler, d.state, d.attempt, d.consumer_id, \
         d.visible_until, d.next_attempt_at, d.last_error, d.skip_handler, d.skip_message, d.created_at, \
         d.updated_at, d.finished_at"
    };
}

macro_rules! handler_columns {
    () => {
        "namespace, name, event_types, after_handlers, failure_policy, max_attempts, initial_backoff_ms, \
         max_backoff_ms, visibility_timeout_ms, start_sequence, created_at, updated_at"
    };
}

pub(super) use {delivery_columns, event_columns, handler_columns};

fn corrupt(what: &str, error: impl std::fmt::Display) -> EventBusError {
    EventBusError::Corrupt(format!("{what}: {error}"))
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("strings and maps serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| corrupt(what, error))
}

fn millis(value: i64) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(value).unwrap_or_default())
}

pub(super) fn decode_event(row: &AnyRow) -> Result<Event> {
    let attributes: String = row.try_get("attributes")?;
    Ok(Event {
        namespace: row.try_get("namespace")?,
        sequence: row.try_get("sequence")?,
        event_type: row.try_get("type")?,
        source: row.try_get("source")?,
        subject: row.try_get("subject")?,
        payload: row.try_get("payload")?,
        content_type: row.try_get("content_type")?,
        attributes: from_json::<BTreeMap<String, String>>("event attributes", &attributes)?,
        idempotency_key: row.try_get("idempotency_key")?,
        time: row.try_get("time")?,
        published_at: row.try_get("published_at")?,
    })
}

pub(super) fn decode_handler(row: &AnyRow) -> Result<Handler> {
    let event_types: Vec<String> = from_json("handler event types", &row.try_get::<String, _>("event_types")?)?;
    let policy: String = row.try_get("failure_policy")?;
    Ok(Handler {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        event_types: event_types
            .iter()
            .map(|pattern| Pattern::parse("event_types", pattern).map_err(|error| corrupt("handler pattern", error)))
            .collect::<Result<_>>()?,
        after: from_json("handler after", &row.try_get::<String, _>("after_handlers")?)?,
        failure_policy: policy.parse().map_err(|error: String| corrupt("failure policy", error))?,
        retry: RetryPolicy {
            max_attempts: u32::try_from(row.try_get::<i64, _>("max_attempts")?).unwrap_or(1).max(1),
            initial_backoff: millis(row.try_get("initial_backoff_ms")?),
            max_backoff: millis(row.try_get("max_backoff_ms")?),
            visibility_timeout: millis(row.try_get("visibility_timeout_ms")?),
        },
        start_sequence: row.try_get("start_sequence")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn decode_state(row: &AnyRow) -> Result<DeliveryState> {
    let state: String = row.try_get("state")?;
    state.parse().map_err(|error: String| corrupt("delivery state", error))
}

/// A delivery row selected with [`delivery_columns`]; with its event when the
/// row also holds [`event_columns`] `("e.")` and `with_event`.
pub(super) fn decode_delivery(row: &AnyRow, with_event: bool) -> Result<Delivery> {
    let skip_handler: Option<String> = row.try_get("skip_handler")?;
    let skip_message: Option<String> = row.try_get("skip_message")?;
    let state = decode_state(row)?;
    let updated_at = row.try_get("updated_at")?;
    Ok(Delivery {
        namespace: row.try_get("d_namespace")?,
        id: DeliveryId { sequence: row.try_get("d_sequence")?, handler: row.try_get("handler")? },
        state,
        attempt: u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(u32::MAX),
        consumer_id: row.try_get("consumer_id")?,
        visible_until: row.try_get("visible_until")?,
        next_attempt_at: row.try_get("next_attempt_at")?,
        last_error: row.try_get("last_error")?,
        skip_reason: skip_handler.map(|handler| SkipReason { handler, message: skip_message.unwrap_or_default() }),
        created_at: row.try_get("created_at")?,
        updated_at,
        // A dead letter stays open (a replay may take it again); its last
        // update dead-lettered it.
        finished_at: match state {
            DeliveryState::DeadLettered => Some(updated_at),
            _ => row.try_get("finished_at")?,
        },
        event: if with_event { Some(decode_event(row)?) } else { None },
    })
}

/// A sibling row (`sequence, handler, state, last_error, skip_handler,
/// skip_message`) as readiness sees it.
pub(super) fn decode_participant(row: &AnyRow) -> Result<(i64, String, Participant)> {
    let state = decode_state(row)?;
    let last_error: Option<String> = row.try_get("last_error")?;
    let skip_handler: Option<String> = row.try_get("skip_handler")?;
    let reason = match (state, skip_handler) {
        (DeliveryState::Skipped, Some(handler)) => {
            let message: Option<String> = row.try_get("skip_message")?;
            format!("skipped: {handler} failed: {}", message.unwrap_or_default())
        }
        _ => last_error.unwrap_or_else(|| "dead-lettered".to_owned()),
    };
    Ok((row.try_get("sequence")?, row.try_get("handler")?, Participant { state, reason }))
}
