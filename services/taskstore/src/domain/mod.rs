//! Domain types and rules of the task store.

mod limits;
mod model;
mod requests;
mod state;

pub use limits::{Limits, prompt_fingerprint};
pub use model::{
    Artifact, JsonObject, Message, Owner, OwnerKind, Part, PartContent, Role, SpawnContext, Task, TaskStatus,
};
pub use requests::*;
pub use state::TaskState;

/// Microseconds since the Unix epoch, now.
pub fn now_micros() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_micros()).unwrap_or(i64::MAX)
}
