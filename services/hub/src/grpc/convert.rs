//! Wire ↔ domain conversions. Input is validated here, field by field; the
//! domain never sees a proto type.

use std::{collections::BTreeMap, time::Duration};

use chorus_proto::hub as pb;
use chorus_runtime::{
    time::timestamp,
    validate::{self, FieldViolation},
};

use crate::{
    config::HubConfig,
    domain::{Agent, AgentStatus, Content, DiscoveryMode, Message, MessageKind, StateChangeKind, StateEntry},
    repository::Subscription,
};

type Checked<T> = Result<T, FieldViolation>;

/// Longest message type, topic, key, capability, agent type.
const MAX_NAME: usize = 256;
/// Most capabilities and metadata entries of one agent.
const MAX_ENTRIES: usize = 64;
/// Longest agent card.
const MAX_CARD: usize = 64 * 1024;

// === Input ===

/// A short printable name (type, topic, key, capability): 1..256 bytes.
pub(super) fn name(field: &str, value: &str) -> Checked<String> {
    if value.is_empty() {
        return Err(FieldViolation::required(field));
    }
    if value.len() > MAX_NAME || value.chars().any(char::is_control) {
        return Err(FieldViolation::new(field, format!("must be 1-{MAX_NAME} bytes without control characters")));
    }
    Ok(value.to_owned())
}

pub(super) fn optional_name(field: &str, value: &str) -> Checked<Option<String>> {
    if value.is_empty() { Ok(None) } else { name(field, value).map(Some) }
}

pub(super) fn names(field: &str, values: &[String]) -> Checked<Vec<String>> {
    if values.len() > MAX_ENTRIES * 16 {
        return Err(FieldViolation::new(field, "too many entries"));
    }
    values.iter().enumerate().map(|(n, value)| name(&format!("{field}[{n}]"), value)).collect()
}

pub(super) fn agent_ids(field: &str, values: &[String]) -> Checked<Vec<String>> {
    values.iter().enumerate().map(|(n, value)| validate::id(&format!("{field}[{n}]"), value)).collect()
}

pub(super) fn content(field: &str, value: Option<pb::Content>, config: &HubConfig) -> Checked<Content> {
    let value = value.ok_or_else(|| FieldViolation::required(field))?;
    if value.payload.len() > config.max_payload_bytes {
        return Err(FieldViolation::new(
            format!("{field}.payload"),
            format!("must be at most {} bytes", config.max_payload_bytes),
        ));
    }
    let content_type = content_type(&format!("{field}.content_type"), value.content_type)?;
    validate::json_payload(&format!("{field}.payload"), &content_type, &value.payload)?;
    Ok(Content { message_type: name(&format!("{field}.type"), &value.r#type)?, payload: value.payload, content_type })
}

pub(super) fn content_type(field: &str, value: String) -> Checked<String> {
    if value.is_empty() {
        return Ok("application/json".to_owned());
    }
    name(field, &value)
}

/// A TTL: the default when unset, at most the configured maximum.
pub(super) fn ttl(field: &str, value: Option<prost_types::Duration>, config: &HubConfig) -> Checked<Duration> {
    let ttl = validate::duration(field, value, config.default_ttl())?;
    let ttl = if ttl.is_zero() { config.default_ttl() } else { ttl };
    if ttl > config.max_ttl() {
        return Err(FieldViolation::new(field, format!("must be at most {} s", config.max_ttl().as_secs())));
    }
    Ok(ttl)
}

/// A state TTL: unset or zero means none (a message's zero TTL means the
/// default one; a key's default is to live for ever).
pub(super) fn state_ttl(value: Option<prost_types::Duration>, config: &HubConfig) -> Checked<Option<Duration>> {
    let value = value.filter(|value| value.seconds != 0 || value.nanos != 0);
    value.map(|value| ttl("ttl", Some(value), config)).transpose()
}

/// How long a consumer holds what it took before it is handed out again:
/// the default when unset, at most `max_ttl` (a lease cannot outlive its
/// message, and a consumer that died would hide it for as long).
pub(super) fn ack_timeout(value: Option<prost_types::Duration>, config: &HubConfig) -> Checked<Duration> {
    let timeout = validate::nonzero_duration("ack_timeout", value, config.default_ack_timeout())?;
    if timeout > config.max_ttl() {
        let message =
            format!("must be at most {:?} (hub.max_ttl_ms): a lease cannot outlive its message", config.max_ttl());
        return Err(FieldViolation::new("ack_timeout", message));
    }
    Ok(timeout)
}

pub(super) fn optional_text(field: &str, value: String) -> Checked<Option<String>> {
    if value.is_empty() { Ok(None) } else { name(field, &value).map(Some) }
}

pub(super) fn kinds(field: &str, values: &[i32]) -> Checked<Vec<MessageKind>> {
    validate::filter_len(field, values.len())?;
    values
        .iter()
        .enumerate()
        .map(|(n, value)| match pb::message::Kind::try_from(*value) {
            Ok(pb::message::Kind::Topic) => Ok(MessageKind::Topic),
            Ok(pb::message::Kind::Direct) => Ok(MessageKind::Direct),
            Ok(pb::message::Kind::Broadcast) => Ok(MessageKind::Broadcast),
            Ok(pb::message::Kind::Request) => Ok(MessageKind::Request),
            Ok(pb::message::Kind::Reply | pb::message::Kind::Unspecified) | Err(_) => {
                Err(FieldViolation::new(format!("{field}[{n}]"), "must be TOPIC, DIRECT, BROADCAST or REQUEST"))
            }
        })
        .collect()
}

pub(super) fn version(field: &str, value: u64) -> Checked<i64> {
    i64::try_from(value).map_err(|_| FieldViolation::new(field, "is out of range"))
}

pub(super) fn agent(value: pb::RegisterAgentRequest, namespace: String) -> Checked<Agent> {
    if value.capabilities.len() > MAX_ENTRIES || value.metadata.len() > MAX_ENTRIES {
        return Err(FieldViolation::new(
            "capabilities",
            format!("at most {MAX_ENTRIES} capabilities and metadata entries"),
        ));
    }
    let agent_card = if value.agent_card_json.is_empty() {
        None
    } else {
        if value.agent_card_json.len() > MAX_CARD {
            return Err(FieldViolation::new("agent_card_json", format!("must be at most {MAX_CARD} bytes")));
        }
        let parsed: serde_json::Value = serde_json::from_str(&value.agent_card_json)
            .map_err(|error| FieldViolation::new("agent_card_json", format!("is not JSON: {error}")))?;
        if !parsed.is_object() {
            return Err(FieldViolation::new("agent_card_json", "must be a JSON object"));
        }
        Some(value.agent_card_json)
    };
    for (key, entry) in &value.metadata {
        name("metadata", key)?;
        if entry.len() > MAX_NAME * 16 {
            return Err(FieldViolation::new("metadata", "values must be at most 4096 bytes"));
        }
    }
    Ok(Agent {
        namespace,
        id: validate::id("agent_id", &value.agent_id)?,
        agent_type: name("agent_type", &value.agent_type)?,
        capabilities: names("capabilities", &value.capabilities)?,
        agent_card,
        metadata: value.metadata.into_iter().collect::<BTreeMap<_, _>>(),
        announce: value.announce,
        registered_at: 0,
        last_seen_at: 0,
    })
}

pub(super) fn agent_status(value: i32) -> Checked<Option<AgentStatus>> {
    match pb::AgentStatus::try_from(value) {
        Ok(pb::AgentStatus::Unspecified) => Ok(None),
        Ok(pb::AgentStatus::Active) => Ok(Some(AgentStatus::Active)),
        Ok(pb::AgentStatus::Stale) => Ok(Some(AgentStatus::Stale)),
        Err(_) => Err(FieldViolation::new("status", format!("unknown value {value}"))),
    }
}

pub(super) fn discovery_mode(value: i32) -> Checked<DiscoveryMode> {
    match pb::DiscoveryMode::try_from(value) {
        Ok(pb::DiscoveryMode::Unspecified | pb::DiscoveryMode::Registry) => Ok(DiscoveryMode::Registry),
        Ok(pb::DiscoveryMode::Static) => Ok(DiscoveryMode::Static),
        Ok(pb::DiscoveryMode::Broadcast) => Ok(DiscoveryMode::Broadcast),
        Err(_) => Err(FieldViolation::new("mode", format!("unknown value {value}"))),
    }
}

// === Output ===

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

fn kind_out(kind: MessageKind) -> pb::message::Kind {
    match kind {
        MessageKind::Topic => pb::message::Kind::Topic,
        MessageKind::Direct => pb::message::Kind::Direct,
        MessageKind::Broadcast => pb::message::Kind::Broadcast,
        MessageKind::Request => pb::message::Kind::Request,
        MessageKind::Reply => pb::message::Kind::Reply,
    }
}

pub(super) fn message(value: Message) -> pb::Message {
    pb::Message {
        id: value.id,
        sequence: unsigned(value.sequence),
        kind: kind_out(value.kind).into(),
        sender: value.sender,
        recipient: value.recipient,
        topic: value.topic.unwrap_or_default(),
        content: Some(pb::Content {
            r#type: value.content.message_type,
            payload: value.content.payload,
            content_type: value.content.content_type,
        }),
        correlation_id: value.correlation_id.unwrap_or_default(),
        sent_at: Some(timestamp(value.sent_at)),
        expires_at: Some(timestamp(value.expires_at)),
        delivery_attempt: value.attempt,
        ack_deadline: value.ack_deadline.map(timestamp),
    }
}

pub(super) fn subscription(value: Subscription) -> pb::Subscription {
    pb::Subscription {
        agent_id: value.agent_id,
        topic: value.topic,
        subscribed_at: Some(timestamp(value.subscribed_at)),
    }
}

pub(super) fn state_entry(value: StateEntry) -> pb::StateEntry {
    pb::StateEntry {
        key: value.key,
        value: value.value.unwrap_or_default(),
        content_type: value.content_type,
        version: unsigned(value.version),
        updated_by: value.updated_by,
        updated_at: Some(timestamp(value.updated_at)),
        expires_at: value.expires_at.map(timestamp),
    }
}

pub(super) fn state_change(value: StateEntry) -> pb::StateChange {
    let kind = match value.change {
        StateChangeKind::Set => pb::state_change::Kind::Set,
        StateChangeKind::Deleted => pb::state_change::Kind::Deleted,
        StateChangeKind::Expired => pb::state_change::Kind::Expired,
    };
    pb::StateChange { kind: kind.into(), entry: Some(state_entry(value)) }
}

pub(super) fn agent_out(value: Agent, status: AgentStatus) -> pb::Agent {
    pb::Agent {
        namespace: value.namespace,
        id: value.id,
        agent_type: value.agent_type,
        capabilities: value.capabilities,
        agent_card_json: value.agent_card.unwrap_or_default(),
        metadata: value.metadata.into_iter().collect(),
        status: match status {
            AgentStatus::Active => pb::AgentStatus::Active,
            AgentStatus::Stale => pb::AgentStatus::Stale,
        }
        .into(),
        registered_at: Some(timestamp(value.registered_at)),
        last_seen_at: Some(timestamp(value.last_seen_at)),
        announce: value.announce,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_checked() {
        let good = pb::RegisterAgentRequest {
            agent_id: "w1".into(),
            agent_type: "worker".into(),
            agent_card_json: r#"{"name":"w1"}"#.into(),
            ..Default::default()
        };
        assert!(agent(good.clone(), "ns".into()).is_ok());
        let not_object = pb::RegisterAgentRequest { agent_card_json: "[1]".into(), ..good.clone() };
        assert_eq!(agent(not_object, "ns".into()).unwrap_err().field, "agent_card_json");
        let not_json = pb::RegisterAgentRequest { agent_card_json: "{".into(), ..good.clone() };
        assert_eq!(agent(not_json, "ns".into()).unwrap_err().field, "agent_card_json");
        let no_type = pb::RegisterAgentRequest { agent_type: String::new(), ..good };
        assert_eq!(agent(no_type, "ns".into()).unwrap_err().field, "agent_type");
    }

    #[test]
    fn ttls_default_and_are_capped() {
        let config = HubConfig::default();
        assert_eq!(ttl("ttl", None, &config).unwrap(), config.default_ttl());
        let long = prost_types::Duration { seconds: i64::try_from(config.max_ttl().as_secs()).unwrap() + 1, nanos: 0 };
        assert_eq!(ttl("ttl", Some(long), &config).unwrap_err().field, "ttl");
    }

    #[test]
    fn a_zero_state_ttl_is_none_not_the_message_default() {
        let config = HubConfig::default();
        assert_eq!(state_ttl(None, &config).unwrap(), None);
        assert_eq!(state_ttl(Some(prost_types::Duration::default()), &config).unwrap(), None);
        let minute = prost_types::Duration { seconds: 60, nanos: 0 };
        assert_eq!(state_ttl(Some(minute), &config).unwrap(), Some(Duration::from_secs(60)));
    }

    #[test]
    fn contents_are_checked() {
        let config = HubConfig { max_payload_bytes: 4, ..HubConfig::default() };
        let big = pb::Content { r#type: "t".into(), payload: vec![0; 5], content_type: String::new() };
        assert_eq!(content("content", Some(big), &config).unwrap_err().field, "content.payload");
        let untyped = pb::Content { r#type: String::new(), payload: vec![], content_type: String::new() };
        assert_eq!(content("content", Some(untyped), &config).unwrap_err().field, "content.type");
        assert_eq!(content("content", None, &config).unwrap_err().field, "content");
    }
}
