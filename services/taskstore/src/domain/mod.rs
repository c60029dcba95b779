//! Domain types and rules of the task store.

mod limits;
mod listing;
mod model;
mod requests;
mod state;

pub use limits::{Limits, prompt_fingerprint};
pub use listing::{Counted, PageToken, TaskPage, TaskQuery};
pub use model::{
    Artifact, JsonObject, Message, Owner, OwnerKind, Part, PartContent, Role, SpawnContext, Task, TaskStatus,
};
pub use requests::*;
pub use state::TaskState;

pub use chorus_runtime::time::now_micros;

/// A new task's id: a UUIDv7, so ids sort by creation.
pub fn new_task_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
