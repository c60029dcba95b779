//! `workflow` agents: a message starts a run of the agent's workflow and the
//! run's progress becomes the task's status. A HITL gate waiting for a
//! decision shows as `input-required`, its reviewers and artifacts in the
//! status message; the reply (`approve`, or `reject: <feedback>`, or a data
//! part `{"decision": …, "reason": …}`, or an IDE's answer to the question
//! through `chorus acp`: allow or reject) decides it and the turn follows the
//! run on. A gate decided elsewhere (`chorus gate`, the workflow API), or a
//! run that ends while its gate waits, moves the task on by itself: the
//! gateway watches each waiting gate. Canceling the task cancels the run.
//!
//! The status message of an interruption carries the run, the gate and the
//! watch cursor under metadata `chorus.workflow`, so the next turn resumes
//! the watch where this one stopped; every status of the run's progress
//! carries the run and its cursor, where a gateway taking the task up after
//! this one died goes on from (`turns`).

use a2a::{Artifact, Message, Part, PartContent};
use chorus_proto::{
    taskstore as pb,
    workflow::{
        self as wf, DecideGateRequest, GetRunRequest, RunState, StartRunRequest, StepKind, StepState, WatchRunRequest,
        run_event::Kind,
    },
};
use serde_json::{Value, json};

use super::{Runner, Turn, Written};
use crate::{acp, config::AgentConfig};

/// The metadata key linking a task to its run.
pub(super) const LINK: &str = "chorus.workflow";

/// Where an earlier turn of the task left its run.
#[derive(Debug, Clone, PartialEq)]
struct Link {
    run_id: String,
    gate: String,
    iteration: u32,
    cursor: String,
}

/// The `chorus.workflow` metadata of the task's messages, newest first.
fn links(task: &pb::Task) -> impl Iterator<Item = Value> + '_ {
    task.history.iter().rev().filter_map(link_in)
}

/// A message's `chorus.workflow` metadata, if it has some.
fn link_in(message: &pb::Message) -> Option<Value> {
    Some(chorus_proto::json::value_to_json(message.metadata.as_ref()?.fields.get(LINK)?))
}

/// The gate the task's last interruption waits on, if it was one: the
/// newest link says where the run is.
fn link_of(task: &pb::Task) -> Option<Link> {
    parse_link(&links(task).next()?)
}

/// The gate an interruption's link names.
fn parse_link(link: &Value) -> Option<Link> {
    Some(Link {
        run_id: link.get("runId")?.as_str()?.to_owned(),
        gate: link.get("gate")?.as_str()?.to_owned(),
        iteration: u32::try_from(link.get("iteration")?.as_u64()?).ok()?,
        cursor: link.get("cursor")?.as_str().unwrap_or_default().to_owned(),
    })
}

/// The run the task started.
fn run_of(task: &pb::Task) -> Option<String> {
    resume_point(task).map(|(run_id, _)| run_id)
}

/// The run the task started, and its last change the task shows (empty:
/// none yet).
fn resume_point(task: &pb::Task) -> Option<(String, String)> {
    links(task).find_map(|link| {
        let cursor = link.get("cursor").and_then(Value::as_str).unwrap_or_default().to_owned();
        Some((link.get("runId")?.as_str()?.to_owned(), cursor))
    })
}

/// Where mirroring a run stopped: at the gate it waits on, or at its end.
type Stopped = Result<Option<Link>, tonic::Status>;

/// What a rejection from an IDE (which offers allow or reject, no
/// feedback) gives the rerun phase as its feedback.
const IDE_REJECTION: &str = "rejected in the IDE";

/// A reply to a waiting gate: the decision and its reason.
fn verdict(message: &Message) -> Option<(wf::Decision, String)> {
    let ide_answer = message.metadata.as_ref().and_then(|metadata| metadata.get(acp::PERMISSION));
    if let Some(chosen) = ide_answer.and_then(Value::as_str) {
        return match chosen {
            acp::ALLOW => Some((wf::Decision::Approve, String::new())),
            acp::REJECT => Some((wf::Decision::Reject, IDE_REJECTION.to_owned())),
            _ => None,
        };
    }
    for part in &message.parts {
        if let PartContent::Data(data) = &part.content {
            let reason = data.get("reason").and_then(Value::as_str).unwrap_or_default().to_owned();
            return match data.get("decision").and_then(Value::as_str)? {
                "approve" => Some((wf::Decision::Approve, reason)),
                "reject" if !reason.trim().is_empty() => Some((wf::Decision::Reject, reason)),
                _ => None,
            };
        }
    }
    let text = message.text()?.trim();
    let lower = text.to_lowercase();
    if lower.starts_with("approve") {
        let reason = text["approve".len()..].trim_start_matches([':', ' ']).to_owned();
        return Some((wf::Decision::Approve, reason));
    }
    let feedback = lower.starts_with("reject").then(|| text["reject".len()..].trim_start_matches([':', ' ']).trim())?;
    (!feedback.is_empty()).then(|| (wf::Decision::Reject, feedback.to_owned()))
}

/// The run's input: the message's first data part that is an object or,
/// when it has none, its first text that is a JSON object (what a client
/// that sends text alone, an IDE's prompt, can give).
fn input_of(message: &Message) -> prost_types::Struct {
    let object = |value: Value| match value {
        Value::Object(object) => Some(object),
        _ => None,
    };
    let data = message.parts.iter().find_map(|part| match &part.content {
        PartContent::Data(data) => object(data.clone()),
        _ => None,
    });
    let text = || {
        message.parts.iter().find_map(|part| match &part.content {
            PartContent::Text(text) => serde_json::from_str(text.trim()).ok().and_then(object),
            _ => None,
        })
    };
    chorus_proto::json::struct_from_json(data.or_else(text).unwrap_or_default())
}

/// Who acts by `message` (starts a run, decides a gate): `a2a`, and the
/// name of the credential it came with when the gateway checks credentials.
fn sender(message: &Message) -> String {
    let caller = message.metadata.as_ref().and_then(|metadata| metadata.get(super::CALLER)).and_then(Value::as_str);
    caller.map_or_else(|| "a2a".to_owned(), |caller| format!("a2a:{caller}"))
}

impl Runner {
    /// One turn of a workflow agent on `turn`'s task: the message, then
    /// the gates the run meets, until the run ends or a reply answers a gate
    /// (its own turn follows the run on).
    pub(super) async fn workflow_turn(&self, agent: &AgentConfig, mut turn: Turn, message: Message) -> Written {
        let gate = self.drive_workflow(agent, &mut turn, message).await?;
        self.await_gates(&mut turn, gate).await
    }

    /// Takes up a workflow agent's task whose gateway stopped: follows its
    /// run on from the last change the task shows, or watches the gate it
    /// waits on; a run it may not have started yet is started (or found:
    /// the start is idempotent on the task).
    pub(super) async fn resume_workflow(&self, agent: &AgentConfig, mut turn: Turn) -> Written {
        let state = turn.task.status.as_ref().map(pb::TaskStatus::state);
        let gate = match (state, resume_point(&turn.task)) {
            (Some(pb::TaskState::InputRequired), _) => link_of(&turn.task),
            (Some(pb::TaskState::Working | pb::TaskState::Submitted), Some((run_id, cursor))) => {
                self.follow_run(&mut turn, run_id, cursor).await?
            }
            (Some(pb::TaskState::Working | pb::TaskState::Submitted), None) => {
                let first = turn.task.history.iter().find(|message| message.role() == pb::Role::User).cloned();
                let Some(first) = first else { return Ok(()) };
                self.drive_workflow(agent, &mut turn, crate::convert::message_out(first)).await?
            }
            _ => None,
        };
        self.await_gates(&mut turn, gate).await
    }

    /// Watches each gate the run waits on in turn, until it ends or a reply
    /// answers one.
    async fn await_gates(&self, turn: &mut Turn, mut gate: Option<Link>) -> Written {
        while let Some(link) = gate {
            let Some(_watching) = self.turns.watch(&turn.namespace, &turn.task.id, &link.gate, link.iteration) else {
                return Ok(());
            };
            gate = self.await_gate(turn, link).await?;
        }
        Ok(())
    }

    /// Starts or steers the run for `message`; the gate the run then waits
    /// on, if it does.
    async fn drive_workflow(&self, agent: &AgentConfig, turn: &mut Turn, message: Message) -> Stopped {
        let mut workflows = self.workflows.clone();
        let (run_id, cursor) = match link_of(&turn.task) {
            Some(link) => {
                let Some((decision, reason)) = verdict(&message) else {
                    if self.gate_waits(&turn.namespace, &link).await? {
                        let again = "Reply `approve`, or `reject: <feedback>`, to decide the gate.";
                        let metadata = Some(linked(&link, None));
                        turn.status(pb::TaskState::InputRequired, Some(again), metadata).await?;
                        return Ok(Some(link));
                    }
                    // Decided elsewhere meanwhile: the task catches up with the run.
                    turn.status(pb::TaskState::Working, Some("The gate was decided. Following the run."), None).await?;
                    return self.follow_run(turn, link.run_id, link.cursor).await;
                };
                let request = DecideGateRequest {
                    namespace: turn.namespace.clone(),
                    run_id: link.run_id.clone(),
                    step_id: link.gate.clone(),
                    decision: decision.into(),
                    decided_by: sender(&message),
                    reason,
                    iteration: Some(link.iteration),
                    ..DecideGateRequest::default()
                };
                match workflows.decide_gate(request).await {
                    Ok(_) => {}
                    // Decided elsewhere (the CLI, the API), or its run
                    // ended: the task catches up with the run instead.
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                        let text = format!("{} Following the run.", status.message());
                        turn.status(pb::TaskState::Working, Some(&text), None).await?;
                    }
                    Err(status) => {
                        let text = format!("The gate was not decided: {}", status.message());
                        let metadata = Some(linked(&link, None));
                        turn.status(pb::TaskState::InputRequired, Some(&text), metadata).await?;
                        return Ok(Some(link));
                    }
                }
                (link.run_id, link.cursor)
            }
            None => {
                let request = StartRunRequest {
                    namespace: turn.namespace.clone(),
                    workflow: agent.workflow.clone().unwrap_or_else(|| agent.id.clone()),
                    input: Some(input_of(&message)),
                    idempotency_key: format!("a2a:{}", turn.task.id),
                    origin: Some(wf::RunOrigin {
                        kind: wf::run_origin::Kind::A2a.into(),
                        started_by: sender(&message),
                        task_id: turn.task.id.clone(),
                        ..wf::RunOrigin::default()
                    }),
                    ..StartRunRequest::default()
                };
                let run = match workflows.start_run(request).await {
                    Ok(run) => run.into_inner(),
                    // Out of reach: the turn is taken up again (see `turns`).
                    Err(status) if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown) => {
                        return Err(status);
                    }
                    // Inputs the workflow does not take, or a workflow an
                    // operator disabled: the agent will not do this task
                    // (A2A's REJECTED), as opposed to failing at it.
                    Err(status) => {
                        let text = format!("The workflow did not start: {}", status.message());
                        let state = match status.code() {
                            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => pb::TaskState::Rejected,
                            _ => pb::TaskState::Failed,
                        };
                        return turn.status(state, Some(&text), None).await.map(|()| None);
                    }
                };
                let started = std::collections::HashMap::from([(LINK.to_owned(), json!({ "runId": run.id }))]);
                let text = match (run.state(), run.pending_reason.as_str()) {
                    (RunState::Pending, reason) if !reason.is_empty() => format!("Run {} is queued, {reason}.", run.id),
                    _ => format!("Run {} started.", run.id),
                };
                turn.status(pb::TaskState::Working, Some(&text), Some(started)).await?;
                (run.id, String::new())
            }
        };
        self.follow_run(turn, run_id, cursor).await
    }

    /// Whether the gate `link` names still waits for a decision.
    async fn gate_waits(&self, namespace: &str, link: &Link) -> Result<bool, tonic::Status> {
        let get = GetRunRequest { namespace: namespace.to_owned(), run_id: link.run_id.clone(), wait_finished: false };
        let run = self.workflows.clone().get_run(get).await?.into_inner();
        Ok(run.steps.iter().any(|step| {
            step.step_id == link.gate && step.iteration == link.iteration && step.state() == StepState::Waiting
        }))
    }

    /// Mirrors the run into the task until it ends, or a gate waits: that
    /// gate. Each status written notes the run's change it came from, where
    /// a gateway taking the task up goes on from.
    async fn follow_run(&self, turn: &mut Turn, run_id: String, after_cursor: String) -> Stopped {
        let mut workflows = self.workflows.clone();
        let request = WatchRunRequest { namespace: turn.namespace.clone(), run_id: run_id.clone(), after_cursor };
        let mut events = workflows.watch_run(request).await?.into_inner();
        let get = GetRunRequest { namespace: turn.namespace.clone(), run_id: run_id.clone(), wait_finished: false };
        while let Some(event) = events.message().await? {
            match (event.kind(), event.step.as_ref()) {
                (Kind::StepUpdated, Some(step))
                    if step.kind() == StepKind::Gate && step.state() == StepState::Waiting =>
                {
                    let run = workflows.get_run(get.clone()).await?.into_inner();
                    let waiting = run.steps.iter().any(|s| s.seq == step.seq && s.state() == StepState::Waiting);
                    if waiting {
                        let link = Link {
                            run_id,
                            gate: step.step_id.clone(),
                            iteration: step.iteration,
                            cursor: event.cursor,
                        };
                        let input = step.input.as_ref().map(chorus_proto::json::struct_to_json).unwrap_or_default();
                        let reviewers = input.get("reviewers").and_then(Value::as_str).unwrap_or("a reviewer");
                        let consequence = match input.get("on_reject").and_then(Value::as_str) {
                            Some("fail") => " A rejection now fails the run.",
                            Some("escalate") => " A rejection now escalates the gate.",
                            _ => "",
                        };
                        let text = format!(
                            "Gate `{}` (round {}) waits for a decision by {reviewers}: reply `approve`, or \
                             `reject: <feedback>`.{consequence}{}",
                            step.step_id,
                            step.iteration,
                            artifacts_text(input.get("artifacts"))
                        );
                        let details = json!({ "artifacts": input.get("artifacts"), "reviewers": reviewers });
                        let metadata = Some(linked(&link, Some(details)));
                        turn.status(pb::TaskState::InputRequired, Some(&text), metadata).await?;
                        return Ok(Some(link));
                    }
                }
                (Kind::StepUpdated, Some(step)) if step.state() == StepState::Completed => {
                    let text = format!("Step `{}` completed.", step.step_id);
                    let progress = json!({ "runId": run_id, "cursor": event.cursor });
                    let metadata = std::collections::HashMap::from([(LINK.to_owned(), progress)]);
                    turn.status(pb::TaskState::Working, Some(&text), Some(metadata)).await?;
                }
                (Kind::RunStateChanged, _) if event.state() == RunState::Completed => {
                    let run = workflows.get_run(get.clone()).await?.into_inner();
                    let output = run.output.as_ref().map(chorus_proto::json::struct_to_json).unwrap_or_default();
                    let artifact = Artifact {
                        artifact_id: a2a::new_artifact_id(),
                        name: Some("output".into()),
                        description: Some(format!("The output of run {run_id}")),
                        parts: vec![Part::data(Value::Object(output))],
                        metadata: None,
                        extensions: None,
                    };
                    turn.artifact(artifact, false, true).await?;
                    let text = format!("Run {run_id} completed.");
                    return turn.status(pb::TaskState::Completed, Some(&text), None).await.map(|()| None);
                }
                (Kind::RunStateChanged, _) if event.state() == RunState::Failed => {
                    let run = workflows.get_run(get.clone()).await?.into_inner();
                    let text = format!("Run {run_id} failed: {}", run.error);
                    return turn.status(pb::TaskState::Failed, Some(&text), None).await.map(|()| None);
                }
                (Kind::RunStateChanged, _) if event.state() == RunState::Canceled => {
                    let text = format!("Run {run_id} was canceled.");
                    return turn.status(pb::TaskState::Canceled, Some(&text), None).await.map(|()| None);
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Watches the gate the task waits on: when it is decided elsewhere
    /// (`chorus gate`, the workflow API) or its run ends, the task catches
    /// up with the run (to the next gate, if there is one), unless an A2A
    /// reply answered first: its turn follows the run then.
    async fn await_gate(&self, turn: &mut Turn, link: Link) -> Stopped {
        let namespace = turn.namespace.clone();
        let request = WatchRunRequest {
            namespace: namespace.clone(),
            run_id: link.run_id.clone(),
            after_cursor: link.cursor.clone(),
        };
        let mut events = self.workflows.clone().watch_run(request).await?.into_inner();
        let note = loop {
            let Some(event) = events.message().await? else { return Ok(None) };
            let ended = event.kind() == Kind::RunStateChanged
                && matches!(event.state(), RunState::Completed | RunState::Failed | RunState::Canceled);
            if ended {
                break format!("Run {} ended while gate `{}` waited.", link.run_id, link.gate);
            }
            if let (Kind::StepUpdated, Some(step)) = (event.kind(), event.step.as_ref())
                && step.step_id == link.gate
                && step.iteration == link.iteration
                && step.state() != StepState::Waiting
            {
                break format!("Gate `{}` was decided outside this conversation.", link.gate);
            }
        };
        // Still waiting on this gate: no reply answered it meanwhile (a reply
        // moves the task on, and the turn it starts follows the run). Of a
        // reply and this answer, the task store takes only the first.
        // Every interruption's status message carries its link: no history.
        let get =
            pb::GetTaskRequest { namespace: namespace.clone(), id: turn.task.id.clone(), history_length: Some(0) };
        let task = turn.tasks.get_task(get).await?.into_inner();
        let status = task.status.as_ref().filter(|status| status.state() == pb::TaskState::InputRequired);
        let waiting = status.and_then(|status| parse_link(&link_in(status.message.as_ref()?)?));
        let same_gate = waiting
            .is_some_and(|now| (&now.run_id, &now.gate, now.iteration) == (&link.run_id, &link.gate, link.iteration));
        if !same_gate {
            return Ok(None);
        }
        let answer = turn.agent_message(&note, None);
        let answered = pb::AnswerQuestionRequest {
            namespace,
            task_id: task.id.clone(),
            answer: Some(answer),
            follower: Some(self.turns.follower()),
        };
        match turn.tasks.answer_question(answered).await {
            Ok(_) => self.follow_run(turn, link.run_id, link.cursor).await,
            Err(status) if status.code() == tonic::Code::FailedPrecondition => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// Passes the cancel of a workflow agent's task on to its run.
    pub(crate) async fn cancel_run(&self, namespace: &str, task: &pb::Task) {
        let Some(run_id) = run_of(task) else { return };
        let request = wf::CancelRunRequest {
            namespace: namespace.to_owned(),
            run_id,
            reason: "its A2A task was canceled".into(),
            canceled_by: "a2a".into(),
        };
        if let Err(status) = self.workflows.clone().cancel_run(request).await {
            tracing::debug!(task_id = %task.id, error = %status.message(), "the run was not canceled");
        }
    }
}

/// The status message metadata of an interruption.
/// The most characters of one artifact a gate's question shows.
const ARTIFACT_CHARS: usize = 2000;

/// A gate's artifacts as its question shows them to whoever decides (an IDE
/// shows the text alone): `name: value` each, after a blank line, a long
/// value cut short. The whole of them is in the status's metadata.
fn artifacts_text(artifacts: Option<&Value>) -> String {
    let Some(Value::Object(artifacts)) = artifacts else { return String::new() };
    artifacts
        .iter()
        .map(|(name, value)| {
            let value = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let shown: String = value.chars().take(ARTIFACT_CHARS).collect();
            let cut = if shown.len() < value.len() { "…" } else { "" };
            format!("\n\n{name}: {shown}{cut}")
        })
        .collect()
}

fn linked(link: &Link, details: Option<Value>) -> std::collections::HashMap<String, Value> {
    std::collections::HashMap::from([(LINK.to_owned(), link_value(link, details))])
}

fn link_value(link: &Link, details: Option<Value>) -> Value {
    let mut value =
        json!({ "runId": link.run_id, "gate": link.gate, "iteration": link.iteration, "cursor": link.cursor });
    if let (Some(Value::Object(details)), Some(map)) = (details, value.as_object_mut()) {
        map.extend(details);
    }
    value
}

#[cfg(test)]
mod tests;
