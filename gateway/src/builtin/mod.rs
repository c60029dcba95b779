//! Agents the gateway runs itself: the `tck` agent, which behaves as the
//! A2A conformance kit's scenarios ask (keyed on the messageId prefix),
//! `remote` agents, whose turns the gateway forwards to an external A2A agent
//! and mirrors into the chorus task, and `workflow` agents, whose messages
//! start and steer workflow runs.
//!
//! They write to the task store like any worker, through its gRPC API; the
//! task is not leased (no worker claims a built-in agent's tasks). A turn
//! that needs no work (most of the `tck` agent's, and every echo) is the
//! task's answer: the task is created with it, settled, in one write. The
//! tasks of workflow and remote agents are followed instead (`turns`), so
//! that another gateway takes them up if this one dies.

mod remote;
mod tck;
mod turns;
mod workflow;

use std::time::Duration;

use a2a::{Artifact, Message, Part, Role};
use chorus_proto::{
    taskstore::{self as pb, task_store_client::TaskStoreClient},
    workflow::workflow_client::WorkflowClient,
};
use chorus_runtime::transport::Transport;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub(crate) use self::turns::Turns;
use crate::{
    catalog::TCK,
    config::{AgentConfig, AgentKind},
    convert,
    delegate::A2aClient,
};

/// Runs the turns of built-in and remote agents.
#[derive(Debug, Clone)]
pub(crate) struct Runner {
    tasks: TaskStoreClient<Transport>,
    workflows: WorkflowClient<Transport>,
    delegate: A2aClient,
    remote_timeout: Duration,
    turns: Turns,
    shutdown: CancellationToken,
}

/// One task's writer.
struct Turn {
    tasks: TaskStoreClient<Transport>,
    namespace: String,
    task: pb::Task,
}

type Written = Result<(), tonic::Status>;

/// The metadata key under which the gateway notes, on a message it was sent,
/// the name of the credential it came with (when it checks credentials): a
/// workflow gate a reply decides records it as who decided.
pub(crate) const CALLER: &str = "chorus.caller";

/// The metadata keys by which the gateway's own status messages link a task
/// to the run or remote task behind it, and by which it notes a message's
/// sender. A client's message may not carry them: the gateway would take
/// its word for which run or remote task to drive, or who sent it.
pub(crate) const LINK_KEYS: [&str; 3] = [workflow::LINK, remote::REMOTE, CALLER];

/// A status message's metadata.
type Metadata = std::collections::HashMap<String, Value>;

impl Turn {
    /// A writer of the same task.
    fn clone_writer(&self) -> Self {
        Self { tasks: self.tasks.clone(), namespace: self.namespace.clone(), task: self.task.clone() }
    }

    /// Moves the task to `state`, with `text` as the agent's status message
    /// (carrying `metadata`: what links the task to a remote task or a run).
    async fn status(&mut self, state: pb::TaskState, text: Option<&str>, metadata: Option<Metadata>) -> Written {
        let message = text.map(|text| self.agent_message(text, metadata));
        self.write_status(state, message).await
    }

    /// Sets the task's state with `message`, another agent's words whole (its
    /// parts and metadata), as this task's agent message, with chorus's `link`.
    async fn status_with(&mut self, state: pb::TaskState, mut message: Message, link: Option<Metadata>) -> Written {
        // Chorus's own keys say what chorus linked; another agent's are dropped.
        let metadata = message.metadata.get_or_insert_with(Metadata::new);
        metadata.retain(|key, _| !LINK_KEYS.contains(&key.as_str()));
        metadata.extend(link.into_iter().flatten());
        if metadata.is_empty() {
            message.metadata = None;
        }
        message.message_id = uuid::Uuid::new_v4().to_string();
        message.role = Role::Agent;
        message.context_id = Some(self.task.context_id.clone());
        message.task_id = Some(self.task.id.clone());
        self.write_status(state, Some(convert::message_in(&message))).await
    }

    async fn write_status(&mut self, state: pb::TaskState, message: Option<pb::Message>) -> Written {
        let request = pb::UpdateStatusRequest {
            namespace: self.namespace.clone(),
            task_id: self.task.id.clone(),
            state: state.into(),
            message,
            lease_id: String::new(),
            brief: true,
        };
        self.tasks.update_status(request).await?;
        Ok(())
    }

    /// Adds `artifact`, or a chunk of it.
    async fn artifact(&mut self, artifact: Artifact, append: bool, last_chunk: bool) -> Written {
        let request = pb::AppendArtifactRequest {
            namespace: self.namespace.clone(),
            task_id: self.task.id.clone(),
            artifact: Some(convert::artifact_in(&artifact)),
            append,
            last_chunk,
            lease_id: String::new(),
            brief: true,
        };
        self.tasks.append_artifact(request).await?;
        Ok(())
    }

    fn agent_message(&self, text: &str, metadata: Option<Metadata>) -> pb::Message {
        let mut message = Message::new(Role::Agent, vec![Part::text(text)]);
        message.context_id = Some(self.task.context_id.clone());
        message.task_id = Some(self.task.id.clone());
        message.metadata = metadata;
        convert::message_in(&message)
    }
}

impl Runner {
    pub(crate) fn new(
        tasks: TaskStoreClient<Transport>,
        workflows: WorkflowClient<Transport>,
        delegate: A2aClient,
        remote_timeout: Duration,
        turns: Turns,
        shutdown: CancellationToken,
    ) -> Self {
        Self { tasks, workflows, delegate, remote_timeout, turns, shutdown }
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

    /// The answer a built-in agent gives `message` at once, when its turn
    /// needs no work: its task is created with it, already settled.
    pub(crate) fn answer(agent: &AgentConfig, message: &Message) -> Option<pb::TaskAnswer> {
        if agent.kind != AgentKind::Builtin {
            return None;
        }
        tck::reply(message).map(tck::Reply::into_answer)
    }

    /// Who follows the turns of `agent`'s new tasks: this gateway, from the
    /// write that makes each, for a workflow or remote agent, so that a
    /// gateway dying as it creates one leaves it to another.
    pub(crate) fn follower(&self, agent: &AgentConfig) -> Option<pb::TurnFollower> {
        runs_turns_apart(agent).then(|| self.turns.follower())
    }

    /// Runs `agent`'s turn on `task` for `message` in the background: a task
    /// just created or answered with [`Runner::follower`] as its follower.
    pub(crate) fn start(&self, agent: &AgentConfig, namespace: &str, task: &pb::Task, message: Message) {
        if runs_turns_apart(agent) {
            self.turns.followed(namespace, &task.id);
        }
        let turn = Turn { tasks: self.tasks.clone(), namespace: namespace.to_owned(), task: task.clone() };
        let runner = self.clone();
        let agent = agent.clone();
        tokio::spawn(async move {
            let (namespace, task_id) = (turn.namespace.clone(), turn.task.id.clone());
            let run = async {
                let outcome = runner.run(&agent, turn, message).await;
                runner.carry_on(&agent, &namespace, &task_id, outcome).await
            };
            let outcome = tokio::select! {
                outcome = run => outcome,
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
            AgentKind::Workflow => self.workflow_turn(agent, turn, message).await,
            AgentKind::Builtin | AgentKind::Worker => tck::run(turn, &message).await,
        }
    }

    /// Catches `task`, which another gateway (or this one's previous run)
    /// followed, up with the run or remote task behind it.
    async fn resume(&self, agent: &AgentConfig, namespace: &str, task: pb::Task) -> Written {
        let turn = Turn { tasks: self.tasks.clone(), namespace: namespace.to_owned(), task };
        match agent.kind {
            AgentKind::Remote => self.resume_remote(agent, turn).await,
            AgentKind::Workflow => self.resume_workflow(agent, turn).await,
            AgentKind::Builtin | AgentKind::Worker => Ok(()),
        }
    }
}

/// Whether the gateway follows `agent`'s turns in the task store, under a
/// lease: they run here, not in a worker, and outlive a request.
fn runs_turns_apart(agent: &AgentConfig) -> bool {
    matches!(agent.kind, AgentKind::Remote | AgentKind::Workflow)
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
