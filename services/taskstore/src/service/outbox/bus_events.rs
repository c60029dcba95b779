//! Task events as bus events: one per change, `task.<kind>`, and one more
//! when a task ends, grouped by namespace in commit order.

use std::collections::HashMap;

use chorus_proto::eventbus::NewEvent;
use chorus_runtime::time::timestamp;
use serde::Serialize;

use crate::{
    domain::{Artifact, EventKind, Message, TaskEvent, TaskState, TaskStatus},
    error::{Result, TaskStoreError},
};

/// The `source` of every event the relay publishes.
const SOURCE: &str = "taskstore";

/// The bus events of `events`, by namespace (in order of first appearance),
/// each namespace's in commit order.
pub(super) fn by_namespace(events: &[TaskEvent], max_payload: usize) -> Result<Vec<(String, Vec<NewEvent>)>> {
    let mut groups: Vec<(String, Vec<NewEvent>)> = Vec::new();
    for event in events {
        let published = bus_events(event, max_payload)?;
        match groups.iter_mut().find(|(namespace, _)| *namespace == event.namespace) {
            Some((_, group)) => group.extend(published),
            None => groups.push((event.namespace.clone(), published)),
        }
    }
    Ok(groups)
}

/// The JSON payload of a bus event: the stored event's, plus the task's ids.
#[derive(Serialize)]
struct Payload<'a> {
    task_id: &'a str,
    context_id: &'a str,
    agent_id: &'a str,
    status: &'a TaskStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    artifact: Option<&'a Artifact>,
    append: bool,
    last_chunk: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a Message>,
    /// The change's message and artifact (and the status message) were left
    /// out: with them, the event was larger than the bus takes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    content_omitted: bool,
}

/// One task event as bus events: `task.<kind>`, and for a move into a final
/// state also `task.<state>` under its own idempotency key. A payload larger
/// than `max_payload` goes without the change's content (`content_omitted`;
/// the task has it): the bus would refuse it, and the relay would offer it
/// again and again, holding up every event after it.
fn bus_events(event: &TaskEvent, max_payload: usize) -> Result<Vec<NewEvent>> {
    let encode = |payload: &Payload<'_>| {
        serde_json::to_vec(payload)
            .map_err(|error| TaskStoreError::Corrupt(format!("cannot encode event {}: {error}", event.cursor)))
    };
    let whole = Payload {
        task_id: &event.task_id,
        context_id: &event.context_id,
        agent_id: &event.agent_id,
        status: &event.status,
        artifact: event.artifact.as_ref(),
        append: event.append,
        last_chunk: event.last_chunk,
        message: event.message.as_ref(),
        content_omitted: false,
    };
    let mut payload = encode(&whole)?;
    if payload.len() > max_payload {
        let status = TaskStatus { message: None, ..event.status.clone() };
        let bare = Payload { status: &status, artifact: None, message: None, content_omitted: true, ..whole };
        payload = encode(&bare)?;
        tracing::debug!(cursor = %event.cursor, "a task event too large for the event bus goes without its content");
    }
    let attributes = HashMap::from([
        ("task_id".to_owned(), event.task_id.clone()),
        ("context_id".to_owned(), event.context_id.clone()),
        ("agent_id".to_owned(), event.agent_id.clone()),
    ]);
    // The task's id makes the key the store's own: a cursor alone would
    // repeat when the store starts over on a new database beside the same
    // bus, or match a key some other publisher in the namespace chose, and
    // the bus would drop the event as a retry of theirs.
    let key = format!("{SOURCE}/{}/{}", event.task_id, event.cursor.id);
    let change = NewEvent {
        r#type: change_type(event.kind).to_owned(),
        source: SOURCE.to_owned(),
        subject: event.task_id.clone(),
        payload,
        content_type: "application/json".to_owned(),
        attributes,
        idempotency_key: key.clone(),
        time: Some(timestamp(event.created_at)),
    };
    let ending = match event.kind {
        EventKind::StatusChanged => final_type(event.status.state),
        EventKind::Created | EventKind::ArtifactUpdated | EventKind::MessageAdded => None,
    };
    let Some(ending) = ending else {
        return Ok(vec![change]);
    };
    let ended = NewEvent { r#type: ending.to_owned(), idempotency_key: format!("{key}/final"), ..change.clone() };
    Ok(vec![change, ended])
}

fn change_type(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "task.created",
        EventKind::StatusChanged => "task.status_changed",
        EventKind::ArtifactUpdated => "task.artifact_updated",
        EventKind::MessageAdded => "task.message_added",
    }
}

/// The type of the event that announces a task ended in `state`.
fn final_type(state: TaskState) -> Option<&'static str> {
    match state {
        TaskState::Completed => Some("task.completed"),
        TaskState::Failed => Some("task.failed"),
        TaskState::Canceled => Some("task.canceled"),
        TaskState::Rejected => Some("task.rejected"),
        TaskState::Submitted | TaskState::Working | TaskState::InputRequired | TaskState::AuthRequired => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Cursor, Role};

    fn event(id: i64, namespace: &str, kind: EventKind, state: TaskState) -> TaskEvent {
        TaskEvent {
            cursor: Cursor { tx: 3, id },
            kind,
            namespace: namespace.to_owned(),
            task_id: format!("task-{id}"),
            context_id: "ctx".to_owned(),
            agent_id: "echo".to_owned(),
            status: TaskStatus { state, message: None, timestamp: 1_000_000 },
            artifact: None,
            append: false,
            last_chunk: false,
            message: None,
            created_at: 1_500_000,
        }
    }

    /// The bus's default payload limit.
    const LIMIT: usize = 1 << 20;

    #[test]
    fn an_event_too_large_for_the_bus_goes_without_its_content() {
        let mut added = event(9, "ns", EventKind::MessageAdded, TaskState::Working);
        added.message = Some(Message::text("m9", Role::User, "x".repeat(LIMIT)));
        added.status.message = Some(Message::text("s9", Role::Agent, "working on it"));
        let published = bus_events(&added, LIMIT).unwrap();
        let bus = &published[0];
        assert!(bus.payload.len() <= LIMIT, "{} bytes", bus.payload.len());
        let payload: serde_json::Value = serde_json::from_slice(&bus.payload).unwrap();
        assert_eq!(payload["content_omitted"], true);
        assert!(payload["message"].is_null() && payload["status"]["message"].is_null(), "{payload}");
        assert_eq!(
            (payload["task_id"].as_str(), payload["status"]["state"].as_str()),
            (Some("task-9"), Some("working"))
        );
        assert_eq!(bus.idempotency_key, "taskstore/task-9/9", "still the change's event, once");

        added.message = Some(Message::text("m9", Role::User, "small"));
        let payload: serde_json::Value =
            serde_json::from_slice(&bus_events(&added, LIMIT).unwrap()[0].payload).unwrap();
        assert_eq!(payload.get("content_omitted"), None, "a payload that fits is whole: {payload}");
        assert_eq!(payload["message"]["parts"][0]["content"]["text"], "small");
    }

    #[test]
    fn a_change_is_one_event_about_its_task() {
        let mut created = event(7, "ns", EventKind::Created, TaskState::Submitted);
        created.message = Some(Message::text("m1", Role::User, "hello"));
        let published = bus_events(&created, LIMIT).unwrap();
        assert_eq!(published.len(), 1);
        let bus = &published[0];
        assert_eq!(bus.r#type, "task.created");
        assert_eq!(bus.source, "taskstore");
        assert_eq!(bus.subject, "task-7");
        assert_eq!(bus.idempotency_key, "taskstore/task-7/7");
        assert_eq!(bus.content_type, "application/json");
        assert_eq!(bus.attributes["task_id"], "task-7");
        assert_eq!(bus.attributes["context_id"], "ctx");
        assert_eq!(bus.attributes["agent_id"], "echo");
        assert_eq!(bus.time, Some(prost_types::Timestamp { seconds: 1, nanos: 500_000_000 }));
        let payload: serde_json::Value = serde_json::from_slice(&bus.payload).unwrap();
        assert_eq!(payload["task_id"], "task-7");
        assert_eq!(payload["context_id"], "ctx");
        assert_eq!(payload["agent_id"], "echo");
        assert_eq!(payload["status"]["state"], "submitted");
        assert_eq!(payload["message"]["parts"][0]["content"]["text"], "hello");
    }

    #[test]
    fn every_kind_has_its_type_and_only_final_states_add_an_event() {
        let kinds = [
            (EventKind::Created, "task.created"),
            (EventKind::StatusChanged, "task.status_changed"),
            (EventKind::ArtifactUpdated, "task.artifact_updated"),
            (EventKind::MessageAdded, "task.message_added"),
        ];
        for (kind, name) in kinds {
            let published = bus_events(&event(1, "ns", kind, TaskState::Working), LIMIT).unwrap();
            assert_eq!(published.iter().map(|bus| bus.r#type.as_str()).collect::<Vec<_>>(), [name]);
        }
        // An artifact written to a finished task's event carries the final
        // status too, but only the status change announces the ending.
        let late = bus_events(&event(1, "ns", EventKind::ArtifactUpdated, TaskState::Completed), LIMIT).unwrap();
        assert_eq!(late.len(), 1);
    }

    #[test]
    fn a_final_status_also_announces_the_ending_under_its_own_key() {
        let endings = [
            (TaskState::Completed, "task.completed"),
            (TaskState::Failed, "task.failed"),
            (TaskState::Canceled, "task.canceled"),
            (TaskState::Rejected, "task.rejected"),
        ];
        for (state, name) in endings {
            let published = bus_events(&event(42, "ns", EventKind::StatusChanged, state), LIMIT).unwrap();
            let types: Vec<&str> = published.iter().map(|bus| bus.r#type.as_str()).collect();
            assert_eq!(types, ["task.status_changed", name]);
            assert_eq!(published[0].idempotency_key, "taskstore/task-42/42");
            assert_eq!(published[1].idempotency_key, "taskstore/task-42/42/final");
            assert_eq!(published[1].payload, published[0].payload);
            assert_eq!(published[1].subject, "task-42");
        }
    }

    #[test]
    fn namespaces_are_published_apart_each_in_commit_order() {
        let events = [
            event(1, "a", EventKind::Created, TaskState::Submitted),
            event(2, "b", EventKind::Created, TaskState::Submitted),
            event(3, "a", EventKind::StatusChanged, TaskState::Completed),
            event(4, "b", EventKind::StatusChanged, TaskState::Working),
        ];
        let groups = by_namespace(&events, LIMIT).unwrap();
        let keys: Vec<(&str, Vec<&str>)> = groups
            .iter()
            .map(|(namespace, events)| {
                (namespace.as_str(), events.iter().map(|bus| bus.idempotency_key.as_str()).collect())
            })
            .collect();
        assert_eq!(
            keys,
            [
                ("a", vec!["taskstore/task-1/1", "taskstore/task-3/3", "taskstore/task-3/3/final"]),
                ("b", vec!["taskstore/task-2/2", "taskstore/task-4/4"])
            ]
        );
    }
}
