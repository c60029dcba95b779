//! The built-in `echo` agent: answers every task with its own text, as the
//! final message and as an artifact named `echo`.

use tokio_util::sync::CancellationToken;

use crate::{Client, HandlerError, Placement, Reply, TaskContext, WorkerError, text_artifact};

/// The echo agent's id.
pub const AGENT_ID: &str = "echo";
/// How many tasks one echo worker handles at once.
pub const CAPACITY: u32 = 256;

/// Runs an echo worker placed at `placement` until `shutdown` is cancelled.
pub async fn run(client: Client, placement: Placement, shutdown: CancellationToken) -> Result<(), WorkerError> {
    placement.worker(client, AGENT_ID).capacity(CAPACITY).run(handle, shutdown).await
}

/// The echo handler.
pub async fn handle(task: TaskContext) -> Result<Reply, HandlerError> {
    Ok(reply(&task.text()))
}

fn reply(text: &str) -> Reply {
    Reply::text(text).with_artifact(text_artifact(AGENT_ID, text))
}

#[cfg(test)]
mod tests {
    use chorus_proto::taskstore::part::Content;

    use super::*;

    #[test]
    fn reply_echoes_the_text_as_message_and_artifact() {
        let reply = reply("hello\nworld");
        assert_eq!(reply.parts(), [crate::text_part("hello\nworld")]);
        let [artifact] = reply.artifacts() else {
            panic!("one artifact expected, got {:?}", reply.artifacts());
        };
        assert_eq!(artifact.name, "echo");
        assert!(uuid::Uuid::parse_str(&artifact.artifact_id).is_ok());
        let [part] = artifact.parts.as_slice() else {
            panic!("one part expected, got {:?}", artifact.parts);
        };
        assert_eq!(part.content, Some(Content::Text("hello\nworld".into())));
    }
}
