//! The TCK scenarios (`scenarios/*.feature` of a2aproject/a2a-tck), keyed
//! on the messageId prefix of the message that starts or continues a turn.
//! Most are answered at once ([`reply`]); the streaming ones work in steps.

use std::time::Duration;

use a2a::{Artifact, Message, Part, PartContent, Role};
use chorus_proto::taskstore as pb;
use serde_json::json;

use super::{Turn, Written};
use crate::convert;

/// How long the `test-resubscribe` scenario keeps its task working.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(4);

/// An artifact named `result`, with a new id.
fn result(parts: Vec<Part>) -> Artifact {
    Artifact {
        artifact_id: uuid::Uuid::new_v4().to_string(),
        name: Some("result".to_owned()),
        description: None,
        parts,
        metadata: None,
        extensions: None,
    }
}

fn file() -> Part {
    Part {
        content: PartContent::Raw(b"tck".to_vec()),
        filename: Some("output.txt".to_owned()),
        media_type: Some("text/plain".to_owned()),
        metadata: None,
    }
}

/// One turn of the `tck` agent on a task that exists.
pub(super) async fn run(turn: Turn, message: &Message) -> Written {
    match scenario(message) {
        Scenario::Reply(reply) => reply.write(turn).await,
        Scenario::Steps(steps) => in_steps(turn, steps).await,
    }
}

/// How the turn a message starts goes.
enum Scenario {
    /// Answered at once.
    Reply(Reply),
    /// Streamed: `working` first, then the work, then `completed`.
    Steps(Steps),
}

/// The work of a streamed scenario.
enum Steps {
    /// Working for [`RESUBSCRIBE_PAUSE`], without output.
    Pause,
    /// One artifact in two chunks.
    Chunked,
    /// One artifact of a file.
    File,
    /// One artifact of this text.
    Text(&'static str),
}

async fn in_steps(mut turn: Turn, steps: Steps) -> Written {
    turn.status(pb::TaskState::Working, None, None).await?;
    match steps {
        Steps::Pause => tokio::time::sleep(RESUBSCRIBE_PAUSE).await,
        Steps::Chunked => {
            let first = result(vec![Part::text("chunk-1 ")]);
            let mut second = first.clone();
            second.parts = vec![Part::text("chunk-2")];
            turn.artifact(first, false, false).await?;
            turn.artifact(second, true, true).await?;
        }
        Steps::File => turn.artifact(result(vec![file()]), false, true).await?,
        Steps::Text(text) => turn.artifact(result(vec![Part::text(text)]), false, true).await?,
    }
    turn.status(pb::TaskState::Completed, None, None).await
}

/// The streamed scenarios of one text artifact, and its text.
const STREAMED: [(&str, &str); 4] = [
    ("tck-stream-artifact-text", "Streamed text content"),
    ("tck-stream-ordering-001", "Ordered output"),
    ("tck-stream-001", "Stream hello from TCK"),
    ("tck-stream-003", "Stream task lifecycle"),
];

/// What a turn answers at once, with no work in between: its artifacts,
/// then its state with its message.
pub(super) struct Reply {
    state: pb::TaskState,
    text: Option<String>,
    artifacts: Vec<Artifact>,
}

impl Reply {
    fn new(state: pb::TaskState, text: Option<&str>, artifacts: Vec<Artifact>) -> Self {
        Self { state, text: text.map(str::to_owned), artifacts }
    }

    /// The reply as the answer a task is created with.
    pub(super) fn into_answer(self) -> pb::TaskAnswer {
        pb::TaskAnswer {
            state: self.state.into(),
            message: self.text.map(|text| convert::message_in(&Message::new(Role::Agent, vec![Part::text(text)]))),
            artifacts: self.artifacts.iter().map(convert::artifact_in).collect(),
        }
    }

    /// The reply written to a task that exists.
    async fn write(self, mut turn: Turn) -> Written {
        for artifact in self.artifacts {
            turn.artifact(artifact, false, true).await?;
        }
        turn.status(self.state, self.text.as_deref(), None).await
    }
}

/// The `tck` agent's reply to `message`, unless its scenario works in steps.
pub(super) fn reply(message: &Message) -> Option<Reply> {
    match scenario(message) {
        Scenario::Reply(reply) => Some(reply),
        Scenario::Steps(_) => None,
    }
}

/// The scenario a message's id names. A message no scenario names is
/// echoed: its text as an artifact and as the status message.
fn scenario(message: &Message) -> Scenario {
    let id = message.message_id.as_str();
    let steps = if id.starts_with("test-resubscribe-message-id") {
        Some(Steps::Pause)
    } else if id.starts_with("tck-stream-artifact-chunked") {
        Some(Steps::Chunked)
    } else if id.starts_with("tck-stream-artifact-file") {
        Some(Steps::File)
    } else {
        STREAMED.iter().find(|(prefix, _)| id.starts_with(prefix)).map(|(_, text)| Steps::Text(text))
    };
    if let Some(steps) = steps {
        return Scenario::Steps(steps);
    }
    let completed =
        |text: Option<&str>, artifacts| Scenario::Reply(Reply::new(pb::TaskState::Completed, text, artifacts));
    let artifact = |part| completed(None, vec![result(vec![part])]);
    if id.starts_with("tck-stream-002") {
        completed(None, Vec::new())
    } else if id.starts_with("tck-artifact-file-url") {
        artifact(Part {
            content: PartContent::Url("https://example.com/output.txt".to_owned()),
            filename: Some("output.txt".to_owned()),
            media_type: Some("text/plain".to_owned()),
            metadata: None,
        })
    } else if id.starts_with("tck-artifact-text") {
        artifact(Part::text("Generated text content"))
    } else if id.starts_with("tck-artifact-file") {
        artifact(file())
    } else if id.starts_with("tck-artifact-data") {
        artifact(Part {
            content: PartContent::Data(json!({"key": "value", "count": 42})),
            filename: None,
            media_type: None,
            metadata: None,
        })
    } else if id.starts_with("tck-input-required") {
        Scenario::Reply(Reply::new(pb::TaskState::InputRequired, Some("Please provide more input"), Vec::new()))
    } else if id.starts_with("tck-reject-task") {
        Scenario::Reply(Reply::new(pb::TaskState::Rejected, Some("rejected"), Vec::new()))
    } else if id.starts_with("tck-complete-task") {
        completed(Some("Hello from TCK"), Vec::new())
    } else {
        let text = message.text().unwrap_or_default();
        completed(Some(text), vec![result(vec![Part::text(text)])])
    }
}
