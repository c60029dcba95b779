//! Row decoding and the column lists that go with it.

use sqlx::{Row as _, any::AnyRow};

use crate::{
    domain::{Agent, Content, Message, MessageKind, Outgoing, Sent, StateEntry},
    error::{HubError, Result},
};

macro_rules! agent_columns {
    () => {
        "namespace, id, agent_type, capabilities, agent_card, metadata, announce, registered_at, last_seen_at"
    };
}

/// An inbox row joined with its message (`i` and `m`).
macro_rules! inbox_columns {
    () => {
        "i.sequence, i.message_id, i.kind, i.sender, i.recipient, i.type, i.topic, i.correlation_id, i.expires_at, \
         i.attempt, i.ack_deadline, m.payload, m.content_type, m.sent_at"
    };
}

macro_rules! state_columns {
    () => {
        "namespace, key, value, content_type, version, change, updated_by, updated_at, expires_at"
    };
}

pub(super) use {agent_columns, inbox_columns, state_columns};

fn corrupt(what: &str, error: impl std::fmt::Display) -> HubError {
    HubError::Corrupt(format!("{what}: {error}"))
}

pub(super) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("strings and maps serialize")
}

pub(super) fn from_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| corrupt(what, error))
}

pub(super) fn decode_agent(row: &AnyRow) -> Result<Agent> {
    Ok(Agent {
        namespace: row.try_get("namespace")?,
        id: row.try_get("id")?,
        agent_type: row.try_get("agent_type")?,
        capabilities: from_json("agent capabilities", &row.try_get::<String, _>("capabilities")?)?,
        agent_card: row.try_get("agent_card")?,
        metadata: from_json("agent metadata", &row.try_get::<String, _>("metadata")?)?,
        announce: row.try_get::<i64, _>("announce")? != 0,
        registered_at: row.try_get("registered_at")?,
        last_seen_at: row.try_get("last_seen_at")?,
    })
}

pub(super) fn decode_kind(text: &str) -> Result<MessageKind> {
    text.parse().map_err(|error: String| corrupt("message kind", error))
}

pub(super) fn decode_message(row: &AnyRow) -> Result<Message> {
    Ok(Message {
        id: row.try_get("message_id")?,
        sequence: row.try_get("sequence")?,
        kind: decode_kind(&row.try_get::<String, _>("kind")?)?,
        sender: row.try_get("sender")?,
        recipient: row.try_get("recipient")?,
        topic: row.try_get("topic")?,
        content: Content {
            message_type: row.try_get("type")?,
            payload: row.try_get("payload")?,
            content_type: row.try_get("content_type")?,
        },
        correlation_id: row.try_get("correlation_id")?,
        sent_at: row.try_get("sent_at")?,
        expires_at: row.try_get("expires_at")?,
        attempt: u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(u32::MAX),
        ack_deadline: row.try_get("ack_deadline")?,
    })
}

pub(super) fn decode_state(row: &AnyRow) -> Result<StateEntry> {
    let change: String = row.try_get("change")?;
    Ok(StateEntry {
        namespace: row.try_get("namespace")?,
        key: row.try_get("key")?,
        value: row.try_get("value")?,
        content_type: row.try_get("content_type")?,
        version: row.try_get("version")?,
        change: change.parse().map_err(|error: String| corrupt("state change", error))?,
        updated_by: row.try_get("updated_by")?,
        updated_at: row.try_get("updated_at")?,
        expires_at: row.try_get("expires_at")?,
    })
}

/// An earlier send with the same idempotency key, from its `id`,
/// `sequence`, `recipients` and `expires_at` columns (under `prefix`).
/// The columns of an earlier send that a duplicate is compared with.
pub(super) const EARLIER: &str = "id, sequence, recipients, expires_at, kind, sender, topic, type, payload, \
     content_type, correlation_id, audience";

/// The send made first under `send`'s idempotency key (its columns named
/// with `prefix`), answered as the duplicate `send` is, unless `send` is
/// another message under the same key.
pub(super) fn decode_duplicate(row: &AnyRow, prefix: &str, send: &Outgoing) -> Result<Sent> {
    let column = |name: &str| format!("{prefix}{name}");
    let text = |name: &str| row.try_get::<Option<String>, _>(column(name).as_str());
    let message_id: String = row.try_get(column("id").as_str())?;
    let payload: Vec<u8> = row.try_get(column("payload").as_str())?;
    let differs = [
        (text("kind")?.as_deref() != Some(send.kind.as_str()), "is another kind of message"),
        (text("sender")?.as_deref() != Some(send.sender.as_str()), "has another sender"),
        (text("topic")?.as_deref() != send.topic(), "went to another topic"),
        // Messages sent before the audience was recorded have none.
        (text("audience")?.is_some_and(|audience| audience != send.audience_key()), "went to other recipients"),
        (text("type")?.as_deref() != Some(send.content.message_type.as_str()), "has another type"),
        (payload != send.content.payload, "has another payload"),
        (text("content_type")?.as_deref() != Some(send.content.content_type.as_str()), "has another content type"),
        (text("correlation_id")?.as_deref() != send.correlation_id.as_deref(), "has another correlation id"),
    ];
    if let Some((_, mismatch)) = differs.into_iter().find(|(differs, _)| *differs) {
        let key = send.idempotency_key.clone().unwrap_or_default();
        return Err(HubError::IdempotencyKeyInUse { key, message_id, mismatch: mismatch.to_owned() });
    }
    Ok(Sent {
        message_id,
        sequence: row.try_get(column("sequence").as_str())?,
        recipients: u32::try_from(row.try_get::<i64, _>(column("recipients").as_str())?).unwrap_or_default(),
        expires_at: row.try_get(column("expires_at").as_str())?,
        duplicate: true,
    })
}
