//! The TCK scenarios (`scenarios/*.feature` of a2aproject/a2a-tck), keyed
//! on the messageId prefix of the message that starts or continues a turn.

use std::time::Duration;

use a2a::{Artifact, Message, Part, PartContent};
use chorus_proto::taskstore as pb;
use serde_json::json;

use super::{Turn, Written};

/// How long the `test-resubscribe` scenario keeps its task working.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(4);

/// An artifact named `result`.
fn result(parts: Vec<Part>, artifact_id: &str) -> Artifact {
    Artifact {
        artifact_id: artifact_id.to_owned(),
        name: Some("result".to_owned()),
        description: None,
        parts,
        metadata: None,
        extensions: None,
    }
}

/// One turn of the `tck` agent.
pub(super) async fn run(mut turn: Turn, message: &Message) -> Written {
    let id = message.message_id.as_str();
    let artifact_id = uuid::Uuid::new_v4().to_string();
    let file = || Part {
        content: PartContent::Raw(b"tck".to_vec()),
        filename: Some("output.txt".to_owned()),
        media_type: Some("text/plain".to_owned()),
        metadata: None,
    };
    let streamed = [
        ("tck-stream-artifact-text", "Streamed text content"),
        ("tck-stream-ordering-001", "Ordered output"),
        ("tck-stream-001", "Stream hello from TCK"),
        ("tck-stream-003", "Stream task lifecycle"),
    ];
    if let Some((_, text)) = streamed.iter().find(|(prefix, _)| id.starts_with(prefix)) {
        turn.status(pb::TaskState::Working, None, None).await?;
        turn.artifact(result(vec![Part::text(*text)], &artifact_id), false, true).await?;
        return turn.status(pb::TaskState::Completed, None, None).await;
    }
    if id.starts_with("tck-stream-artifact-chunked") {
        turn.status(pb::TaskState::Working, None, None).await?;
        turn.artifact(result(vec![Part::text("chunk-1 ")], &artifact_id), false, false).await?;
        turn.artifact(result(vec![Part::text("chunk-2")], &artifact_id), true, true).await?;
        return turn.status(pb::TaskState::Completed, None, None).await;
    }
    if id.starts_with("tck-stream-artifact-file") {
        turn.status(pb::TaskState::Working, None, None).await?;
        turn.artifact(result(vec![file()], &artifact_id), false, true).await?;
        return turn.status(pb::TaskState::Completed, None, None).await;
    }
    if id.starts_with("test-resubscribe-message-id") {
        turn.status(pb::TaskState::Working, None, None).await?;
        tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
        return turn.status(pb::TaskState::Completed, None, None).await;
    }
    if id.starts_with("tck-stream-002") {
        return turn.status(pb::TaskState::Completed, None, None).await;
    }
    let artifact = if id.starts_with("tck-artifact-file-url") {
        Some(Part {
            content: PartContent::Url("https://example.com/output.txt".to_owned()),
            filename: Some("output.txt".to_owned()),
            media_type: Some("text/plain".to_owned()),
            metadata: None,
        })
    } else if id.starts_with("tck-artifact-text") {
        Some(Part::text("Generated text content"))
    } else if id.starts_with("tck-artifact-file") {
        Some(file())
    } else if id.starts_with("tck-artifact-data") {
        Some(Part {
            content: PartContent::Data(json!({"key": "value", "count": 42})),
            filename: None,
            media_type: None,
            metadata: None,
        })
    } else {
        None
    };
    if let Some(part) = artifact {
        turn.artifact(result(vec![part], &artifact_id), false, true).await?;
        return turn.status(pb::TaskState::Completed, None, None).await;
    }
    if id.starts_with("tck-input-required") {
        return turn.status(pb::TaskState::InputRequired, Some("Please provide more input"), None).await;
    }
    if id.starts_with("tck-reject-task") {
        return turn.status(pb::TaskState::Rejected, Some("rejected"), None).await;
    }
    if id.starts_with("tck-complete-task") {
        return turn.status(pb::TaskState::Completed, Some("Hello from TCK"), None).await;
    }
    let text = message.text().unwrap_or_default().to_owned();
    turn.artifact(result(vec![Part::text(text.clone())], &artifact_id), false, true).await?;
    turn.status(pb::TaskState::Completed, Some(&text), None).await
}
