//! `remote` agents: each turn goes to an external A2A agent, and what it
//! answers comes back into the chorus task.
//!
//! The chorus task and the remote task stay one conversation: once the
//! remote task exists, and when it waits for input, a status message
//! carries its ids (metadata `chorus.remote`), so the answer continues that
//! remote task, and a gateway taking the task up follows it. Canceling the
//! chorus task cancels the remote one.

use std::{collections::HashSet, future::Future};

use a2a::{CancelTaskRequest, Message, StreamResponse, TaskState};
use chorus_proto::taskstore as pb;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Runner, Turn, Written};
use crate::{
    config::AgentConfig,
    convert,
    delegate::{Credentials, DelegateError, DelegateOutcome, DelegateTarget, pick_interface},
};

/// The metadata key linking a chorus task to the remote task behind it.
pub(super) const REMOTE: &str = "chorus.remote";

/// The remote task (id, context id) an earlier turn of `task` left waiting.
fn remote_of(task: &pb::Task) -> Option<(String, String)> {
    task.history.iter().rev().find_map(|message| {
        let link = message.metadata.as_ref()?.fields.get(REMOTE)?;
        let link = chorus_proto::json::value_to_json(link);
        let task_id = link.get("taskId")?.as_str()?.to_owned();
        let context_id = link.get("contextId")?.as_str()?.to_owned();
        Some((task_id, context_id))
    })
}

impl Runner {
    /// One turn of `agent`, a remote agent, on `turn`'s task. Once the remote
    /// task exists, a status message links it (so that a cancel, or another
    /// gateway taking the task up, finds it); a new remote task goes in the
    /// chorus task's context, so that the remote agent sees one conversation.
    pub(super) async fn forward(&self, agent: &AgentConfig, mut turn: Turn, mut message: Message) -> Written {
        turn.status(pb::TaskState::Working, None, None).await?;
        let (task_id, context_id) = remote_of(&turn.task).unzip();
        message.task_id = task_id;
        message.context_id = context_id.or_else(|| Some(turn.task.context_id.clone()));
        // Which of chorus's credentials sent it is chorus's to know.
        if let Some(metadata) = &mut message.metadata {
            metadata.remove(super::CALLER);
        }
        let canceled = CancellationToken::new();
        let watcher = tokio::spawn(cancel_when_canceled(turn.clone_writer(), canceled.clone()));
        let target = DelegateTarget::new(agent.url.clone().unwrap_or_default());
        let (observer, observed) = mpsc::unbounded_channel();
        let credentials = credentials_of(agent);
        let delegation = self.delegate.delegate_until(
            &target,
            message,
            self.remote_timeout,
            credentials.as_ref(),
            &canceled,
            Some(observer),
        );
        let mut mirror = Mirror::default();
        let outcome = mirror.run(&mut turn, delegation, observed).await?;
        watcher.abort();
        settle(agent, turn, outcome, &mirror.complete).await
    }

    /// Takes up a remote agent's task whose gateway stopped while its remote
    /// task worked: follows that task to its end. One waiting on its user
    /// needs nothing; one whose remote task was never linked is failed,
    /// since its message may or may not have reached the remote agent.
    pub(super) async fn resume_remote(&self, agent: &AgentConfig, mut turn: Turn) -> Written {
        let state = turn.task.status.as_ref().map(pb::TaskStatus::state);
        if !matches!(state, Some(pb::TaskState::Working | pb::TaskState::Submitted)) {
            return Ok(());
        }
        let Some((remote_id, _)) = remote_of(&turn.task) else {
            let why = "The gateway forwarding this turn stopped before the remote agent made a task of it: send \
                       the message again.";
            return turn.status(pb::TaskState::Failed, Some(why), None).await;
        };
        let canceled = CancellationToken::new();
        let watcher = tokio::spawn(cancel_when_canceled(turn.clone_writer(), canceled.clone()));
        let target = DelegateTarget::new(agent.url.clone().unwrap_or_default());
        let (observer, observed) = mpsc::unbounded_channel();
        let credentials = credentials_of(agent);
        let (timeout, remote) = (self.remote_timeout, remote_id.clone());
        let delegation =
            self.delegate.resume_until(&target, remote, timeout, credentials.as_ref(), &canceled, Some(observer));
        let mut mirror = Mirror { linked: Some(remote_id), ..Mirror::default() };
        let outcome = mirror.run(&mut turn, delegation, observed).await?;
        watcher.abort();
        settle(agent, turn, outcome, &mirror.complete).await
    }
}

/// The credentials `agent` is called with: the value of the environment
/// variable its configuration names.
fn credentials_of(agent: &AgentConfig) -> Option<Credentials> {
    let read = |variable: &Option<String>| std::env::var(variable.as_deref()?).ok().filter(|value| !value.is_empty());
    if let Some(token) = read(&agent.bearer_token_env) {
        return Some(Credentials::Bearer(token));
    }
    let value = read(&agent.api_key_env)?;
    Some(Credentials::ApiKey { header: agent.api_key_header.clone().unwrap_or_else(|| "X-API-Key".to_owned()), value })
}

/// What of the remote task the chorus task already shows.
#[derive(Debug, Default)]
struct Mirror {
    /// The remote task linked (by a status message).
    linked: Option<String>,
    /// The last progress message written.
    said: Option<String>,
    /// The artifacts written so far.
    artifacts: HashSet<String>,
    /// Those whose last chunk was written: the outcome need not write them again.
    complete: HashSet<String>,
}

impl Mirror {
    /// Writes into the chorus task what the remote task shows while
    /// `delegation` follows it: a link once it exists, its progress
    /// messages, its artifacts as they are streamed. Returns the outcome.
    async fn run(
        &mut self,
        turn: &mut Turn,
        delegation: impl Future<Output = Delegated>,
        mut observed: mpsc::UnboundedReceiver<StreamResponse>,
    ) -> Result<Delegated, tonic::Status> {
        tokio::pin!(delegation);
        loop {
            tokio::select! {
                outcome = &mut delegation => return Ok(outcome),
                Some(event) = observed.recv() => self.show(turn, event).await?,
            }
        }
    }

    async fn show(&mut self, turn: &mut Turn, event: StreamResponse) -> Written {
        let (task_id, context_id) = match &event {
            StreamResponse::Task(task) => (&task.id, &task.context_id),
            StreamResponse::StatusUpdate(update) => (&update.task_id, &update.context_id),
            StreamResponse::ArtifactUpdate(update) => (&update.task_id, &update.context_id),
            StreamResponse::Message(_) => return Ok(()),
        };
        if self.linked.is_none() {
            let link = json!({ "taskId": task_id, "contextId": context_id });
            let text = format!("Remote task {task_id} works on it.");
            turn.status(pb::TaskState::Working, Some(&text), Some(link_metadata(link))).await?;
            self.linked = Some(task_id.clone());
        }
        let status = match event {
            StreamResponse::Task(task) => task.status,
            StreamResponse::StatusUpdate(update) => update.status,
            StreamResponse::ArtifactUpdate(update) => {
                // A chunk of an artifact not written yet starts it.
                let append = update.append == Some(true) && self.artifacts.contains(&update.artifact.artifact_id);
                let (id, last) = (update.artifact.artifact_id.clone(), update.last_chunk == Some(true));
                self.artifacts.insert(id.clone());
                turn.artifact(update.artifact, append, last).await?;
                if last {
                    self.complete.insert(id);
                } else {
                    self.complete.remove(&id);
                }
                return Ok(());
            }
            StreamResponse::Message(_) => return Ok(()),
        };
        // Progress only: the final state, or a question, is the outcome's.
        let text = status.message.as_ref().and_then(Message::text).map(str::to_owned);
        if status.state != TaskState::Working || text.is_none() || text == self.said {
            return Ok(());
        }
        turn.status(pb::TaskState::Working, text.as_deref(), None).await?;
        self.said = text;
        Ok(())
    }
}

/// What following a remote task came to.
type Delegated = Result<DelegateOutcome, DelegateError>;

/// Mirrors what the remote agent answered into the chorus task: its final
/// status message whole (parts and metadata), and the artifacts the chorus
/// task does not show yet (`complete`: streamed to their last chunk).
async fn settle(agent: &AgentConfig, mut turn: Turn, outcome: Delegated, complete: &HashSet<String>) -> Written {
    match outcome {
        Ok(DelegateOutcome::Task(task)) => {
            for artifact in task.artifacts.iter().flatten() {
                let shown = turn.task.artifacts.iter().any(|known| *known == convert::artifact_in(artifact));
                if !shown && !complete.contains(&artifact.artifact_id) {
                    turn.artifact(artifact.clone(), false, true).await?;
                }
            }
            let state = convert::state_in(&task.status.state);
            let waiting = convert::is_interrupted(&task.status.state);
            let link = waiting.then(|| link_metadata(json!({ "taskId": task.id, "contextId": task.context_id })));
            match task.status.message {
                Some(message) => turn.status_with(state, message, link).await,
                None => turn.status(state, waiting.then_some("The agent needs input"), link).await,
            }
        }
        Ok(DelegateOutcome::Message(reply)) => turn.status_with(pb::TaskState::Completed, reply, None).await,
        Err(DelegateError::Canceled { .. }) => Ok(()),
        Err(error) => {
            let reason = format!("remote agent {}: {error}", agent.id);
            turn.status(pb::TaskState::Failed, Some(&reason), None).await
        }
    }
}

impl Runner {
    /// Passes the cancel of `task`, a remote agent's, in `was` before it, on
    /// to the remote task behind it: one an earlier turn left waiting, or one
    /// whose turn no gateway here runs (its gateway may be dead). A turn in
    /// flight here cancels its own, once. Best effort: the chorus task is
    /// canceled either way.
    pub(crate) async fn cancel_remote(&self, agent: &AgentConfig, task: &pb::Task, was: &TaskState) {
        if !convert::is_interrupted(was) && self.turns.follows(&task.namespace, &task.id) {
            return;
        }
        let Some((remote_id, _)) = remote_of(task) else { return };
        let base_url = agent.url.clone().unwrap_or_default();
        let canceled = async {
            let card = self.delegate.card(&base_url).await?;
            let endpoint = pick_interface(&card)?;
            let request = CancelTaskRequest { id: remote_id.clone(), metadata: None, tenant: None };
            self.delegate.cancel_task(&endpoint, request, credentials_of(agent).as_ref()).await
        };
        match canceled.await {
            Ok(remote) => tracing::debug!(%remote_id, state = ?remote.status.state, "remote task canceled"),
            Err(error) => tracing::warn!(%remote_id, agent = %agent.id, %error, "could not cancel the remote task"),
        }
    }
}

/// Cancels `canceled` when the chorus task ends while its turn is away.
async fn cancel_when_canceled(turn: Turn, canceled: CancellationToken) {
    let request = pb::WatchTaskRequest {
        namespace: turn.namespace.clone(),
        task_id: turn.task.id.clone(),
        snapshot: true,
        ..pb::WatchTaskRequest::default()
    };
    let Ok(events) = turn.tasks.clone().watch_task(request).await else { return };
    let mut events = events.into_inner();
    while let Some(Ok(event)) = events.next().await {
        let ended = match convert::event_out(event) {
            Some(StreamResponse::Task(task)) => task.status.state.is_terminal(),
            Some(StreamResponse::StatusUpdate(update)) => update.status.state.is_terminal(),
            Some(StreamResponse::Message(_) | StreamResponse::ArtifactUpdate(_)) | None => false,
        };
        if ended {
            canceled.cancel();
            return;
        }
    }
}

/// The link written into a status message's metadata.
pub(super) fn link_metadata(link: Value) -> std::collections::HashMap<String, Value> {
    std::collections::HashMap::from([(REMOTE.to_owned(), link)])
}
