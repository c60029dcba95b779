//! What the bridge does when the agent's task stops in `input-required`.
//!
//! - The status message's metadata holds [`READ_TEXT_FILE`]
//!   (`{"path": "/abs/file", "line": 1, "limit": 100}`, `line` and `limit`
//!   optional): the agent wants a file of the IDE's. When the IDE advertised
//!   `fs.readTextFile`, the bridge calls `fs/read_text_file` and answers with
//!   a user message holding the text (one text part named by the path, the
//!   same metadata key set to `{"path"}`); when it cannot, with the reason
//!   (metadata `{"path", "error"}`). The IDE sees a `read` tool call. Only
//!   files in the session's folders (`cwd`, `additionalDirectories`) are
//!   asked for, their paths with `.` and `..` resolved as written: the agent
//!   reads nothing else of the IDE's machine.
//! - Any other question becomes `session/request_permission` with the
//!   options `allow` and `reject`; the answer is a user message whose text
//!   is the chosen option id (metadata [`PERMISSION`] holds it too). If the
//!   IDE cancels the request, the turn ends `cancelled`.

use std::path::{Component, Path, PathBuf};
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
    /// The session's folders: the only ones the agent may read files in.
    pub(crate) folders: &'a [PathBuf],
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
        let path = resolved(&request.path);
        let request = FileRequest { path: path.clone(), ..request };
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
        } else if !self.folders.iter().any(|folder| path.starts_with(resolved(folder))) {
            let folders: Vec<String> = self.folders.iter().map(|folder| folder.display().to_string()).collect();
            Err(format!(
                "the agent asked for {}, which is outside the session's folders ({})",
                path.display(),
                folders.join(", ")
            ))
        } else if !self.can_read_files {
            Err("the client does not let the agent read its files (no fs.readTextFile capability)".to_owned())
        } else {
            tokio::select! {
                () = self.cancel.cancelled() => {
                    self.update(Update::ToolChange { id, status: Some(ToolStatus::Failed), content: None })?;
                    return Ok(Answer::Cancelled);
                }
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

/// `path` with its `.` and `..` resolved as written (not on disk: the
/// files are the IDE's); `..` above the root stays at the root.
fn resolved(path: &Path) -> PathBuf {
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                clean.pop();
            }
            other => clean.push(other),
        }
    }
    clean
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

    #[test]
    fn paths_are_resolved_as_written() {
        assert_eq!(resolved(Path::new("/w/./src/../lib.rs")), PathBuf::from("/w/lib.rs"));
        assert_eq!(resolved(Path::new("/w/../../etc/passwd")), PathBuf::from("/etc/passwd"));
        assert_eq!(resolved(Path::new("/w/a/")), PathBuf::from("/w/a"));
        assert!(!resolved(Path::new("/w/../wx/a")).starts_with("/w"), "a sibling whose name begins alike");
    }

    /// An IDE that reads every file it is asked for, noting its path.
    #[derive(Default)]
    struct Reader(std::sync::Mutex<Vec<PathBuf>>);

    #[async_trait::async_trait]
    impl Ide for Reader {
        fn update(&self, _: &str, _: Update) -> Result<()> {
            Ok(())
        }

        async fn request_permission(&self, _: &str, _: ToolCall) -> Result<Option<String>> {
            Ok(None)
        }

        async fn read_text_file(&self, _: &str, request: &FileRequest) -> Result<String> {
            self.0.lock().expect("reads").push(request.path.clone());
            Ok("text".to_owned())
        }
    }

    /// An IDE that never answers a read, noting the updates it is sent.
    #[derive(Default)]
    struct Silent(std::sync::Mutex<Vec<Update>>);

    #[async_trait::async_trait]
    impl Ide for Silent {
        fn update(&self, _: &str, update: Update) -> Result<()> {
            self.0.lock().expect("updates").push(update);
            Ok(())
        }

        async fn request_permission(&self, _: &str, _: ToolCall) -> Result<Option<String>> {
            Ok(None)
        }

        async fn read_text_file(&self, _: &str, _: &FileRequest) -> Result<String> {
            std::future::pending().await
        }
    }

    /// The first question of task `t` to `ide`, which lets the agent read
    /// files in `folders`.
    fn question<'a>(ide: Arc<dyn Ide>, folders: &'a [PathBuf], cancel: &'a CancellationToken) -> Question<'a> {
        Question { ide, session_id: "s", task_id: "t", number: 1, can_read_files: true, folders, cancel }
    }

    /// The agent's request for the IDE's file at `path`.
    fn asking_for(path: &str) -> Message {
        let mut message = Message::new(a2a::Role::Agent, vec![Part::text("need a file")]);
        message.metadata = Some([(READ_TEXT_FILE.to_owned(), json!({ "path": path }))].into());
        message
    }

    #[tokio::test]
    async fn a_read_cancelled_on_its_way_closes_its_tool_call() {
        let ide = Arc::new(Silent::default());
        let folders = [PathBuf::from("/w")];
        let cancel = CancellationToken::new();
        let question = question(Arc::clone(&ide) as Arc<dyn Ide>, &folders, &cancel);
        let canceller = cancel.clone();
        tokio::spawn(async move { canceller.cancel() });
        assert!(matches!(question.answer(Some(&asking_for("/w/a.rs"))).await, Ok(Answer::Cancelled)));
        let updates = ide.0.lock().expect("updates");
        let closed = matches!(updates.last(), Some(Update::ToolChange { status: Some(ToolStatus::Failed), .. }));
        assert!(closed, "the read's tool call is not left in progress: {updates:?}");
    }

    #[tokio::test]
    async fn only_files_in_the_session_s_folders_are_asked_for() {
        let ide = Arc::new(Reader::default());
        let folders = [PathBuf::from("/w"), PathBuf::from("/lib/extra")];
        let cancel = CancellationToken::new();
        let question = question(Arc::clone(&ide) as Arc<dyn Ide>, &folders, &cancel);
        for path in ["/w/../../etc/passwd", "/etc/passwd", "/wx/a", "/lib/other"] {
            let Ok(Answer::Reply(_, (_, answer))) = question.answer(Some(&asking_for(path))).await else {
                panic!("{path}")
            };
            assert!(answer["error"].as_str().is_some_and(|error| error.contains("outside")), "{path}: {answer}");
        }
        for path in ["/w/src/./a.rs", "/lib/extra/b/../c.rs"] {
            let Ok(Answer::Reply(_, (_, answer))) = question.answer(Some(&asking_for(path))).await else {
                panic!("{path}")
            };
            assert_eq!(answer.get("error"), None, "{path}: {answer}");
        }
        let read = ide.0.lock().expect("reads").clone();
        assert_eq!(read, [PathBuf::from("/w/src/a.rs"), PathBuf::from("/lib/extra/c.rs")], "resolved, nothing else");
    }
}
