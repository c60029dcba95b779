//! The `chorus.taskstore.v1` gRPC service: handlers convert and delegate.

mod convert;
mod handlers;
mod inbox;
mod pages;
mod push_convert;

use chorus_proto::taskstore::{self as pb, task_store_server::TaskStoreServer};
use chorus_runtime::{
    server::ServerConfig,
    telemetry::record_ids,
    validate::{self, FieldViolation},
};

use crate::{
    domain::{Message, Role, Task},
    service::TaskStore,
};

/// The `chorus.taskstore.v1.TaskStore` service over a [`TaskStore`].
#[derive(Debug, Clone)]
pub struct TaskStoreGrpc {
    store: TaskStore,
    /// The largest message this service takes, and the size a page of
    /// tasks keeps under, so that a client with the same limit reads it.
    max_message_bytes: usize,
}

impl TaskStoreGrpc {
    pub fn new(store: TaskStore) -> Self {
        Self { store, max_message_bytes: ServerConfig::default().max_message_bytes }
    }

    /// The tonic server, accepting requests up to `max_message_bytes` and
    /// keeping pages of tasks under it.
    pub fn into_server(self, max_message_bytes: usize) -> TaskStoreServer<Self> {
        TaskStoreServer::new(Self { max_message_bytes, ..self }).max_decoding_message_size(max_message_bytes)
    }
}

/// Checks a namespace and a task id, and records both on the request span.
fn task_ref(namespace: &str, field: &str, task_id: &str) -> Result<(String, String), FieldViolation> {
    let namespace = validate::namespace(namespace)?;
    let task_id = validate::id(field, task_id)?;
    record_ids(&namespace, &task_id);
    Ok((namespace, task_id))
}

/// A message for the task `task_id`, or for the task the call creates
/// (`None`), stored under it: one that names another task is refused, not
/// moved to this one, and a task starts with its client's words.
fn message_for(field: &str, value: Option<pb::Message>, task_id: Option<&str>) -> Result<Message, FieldViolation> {
    let message = convert::message(field, value)?;
    if task_id.is_none() && message.role == Role::Agent {
        return Err(FieldViolation::new(
            format!("{field}.role"),
            "is ROLE_AGENT, but a task starts with its client's message: ROLE_USER",
        ));
    }
    let Some(named) = message.task_id.as_deref() else {
        return Ok(message);
    };
    match task_id {
        Some(task_id) if named == task_id => Ok(message),
        Some(task_id) => Err(FieldViolation::new(
            format!("{field}.task_id"),
            format!("names task {named}, but the call is for task {task_id}: leave it empty or name that task"),
        )),
        None => Err(FieldViolation::new(
            format!("{field}.task_id"),
            format!("names task {named}, but the call creates a task: leave it empty (AddMessage continues a task)"),
        )),
    }
}

/// Refuses a new task's first message naming another context than the
/// request's `context_id` (a task takes its first message's when the request
/// names none).
fn check_context(named: Option<&str>, message: &Message) -> Result<(), FieldViolation> {
    match (named, message.context_id.as_deref()) {
        (Some(named), Some(other)) if named != other => Err(FieldViolation::new(
            "message.context_id",
            format!("names context {other}, but the request's context_id is {named}: leave one empty or name the same"),
        )),
        _ => Ok(()),
    }
}

/// As [`message_for`], for a message that may be absent.
fn optional_message_for(
    field: &str,
    value: Option<pb::Message>,
    task_id: &str,
) -> Result<Option<Message>, FieldViolation> {
    value.map(|value| message_for(field, Some(value), Some(task_id))).transpose()
}

/// The answer to a write: the task, without its history and artifacts when
/// the caller asked for it `brief`.
fn written(mut task: Task, brief: bool) -> tonic::Response<pb::Task> {
    if brief {
        task.history.clear();
        task.artifacts.clear();
    }
    tonic::Response::new(convert::task_out(task))
}
