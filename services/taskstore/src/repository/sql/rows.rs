//! Decoding stored rows into domain values.

use std::collections::HashMap;

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use sqlx::{Row as _, any::AnyRow};

use crate::{
    domain::{
        Artifact, EventKind, InboxKind, InboxMessage, JsonObject, Message, Owner, OwnerKind, PendingPush, PushConfig,
        PushConfigKey, SpawnContext, Task, TaskState, TaskStatus,
    },
    error::{Result, TaskStoreError},
};

/// The task columns every task query selects, in [`TaskRecord::decode`]'s order.
macro_rules! task_columns {
    () => {
        "namespace, id, context_id, agent_id, state, status_message, status_timestamp, metadata, parent_id, \
         owner_kind, owner_id, depth, spawn_context, attempt, created_at, lease_id, max_retries, trace_context, \
         history_count, worker_id, lease_expires_at, run_by_creator"
    };
}
pub(super) use task_columns;

/// The history (messages at positions where `$window` holds) and the
/// artifacts of the task row `$row`, each aggregated into one column of JSON
/// objects joined by commas (`string_agg` with an order: PostgreSQL, and
/// SQLite since 3.44); [`decode_parts`] reads them.
macro_rules! aggregated_parts {
    ($row:literal, $window:literal) => {
        concat!(
            "(SELECT string_agg(message, ',' ORDER BY position) FROM taskstore_history h WHERE h.namespace = ",
            $row,
            ".namespace AND h.task_id = ",
            $row,
            ".id",
            $window,
            ") AS history, (SELECT string_agg(artifact, ',' ORDER BY position) FROM taskstore_artifacts a \
             WHERE a.namespace = ",
            $row,
            ".namespace AND a.task_id = ",
            $row,
            ".id) AS artifacts"
        )
    };
}
pub(super) use aggregated_parts;

/// The history and artifacts of a row selected with [`aggregated_parts`].
pub(super) fn decode_parts(row: &AnyRow) -> Result<(Vec<Message>, Vec<Artifact>)> {
    Ok((from_json_list(row.try_get("history")?)?, from_json_list(row.try_get("artifacts")?)?))
}

/// The task whole, from a row of [`task_columns`] and [`aggregated_parts`].
pub(super) fn decode_whole(row: &AnyRow) -> Result<Task> {
    let (history, artifacts) = decode_parts(row)?;
    Ok(Task { history, artifacts, ..TaskRecord::decode(row)?.task })
}

/// A task row: the task without history and artifacts, plus its bookkeeping.
#[derive(Debug, Clone)]
pub(super) struct TaskRecord {
    pub(super) task: Task,
    pub(super) lease_id: Option<String>,
    pub(super) worker_id: Option<String>,
    pub(super) lease_expires_at: Option<i64>,
    pub(super) max_retries: u32,
    pub(super) trace_context: HashMap<String, String>,
    pub(super) history_count: i64,
    /// Its creator runs its turns: no worker claims it, and its agent's
    /// writes need no lease.
    pub(super) run_by_creator: bool,
}

impl TaskRecord {
    pub(super) fn decode(row: &AnyRow) -> Result<Self> {
        let state: String = row.try_get("state")?;
        let spawn_context: String = row.try_get("spawn_context")?;
        let owner_kind: Option<String> = row.try_get("owner_kind")?;
        let owner_id: Option<String> = row.try_get("owner_id")?;
        let owner = match (owner_kind, owner_id) {
            (Some(kind), Some(id)) => Some(Owner { kind: parse_enum(&kind, OwnerKind::parse, "owner kind")?, id }),
            _ => None,
        };
        let task = Task {
            namespace: row.try_get("namespace")?,
            id: row.try_get("id")?,
            context_id: row.try_get("context_id")?,
            agent_id: row.try_get("agent_id")?,
            status: TaskStatus {
                state: parse_enum(&state, TaskState::parse, "task state")?,
                message: from_json_opt(row.try_get("status_message")?)?,
                timestamp: row.try_get("status_timestamp")?,
            },
            artifacts: Vec::new(),
            history: Vec::new(),
            metadata: from_json_opt(row.try_get("metadata")?)?,
            parent_id: row.try_get("parent_id")?,
            owner,
            depth: to_u32(row.try_get("depth")?),
            spawn_context: parse_enum(&spawn_context, SpawnContext::parse, "spawn context")?,
            attempt: to_u32(row.try_get("attempt")?),
            created_at: row.try_get("created_at")?,
        };
        Ok(Self {
            task,
            lease_id: row.try_get("lease_id")?,
            worker_id: row.try_get("worker_id")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            max_retries: to_u32(row.try_get("max_retries")?),
            trace_context: from_json(&row.try_get::<String, _>("trace_context")?)?,
            history_count: row.try_get("history_count")?,
            run_by_creator: row.try_get::<i64, _>("run_by_creator")? != 0,
        })
    }
}

/// What an event row's payload holds besides its columns.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct EventPayload {
    pub(super) status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) artifact: Option<Artifact>,
    #[serde(default)]
    pub(super) append: bool,
    #[serde(default)]
    pub(super) last_chunk: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) message: Option<Message>,
}

pub(super) fn decode_event(row: &AnyRow) -> Result<crate::domain::TaskEvent> {
    let kind: String = row.try_get("kind")?;
    let payload: EventPayload = from_json(&row.try_get::<String, _>("payload")?)?;
    Ok(crate::domain::TaskEvent {
        cursor: crate::domain::Cursor { tx: row.try_get("tx_id")?, id: row.try_get("id")? },
        kind: parse_enum(&kind, EventKind::parse, "event kind")?,
        namespace: row.try_get("namespace")?,
        task_id: row.try_get("task_id")?,
        context_id: row.try_get("context_id")?,
        agent_id: row.try_get("agent_id")?,
        status: payload.status,
        artifact: payload.artifact,
        append: payload.append,
        last_chunk: payload.last_chunk,
        message: payload.message,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) fn decode_inbox(row: &AnyRow) -> Result<InboxMessage> {
    let kind: String = row.try_get("kind")?;
    let owner_kind: String = row.try_get("owner_kind")?;
    let task_state: Option<String> = row.try_get("task_state")?;
    Ok(InboxMessage {
        id: row.try_get::<i64, _>("id")?.to_string(),
        kind: parse_enum(&kind, InboxKind::parse, "inbox kind")?,
        owner: Owner { kind: parse_enum(&owner_kind, OwnerKind::parse, "owner kind")?, id: row.try_get("owner_id")? },
        task_id: row.try_get("task_id")?,
        parent_task_id: row.try_get("parent_task_id")?,
        message: from_json_opt(row.try_get("message")?)?,
        task_state: task_state.map(|state| parse_enum(&state, TaskState::parse, "task state")).transpose()?,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) fn decode_push_config(row: &AnyRow) -> Result<PushConfig> {
    Ok(PushConfig {
        id: row.try_get("id")?,
        task_id: row.try_get("task_id")?,
        url: row.try_get("url")?,
        token: row.try_get("token")?,
        auth_scheme: row.try_get("auth_scheme")?,
        auth_credentials: row.try_get("auth_credentials")?,
    })
}

pub(super) fn decode_push_key(row: &AnyRow) -> Result<PushConfigKey> {
    Ok(PushConfigKey { namespace: row.try_get("namespace")?, task_id: row.try_get("task_id")?, id: row.try_get("id")? })
}

pub(super) fn decode_pending_push(row: &AnyRow) -> Result<PendingPush> {
    let tx: Option<i64> = row.try_get("delivered_tx")?;
    let id: Option<i64> = row.try_get("delivered_id")?;
    Ok(PendingPush {
        key: decode_push_key(row)?,
        delivered: tx.zip(id).map(|(tx, id)| crate::domain::Cursor { tx, id }),
    })
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|error| TaskStoreError::Corrupt(format!("cannot encode: {error}")))
}

/// `message` as it reads back once stored, to compare with stored ones:
/// serde_json may read a float back a bit off (it has no `float_roundtrip`
/// here), so a message compared with a stored one takes the same round trip.
pub(super) fn as_stored(message: &crate::domain::Message) -> Result<crate::domain::Message> {
    from_json(&to_json(message)?)
}

/// Whether the JSON `message` column's message id is $3, in `backend`'s SQL.
pub(super) fn message_id_is_3(backend: chorus_runtime::storage::Backend) -> &'static str {
    match backend {
        chorus_runtime::storage::Backend::Postgres => "CAST(message AS json) ->> 'message_id' = $3",
        chorus_runtime::storage::Backend::Sqlite => "json_extract(message, '$.message_id') = $3",
    }
}

pub(super) fn to_json_opt<T: Serialize>(value: Option<&T>) -> Result<Option<String>> {
    value.map(to_json).transpose()
}

pub(super) fn from_json<T: DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|error| TaskStoreError::Corrupt(format!("cannot decode stored JSON: {error}")))
}

pub(super) fn from_json_opt<T: DeserializeOwned>(text: Option<String>) -> Result<Option<T>> {
    text.as_deref().map(from_json).transpose()
}

/// Stored JSON documents joined with commas (SQL `string_agg`), or none.
pub(super) fn from_json_list<T: DeserializeOwned>(joined: Option<String>) -> Result<Vec<T>> {
    joined.map_or_else(|| Ok(Vec::new()), |joined| from_json(&format!("[{joined}]")))
}

/// Metadata objects are stored as JSON text too.
pub(super) fn metadata_json(metadata: Option<&JsonObject>) -> Result<Option<String>> {
    to_json_opt(metadata)
}

fn parse_enum<T>(value: &str, parse: fn(&str) -> Option<T>, what: &str) -> Result<T> {
    parse(value).ok_or_else(|| TaskStoreError::Corrupt(format!("unknown {what} {value:?}")))
}

fn to_u32(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
