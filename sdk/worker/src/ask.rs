//! Asking the task's user a question and waiting for the answer.

use std::time::Duration;

use chorus_proto::taskstore::{Message, Part, Role, TaskState, WatchTaskRequest, task_event::Kind};
use chorus_runtime::transport;

use crate::{
    Client, HandlerError, TaskContext, WorkerError,
    backoff::{Backoff, next_jittered},
    reply::{agent_message, text_part},
};

impl TaskContext {
    /// A message from this task's agent (a fresh id, the task's context),
    /// to ask with or to report in.
    pub fn agent_message(&self, parts: Vec<Part>) -> Message {
        agent_message(self.task(), parts)
    }

    /// Asks the task's user `question`: the task goes `INPUT_REQUIRED` (an
    /// A2A client, an IDE or an orchestrator answers it), and this waits for
    /// the answer, the next user message, however long it takes (the lease,
    /// renewed beside the handler, bounds nothing). A task store that
    /// restarts meanwhile is watched again; an answer given then is not
    /// missed. A task canceled meanwhile ends the wait with an error.
    pub async fn ask(&self, question: impl Into<String>) -> Result<Message, HandlerError> {
        self.ask_message(self.agent_message(vec![text_part(question)])).await
    }

    /// [`ask`](Self::ask) with a whole message (metadata, several parts).
    pub async fn ask_message(&self, question: Message) -> Result<Message, HandlerError> {
        self.update_status(TaskState::InputRequired, question).await?;
        let mut client = self.client();
        let mut backoff = Backoff::new(REWATCH_FIRST, REWATCH_LONGEST);
        loop {
            // The task store restarts, or is out of reach for a moment: the
            // task still waits, and a new watch's snapshot shows an answer
            // given meanwhile.
            if let Some(answer) = watch_answer(self, &mut client).await? {
                return Ok(answer);
            }
            tokio::select! {
                () = self.cancelled() => return Err(HandlerError::fatal("the task was cancelled")),
                () = tokio::time::sleep(next_jittered(&mut backoff)) => {}
            }
        }
    }
}

/// The first pause before the answer is watched for again, and the longest.
const REWATCH_FIRST: Duration = Duration::from_millis(200);
const REWATCH_LONGEST: Duration = Duration::from_secs(5);

/// Watches the task until the user answers it; `None` when the task store
/// went away first (UNAVAILABLE, or the watch's connection broke), and the
/// watch is worth opening again.
async fn watch_answer(task: &TaskContext, client: &mut Client) -> Result<Option<Message>, HandlerError> {
    let went_away = |status: tonic::Status| {
        if !transport::cut_off(&status) {
            return Err(HandlerError::from(WorkerError::from(status)));
        }
        tracing::info!(task_id = task.id(), error = status.message(), "watching for the answer again");
        Ok(None)
    };
    let watch = WatchTaskRequest {
        namespace: task.namespace().to_owned(),
        task_id: task.id().to_owned(),
        snapshot: true,
        ..WatchTaskRequest::default()
    };
    let mut events = match client.watch_task(watch).await {
        Ok(events) => events.into_inner(),
        Err(status) => return went_away(status),
    };
    loop {
        let event = tokio::select! {
            () = task.cancelled() => return Err(HandlerError::fatal("the task was cancelled")),
            event = events.message() => event,
        };
        let event = match event {
            Ok(Some(event)) => event,
            Ok(None) => return Err(HandlerError::retryable("the task store ended the watch before the answer came")),
            Err(status) => return went_away(status),
        };
        match Kind::try_from(event.kind) {
            Ok(Kind::Snapshot) => {
                let Some(snapshot) = event.task else { continue };
                let answered = snapshot.status.as_ref().is_some_and(|s| s.state == i32::from(TaskState::Working));
                let latest = snapshot.history.iter().rev().find(|m| m.role == i32::from(Role::User));
                if let (true, Some(answer)) = (answered, latest) {
                    return Ok(Some(answer.clone()));
                }
            }
            Ok(Kind::MessageAdded) => {
                if let Some(answer) = event.message.filter(|m| m.role == i32::from(Role::User)) {
                    return Ok(Some(answer));
                }
            }
            Ok(Kind::StatusChanged | Kind::ArtifactUpdated | Kind::Created | Kind::Unspecified) | Err(_) => {}
        }
    }
}
