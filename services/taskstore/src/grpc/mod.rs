//! The `chorus.taskstore.v1` gRPC service: handlers convert and delegate.

mod convert;
mod handlers;
mod inbox;
mod pages;
mod push_convert;

use chorus_proto::taskstore::task_store_server::TaskStoreServer;
use chorus_runtime::{
    server::ServerConfig,
    telemetry::record_ids,
    validate::{self, FieldViolation},
};

use crate::service::TaskStore;

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
