//! One prompt turn: the prompt goes to the agent as a streaming A2A task in
//! the session's context, and the task's events come back as
//! `session/update`s until the task settles.
//!
//! - agent status messages → `agent_message_chunk` (one ACP `messageId` per
//!   A2A message), or `agent_thought_chunk` / `plan` as their metadata says
//!   ([`super::plan`]); a direct A2A message reply ends the turn the same way;
//! - artifacts → `tool_call` (`in_progress`), then `tool_call_update` with
//!   the content so far, `completed` with the last chunk;
//! - `input-required` → a question for the IDE ([`super::ask`]), whose answer
//!   continues the same task;
//! - completed → `end_turn`, rejected → `refusal`, canceled → `cancelled`;
//!   failed and auth-required → a JSON-RPC error naming the task.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use a2a::{Message, Part, Role, SendMessageRequest, StreamResponse, TaskState, TaskStatus};
use futures_util::{StreamExt as _, future, stream, stream::BoxStream};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::ask::{self, Answer};
use super::content::{Content, ToolCall, ToolKind, ToolStatus, Update, content_of, part_of, text_of};
use super::error::{AcpError, Result};
use super::plan;
use super::session::{SESSION_METADATA, SessionContext, TurnGuard};
use super::upstream::Upstream;
use super::{Ide, StopReason};
use crate::delegate::DelegateError;

/// A stream of the task's events.
type Events = BoxStream<'static, Result<StreamResponse, DelegateError>>;

/// The first and the longest pause before following a task again.
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(2);
/// How long a cancelled turn waits for the gateway to name the task it made.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How long a cancelled turn waits for `CancelTask`.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest session title, in characters.
const TITLE_CHARS: usize = 80;
/// How long a task may wait for a worker before the turn says it does.
const UNCLAIMED_AFTER: Duration = Duration::from_secs(5);

/// How a stream of the task ended.
enum Settled {
    /// Terminal (or auth-required, which ACP cannot answer).
    Finished(TaskState, Option<Message>),
    /// The agent asks something.
    Interrupted(TaskStatus),
    Cancelled,
}

/// An artifact shown as a tool call.
struct Tool {
    content: Vec<Content>,
    done: bool,
}

/// The state of one turn.
pub(crate) struct Turn {
    pub(crate) upstream: Upstream,
    pub(crate) ide: Arc<dyn Ide>,
    pub(crate) session_id: String,
    pub(crate) context: SessionContext,
    pub(crate) cancel: CancellationToken,
    /// Fires when the connection closes: a task that waits for an answer
    /// then waits on, for the session's next prompt once loaded again.
    closing: CancellationToken,
    pub(crate) can_read_files: bool,
    task_id: Option<String>,
    shown: HashSet<String>,
    tools: HashMap<String, Tool>,
    questions: usize,
    /// The task was last seen `submitted`: no worker has taken it.
    queued: bool,
    /// The turn said so.
    said_queued: bool,
}

impl Turn {
    pub(crate) fn new(
        upstream: Upstream,
        ide: Arc<dyn Ide>,
        session_id: String,
        context: SessionContext,
        guard: &TurnGuard,
        can_read_files: bool,
    ) -> Self {
        Self {
            upstream,
            ide,
            session_id,
            context,
            cancel: guard.cancel().clone(),
            closing: guard.closing().clone(),
            can_read_files,
            // A task an earlier connection left waiting: this turn answers it.
            task_id: guard.waiting.clone(),
            shown: HashSet::new(),
            tools: HashMap::new(),
            questions: 0,
            queued: false,
            said_queued: false,
        }
    }

    /// Runs the turn to its stop reason.
    pub(crate) async fn run(mut self, prompt: Vec<Content>) -> Result<StopReason> {
        if let Some(Content::Unsupported(kind)) = prompt.iter().find(|c| matches!(c, Content::Unsupported(_))) {
            return Err(AcpError::InvalidParams(format!("this agent takes no {kind} content")));
        }
        let parts: Vec<Option<Part>> =
            prompt.iter().map(part_of).collect::<Result<_, _>>().map_err(AcpError::InvalidParams)?;
        let parts: Vec<Part> = parts.into_iter().flatten().collect();
        if parts.is_empty() {
            return Err(AcpError::InvalidParams("the prompt is empty".to_owned()));
        }
        if let Some(task_id) = &self.task_id {
            // Unless it was answered meanwhile (`chorus gate`, another client).
            let task = self.upstream.get(task_id).await;
            if !task.is_ok_and(|task| task.status.state == TaskState::InputRequired) {
                self.task_id = None;
            }
        }
        let mut message = self.message(parts, None);
        let mut task_metadata = self.task_id.is_none().then(|| self.task_metadata(&text_of(&prompt)));
        loop {
            let settled = self.follow(message, task_metadata.take()).await?;
            let status = match settled {
                Settled::Cancelled => return Ok(self.cancelled().await),
                Settled::Finished(state, last) => return self.finish(&state, last.as_ref()),
                Settled::Interrupted(status) => status,
            };
            self.questions += 1;
            let task_id = self.task_id.clone().unwrap_or_default();
            let folders = self.context.folders();
            let question = ask::Question {
                ide: Arc::clone(&self.ide),
                session_id: &self.session_id,
                task_id: &task_id,
                number: self.questions,
                can_read_files: self.can_read_files,
                folders: &folders,
                cancel: &self.cancel,
            };
            let answered = question.answer(status.message.as_ref()).await;
            if self.closing.is_cancelled() {
                // The IDE went away while the task waits for its answer: it
                // waits on, parked, and the session, loaded again, answers it.
                tracing::info!(task_id, "the connection closed while the task waited for an answer; it waits on");
                return Ok(StopReason::Cancelled);
            }
            match answered {
                Ok(Answer::Reply(parts, metadata)) => message = self.message(parts, Some(metadata)),
                Ok(Answer::Cancelled) => return Ok(self.cancelled().await),
                Err(error) => {
                    // No answer will come: the task would wait for one for good.
                    self.cancelled().await;
                    return Err(error);
                }
            }
        }
    }

    /// An A2A user message of the session, continuing the task once there is one.
    fn message(&self, parts: Vec<Part>, extra: Option<(String, Value)>) -> Message {
        let mut metadata = HashMap::from([(SESSION_METADATA.to_owned(), self.context.metadata(&self.session_id))]);
        metadata.extend(extra);
        let mut message = Message::new(Role::User, parts);
        message.context_id = Some(self.session_id.clone());
        message.task_id.clone_from(&self.task_id);
        message.metadata = Some(metadata);
        message
    }

    /// The task's own metadata: what `session/list` finds sessions by.
    fn task_metadata(&self, text: &str) -> HashMap<String, Value> {
        let first_line = text.lines().find(|line| !line.trim().is_empty()).unwrap_or("").trim();
        let title: String = first_line.chars().take(TITLE_CHARS).collect();
        let session = json!({
            "sessionId": self.session_id,
            "agent": self.upstream.agent(),
            "cwd": self.context.cwd,
            "additionalDirectories": self.context.additional_directories,
            "title": title,
            // What a replay orders the session's turns by (RFC 3339, UTC:
            // text order is time order).
            "promptedAt": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        });
        HashMap::from([(SESSION_METADATA.to_owned(), session)])
    }

    /// Sends `message` and shows the task's events until it settles.
    async fn follow(&mut self, message: Message, metadata: Option<HashMap<String, Value>>) -> Result<Settled> {
        let request = SendMessageRequest { message, configuration: None, metadata, tenant: None };
        let stream = tokio::select! {
            () = self.cancel.cancelled() => return Ok(Settled::Cancelled),
            stream = self.upstream.stream(request) => stream?,
        };
        let mut stream: Events = Box::pin(stream);
        let unclaimed = tokio::time::sleep(UNCLAIMED_AFTER);
        tokio::pin!(unclaimed);
        loop {
            let event = tokio::select! {
                biased;
                () = self.cancel.cancelled(), if self.task_id.is_some() => return Ok(Settled::Cancelled),
                () = self.cancel.cancelled(), if self.task_id.is_none() => {
                    // Learn the task the gateway made, so that it can be canceled.
                    if let Ok(Some(Ok(event))) = tokio::time::timeout(CANCEL_GRACE, stream.next()).await {
                        self.note_task(&event);
                    }
                    return Ok(Settled::Cancelled);
                }
                event = stream.next() => event,
                () = &mut unclaimed, if self.queued && !self.said_queued => {
                    self.said_queued = true;
                    let text = format!(
                        "No worker of agent {} has taken the task yet: it waits for one (cancel to give up).",
                        self.upstream.agent()
                    );
                    let said = Update::Thought { message_id: None, content: Content::Text(text) };
                    self.ide.update(&self.session_id, said)?;
                    continue;
                }
            };
            let failure = match event {
                Some(Ok(event)) => match self.on_event(event)? {
                    Some(settled) => return Ok(settled),
                    None => continue,
                },
                Some(Err(error)) => AcpError::Gateway(error),
                None => AcpError::StreamEnded(self.task_id.clone().unwrap_or_else(|| "(none yet)".to_owned())),
            };
            // The gateway may have gone away for a while (a restart, a
            // deploy): the task goes on there, and the turn follows it again.
            let Some(task_id) = self.task_id.clone().filter(|_| failure.gateway_went_away()) else {
                return Err(failure);
            };
            match self.follow_again(&task_id, failure).await? {
                Some(events) => stream = events,
                None => return Ok(Settled::Cancelled),
            }
        }
    }

    /// Subscribes to the task again, after pauses that double, until the
    /// gateway answers or [`Upstream::gateway_wait`] has passed; `None` when
    /// the turn is cancelled meanwhile. The subscription starts with the task
    /// as it is, whose messages and artifacts already shown are not shown
    /// twice.
    async fn follow_again(&self, task_id: &str, mut failure: AcpError) -> Result<Option<Events>> {
        let error = failure.to_string();
        tracing::info!(task_id, error, "the task's stream broke; following it again when the gateway answers");
        let waited = self.upstream.gateway_wait();
        let deadline = tokio::time::Instant::now() + waited;
        let mut pause = FIRST_PAUSE;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                let (task_id, cause) = (task_id.to_owned(), failure.to_string());
                return Err(AcpError::GatewayGone { task_id, waited: waited.as_secs(), cause });
            }
            tokio::select! {
                () = self.cancel.cancelled() => return Ok(None),
                () = tokio::time::sleep(pause.min(left)) => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
            let mut events: Events = Box::pin(self.upstream.subscribe(task_id).await?);
            let first = tokio::select! {
                () = self.cancel.cancelled() => return Ok(None),
                first = events.next() => first,
            };
            match first {
                Some(Ok(event)) => return Ok(Some(Box::pin(stream::once(future::ready(Ok(event))).chain(events)))),
                // It settled meanwhile: no stream follows a finished task,
                // whose last state is read instead.
                Some(Err(DelegateError::Remote { code: a2a::error_code::UNSUPPORTED_OPERATION, .. })) => {
                    let task = StreamResponse::Task(self.upstream.get(task_id).await?);
                    return Ok(Some(Box::pin(stream::once(future::ready(Ok(task))))));
                }
                Some(Err(error)) => failure = AcpError::Gateway(error),
                None => {}
            }
            if !failure.gateway_went_away() {
                return Err(failure);
            }
        }
    }

    fn note_task(&mut self, event: &StreamResponse) {
        let id = match event {
            StreamResponse::Task(task) => Some(&task.id),
            StreamResponse::StatusUpdate(update) => Some(&update.task_id),
            StreamResponse::ArtifactUpdate(update) => Some(&update.task_id),
            StreamResponse::Message(message) => message.task_id.as_ref(),
        };
        if let Some(id) = id {
            self.task_id = Some(id.clone());
        }
    }

    fn on_event(&mut self, event: StreamResponse) -> Result<Option<Settled>> {
        self.note_task(&event);
        match event {
            StreamResponse::Task(task) => {
                for artifact in task.artifacts.unwrap_or_default() {
                    if !self.tools.contains_key(&artifact.artifact_id) {
                        self.artifact(&artifact, false, true)?;
                    }
                }
                self.status(&task.status)
            }
            StreamResponse::Message(message) => {
                self.show(&message)?;
                Ok(Some(Settled::Finished(TaskState::Completed, Some(message))))
            }
            StreamResponse::StatusUpdate(update) => self.status(&update.status),
            StreamResponse::ArtifactUpdate(update) => {
                let append = update.append == Some(true);
                self.artifact(&update.artifact, append, update.last_chunk == Some(true))?;
                Ok(None)
            }
        }
    }

    fn status(&mut self, status: &TaskStatus) -> Result<Option<Settled>> {
        self.queued = status.state == TaskState::Submitted;
        if let Some(message) = &status.message {
            self.show(message)?;
        }
        let settled = match status.state {
            TaskState::Completed
            | TaskState::Failed
            | TaskState::Canceled
            | TaskState::Rejected
            | TaskState::AuthRequired => Some(Settled::Finished(status.state.clone(), status.message.clone())),
            TaskState::InputRequired => Some(Settled::Interrupted(status.clone())),
            TaskState::Unspecified | TaskState::Submitted | TaskState::Working => None,
        };
        Ok(settled)
    }

    /// Shows an agent message once (requests for files are not words).
    fn show(&mut self, message: &Message) -> Result<()> {
        if message.role != Role::Agent || ask::file_request(Some(message)).is_some() {
            return Ok(());
        }
        if !self.shown.insert(message.message_id.clone()) {
            return Ok(());
        }
        if let Some(plan) = plan::plan_of(message) {
            // A plan's words only name it.
            return self.ide.update(&self.session_id, Update::Plan(plan));
        }
        let thought = plan::is_thought(message);
        for part in &message.parts {
            let (message_id, content) = (Some(message.message_id.clone()), content_of(part));
            let update =
                if thought { Update::Thought { message_id, content } } else { Update::Agent { message_id, content } };
            self.ide.update(&self.session_id, update)?;
        }
        Ok(())
    }

    fn artifact(&mut self, artifact: &a2a::Artifact, append: bool, last: bool) -> Result<()> {
        let id = format!("artifact-{}", artifact.artifact_id);
        let parts = artifact.parts.iter().map(content_of);
        let tool = match self.tools.get_mut(&artifact.artifact_id) {
            Some(tool) if tool.done => return Ok(()),
            Some(tool) => tool,
            None => {
                let title =
                    artifact.name.clone().filter(|name| !name.is_empty()).unwrap_or_else(|| "artifact".to_owned());
                let call = ToolCall {
                    id: id.clone(),
                    title,
                    kind: ToolKind::Other,
                    status: ToolStatus::InProgress,
                    content: Vec::new(),
                    locations: Vec::new(),
                };
                self.ide.update(&self.session_id, Update::ToolCall(call))?;
                self.tools.entry(artifact.artifact_id.clone()).or_insert(Tool { content: Vec::new(), done: false })
            }
        };
        if !append {
            tool.content.clear();
        }
        tool.content.extend(parts);
        tool.done = last;
        let status = if last { ToolStatus::Completed } else { ToolStatus::InProgress };
        let update = Update::ToolChange { id, status: Some(status), content: Some(tool.content.clone()) };
        self.ide.update(&self.session_id, update)
    }

    /// Closes the tool calls still open, as the task ended.
    fn close_tools(&mut self, status: ToolStatus) -> Result<()> {
        for (artifact_id, tool) in &mut self.tools {
            if !tool.done {
                tool.done = true;
                let update =
                    Update::ToolChange { id: format!("artifact-{artifact_id}"), status: Some(status), content: None };
                self.ide.update(&self.session_id, update)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self, state: &TaskState, last: Option<&Message>) -> Result<StopReason> {
        let succeeded = *state == TaskState::Completed;
        self.close_tools(if succeeded { ToolStatus::Completed } else { ToolStatus::Failed })?;
        let task_id = self.task_id.clone().unwrap_or_default();
        let reason = || last.and_then(Message::text).unwrap_or("the agent gave no reason").to_owned();
        match state {
            TaskState::Completed => Ok(StopReason::EndTurn),
            TaskState::Rejected => Ok(StopReason::Refusal),
            TaskState::Canceled => Ok(StopReason::Cancelled),
            TaskState::Failed => Err(AcpError::TaskEnded { task_id, state: "failed", reason: reason() }),
            TaskState::AuthRequired => Err(AcpError::TaskEnded { task_id, state: "auth-required", reason: reason() }),
            TaskState::Unspecified | TaskState::Submitted | TaskState::Working | TaskState::InputRequired => {
                Err(AcpError::StreamEnded(task_id))
            }
        }
    }

    /// `session/cancel`: the task is canceled, the turn ends `cancelled`.
    async fn cancelled(&mut self) -> StopReason {
        if let Some(task_id) = &self.task_id {
            match tokio::time::timeout(CANCEL_TIMEOUT, self.upstream.cancel(task_id)).await {
                Ok(Ok(_)) => tracing::debug!(%task_id, "task canceled"),
                Ok(Err(error)) => tracing::warn!(%task_id, %error, "cannot cancel the task"),
                Err(_) => tracing::warn!(%task_id, "the gateway did not cancel the task in time"),
            }
        }
        if let Err(error) = self.close_tools(ToolStatus::Failed) {
            tracing::debug!(%error, "cannot close the turn's tool calls");
        }
        StopReason::Cancelled
    }
}
