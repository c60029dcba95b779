//! Task-store requests and watches, as a test writes them.

use std::time::Duration;

use chorus_proto::taskstore::{
    CreateTaskRequest, GetTaskRequest, Message, Part, Role, Task, TaskEvent, TaskState, WatchTaskRequest,
    part::Content, task_event, task_store_client::TaskStoreClient,
};
use tonic::{Streaming, transport::Channel};

use crate::DEADLINE;

/// A task-store client over a real connection.
pub type Client = TaskStoreClient<Channel>;

/// A message with a fresh id and one text part.
pub fn text_message(role: Role, text: &str) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        role: role.into(),
        parts: vec![Part { content: Some(Content::Text(text.to_owned())), ..Part::default() }],
        ..Message::default()
    }
}

/// A request for a task for `agent_id` whose first message says `text`.
pub fn create_request(namespace: &str, agent_id: &str, text: &str) -> CreateTaskRequest {
    CreateTaskRequest {
        namespace: namespace.to_owned(),
        agent_id: agent_id.to_owned(),
        message: Some(text_message(Role::User, text)),
        ..CreateTaskRequest::default()
    }
}

/// Creates a task for `agent_id` whose first message says `text`.
pub async fn create_task(client: &mut Client, namespace: &str, agent_id: &str, text: &str) -> Task {
    let created = client.create_task(create_request(namespace, agent_id, text)).await;
    created.unwrap_or_else(|status| panic!("CreateTask failed: {status:?}")).into_inner()
}

pub async fn get_task(client: &mut Client, namespace: &str, id: &str) -> Task {
    let request = GetTaskRequest { namespace: namespace.to_owned(), id: id.to_owned(), history_length: None };
    let task = client.get_task(request).await;
    task.unwrap_or_else(|status| panic!("GetTask {id} failed: {status:?}")).into_inner()
}

/// The text parts of a message, joined by newlines.
pub fn text_of(message: Option<&Message>) -> String {
    let parts = message.map_or(&[][..], |message| &message.parts);
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|part| match &part.content {
            Some(Content::Text(text)) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    texts.join("\n")
}

/// A task's state.
pub fn state(task: &Task) -> TaskState {
    task.status.as_ref().map_or(TaskState::Unspecified, |status| status.state())
}

/// The text of a task's status message.
pub fn status_text(task: &Task) -> String {
    text_of(task.status.as_ref().and_then(|status| status.message.as_ref()))
}

/// The state an event reports (its task's state after the change).
pub fn event_state(event: &TaskEvent) -> TaskState {
    event.status.as_ref().map_or(TaskState::Unspecified, |status| status.state())
}

/// The text of the status message an event reports.
pub fn event_text(event: &TaskEvent) -> String {
    text_of(event.status.as_ref().and_then(|status| status.message.as_ref()))
}

/// Whether `event` is a status change to `state`.
pub fn is_status(event: &TaskEvent, state: TaskState) -> bool {
    event.kind() == task_event::Kind::StatusChanged && event_state(event) == state
}

/// A `WatchTask` stream, read with deadlines.
#[derive(Debug)]
pub struct TaskWatch {
    task_id: String,
    stream: Streaming<TaskEvent>,
    seen: Vec<TaskEvent>,
}

impl TaskWatch {
    /// Watches task `task_id` after `after_cursor` (empty: from its first event).
    pub async fn open(client: &mut Client, namespace: &str, task_id: &str, after_cursor: &str) -> Self {
        let request = WatchTaskRequest {
            namespace: namespace.to_owned(),
            task_id: task_id.to_owned(),
            after_cursor: after_cursor.to_owned(),
            snapshot: false,
        };
        let stream = client.watch_task(request).await;
        let stream = stream.unwrap_or_else(|status| panic!("WatchTask {task_id} failed: {status:?}")).into_inner();
        Self { task_id: task_id.to_owned(), stream, seen: Vec::new() }
    }

    /// The next event, `None` when the watch ended (the task is terminal).
    pub async fn next(&mut self) -> Option<TaskEvent> {
        let next = tokio::time::timeout(DEADLINE, self.stream.message()).await;
        let event = match next {
            Ok(Ok(event)) => event,
            Ok(Err(status)) => panic!("watch of task {} broke: {status:?}; seen {:#?}", self.task_id, self.seen),
            Err(_) => panic!("no event for task {} within {DEADLINE:?}; seen {:#?}", self.task_id, self.seen),
        };
        if let Some(event) = &event {
            self.seen.push(event.clone());
        }
        event
    }

    /// Reads events until one matches `wanted` (described by `what`), and returns it.
    pub async fn until(&mut self, what: &str, wanted: impl Fn(&TaskEvent) -> bool) -> TaskEvent {
        loop {
            match self.next().await {
                Some(event) if wanted(&event) => return event,
                Some(_) => {}
                None => panic!("task {} ended before {what}; seen {:#?}", self.task_id, self.seen),
            }
        }
    }

    /// Reads events until a status change to `state`, and returns it.
    pub async fn until_status(&mut self, state: TaskState) -> TaskEvent {
        self.until(&format!("becoming {state:?}"), |event| is_status(event, state)).await
    }

    /// Reads events until the watch ends, and returns every event it gave.
    pub async fn until_end(mut self) -> Vec<TaskEvent> {
        while self.next().await.is_some() {}
        self.seen
    }

    /// Asserts no event arrives for `quiet`: nothing happens to the task.
    pub async fn assert_quiet(&mut self, quiet: Duration) {
        if let Ok(next) = tokio::time::timeout(quiet, self.stream.message()).await {
            panic!("task {} changed within {quiet:?}: {next:#?}; seen before {:#?}", self.task_id, self.seen);
        }
    }

    /// Every event read so far.
    pub fn seen(&self) -> &[TaskEvent] {
        &self.seen
    }
}
