//! Wire ↔ domain conversions. Input is validated here, field by field; the
//! domain never sees a proto type.

use std::{collections::BTreeMap, time::Duration};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use chorus_proto::eventbus as pb;
use chorus_runtime::{
    time::{timestamp, timestamp_micros},
    validate::{self, FieldViolation},
};

use crate::{
    config::EventBusConfig,
    domain::{
        Delivery, DeliveryId, DeliveryState, Event, EventType, FailurePolicy, HandlerView, NewEvent, Pattern,
        Published, RetryPolicy,
    },
};

type Checked<T> = Result<T, FieldViolation>;

/// Most events in one batch, deliveries in one ack.
pub(super) const MAX_BATCH: usize = 1000;
/// Longest handler name.
const MAX_HANDLER_NAME: usize = 128;
/// Most attributes on one event, and their longest key and value.
const MAX_ATTRIBUTES: usize = 64;
const MAX_ATTRIBUTE_KEY: usize = 128;
const MAX_ATTRIBUTE_VALUE: usize = 4096;
/// Longest source, subject, content type, idempotency key.
const MAX_TEXT: usize = 512;

// === Input ===

pub(super) fn handler_name(field: &str, value: &str) -> Checked<String> {
    let valid = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if value.is_empty() {
        return Err(FieldViolation::required(field));
    }
    if value.len() > MAX_HANDLER_NAME || !value.chars().all(valid) {
        return Err(FieldViolation::new(
            field,
            format!("must be 1-{MAX_HANDLER_NAME} characters of letters, digits, '.', '_' or '-'"),
        ));
    }
    Ok(value.to_owned())
}

fn text(field: &str, value: String, required: bool) -> Checked<String> {
    if required && value.is_empty() {
        return Err(FieldViolation::required(field));
    }
    if value.len() > MAX_TEXT {
        return Err(FieldViolation::new(field, format!("must be at most {MAX_TEXT} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(FieldViolation::new(field, "must not contain control characters"));
    }
    Ok(value)
}

pub(super) fn new_event(field: &str, value: Option<pb::NewEvent>, max_payload: usize) -> Checked<NewEvent> {
    let value = value.ok_or_else(|| FieldViolation::required(field))?;
    let at = |name: &str| format!("{field}.{name}");
    if value.payload.len() > max_payload {
        return Err(FieldViolation::new(at("payload"), format!("must be at most {max_payload} bytes")));
    }
    if value.attributes.len() > MAX_ATTRIBUTES {
        return Err(FieldViolation::new(at("attributes"), format!("at most {MAX_ATTRIBUTES} entries")));
    }
    for (key, attribute) in &value.attributes {
        if key.is_empty() || key.len() > MAX_ATTRIBUTE_KEY || attribute.len() > MAX_ATTRIBUTE_VALUE {
            return Err(FieldViolation::new(
                at("attributes"),
                format!("keys must be 1-{MAX_ATTRIBUTE_KEY} bytes and values at most {MAX_ATTRIBUTE_VALUE}"),
            ));
        }
    }
    let content_type = text(&at("content_type"), value.content_type, false)?;
    let content_type = if content_type.is_empty() { "application/json".to_owned() } else { content_type };
    validate::json_payload(&at("payload"), &content_type, &value.payload)?;
    Ok(NewEvent {
        event_type: EventType::parse(&at("type"), &value.r#type)?,
        source: text(&at("source"), value.source, true)?,
        subject: text(&at("subject"), value.subject, false)?,
        payload: value.payload,
        content_type,
        attributes: value.attributes.into_iter().collect::<BTreeMap<_, _>>(),
        idempotency_key: Some(text(&at("idempotency_key"), value.idempotency_key, false)?).filter(|k| !k.is_empty()),
        time: timestamp_micros(&at("time"), value.time)?,
    })
}

pub(super) fn patterns(field: &str, values: &[String]) -> Checked<Vec<Pattern>> {
    validate::filter_len(field, values.len())?;
    values.iter().enumerate().map(|(n, value)| Pattern::parse(&format!("{field}[{n}]"), value)).collect()
}

/// The longest failure kept from a nack: a delivery repeats it in every
/// answer that shows it (deliveries, dead letters, redeliveries).
const MAX_ERROR_BYTES: usize = 16 << 10;

/// A nack's failure as recorded: "nacked" when it gives none, its first
/// 16 KiB when it gives more (a stack trace, a whole response).
pub(super) fn failure(error: String) -> String {
    if error.is_empty() {
        return "nacked".to_owned();
    }
    if error.len() <= MAX_ERROR_BYTES {
        return error;
    }
    format!("{}… (cut from {} bytes)", &error[..error.floor_char_boundary(MAX_ERROR_BYTES)], error.len())
}

pub(super) fn failure_policy(value: i32) -> Checked<FailurePolicy> {
    match pb::FailurePolicy::try_from(value) {
        Ok(pb::FailurePolicy::Unspecified | pb::FailurePolicy::Fail) => Ok(FailurePolicy::Fail),
        Ok(pb::FailurePolicy::Ignore) => Ok(FailurePolicy::Ignore),
        Err(_) => Err(FieldViolation::new("failure_policy", format!("unknown value {value}"))),
    }
}

/// The longest a consumer may hold a delivery at once: one that died holds
/// it, and its handler's later deliveries, for as long. Longer work extends.
const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// A lease no longer than [`MAX_LEASE`].
pub(super) fn lease(field: &str, value: Duration) -> Checked<Duration> {
    if value > MAX_LEASE {
        let hours = MAX_LEASE.as_secs() / 3600;
        let reason = format!("must be at most {hours}h; a consumer that needs longer extends its lease");
        return Err(FieldViolation::new(field, reason));
    }
    Ok(value)
}

pub(super) fn retry_policy(value: Option<pb::RetryPolicy>, config: &EventBusConfig) -> Checked<RetryPolicy> {
    let defaults = config.default_retry();
    let Some(value) = value else { return Ok(defaults) };
    let policy = RetryPolicy {
        max_attempts: if value.max_attempts == 0 { defaults.max_attempts } else { value.max_attempts },
        initial_backoff: validate::nonzero_duration(
            "retry_policy.initial_backoff",
            value.initial_backoff,
            defaults.initial_backoff,
        )?,
        max_backoff: validate::nonzero_duration("retry_policy.max_backoff", value.max_backoff, defaults.max_backoff)?,
        visibility_timeout: lease(
            "retry_policy.visibility_timeout",
            validate::nonzero_duration(
                "retry_policy.visibility_timeout",
                value.visibility_timeout,
                defaults.visibility_timeout,
            )?,
        )?,
    };
    if policy.max_attempts > 1000 {
        return Err(FieldViolation::new("retry_policy.max_attempts", "must be at most 1000"));
    }
    if policy.max_backoff < policy.initial_backoff {
        return Err(FieldViolation::new("retry_policy.max_backoff", "must not be shorter than initial_backoff"));
    }
    Ok(policy)
}

pub(super) fn delivery_id(field: &str, value: &str) -> Checked<DeliveryId> {
    if value.is_empty() {
        return Err(FieldViolation::required(field));
    }
    let id: DeliveryId =
        value.parse().map_err(|()| FieldViolation::new(field, "is not a delivery id (`<sequence>:<handler>`)"))?;
    handler_name(field, &id.handler)?;
    Ok(id)
}

pub(super) fn delivery_ids(field: &str, values: &[String], required: bool) -> Checked<Vec<DeliveryId>> {
    if required && values.is_empty() {
        return Err(FieldViolation::required(field));
    }
    if values.len() > MAX_BATCH {
        return Err(FieldViolation::new(field, format!("at most {MAX_BATCH} per call")));
    }
    values.iter().enumerate().map(|(n, value)| delivery_id(&format!("{field}[{n}]"), value)).collect()
}

pub(super) fn delivery_state(field: &str, value: i32) -> Checked<DeliveryState> {
    match pb::DeliveryState::try_from(value) {
        Ok(pb::DeliveryState::Pending) => Ok(DeliveryState::Pending),
        Ok(pb::DeliveryState::InFlight) => Ok(DeliveryState::InFlight),
        Ok(pb::DeliveryState::Acked) => Ok(DeliveryState::Acked),
        Ok(pb::DeliveryState::Failed) => Ok(DeliveryState::Failed),
        Ok(pb::DeliveryState::Skipped) => Ok(DeliveryState::Skipped),
        Ok(pb::DeliveryState::DeadLettered) => Ok(DeliveryState::DeadLettered),
        Ok(pb::DeliveryState::Unspecified) | Err(_) => {
            Err(FieldViolation::new(field, format!("must be a delivery state, not {value}")))
        }
    }
}

/// A sequence from the wire, within what the database stores.
pub(super) fn sequence(field: &str, value: u64) -> Checked<i64> {
    i64::try_from(value).map_err(|_| FieldViolation::new(field, "is out of range"))
}

/// A page token: an opaque form of the last item's key.
pub(super) fn page_token(value: &str) -> String {
    URL_SAFE_NO_PAD.encode(value)
}

pub(super) fn parse_page_token(field: &str, value: &str) -> Checked<Option<String>> {
    if value.is_empty() {
        return Ok(None);
    }
    URL_SAFE_NO_PAD
        .decode(value)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .map(Some)
        .ok_or_else(|| FieldViolation::new(field, "is not a page token this service handed out"))
}

// === Output ===

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

pub(super) fn published(value: Published) -> pb::PublishResponse {
    pb::PublishResponse {
        sequence: unsigned(value.sequence),
        duplicate: value.duplicate,
        published_at: Some(timestamp(value.published_at)),
    }
}

pub(super) fn event(value: Event) -> pb::Event {
    pb::Event {
        namespace: value.namespace,
        sequence: unsigned(value.sequence),
        r#type: value.event_type,
        source: value.source,
        subject: value.subject,
        payload: value.payload,
        content_type: value.content_type,
        attributes: value.attributes.into_iter().collect(),
        idempotency_key: value.idempotency_key.unwrap_or_default(),
        time: Some(timestamp(value.time)),
        published_at: Some(timestamp(value.published_at)),
    }
}

fn failure_policy_out(value: FailurePolicy) -> pb::FailurePolicy {
    match value {
        FailurePolicy::Fail => pb::FailurePolicy::Fail,
        FailurePolicy::Ignore => pb::FailurePolicy::Ignore,
    }
}

fn duration_out(value: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(value).unwrap_or_default()
}

pub(super) fn handler(value: HandlerView) -> pb::Handler {
    let HandlerView { handler, unresolved_after, stats } = value;
    pb::Handler {
        namespace: handler.namespace,
        name: handler.name,
        event_types: handler.event_types.iter().map(|pattern| pattern.as_str().to_owned()).collect(),
        after: handler.after,
        failure_policy: failure_policy_out(handler.failure_policy).into(),
        retry_policy: Some(pb::RetryPolicy {
            max_attempts: handler.retry.max_attempts,
            initial_backoff: Some(duration_out(handler.retry.initial_backoff)),
            max_backoff: Some(duration_out(handler.retry.max_backoff)),
            visibility_timeout: Some(duration_out(handler.retry.visibility_timeout)),
        }),
        unresolved_after,
        start_sequence: unsigned(handler.start_sequence),
        stats: Some(pb::HandlerStats {
            finished_through_sequence: unsigned(stats.finished_through),
            lag: unsigned(stats.lag),
            pending: stats.pending,
            in_flight: stats.in_flight,
            failed: stats.failed,
            dead_lettered: stats.dead_lettered,
            consumers: stats.consumers,
        }),
        created_at: Some(timestamp(handler.created_at)),
        updated_at: Some(timestamp(handler.updated_at)),
    }
}

pub(super) fn delivery_state_out(value: DeliveryState) -> pb::DeliveryState {
    match value {
        DeliveryState::Pending => pb::DeliveryState::Pending,
        DeliveryState::InFlight => pb::DeliveryState::InFlight,
        DeliveryState::Acked => pb::DeliveryState::Acked,
        DeliveryState::Failed => pb::DeliveryState::Failed,
        DeliveryState::Skipped => pb::DeliveryState::Skipped,
        DeliveryState::DeadLettered => pb::DeliveryState::DeadLettered,
    }
}

pub(super) fn delivery(value: Delivery) -> pb::Delivery {
    let id = value.id.to_string();
    pb::Delivery {
        skip_reason: value.skip_reason.map(|reason| pb::SkipReason {
            delivery_id: DeliveryId { sequence: value.id.sequence, handler: reason.handler.clone() }.to_string(),
            handler: reason.handler,
            message: reason.message,
        }),
        id,
        handler: value.id.handler,
        sequence: unsigned(value.id.sequence),
        event: value.event.map(event),
        state: delivery_state_out(value.state).into(),
        attempt: value.attempt,
        consumer_id: value.consumer_id.unwrap_or_default(),
        visible_until: value.visible_until.map(timestamp),
        next_attempt_at: value.next_attempt_at.map(timestamp),
        last_error: value.last_error.unwrap_or_default(),
        created_at: Some(timestamp(value.created_at)),
        updated_at: Some(timestamp(value.updated_at)),
        finished_at: value.finished_at.map(timestamp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_failure_keeps_its_first_16_kib() {
        assert_eq!(failure(String::new()), "nacked");
        assert_eq!(failure("timeout".into()), "timeout");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let kept = failure(long.clone());
        assert!(kept.len() < MAX_ERROR_BYTES + 64, "{}", kept.len());
        assert!(kept.ends_with(&format!("… (cut from {} bytes)", long.len())), "{}", &kept[kept.len() - 40..]);
        assert!(long.starts_with(kept.trim_end_matches(&format!("… (cut from {} bytes)", long.len()))));
    }

    #[test]
    fn list_filters_are_bounded() {
        let many: Vec<String> = (0..=validate::MAX_FILTER_ENTRIES).map(|n| format!("type.{n}")).collect();
        let refused = patterns("event_types", &many).unwrap_err();
        assert_eq!(refused.field, "event_types");
        assert!(patterns("event_types", &many[1..]).is_ok());
    }

    #[test]
    fn events_are_checked_field_by_field() {
        let good = pb::NewEvent { r#type: "task.completed".into(), source: "test".into(), ..Default::default() };
        let event = new_event("event", Some(good.clone()), 10).unwrap();
        assert_eq!(event.content_type, "application/json");
        assert_eq!(event.idempotency_key, None);
        let cases = [
            (pb::NewEvent { r#type: String::new(), ..good.clone() }, "event.type"),
            (pb::NewEvent { source: String::new(), ..good.clone() }, "event.source"),
            (pb::NewEvent { payload: vec![0; 11], ..good.clone() }, "event.payload"),
            (pb::NewEvent { subject: "a\u{0}b".into(), ..good.clone() }, "event.subject"),
        ];
        for (bad, field) in cases {
            assert_eq!(new_event("event", Some(bad), 10).unwrap_err().field, field);
        }
        assert_eq!(new_event("event", None, 10).unwrap_err().field, "event");
    }

    #[test]
    fn handler_names_and_delivery_ids() {
        assert!(handler_name("name", "audit-logger.v2").is_ok());
        assert!(handler_name("name", "").is_err());
        assert!(handler_name("name", "a b").is_err());
        assert!(handler_name("name", &"a".repeat(129)).is_err());
        assert_eq!(delivery_id("id", "7:audit").unwrap(), DeliveryId { sequence: 7, handler: "audit".into() });
        assert!(delivery_id("id", "7:a b").is_err());
        assert!(delivery_ids("ids", &[], true).is_err());
    }

    #[test]
    fn retry_policies_take_defaults_and_reject_nonsense() {
        let config = EventBusConfig::default();
        assert_eq!(retry_policy(None, &config).unwrap(), config.default_retry());
        let inverted = pb::RetryPolicy {
            initial_backoff: Some(prost_types::Duration { seconds: 10, nanos: 0 }),
            max_backoff: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
            ..Default::default()
        };
        assert_eq!(retry_policy(Some(inverted), &config).unwrap_err().field, "retry_policy.max_backoff");
    }

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        assert_eq!(parse_page_token("t", &page_token("7:a")).unwrap().as_deref(), Some("7:a"));
        assert!(parse_page_token("t", "***").is_err());
        assert_eq!(parse_page_token("t", "").unwrap(), None);
    }
}
