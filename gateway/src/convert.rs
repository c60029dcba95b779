//! Between the task store's contract and the A2A model: the task store
//! keeps A2A tasks, so this is a field-for-field mapping.

use a2a::{
    Artifact, Message, Part, PartContent, Role, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus,
    TaskStatusUpdateEvent,
};
use a2a_pb::pbconv::{from_proto_timestamp, json_value_to_proto_value};
use chorus_proto::json::value_to_json;
use chorus_proto::taskstore::{self as pb, part::Content, task_event::Kind};

pub(crate) fn state_in(state: &TaskState) -> pb::TaskState {
    match state {
        TaskState::Unspecified => pb::TaskState::Unspecified,
        TaskState::Submitted => pb::TaskState::Submitted,
        TaskState::Working => pb::TaskState::Working,
        TaskState::Completed => pb::TaskState::Completed,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Canceled => pb::TaskState::Canceled,
        TaskState::InputRequired => pb::TaskState::InputRequired,
        TaskState::Rejected => pb::TaskState::Rejected,
        TaskState::AuthRequired => pb::TaskState::AuthRequired,
    }
}

/// A state as the wire names it (`TASK_STATE_COMPLETED`), for messages.
pub(crate) fn state_name(state: &TaskState) -> String {
    match serde_json::to_value(state) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{state:?}"),
    }
}

pub(crate) fn state_out(state: i32) -> TaskState {
    match pb::TaskState::try_from(state) {
        Ok(pb::TaskState::Submitted) => TaskState::Submitted,
        Ok(pb::TaskState::Working) => TaskState::Working,
        Ok(pb::TaskState::Completed) => TaskState::Completed,
        Ok(pb::TaskState::Failed) => TaskState::Failed,
        Ok(pb::TaskState::Canceled) => TaskState::Canceled,
        Ok(pb::TaskState::InputRequired) => TaskState::InputRequired,
        Ok(pb::TaskState::Rejected) => TaskState::Rejected,
        Ok(pb::TaskState::AuthRequired) => TaskState::AuthRequired,
        Ok(pb::TaskState::Unspecified) | Err(_) => TaskState::Unspecified,
    }
}

/// Whether `event` is the task's final change: the task store ends a watch
/// after it.
pub(crate) fn ends_task(event: &pb::TaskEvent) -> bool {
    event.kind() == pb::task_event::Kind::StatusChanged
        && state_out(event.status.as_ref().map_or(0, |status| status.state)).is_terminal()
}

/// Whether a task in `state` waits for its caller (a stream ends there).
pub(crate) fn is_interrupted(state: &TaskState) -> bool {
    matches!(state, TaskState::InputRequired | TaskState::AuthRequired)
}

/// Whether a task in `state` is done for now: terminal, or waiting for its
/// caller.
pub(crate) fn is_settled(state: &TaskState) -> bool {
    state.is_terminal() || is_interrupted(state)
}

fn metadata_in(metadata: Option<&std::collections::HashMap<String, serde_json::Value>>) -> Option<prost_types::Struct> {
    metadata.map(a2a_pb::pbconv::to_proto_struct)
}

fn metadata_out(metadata: Option<prost_types::Struct>) -> Option<std::collections::HashMap<String, serde_json::Value>> {
    metadata
        .map(|metadata| metadata.fields.iter().map(|(key, value)| (key.clone(), value_to_json(value))).collect())
        .filter(|metadata: &std::collections::HashMap<_, _>| !metadata.is_empty())
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

fn list_out(items: Vec<String>) -> Option<Vec<String>> {
    (!items.is_empty()).then_some(items)
}

pub(crate) fn part_in(part: &Part) -> pb::Part {
    let content = match &part.content {
        PartContent::Text(text) => Content::Text(text.clone()),
        PartContent::Raw(bytes) => Content::Raw(bytes.clone()),
        PartContent::Url(url) => Content::Url(url.clone()),
        PartContent::Data(value) => Content::Data(json_value_to_proto_value(value)),
    };
    pb::Part {
        content: Some(content),
        metadata: metadata_in(part.metadata.as_ref()),
        filename: part.filename.clone().unwrap_or_default(),
        media_type: part.media_type.clone().unwrap_or_default(),
    }
}

fn part_out(part: pb::Part) -> Part {
    let content = match part.content {
        Some(Content::Text(text)) => PartContent::Text(text),
        Some(Content::Raw(bytes)) => PartContent::Raw(bytes),
        Some(Content::Url(url)) => PartContent::Url(url),
        Some(Content::Data(value)) => PartContent::Data(value_to_json(&value)),
        None => PartContent::Text(String::new()),
    };
    Part {
        content,
        filename: non_empty(part.filename),
        media_type: non_empty(part.media_type),
        metadata: metadata_out(part.metadata),
    }
}

pub(crate) fn message_in(message: &Message) -> pb::Message {
    let role = match message.role {
        Role::User => pb::Role::User,
        Role::Agent => pb::Role::Agent,
        Role::Unspecified => pb::Role::Unspecified,
    };
    pb::Message {
        message_id: message.message_id.clone(),
        context_id: message.context_id.clone().unwrap_or_default(),
        task_id: message.task_id.clone().unwrap_or_default(),
        role: role.into(),
        parts: message.parts.iter().map(part_in).collect(),
        metadata: metadata_in(message.metadata.as_ref()),
        extensions: message.extensions.clone().unwrap_or_default(),
        reference_task_ids: message.reference_task_ids.clone().unwrap_or_default(),
    }
}

pub(crate) fn message_out(message: pb::Message) -> Message {
    let role = match pb::Role::try_from(message.role) {
        Ok(pb::Role::User) => Role::User,
        Ok(pb::Role::Agent) => Role::Agent,
        Ok(pb::Role::Unspecified) | Err(_) => Role::Unspecified,
    };
    Message {
        message_id: message.message_id,
        context_id: non_empty(message.context_id),
        task_id: non_empty(message.task_id),
        role,
        parts: message.parts.into_iter().map(part_out).collect(),
        metadata: metadata_out(message.metadata),
        extensions: list_out(message.extensions),
        reference_task_ids: list_out(message.reference_task_ids),
    }
}

pub(crate) fn artifact_in(artifact: &Artifact) -> pb::Artifact {
    pb::Artifact {
        artifact_id: artifact.artifact_id.clone(),
        name: artifact.name.clone().unwrap_or_default(),
        description: artifact.description.clone().unwrap_or_default(),
        parts: artifact.parts.iter().map(part_in).collect(),
        metadata: metadata_in(artifact.metadata.as_ref()),
        extensions: artifact.extensions.clone().unwrap_or_default(),
    }
}

fn artifact_out(artifact: pb::Artifact) -> Artifact {
    Artifact {
        artifact_id: artifact.artifact_id,
        name: non_empty(artifact.name),
        description: non_empty(artifact.description),
        parts: artifact.parts.into_iter().map(part_out).collect(),
        metadata: metadata_out(artifact.metadata),
        extensions: list_out(artifact.extensions),
    }
}

fn status_out(status: Option<pb::TaskStatus>) -> TaskStatus {
    let status = status.unwrap_or_default();
    TaskStatus {
        state: state_out(status.state),
        message: status.message.map(message_out),
        timestamp: status.timestamp.as_ref().and_then(from_proto_timestamp),
    }
}

/// An A2A task. `include_artifacts` false omits them (ListTasks' default);
/// the history is whatever the task store returned.
pub(crate) fn task_out(task: pb::Task, include_artifacts: bool) -> Task {
    Task {
        id: task.id,
        context_id: task.context_id,
        status: status_out(task.status),
        artifacts: (include_artifacts && !task.artifacts.is_empty())
            .then(|| task.artifacts.into_iter().map(artifact_out).collect()),
        history: (!task.history.is_empty()).then(|| task.history.into_iter().map(message_out).collect()),
        metadata: metadata_out(task.metadata),
    }
}

/// A task of an external agent, as chorus contracts carry it.
pub(crate) fn task_in(task: &Task) -> pb::Task {
    pb::Task {
        id: task.id.clone(),
        context_id: task.context_id.clone(),
        status: Some(pb::TaskStatus {
            state: state_in(&task.status.state).into(),
            message: task.status.message.as_ref().map(message_in),
            timestamp: task.status.timestamp.as_ref().and_then(a2a_pb::pbconv::to_proto_timestamp),
        }),
        artifacts: task.artifacts.iter().flatten().map(artifact_in).collect(),
        history: task.history.iter().flatten().map(message_in).collect(),
        metadata: metadata_in(task.metadata.as_ref()),
        ..pb::Task::default()
    }
}

/// The task as it was when created: submitted, with its first message.
pub(crate) fn task_as_created(mut task: pb::Task) -> Task {
    task.artifacts.clear();
    task.history.truncate(1);
    let timestamp = task.created_at;
    task.status = Some(pb::TaskStatus { state: pb::TaskState::Submitted.into(), message: None, timestamp });
    task_out(task, false)
}

/// What a task change is to an A2A stream: status and artifact updates;
/// the rest (creation, messages) is not streamed.
pub(crate) fn event_out(event: pb::TaskEvent) -> Option<StreamResponse> {
    match Kind::try_from(event.kind) {
        Ok(Kind::StatusChanged) => Some(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: event.task_id,
            context_id: event.context_id,
            status: status_out(event.status),
            metadata: None,
        })),
        Ok(Kind::ArtifactUpdated) => Some(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: event.task_id,
            context_id: event.context_id,
            artifact: artifact_out(event.artifact?),
            append: event.append.then_some(true),
            last_chunk: event.last_chunk.then_some(true),
            metadata: None,
        })),
        Ok(Kind::Snapshot) => event.task.map(|task| StreamResponse::Task(task_out(task, true))),
        Ok(Kind::Created | Kind::MessageAdded | Kind::Unspecified) | Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parts_survive_the_round_trip() {
        let parts = vec![
            Part::text("hi"),
            Part {
                content: PartContent::Raw(b"tck".to_vec()),
                filename: Some("output.txt".into()),
                media_type: Some("text/plain".into()),
                metadata: None,
            },
            Part {
                content: PartContent::Url("https://example.com/x".into()),
                filename: None,
                media_type: None,
                metadata: None,
            },
            Part {
                content: PartContent::Data(json!({"key": "value", "count": 42})),
                filename: None,
                media_type: None,
                metadata: Some([("k".to_owned(), json!(1))].into()),
            },
        ];
        for part in parts {
            assert_eq!(part_out(part_in(&part)), part);
        }
    }

    #[test]
    fn messages_survive_the_round_trip() {
        let mut message = Message::new(Role::User, vec![Part::text("hello")]);
        message.context_id = Some("c1".into());
        message.task_id = Some("t1".into());
        message.reference_task_ids = Some(vec!["t0".into()]);
        assert_eq!(message_out(message_in(&message)), message);
    }

    #[test]
    fn listing_without_artifacts_omits_them() {
        let task = pb::Task {
            id: "t".into(),
            context_id: "c".into(),
            artifacts: vec![pb::Artifact { artifact_id: "a".into(), ..pb::Artifact::default() }],
            ..pb::Task::default()
        };
        assert!(task_out(task.clone(), false).artifacts.is_none());
        assert_eq!(task_out(task, true).artifacts.map(|artifacts| artifacts.len()), Some(1));
    }

    #[test]
    fn only_status_artifact_and_snapshot_events_are_streamed() {
        let event = |kind: Kind| pb::TaskEvent { kind: kind.into(), task_id: "t".into(), ..pb::TaskEvent::default() };
        assert!(event_out(event(Kind::Created)).is_none());
        assert!(event_out(event(Kind::MessageAdded)).is_none());
        assert!(matches!(event_out(event(Kind::StatusChanged)), Some(StreamResponse::StatusUpdate(_))));
        assert!(event_out(event(Kind::ArtifactUpdated)).is_none(), "an artifact event without its artifact");
    }
}
