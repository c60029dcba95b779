//! The built-in `echo` agent: answers every task with its own text, as the
//! final message and as an artifact named `echo`; a message with other parts
//! than text (data, a file's bytes or URL) is answered with its parts as
//! they are.

use chorus_proto::taskstore::{Artifact, Part, part::Content};
use tokio_util::sync::CancellationToken;

use crate::{
    Client, HandlerError, Placement, Reply, TaskContext, WorkerError,
    reply::{latest_user_parts, text_of},
    text_artifact,
};

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
    let parts = latest_user_parts(task.task());
    let text_alone = parts.iter().all(|part| matches!(part.content, Some(Content::Text(_))));
    Ok(if text_alone { reply(&text_of(parts)) } else { reply_parts(parts) })
}

fn reply(text: &str) -> Reply {
    Reply::text(text).with_artifact(text_artifact(AGENT_ID, text))
}

fn reply_parts(parts: &[Part]) -> Reply {
    let artifact = Artifact {
        artifact_id: uuid::Uuid::new_v4().to_string(),
        name: AGENT_ID.to_owned(),
        parts: parts.to_vec(),
        ..Artifact::default()
    };
    parts.iter().cloned().fold(Reply::new(), Reply::with_part).with_artifact(artifact)
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn other_parts_are_echoed_as_they_are() {
        let data = Part { content: Some(Content::Url("https://example.com/a.png".into())), ..Part::default() };
        let parts = [crate::text_part("look"), data];
        let reply = reply_parts(&parts);
        assert_eq!(reply.parts(), parts);
        assert_eq!(reply.artifacts()[0].parts, parts);
    }
}
