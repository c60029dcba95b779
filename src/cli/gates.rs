//! `chorus gate list|approve|reject`.

use chorus_proto::workflow::{
    self as pb, DecideGateRequest, ListRunsRequest, StepKind, StepState, workflow_client::WorkflowClient,
};
use chorus_runtime::transport::Transport;

use super::{Failure, Outcome, Target, view};

type Client = WorkflowClient<Transport>;

/// A decision from the command line.
#[derive(Debug)]
pub(super) enum Verdict {
    Approve(String),
    Reject(String),
}

/// A gate waiting for a decision, and its run.
struct Waiting {
    run_id: String,
    workflow: String,
    step: pb::StepRecord,
}

pub(super) async fn list(client: &mut Client, target: &Target, workflow: Option<String>, json: bool) -> Outcome {
    let mut waiting = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListRunsRequest {
            namespace: target.namespace.clone(),
            workflow: workflow.clone().unwrap_or_default(),
            states: vec![pb::RunState::Waiting.into(), pb::RunState::Running.into()],
            include_steps: true,
            page_size: 100,
            page_token: page_token.clone(),
            ..ListRunsRequest::default()
        };
        let page = client.list_runs(request).await?.into_inner();
        for run in page.runs {
            let gates = run.steps.into_iter().filter(|s| s.kind() == StepKind::Gate && s.state() == StepState::Waiting);
            waiting.extend(gates.map(|step| Waiting { run_id: run.id.clone(), workflow: run.workflow.clone(), step }));
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    super::definitions::check_known(client, target, workflow, waiting.is_empty()).await?;
    if json {
        return view::print_json(waiting.iter().map(|gate| {
            serde_json::json!({
                "run_id": gate.run_id,
                "workflow": gate.workflow,
                "step_id": gate.step.step_id,
                "iteration": gate.step.iteration,
                "input": view::struct_json(gate.step.input.as_ref()),
                "waiting_since": view::timestamp_json(gate.step.started_at.as_ref().or(gate.step.created_at.as_ref())),
                "expires_at": view::timestamp_json(gate.step.wake_at.as_ref()),
            })
        }));
    }
    let header = ["RUN", "WORKFLOW", "GATE", "ITER", "REVIEWERS", "IF REJECTED", "WAITING SINCE", "EXPIRES"];
    let mut rows = vec![header.map(str::to_owned).to_vec()];
    // What each gate decides on, below the table: too long for a column.
    let mut decided_on = String::new();
    for Waiting { run_id, workflow, step } in &waiting {
        let input = step.input.as_ref().map(chorus_proto::json::struct_to_json).unwrap_or_default();
        let reviewers = match view::reviewers(step.input.as_ref()) {
            reviewers if reviewers.is_empty() => "-".to_owned(),
            reviewers => reviewers,
        };
        let shown = view::artifacts(step.input.as_ref(), "  ");
        if !shown.is_empty() {
            decided_on.push_str(&format!("\n{run_id} {}#{}:\n{shown}", step.step_id, step.iteration));
        }
        rows.push(vec![
            run_id.clone(),
            workflow.clone(),
            step.step_id.clone(),
            step.iteration.to_string(),
            reviewers,
            match input.get("on_reject").and_then(|r| r.as_str()) {
                Some("fail") => "run fails",
                Some("escalate") => "escalates",
                _ => "phase reruns",
            }
            .to_owned(),
            view::time(step.started_at.as_ref().or(step.created_at.as_ref())),
            step.wake_at.as_ref().map_or_else(|| "-".to_owned(), |at| view::time(Some(at))),
        ]);
    }
    out!("{}{decided_on}", view::table(&rows));
    Ok(())
}

/// A person's decision on a gate.
pub(super) struct Decision {
    pub(super) verdict: Verdict,
    /// Who decides (default: $USER).
    pub(super) by: Option<String>,
    /// The round decided, when the person names it.
    pub(super) iteration: Option<u32>,
}

pub(super) async fn decide(
    client: &mut Client,
    target: &Target,
    run_id: &str,
    step: &str,
    decision: Decision,
) -> Outcome {
    let Decision { verdict, by, iteration } = decision;
    let (decision, reason) = match verdict {
        Verdict::Approve(reason) => (pb::Decision::Approve, reason),
        Verdict::Reject(feedback) if feedback.trim().is_empty() => {
            return Err(Failure::Call("--feedback must say what to change".into()));
        }
        Verdict::Reject(feedback) => (pb::Decision::Reject, feedback),
    };
    let request = DecideGateRequest {
        namespace: target.namespace.clone(),
        run_id: run_id.to_owned(),
        step_id: step.to_owned(),
        decision: decision.into(),
        decided_by: by.unwrap_or_else(view::user),
        reason,
        iteration,
        ..DecideGateRequest::default()
    };
    let run = client.decide_gate(request).await?.into_inner();
    let decided = run.gate_decisions.iter().rev().find(|d| d.step_id == step);
    match decided {
        Some(decision) => {
            let outcome = decision.outcome().as_str_name().trim_start_matches("OUTCOME_").to_lowercase();
            outln!("{} {step}#{}: {outcome}; run {}", run.id, decision.iteration, view::run_state(run.state()));
        }
        None => outln!("{} {step}: decided; run {}", run.id, view::run_state(run.state())),
    }
    Ok(())
}
