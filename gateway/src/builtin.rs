//! Agents the gateway runs itself: the `tck` agent, which behaves as the
//! A2A conformance kit's scenarios ask (keyed on the messageId prefix), and
//! `remote` agents, whose turns the gateway forwards to an external A2A agent
//! and mirrors into the chorus task.
//!
//! They write to the task store like any worker, through its gRPC API; the
//! task is not leased (no worker claims a built-in agent's tasks).

use std::time::Duration;

use a2a::{Message, Part, PartContent, Role};
use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::{
    catalog::TCK,
    config::{AgentConfig, AgentKind},
    convert,
    delegate::{A2aClient, DelegateOutcome, DelegateTarget},
};

/// How long the `test-resubscribe` scenario keeps its task working.
const RESUBSCRIBE_PAUSE: Duration = Duration::from_secs(4);

/// Runs the turns of built-in and remote agents.
#[derive(Debug, Clone)]
pub(crate) struct Runner {
    tasks: TaskStoreClient<Channel>,
    delegate: A2aClient,
    remote_timeout: Duration,
    shutdown: CancellationToken,
}

/// One task's writer.
struct Turn {
    tasks: TaskStoreClient<Channel>,
    namespace: String,
    task: pb::Task,
}

type Written = Result<(), tonic::Status>;

impl Turn {
    async fn status(&mut self, state: pb::TaskState, text: Option<&str>) -> Written {
        let message = text.map(|text| self.agent_message(text));
        let request = pb::UpdateStatusRequest {
            namespace: self.namespace.clone(),
            task_id: self.task.id.clone(),
            state: state.into(),
            message,
            lease_id: String::new(),
        };
        self.tasks.update_status(request).await?;
        Ok(())
    }

    async fn artifact(&mut self, parts: Vec<Part>, append: bool, last_chunk: bool, artifact_id: &str) -> Written {
        let artifact = a2a::Artifact {
            artifact_id: artifact_id.to_owned(),
            name: Some("result".to_owned()),
            description: None,
            parts,
            metadata: None,
            extensions: None,
        };
        let request = pb::AppendArtifactRequest {
            namespace: self.namespace.clone(),
            task_id: self.task.id.clone(),
            artifact: Some(convert::artifact_in(&artifact)),
            append,
            last_chunk,
            lease_id: String::new(),
        };
        self.tasks.append_artifact(request).await?;
        Ok(())
    }

    fn agent_message(&self, text: &str) -> pb::Message {
        let mut message = Message::new(Role::Agent, vec![Part::text(text)]);
        message.context_id = Some(self.task.context_id.clone());
        message.task_id = Some(self.task.id.clone());
        convert::message_in(&message)
    }
}

impl Runner {
    pub(crate) fn new(
        tasks: TaskStoreClient<Channel>,
        delegate: A2aClient,
        remote_timeout: Duration,
        shutdown: CancellationToken,
    ) -> Self {
        Self { tasks, delegate, remote_timeout, shutdown }
    }

    /// The message a built-in agent answers without a task, if it does.
    pub(crate) fn direct_reply(agent: &AgentConfig, message: &Message) -> Option<Message> {
        let direct = agent.kind == AgentKind::Builtin
            && agent.id == TCK
            && message.message_id.starts_with("tck-message-response");
        direct.then(|| {
            let mut reply = Message::new(Role::Agent, vec![Part::text("Direct message response")]);
            reply.context_id = Some(message.context_id.clone().unwrap_or_else(a2a::new_context_id));
            reply
        })
    }

    /// Runs `agent`'s turn on `task` for `message` in the background.
    pub(crate) fn start(&self, agent: &AgentConfig, namespace: &str, task: &pb::Task, message: Message) {
        let turn = Turn { tasks: self.tasks.clone(), namespace: namespace.to_owned(), task: task.clone() };
        let runner = self.clone();
        let agent = agent.clone();
        tokio::spawn(async move {
            let task_id = turn.task.id.clone();
            let outcome = tokio::select! {
                outcome = runner.run(&agent, turn, message) => outcome,
                () = runner.shutdown.cancelled() => Ok(()),
            };
            if let Err(status) = outcome {
                // A canceled task refuses further writes: that ends the turn.
                tracing::debug!(%task_id, agent = %agent.id, error = %status.message(), "built-in turn ended early");
            }
        });
    }

    async fn run(&self, agent: &AgentConfig, turn: Turn, message: Message) -> Written {
        match agent.kind {
            AgentKind::Remote => self.forward(agent, turn, message).await,
            AgentKind::Builtin | AgentKind::Worker => tck(turn, &message).await,
        }
    }

    /// A remote agent's turn: the message goes to the external agent; its
    /// artifacts and final state come back into the chorus task.
    async fn forward(&self, agent: &AgentConfig, mut turn: Turn, mut message: Message) -> Written {
        turn.status(pb::TaskState::Working, None).await?;
        message.task_id = None;
        message.context_id = None;
        let target = DelegateTarget::new(agent.url.clone().unwrap_or_default());
        let outcome = self.delegate.delegate(&target, message, self.remote_timeout, None).await;
        match outcome {
            Ok(DelegateOutcome::Task(task)) => {
                for artifact in task.artifacts.unwrap_or_default() {
                    turn.artifact(artifact.parts, false, true, &artifact.artifact_id).await?;
                }
                let text = task.status.message.as_ref().and_then(|message| message.text()).map(str::to_owned);
                let state = convert::state_in(&task.status.state);
                turn.status(state, text.as_deref()).await
            }
            Ok(DelegateOutcome::Message(reply)) => {
                let text = reply.text().unwrap_or_default().to_owned();
                turn.status(pb::TaskState::Completed, Some(&text)).await
            }
            Err(error) => {
                turn.status(pb::TaskState::Failed, Some(&format!("remote agent {}: {error}", agent.id))).await
            }
        }
    }
}

/// The TCK scenarios (`scenarios/*.feature` of a2aproject/a2a-tck).
async fn tck(mut turn: Turn, message: &Message) -> Written {
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
        turn.status(pb::TaskState::Working, None).await?;
        turn.artifact(vec![Part::text(*text)], false, true, &artifact_id).await?;
        return turn.status(pb::TaskState::Completed, None).await;
    }
    if id.starts_with("tck-stream-artifact-chunked") {
        turn.status(pb::TaskState::Working, None).await?;
        turn.artifact(vec![Part::text("chunk-1 ")], false, false, &artifact_id).await?;
        turn.artifact(vec![Part::text("chunk-2")], true, true, &artifact_id).await?;
        return turn.status(pb::TaskState::Completed, None).await;
    }
    if id.starts_with("tck-stream-artifact-file") {
        turn.status(pb::TaskState::Working, None).await?;
        turn.artifact(vec![file()], false, true, &artifact_id).await?;
        return turn.status(pb::TaskState::Completed, None).await;
    }
    if id.starts_with("test-resubscribe-message-id") {
        turn.status(pb::TaskState::Working, None).await?;
        tokio::time::sleep(RESUBSCRIBE_PAUSE).await;
        return turn.status(pb::TaskState::Completed, None).await;
    }
    if id.starts_with("tck-stream-002") {
        return turn.status(pb::TaskState::Completed, None).await;
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
        turn.artifact(vec![part], false, true, &artifact_id).await?;
        return turn.status(pb::TaskState::Completed, None).await;
    }
    if id.starts_with("tck-input-required") {
        return turn.status(pb::TaskState::InputRequired, Some("Please provide more input")).await;
    }
    if id.starts_with("tck-reject-task") {
        return turn.status(pb::TaskState::Rejected, Some("rejected")).await;
    }
    if id.starts_with("tck-complete-task") {
        return turn.status(pb::TaskState::Completed, Some("Hello from TCK")).await;
    }
    let text = message.text().unwrap_or_default().to_owned();
    turn.artifact(vec![Part::text(text.clone())], false, true, &artifact_id).await?;
    turn.status(pb::TaskState::Completed, Some(&text)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;

    #[test]
    fn only_the_tck_agent_answers_directly() {
        let catalog = crate::catalog::Catalog::new(&GatewayConfig::default(), "http://h").expect("catalog");
        let mut message = Message::new(Role::User, vec![Part::text("hi")]);
        message.message_id = "tck-message-response-1".to_owned();
        message.context_id = Some("ctx".to_owned());
        let reply = Runner::direct_reply(catalog.agent(TCK).expect("tck"), &message).expect("a direct reply");
        assert_eq!(reply.text(), Some("Direct message response"));
        assert_eq!(reply.context_id.as_deref(), Some("ctx"));
        assert!(Runner::direct_reply(catalog.agent("echo").expect("echo"), &message).is_none());
    }
}
