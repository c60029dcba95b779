//! What the bridge does when the agent's task stops in `input-required`.
//!
//! - The status message's metadata holds [`READ_TEXT_FILE`]
//!   (`{"path": "/abs/file", "line": 1, "limit": 100}`, `line` and `limit`
//!   optional): the agent wants a file of the IDE's. When the IDE advertised
//!   `fs.readTextFile`, the bridge calls `fs/read_text_file` and answers with
//!   a user message holding the text (one text part named by the path, the
//!   same metadata key set to `{"path"}`); when it cannot, with the reason
//!   (metadata `{"path", "error"}`). The IDE sees a `read` tool call.
//! - Any other question becomes `session/request_permission` with the
//!   options `allow` and `reject`; the answer is a user message whose text
//!   is the chosen option id (metadata [`PERMISSION`] holds it too). If the
//!   IDE cancels the request, the turn ends `cancelled`.

use std::path::PathBuf;
use std::sync::Arc;

use a2a::{Message, Part, PartContent};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Ide;
use super::content::{Content, PART_URI, ToolCall, ToolKind, ToolStatus, Update};
use super::error::{AcpError, Result};

/// Metadata key of an agent's request for an IDE file, and of its answer.
pub const READ_TEXT_FILE: &str = "acp/readTextFile";
/// Metadata key of the answer to a permission question.
pub const PERMISSION: &str = "acp/permission";
/// The option that lets the agent go on.
pub const ALLOW: &str = "allow";
/// The option that does not.
pub const REJECT: &str = "reject";

/// A file the agent asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FileRequest {
    pub(crate) path: PathBuf,
    pub(crate) line: Option<u32>,
    pub(crate) limit: Option<u32>,
}

/// The file request in a status message's metadata, if it holds one.
pub(crate) fn file_request(message: Option<&Message>) -> Option<FileRequest> {
    let request = message?.metadata.as_ref()?.get(READ_TEXT_FILE)?;
    let number = |key: &str| request.get(key).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
    Some(FileRequest {
        path: PathBuf::from(request.get("path").and_then(Value::as_str).unwrap_or_default()),
        line: number("line"),
        limit: number("limit"),
    })
}

/// The options of every permission question.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PermissionOption {
    pub(crate) id: &'static str,
    pub(crate) name: &'static str,
    /// `allow_once` when true, `reject_once` when false.
    pub(crate) allows: bool,
}

/// The options the IDE offers for a question.
pub(crate) const OPTIONS: [PermissionOption; 2] = [
    PermissionOption { id: ALLOW, name: "Allow", allows: true },
    PermissionOption { id: REJECT, name: "Reject", allows: false },
];

/// How a question was answered.
pub(crate) enum Answer {
    /// Continue the task with these parts and this metadata entry.
    Reply(Vec<Part>, (String, Value)),
    /// The user cancelled.
    Cancelled,
}

/// One question of the agent, to put to the IDE.
pub(crate) struct Question<'a> {
    pub(crate) ide: Arc<dyn Ide>,
    pub(crate) session_id: &'a str,
    pub(crate) task_id: &'a str,
    /// Which question of the turn this is (tool call ids stay unique).
    pub(crate) number: usize,
    pub(crate) can_read_files: bool,
    pub(crate) cancel: &'a CancellationToken,
}

impl Question<'_> {
    /// Puts the question to the IDE and turns its answer into a reply.
    pub(crate) async fn answer(&self, message: Option<&Message>) -> Result<Answer> {
        match file_request(message) {
            Some(request) => self.read_file(request).await,
            None => self.permission(message).await,
        }
    }

    fn update(&self, update: Update) -> Result<()> {
        self.ide.update(self.session_id, update)
    }

    async fn permission(&self, message: Option<&Message>) -> Result<Answer> {
        let question = message
            .and_then(Message::text)
            .filter(|text| !text.trim().is_empty())
            .unwrap_or("The agent asks to continue.")
            .to_owned();
        let title = question.lines().next().unwrap_or_default().to_owned();
        let call = ToolCall {
            id: format!("input-{}-{}", self.task_id, self.number),
            title,
            kind: ToolKind::Other,
            status: ToolStatus::InProgress,
            content: vec![Content::Text(question)],
            locations: Vec::new(),
        };
        let id = call.id.clone();
        self.update(Update::ToolCall(call.clone()))?;
        let chosen = tokio::select! {
            () = self.cancel.cancelled() => None,
            chosen = self.ide.request_permission(self.session_id, call) => chosen?,
        };
        // A selected outcome names an offered option (ACP schema); another
        // would reach the agent as the user's words.
        let offered = chosen.as_ref().is_none_or(|chosen| OPTIONS.iter().any(|option| option.id == chosen));
        let status = if chosen.is_some() && offered { ToolStatus::Completed } else { ToolStatus::Failed };
        self.update(Update::ToolChange { id, status: Some(status), content: None })?;
        if !offered {
            let ids: Vec<&str> = OPTIONS.iter().map(|option| option.id).collect();
            return Err(AcpError::Client(format!(
                "it chose option {:?}, which was not offered ({})",
                chosen.unwrap_or_default(),
                ids.join(", ")
            )));
        }
        Ok(match chosen {
            Some(option) => Answer::Reply(vec![Part::text(option.clone())], (PERMISSION.to_owned(), json!(option))),
            None => Answer::Cancelled,
        })
    }

    async fn read_file(&self, request: FileRequest) -> Result<Answer> {
        let path = request.path.clone();
        let call = ToolCall {
            id: format!("read-{}-{}", self.task_id, self.number),
            title: format!("Read {}", path.display()),
            kind: ToolKind::Read,
            status: ToolStatus::InProgress,
            content: Vec::new(),
            locations: vec![path.clone()],
        };
        let id = call.id.clone();
        self.update(Update::ToolCall(call))?;
        let read = if !path.is_absolute() {
            Err(format!("the agent asked for {}, which is not an absolute path", path.display()))
        } else if !self.can_read_files {
            Err("the client does not let the agent read its files (no fs.readTextFile capability)".to_owned())
        } else {
            tokio::select! {
                () = self.cancel.cancelled() => return Ok(Answer::Cancelled),
                read = self.ide.read_text_file(self.session_id, &request) => read.map_err(|error| error.to_string()),
            }
        };
        let status = if read.is_ok() { ToolStatus::Completed } else { ToolStatus::Failed };
        self.update(Update::ToolChange { id, status: Some(status), content: None })?;
        let shown = path.display().to_string();
        Ok(match read {
            Ok(text) => {
                let uri = format!("file://{shown}");
                let part = Part {
                    content: PartContent::Text(text),
                    filename: Some(shown.clone()),
                    media_type: None,
                    metadata: Some([(PART_URI.to_owned(), json!(uri))].into()),
                };
                Answer::Reply(vec![part], (READ_TEXT_FILE.to_owned(), json!({ "path": shown })))
            }
            Err(error) => Answer::Reply(
                vec![Part::text(error.clone())],
                (READ_TEXT_FILE.to_owned(), json!({ "path": shown, "error": error })),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_request_is_read_from_the_status_metadata() {
        let mut message = Message::new(a2a::Role::Agent, vec![Part::text("need a file")]);
        assert_eq!(file_request(Some(&message)), None);
        message.metadata = Some([(READ_TEXT_FILE.to_owned(), json!({"path": "/src/a.rs", "line": 3}))].into());
        let request = file_request(Some(&message)).expect("a request");
        assert_eq!(request, FileRequest { path: PathBuf::from("/src/a.rs"), line: Some(3), limit: None });
    }
}
