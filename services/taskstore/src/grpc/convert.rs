//! Wire ↔ domain conversions. Input is validated here, field by field; the
//! domain never sees a proto type.

use std::str::FromStr;

use chorus_proto::taskstore as pb;
pub(super) use chorus_runtime::time::{timestamp, timestamp_micros};
use chorus_runtime::validate::{self, FieldViolation};
use prost_types::{ListValue, Struct, Value, value::Kind};

use crate::domain::{
    Artifact, ClaimEvent, Claimed, Cursor, EventKind, InboxKind, InboxMessage, JsonObject, Message, Owner, OwnerKind,
    Part, PartContent, Role, SpawnContext, Task, TaskAnswer, TaskCursor, TaskEvent, TaskState, TaskStatus,
    repeated_artifact_id,
};

pub(super) type Checked<T> = Result<T, FieldViolation>;

// === JSON (google.protobuf.Struct) ===

pub(super) fn json_object(field: &str, value: Option<Struct>) -> Checked<Option<JsonObject>> {
    value.map(|value| struct_to_json(field, value)).transpose()
}

fn struct_to_json(field: &str, value: Struct) -> Checked<JsonObject> {
    value
        .fields
        .into_iter()
        .map(|(key, value)| {
            let json = value_to_json(&format!("{field}.{key}"), value)?;
            Ok((key, json))
        })
        .collect()
}

fn value_to_json(field: &str, value: Value) -> Checked<serde_json::Value> {
    Ok(match value.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::BoolValue(flag)) => serde_json::Value::Bool(flag),
        Some(Kind::StringValue(text)) => serde_json::Value::String(text),
        Some(Kind::NumberValue(number)) => chorus_proto::json::json_number(number)
            .map(serde_json::Value::Number)
            .ok_or_else(|| FieldViolation::new(field, "numbers must be finite (JSON has no NaN or Infinity)"))?,
        Some(Kind::StructValue(object)) => serde_json::Value::Object(struct_to_json(field, object)?),
        Some(Kind::ListValue(list)) => serde_json::Value::Array(
            list.values
                .into_iter()
                .enumerate()
                .map(|(index, item)| value_to_json(&format!("{field}[{index}]"), item))
                .collect::<Checked<_>>()?,
        ),
    })
}

pub(super) fn struct_from_json(object: JsonObject) -> Struct {
    Struct { fields: object.into_iter().map(|(key, value)| (key, value_from_json(value))).collect() }
}

fn value_from_json(value: serde_json::Value) -> Value {
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(flag) => Kind::BoolValue(flag),
        serde_json::Value::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or_default()),
        serde_json::Value::String(text) => Kind::StringValue(text),
        serde_json::Value::Array(items) => {
            Kind::ListValue(ListValue { values: items.into_iter().map(value_from_json).collect() })
        }
        serde_json::Value::Object(object) => Kind::StructValue(struct_from_json(object)),
    };
    Value { kind: Some(kind) }
}

// === Input ===

pub(super) fn message(field: &str, value: Option<pb::Message>) -> Checked<Message> {
    let value = value.ok_or_else(|| FieldViolation::required(field))?;
    let role = match pb::Role::try_from(value.role) {
        Ok(pb::Role::User) => Role::User,
        Ok(pb::Role::Agent) => Role::Agent,
        Ok(pb::Role::Unspecified) | Err(_) => {
            return Err(FieldViolation::new(format!("{field}.role"), "must be ROLE_USER or ROLE_AGENT"));
        }
    };
    Ok(Message {
        message_id: validate::id(&format!("{field}.message_id"), &value.message_id)?,
        context_id: validate::optional_id(&format!("{field}.context_id"), &value.context_id)?,
        task_id: validate::optional_id(&format!("{field}.task_id"), &value.task_id)?,
        role,
        parts: parts(&format!("{field}.parts"), value.parts)?,
        metadata: json_object(&format!("{field}.metadata"), value.metadata)?,
        extensions: value.extensions,
        reference_task_ids: value.reference_task_ids,
    })
}

/// How long a failed task waits before its next claim: zero when unset, at
/// most a day.
pub(super) fn retry_after(value: Option<prost_types::Duration>) -> Checked<std::time::Duration> {
    let after = validate::duration("retry_after", value, std::time::Duration::ZERO)?;
    if after > std::time::Duration::from_secs(24 * 3600) {
        return Err(FieldViolation::new("retry_after", "must be at most 1d"));
    }
    Ok(after)
}

pub(super) fn optional_message(field: &str, value: Option<pb::Message>) -> Checked<Option<Message>> {
    value.map(|value| message(field, Some(value))).transpose()
}

/// URL schemes whose link runs script in the page that shows it.
const SCRIPT_SCHEMES: [&str; 2] = ["javascript", "vbscript"];

fn parts(field: &str, values: Vec<pb::Part>) -> Checked<Vec<Part>> {
    if values.is_empty() {
        return Err(FieldViolation::new(field, "must hold at least one part"));
    }
    values.into_iter().enumerate().map(|(index, value)| part(&format!("{field}[{index}]"), value)).collect()
}

fn part(field: &str, value: pb::Part) -> Checked<Part> {
    let content = match value.content {
        Some(pb::part::Content::Text(text)) => PartContent::Text(text),
        Some(pb::part::Content::Raw(bytes)) => PartContent::Raw(bytes),
        Some(pb::part::Content::Url(url)) => match url::Url::parse(&url) {
            Ok(parsed) if SCRIPT_SCHEMES.contains(&parsed.scheme()) => {
                let problem = format!("is a {}: URL, which a page showing it as a link would run", parsed.scheme());
                return Err(FieldViolation::new(format!("{field}.url"), problem));
            }
            Ok(_) => PartContent::Url(url),
            Err(error) => return Err(FieldViolation::new(format!("{field}.url"), format!("is not a URL: {error}"))),
        },
        Some(pb::part::Content::Data(data)) => PartContent::Data(value_to_json(&format!("{field}.data"), data)?),
        None => {
            return Err(FieldViolation::new(format!("{field}.content"), "one of text, raw, url or data is required"));
        }
    };
    Ok(Part {
        content,
        metadata: json_object(&format!("{field}.metadata"), value.metadata)?,
        filename: non_empty(value.filename),
        media_type: non_empty(value.media_type),
    })
}

pub(super) fn artifact(field: &str, value: Option<pb::Artifact>) -> Checked<Artifact> {
    let value = value.ok_or_else(|| FieldViolation::required(field))?;
    Ok(Artifact {
        artifact_id: validate::id(&format!("{field}.artifact_id"), &value.artifact_id)?,
        name: non_empty(value.name),
        description: non_empty(value.description),
        parts: parts(&format!("{field}.parts"), value.parts)?,
        metadata: json_object(&format!("{field}.metadata"), value.metadata)?,
        extensions: value.extensions,
    })
}

pub(super) fn artifacts(field: &str, values: Vec<pb::Artifact>) -> Checked<Vec<Artifact>> {
    values.into_iter().enumerate().map(|(index, value)| artifact(&format!("{field}[{index}]"), Some(value))).collect()
}

pub(super) fn answer(value: Option<pb::TaskAnswer>) -> Checked<Option<TaskAnswer>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let state = task_state("answer.state", value.state)?;
    if !TaskAnswer::can_settle_in(state) {
        return Err(FieldViolation::new(
            "answer.state",
            "must be completed, failed, rejected, input-required or auth-required",
        ));
    }
    let answer = TaskAnswer {
        state,
        message: optional_message("answer.message", value.message)?,
        artifacts: artifacts("answer.artifacts", value.artifacts)?,
    };
    if let Some(id) = repeated_artifact_id(&answer.artifacts) {
        return Err(FieldViolation::new("answer.artifacts", format!("gives artifact {id} twice")));
    }
    Ok(Some(answer))
}

pub(super) fn task_state(field: &str, value: i32) -> Checked<TaskState> {
    match pb::TaskState::try_from(value) {
        Ok(pb::TaskState::Submitted) => Ok(TaskState::Submitted),
        Ok(pb::TaskState::Working) => Ok(TaskState::Working),
        Ok(pb::TaskState::InputRequired) => Ok(TaskState::InputRequired),
        Ok(pb::TaskState::AuthRequired) => Ok(TaskState::AuthRequired),
        Ok(pb::TaskState::Completed) => Ok(TaskState::Completed),
        Ok(pb::TaskState::Failed) => Ok(TaskState::Failed),
        Ok(pb::TaskState::Canceled) => Ok(TaskState::Canceled),
        Ok(pb::TaskState::Rejected) => Ok(TaskState::Rejected),
        Ok(pb::TaskState::Unspecified) | Err(_) => Err(FieldViolation::new(field, "must be a task state")),
    }
}

/// A state filter: unspecified means any.
pub(super) fn optional_task_state(field: &str, value: i32) -> Checked<Option<TaskState>> {
    if value == pb::TaskState::Unspecified as i32 {
        return Ok(None);
    }
    task_state(field, value).map(Some)
}

pub(super) fn owner(field: &str, value: Option<pb::Owner>) -> Checked<Option<Owner>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let kind = match pb::owner::Kind::try_from(value.kind) {
        Ok(pb::owner::Kind::Orchestrator) => OwnerKind::Orchestrator,
        Ok(pb::owner::Kind::Worker) => OwnerKind::Worker,
        Ok(pb::owner::Kind::Agent) => OwnerKind::Agent,
        Ok(pb::owner::Kind::Unspecified) | Err(_) => {
            return Err(FieldViolation::new(format!("{field}.kind"), "must be orchestrator, worker or agent"));
        }
    };
    Ok(Some(Owner { kind, id: validate::id(&format!("{field}.id"), &value.id)? }))
}

pub(super) fn required_owner(field: &str, value: Option<pb::Owner>) -> Checked<Owner> {
    owner(field, value)?.ok_or_else(|| FieldViolation::required(field))
}

pub(super) fn spawn_context(value: i32) -> Checked<SpawnContext> {
    match pb::SpawnContext::try_from(value) {
        Ok(pb::SpawnContext::Unspecified | pb::SpawnContext::Agent) => Ok(SpawnContext::Agent),
        Ok(pb::SpawnContext::Orchestrator) => Ok(SpawnContext::Orchestrator),
        Err(_) => Err(FieldViolation::new("spawn_context", "must be a spawn context")),
    }
}

pub(super) fn inbox_kind(field: &str, value: i32) -> Checked<InboxKind> {
    match pb::inbox_message::Kind::try_from(value) {
        Ok(pb::inbox_message::Kind::Status) => Ok(InboxKind::Status),
        Ok(pb::inbox_message::Kind::Question) => Ok(InboxKind::Question),
        Ok(pb::inbox_message::Kind::Error) => Ok(InboxKind::Error),
        Ok(pb::inbox_message::Kind::Completion) => {
            Err(FieldViolation::new(field, "completions are sent by the task store when a subtask finishes"))
        }
        Ok(pb::inbox_message::Kind::Unspecified) | Err(_) => {
            Err(FieldViolation::new(field, "must be KIND_STATUS, KIND_QUESTION or KIND_ERROR"))
        }
    }
}

/// A cursor this service handed out (a [`Cursor`], or a [`TaskCursor`] for
/// one task's watch); empty: none.
pub(super) fn cursor<C: FromStr<Err = ()>>(field: &str, value: &str) -> Checked<Option<C>> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|()| FieldViolation::new(field, "is not a cursor this service handed out"))
}

/// Where a push config is: a task's cursor without the changes a snapshot
/// had seen. A config resumed from it may get those again, as delivery is
/// at least once anyway; its follower, on the snapshot's own watch, does not.
pub(super) fn push_cursor(field: &str, value: &str) -> Checked<Option<Cursor>> {
    cursor::<TaskCursor>(field, value).map(|cursor| cursor.map(|cursor| cursor.after))
}

pub(super) fn non_empty(value: String) -> Option<String> {
    (!value.is_empty()).then_some(value)
}

// === Output ===

pub(super) fn task_state_out(state: TaskState) -> pb::TaskState {
    match state {
        TaskState::Submitted => pb::TaskState::Submitted,
        TaskState::Working => pb::TaskState::Working,
        TaskState::InputRequired => pb::TaskState::InputRequired,
        TaskState::AuthRequired => pb::TaskState::AuthRequired,
        TaskState::Completed => pb::TaskState::Completed,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Canceled => pb::TaskState::Canceled,
        TaskState::Rejected => pb::TaskState::Rejected,
    }
}

pub(super) fn message_out(message: Message) -> pb::Message {
    let role = match message.role {
        Role::User => pb::Role::User,
        Role::Agent => pb::Role::Agent,
    };
    pb::Message {
        message_id: message.message_id,
        context_id: message.context_id.unwrap_or_default(),
        task_id: message.task_id.unwrap_or_default(),
        role: role.into(),
        parts: message.parts.into_iter().map(part_out).collect(),
        metadata: message.metadata.map(struct_from_json),
        extensions: message.extensions,
        reference_task_ids: message.reference_task_ids,
    }
}

fn part_out(part: Part) -> pb::Part {
    let content = match part.content {
        PartContent::Text(text) => pb::part::Content::Text(text),
        PartContent::Raw(bytes) => pb::part::Content::Raw(bytes),
        PartContent::Url(url) => pb::part::Content::Url(url),
        PartContent::Data(data) => pb::part::Content::Data(value_from_json(data)),
    };
    pb::Part {
        content: Some(content),
        metadata: part.metadata.map(struct_from_json),
        filename: part.filename.unwrap_or_default(),
        media_type: part.media_type.unwrap_or_default(),
    }
}

pub(super) fn artifact_out(artifact: Artifact) -> pb::Artifact {
    pb::Artifact {
        artifact_id: artifact.artifact_id,
        name: artifact.name.unwrap_or_default(),
        description: artifact.description.unwrap_or_default(),
        parts: artifact.parts.into_iter().map(part_out).collect(),
        metadata: artifact.metadata.map(struct_from_json),
        extensions: artifact.extensions,
    }
}

fn status_out(status: TaskStatus) -> pb::TaskStatus {
    pb::TaskStatus {
        state: task_state_out(status.state).into(),
        message: status.message.map(message_out),
        timestamp: Some(timestamp(status.timestamp)),
    }
}

fn owner_out(owner: Owner) -> pb::Owner {
    let kind = match owner.kind {
        OwnerKind::Orchestrator => pb::owner::Kind::Orchestrator,
        OwnerKind::Worker => pb::owner::Kind::Worker,
        OwnerKind::Agent => pb::owner::Kind::Agent,
    };
    pb::Owner { kind: kind.into(), id: owner.id }
}

pub(super) fn task_out(task: Task) -> pb::Task {
    let spawn_context = match task.spawn_context {
        SpawnContext::Agent => pb::SpawnContext::Agent,
        SpawnContext::Orchestrator => pb::SpawnContext::Orchestrator,
    };
    pb::Task {
        id: task.id,
        context_id: task.context_id,
        status: Some(status_out(task.status)),
        artifacts: task.artifacts.into_iter().map(artifact_out).collect(),
        history: task.history.into_iter().map(message_out).collect(),
        metadata: task.metadata.map(struct_from_json),
        namespace: task.namespace,
        agent_id: task.agent_id,
        parent_task_id: task.parent_id.unwrap_or_default(),
        owner: task.owner.map(owner_out),
        depth: task.depth,
        spawn_context: spawn_context.into(),
        attempt: task.attempt,
        created_at: Some(timestamp(task.created_at)),
    }
}

pub(super) fn claimed_out(claimed: Claimed) -> pb::ClaimedTask {
    pb::ClaimedTask {
        task: Some(task_out(claimed.task)),
        lease_id: claimed.lease_id,
        lease_expires_at: Some(timestamp(claimed.lease_expires_at)),
        trace_context: claimed.trace_context,
        canceled_task_id: String::new(),
    }
}

/// A task, or the notice that one was canceled: only its id.
pub(super) fn claim_event_out(event: ClaimEvent) -> pb::ClaimedTask {
    match event {
        ClaimEvent::Claimed(claimed) => claimed_out(*claimed),
        ClaimEvent::Canceled(canceled_task_id) => pb::ClaimedTask { canceled_task_id, ..pb::ClaimedTask::default() },
    }
}

pub(super) fn event_out(event: TaskEvent) -> pb::TaskEvent {
    let kind = match event.kind {
        EventKind::Created => pb::task_event::Kind::Created,
        EventKind::StatusChanged => pb::task_event::Kind::StatusChanged,
        EventKind::ArtifactUpdated => pb::task_event::Kind::ArtifactUpdated,
        EventKind::MessageAdded => pb::task_event::Kind::MessageAdded,
    };
    pb::TaskEvent {
        cursor: event.cursor.to_string(),
        kind: kind.into(),
        task_id: event.task_id,
        context_id: event.context_id,
        agent_id: event.agent_id,
        status: Some(status_out(event.status)),
        artifact: event.artifact.map(artifact_out),
        append: event.append,
        last_chunk: event.last_chunk,
        message: event.message.map(message_out),
        task: None,
    }
}

/// The first event of a watch with a snapshot: `task` as of `cursor`.
pub(super) fn snapshot_out(task: Task, cursor: Option<TaskCursor>) -> pb::TaskEvent {
    pb::TaskEvent {
        cursor: cursor.map(|cursor| cursor.to_string()).unwrap_or_default(),
        kind: pb::task_event::Kind::Snapshot.into(),
        task_id: task.id.clone(),
        context_id: task.context_id.clone(),
        agent_id: task.agent_id.clone(),
        status: Some(status_out(task.status.clone())),
        task: Some(task_out(task)),
        ..pb::TaskEvent::default()
    }
}

pub(super) fn inbox_out(message: InboxMessage) -> pb::InboxMessage {
    let kind = match message.kind {
        InboxKind::Completion => pb::inbox_message::Kind::Completion,
        InboxKind::Status => pb::inbox_message::Kind::Status,
        InboxKind::Question => pb::inbox_message::Kind::Question,
        InboxKind::Error => pb::inbox_message::Kind::Error,
    };
    pb::InboxMessage {
        id: message.id,
        kind: kind.into(),
        owner: Some(owner_out(message.owner)),
        task_id: message.task_id,
        parent_task_id: message.parent_task_id.unwrap_or_default(),
        message: message.message.map(message_out),
        task_state: message.task_state.map_or(pb::TaskState::Unspecified, task_state_out).into(),
        created_at: Some(timestamp(message.created_at)),
    }
}

#[cfg(test)]
mod tests;
