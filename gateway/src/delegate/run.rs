//! [`A2aClient::delegate`]: send one message to a remote agent and follow the
//! task until it settles or the deadline passes.

use std::pin::pin;
use std::time::Duration;

use a2a::{
    CancelTaskRequest, GetTaskRequest, Message, SendMessageConfiguration, SendMessageRequest, SendMessageResponse,
    StreamResponse, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus,
};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::wire;
use super::{A2aClient, Credentials, DelegateError, DelegateOutcome, DelegateTarget, Endpoint};
use crate::convert::{is_interrupted, is_settled};

/// How long the cancel request of a timed-out delegation may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Who is told of the remote task as it goes: its first snapshot, then each
/// status and artifact update streamed, or each snapshot polled whose status
/// changed.
pub(crate) type Observer = mpsc::UnboundedSender<StreamResponse>;

/// What a delegation has learnt so far, kept when the deadline cuts it short.
#[derive(Debug, Default)]
struct Progress {
    endpoint: Option<Endpoint>,
    task_id: Option<String>,
    observer: Option<Observer>,
}

impl Progress {
    /// The remote task exists: noted.
    fn learn(&mut self, task: &Task) {
        if self.task_id.is_none() {
            self.task_id = Some(task.id.clone());
        }
    }

    /// Tells the observer, if any, of `event`.
    fn tell(&self, event: &StreamResponse) {
        if let Some(observer) = &self.observer {
            let _ = observer.send(event.clone());
        }
    }
}

impl A2aClient {
    /// Delegates `message` to the agent at `target` and waits, at most
    /// `timeout`, until its task is terminal or interrupted (input-required,
    /// auth-required), or until it answers with a message.
    ///
    /// Uses the agent card (cached per base URL) to pick the interface; follows
    /// the task over SSE when the card declares `capabilities.streaming`, else
    /// sends with `returnImmediately` and polls `GetTask` with backoff. When
    /// the deadline passes the remote task is asked to cancel and the result
    /// is [`DelegateError::Timeout`]. (The gateway's callers all pass a cancel.)
    #[cfg(test)]
    pub(crate) async fn delegate(
        &self,
        target: &DelegateTarget,
        message: Message,
        timeout: Duration,
        credentials: Option<&Credentials>,
    ) -> Result<DelegateOutcome, DelegateError> {
        self.delegate_until(target, message, timeout, credentials, &CancellationToken::new(), None).await
    }

    /// [`delegate`](Self::delegate), which `cancel` also cuts short: the
    /// remote task is then asked to cancel and the result is
    /// [`DelegateError::Canceled`]. `observer` is told of the remote task as
    /// it goes.
    pub(crate) async fn delegate_until(
        &self,
        target: &DelegateTarget,
        message: Message,
        timeout: Duration,
        credentials: Option<&Credentials>,
        cancel: &CancellationToken,
        observer: Option<Observer>,
    ) -> Result<DelegateOutcome, DelegateError> {
        let mut progress = Progress { observer, ..Progress::default() };
        let finished = within(timeout, cancel, self.run(target, message, credentials, &mut progress)).await;
        self.settled(finished, progress, credentials, cancel).await
    }

    /// Follows the remote task `task_id` an earlier delegation to `target`
    /// made, as [`delegate_until`](Self::delegate_until) would have.
    pub(crate) async fn resume_until(
        &self,
        target: &DelegateTarget,
        task_id: String,
        timeout: Duration,
        credentials: Option<&Credentials>,
        cancel: &CancellationToken,
        observer: Option<Observer>,
    ) -> Result<DelegateOutcome, DelegateError> {
        let mut progress = Progress { task_id: Some(task_id.clone()), observer, ..Progress::default() };
        let run = async {
            let endpoint = target.endpoint(&*self.card(&target.base_url).await?)?;
            progress.endpoint = Some(endpoint.clone());
            self.poll(&endpoint, task_id, credentials, &progress, None).await.map(DelegateOutcome::Task)
        };
        let finished = within(timeout, cancel, run).await;
        self.settled(finished, progress, credentials, cancel).await
    }

    /// The outcome of a delegation, or, cut short by its deadline or
    /// `cancel`, its remote task asked to cancel and why it stopped.
    async fn settled(
        &self,
        finished: Option<Result<DelegateOutcome, DelegateError>>,
        progress: Progress,
        credentials: Option<&Credentials>,
        cancel: &CancellationToken,
    ) -> Result<DelegateOutcome, DelegateError> {
        if let Some(outcome) = finished {
            return outcome;
        }
        self.cancel_abandoned(&progress, credentials).await;
        let task_id = progress.task_id;
        if cancel.is_cancelled() {
            Err(DelegateError::Canceled { task_id })
        } else {
            Err(DelegateError::Timeout { task_id })
        }
    }

    async fn run(
        &self,
        target: &DelegateTarget,
        message: Message,
        credentials: Option<&Credentials>,
        progress: &mut Progress,
    ) -> Result<DelegateOutcome, DelegateError> {
        let card = self.card(&target.base_url).await?;
        let endpoint = target.endpoint(&card)?;
        progress.endpoint = Some(endpoint.clone());
        let streaming = card.capabilities.streaming == Some(true);
        let configuration = (!streaming).then_some(SendMessageConfiguration {
            accepted_output_modes: None,
            task_push_notification_config: None,
            history_length: None,
            return_immediately: Some(true),
        });
        let continues = message.task_id.is_some();
        let request = SendMessageRequest { message, configuration, metadata: None, tenant: None };
        let (first, stale) = if streaming {
            self.follow_stream(&endpoint, request, credentials, progress, continues).await?
        } else {
            match self.send(&endpoint, request, credentials).await? {
                SendMessageResponse::Task(task) => {
                    let stale = stale_question(continues, &task);
                    (DelegateOutcome::Task(task), stale)
                }
                SendMessageResponse::Message(message) => (DelegateOutcome::Message(message), None),
            }
        };
        let task = match first {
            DelegateOutcome::Task(task) if !answered(&task, stale.as_ref()) => task,
            settled => return Ok(settled),
        };
        progress.learn(&task);
        if !streaming {
            progress.tell(&StreamResponse::Task(task.clone()));
        }
        self.poll(&endpoint, task.id, credentials, progress, stale).await.map(DelegateOutcome::Task)
    }

    /// Follows the event stream; returns the task once it settles, or as last
    /// seen when the stream closes or breaks early (the caller then polls),
    /// with the question a continuation answers (see [`stale_question`]).
    async fn follow_stream(
        &self,
        endpoint: &Endpoint,
        request: SendMessageRequest,
        credentials: Option<&Credentials>,
        progress: &mut Progress,
        continues: bool,
    ) -> Result<(DelegateOutcome, Option<TaskStatus>), DelegateError> {
        let mut events = pin!(self.stream(endpoint, request, credentials));
        let mut task: Option<Task> = None;
        let mut stale = None;
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(error @ DelegateError::Http { .. }) if task.is_some() => {
                    warn!(%error, "the event stream of a remote A2A task broke; polling the task instead");
                    break;
                }
                Err(error) => return Err(error),
            };
            match (&task, &event) {
                (None, StreamResponse::Message(message)) => {
                    return Ok((DelegateOutcome::Message(message.clone()), None));
                }
                (None, StreamResponse::Task(first)) => stale = stale_question(continues, first),
                // The agent's own word on the task, even the same question again.
                (_, StreamResponse::StatusUpdate(_)) => stale = None,
                _ => {}
            }
            progress.tell(&event);
            apply(&mut task, event);
            if let Some(current) = &task {
                progress.learn(current);
                if answered(current, stale.as_ref()) {
                    break;
                }
            }
        }
        let task =
            task.ok_or_else(|| wire::protocol(&endpoint.url, "the event stream ended before any task or message"))?;
        Ok((DelegateOutcome::Task(task), stale))
    }

    /// Polls `GetTask` with exponential backoff until the task settles
    /// (past the `stale` question a continuation answers), telling the
    /// observer of each snapshot whose status changed.
    async fn poll(
        &self,
        endpoint: &Endpoint,
        id: String,
        credentials: Option<&Credentials>,
        progress: &Progress,
        stale: Option<TaskStatus>,
    ) -> Result<Task, DelegateError> {
        let mut delay = self.poll_initial;
        let mut last: Option<TaskStatus> = None;
        loop {
            tokio::time::sleep(delay).await;
            let request = GetTaskRequest { id: id.clone(), history_length: None, tenant: None };
            let task = self.get_task(endpoint, request, credentials).await?;
            if answered(&task, stale.as_ref()) {
                return Ok(task);
            }
            if last.as_ref() != Some(&task.status) {
                last = Some(task.status.clone());
                progress.tell(&StreamResponse::Task(task));
            }
            delay = (delay * 2).min(self.poll_max);
        }
    }

    /// Best effort: asks the agent to cancel the task a timed-out delegation left behind.
    async fn cancel_abandoned(&self, progress: &Progress, credentials: Option<&Credentials>) {
        let (Some(endpoint), Some(task_id)) = (&progress.endpoint, &progress.task_id) else {
            return;
        };
        let request = CancelTaskRequest { id: task_id.clone(), metadata: None, tenant: None };
        match tokio::time::timeout(CANCEL_TIMEOUT, self.cancel_task(endpoint, request, credentials)).await {
            Ok(Ok(task)) => debug!(task_id, state = ?task.status.state, "canceled a timed-out remote A2A task"),
            Ok(Err(error)) => warn!(task_id, %error, "could not cancel a timed-out remote A2A task"),
            Err(_) => warn!(task_id, "the remote A2A agent did not answer the cancel request in time"),
        }
    }
}

/// What `run` came to, unless `timeout` passed or `cancel` fired first.
async fn within<T>(timeout: Duration, cancel: &CancellationToken, run: impl Future<Output = T>) -> Option<T> {
    let run = Box::pin(run);
    tokio::select! {
        result = tokio::time::timeout(timeout, run) => result.ok(),
        () = cancel.cancelled() => None,
    }
}

/// The status a continuation's first snapshot shows while the task still
/// waits on the question the message answers: agents send the task as it is
/// before they take the answer up (the JS SDK must), and that question is not
/// the turn's outcome.
fn stale_question(continues: bool, first: &Task) -> Option<TaskStatus> {
    (continues && is_interrupted(&first.status.state)).then(|| first.status.clone())
}

/// Whether the task settled, other than still on the `stale` question.
fn answered(task: &Task, stale: Option<&TaskStatus>) -> bool {
    is_settled(&task.status.state) && stale != Some(&task.status)
}

/// Folds a stream event into the task as last seen.
fn apply(task: &mut Option<Task>, event: StreamResponse) {
    match event {
        StreamResponse::Task(snapshot) => *task = Some(snapshot),
        StreamResponse::Message(message) => {
            if let Some(current) = task {
                current.history.get_or_insert_with(Vec::new).push(message);
            }
        }
        StreamResponse::StatusUpdate(update) => {
            if let Some(current) = snapshot_for(task, &update.task_id, &update.context_id) {
                current.status = update.status;
            }
        }
        StreamResponse::ArtifactUpdate(update) => {
            if let Some(current) = snapshot_for(task, &update.task_id, &update.context_id) {
                merge_artifact(current, update);
            }
        }
    }
}

/// The snapshot an update for task `id` applies to. An update before the
/// first `Task` event (which 1.0 agents send first) starts the snapshot; an
/// update for another task is ignored.
fn snapshot_for<'a>(task: &'a mut Option<Task>, id: &str, context_id: &str) -> Option<&'a mut Task> {
    let current = task.get_or_insert_with(|| Task {
        id: id.to_owned(),
        context_id: context_id.to_owned(),
        status: TaskStatus { state: TaskState::Working, message: None, timestamp: None },
        artifacts: None,
        history: None,
        metadata: None,
    });
    if current.id != id {
        debug!(task_id = %id, "ignoring an update for another task");
        return None;
    }
    Some(current)
}

/// Adds or replaces the artifact of `update`, or appends its parts.
fn merge_artifact(task: &mut Task, update: TaskArtifactUpdateEvent) {
    let artifacts = task.artifacts.get_or_insert_with(Vec::new);
    match artifacts.iter_mut().find(|a| a.artifact_id == update.artifact.artifact_id) {
        Some(existing) if update.append == Some(true) => existing.parts.extend(update.artifact.parts),
        Some(existing) => *existing = update.artifact,
        None => artifacts.push(update.artifact),
    }
}
