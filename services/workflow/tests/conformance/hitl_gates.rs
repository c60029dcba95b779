//! HITL gates: a rejection reruns the phase with its feedback, rejections
//! past the limit escalate and then fail, an unanswered gate expires, and a
//! decision on a gate that is not waiting changes nothing.

use chorus_workflow::{
    domain::{Decision, Outcome, Run, RunState, StepKind, StepState},
    error::WorkflowError,
    service::GateCall,
};
use serde_json::{Map, Value, json};

use crate::{
    harness::{Harness, NS, conformance},
    runs::{GATED, signal},
};

conformance!(
    a_rejected_gate_reruns_its_phase_with_feedback_then_approves,
    rejections_past_the_limit_escalate_then_fail,
    an_unanswered_gate_expires,
    decisions_on_gates_not_waiting_change_nothing,
    a_gate_rerun_by_an_enclosing_phase_gets_its_budget_again,
);

pub(crate) fn gate(step: &str, decision: Decision, by: &str, reason: &str) -> GateCall {
    GateCall {
        step_id: step.into(),
        decision,
        decided_by: by.into(),
        reason: reason.into(),
        data: Map::new(),
        iteration: None,
    }
}

async fn a_rejected_gate_reruns_its_phase_with_feedback_then_approves(h: Harness) {
    h.put(GATED).await;
    let run = h.run("gated", json!({})).await;
    let run = h.waiting(&run.id).await;
    let waiting = run.body.steps.last().expect("gate record");
    assert_eq!((waiting.step_id.as_str(), waiting.state), ("signoff", StepState::Waiting));
    assert_eq!(waiting.input["artifacts"]["summary"], json!("did: design it"));
    let (_, outcome) = h
        .workflows
        .decide_gate(NS, &run.id, gate("signoff", Decision::Reject, "ana", "add tests"))
        .await
        .expect("reject");
    assert_eq!(outcome, Outcome::Rerun);
    let run = h
        .until(&run.id, "the gate's second round", |run| {
            run.state == RunState::Waiting && run.body.steps.iter().filter(|s| s.step_id == "signoff").count() == 2
        })
        .await;
    let rerun = run.body.steps.iter().rfind(|s| s.step_id == "design").expect("design again");
    assert_eq!(rerun.iteration, 2);
    assert_eq!(rerun.input["feedback"]["reason"], json!("add tests"));
    assert_eq!(rerun.output.as_ref().expect("output")["feedback"]["reason"], json!("add tests"), "the agent saw it");
    h.workflows.decide_gate(NS, &run.id, gate("signoff", Decision::Approve, "ben", "fine")).await.expect("approve");
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let decisions: Vec<(&str, Outcome, u32)> =
        run.body.gate_decisions.iter().map(|d| (d.decided_by.as_str(), d.outcome, d.iteration)).collect();
    assert_eq!(decisions, [("ana", Outcome::Rerun, 1), ("ben", Outcome::Continued, 2)]);
}

/// Each waiting round of a gate says what rejecting it does.
fn on_reject(run: &Run) -> &Value {
    &run.body.steps.last().expect("a gate round").input["on_reject"]
}

async fn rejections_past_the_limit_escalate_then_fail(h: Harness) {
    h.put(GATED).await;
    let run = h.run("gated", json!({})).await;
    let run = h.waiting(&run.id).await;
    assert_eq!(on_reject(&run), "rerun");
    let unknown = h.workflows.decide_gate(NS, &run.id, gate("nosuch", Decision::Approve, "ana", "")).await;
    let unknown = unknown.expect_err("no such step");
    assert!(unknown.to_string().contains("workflow gated (version 1) has no step `nosuch`"), "{unknown}");
    let early = h.workflows.decide_gate(NS, &run.id, gate("build", Decision::Approve, "ana", "")).await;
    let early = early.expect_err("not reached");
    assert!(matches!(&early, WorkflowError::GateNotReached { step_id, .. } if step_id == "build"), "{early}");
    assert!(early.to_string().contains("not been reached yet"), "{early}");
    h.workflows.decide_gate(NS, &run.id, gate("signoff", Decision::Reject, "ana", "no")).await.expect("first");
    let run = h
        .until(&run.id, "round two", |r| {
            r.body.steps.iter().filter(|s| s.step_id == "signoff").count() == 2 && r.state == RunState::Waiting
        })
        .await;
    assert_eq!(on_reject(&run), "escalate", "its rejections are spent");
    let (run, outcome) = h
        .workflows
        .decide_gate(NS, &run.id, gate("signoff", Decision::Reject, "ana", "still no"))
        .await
        .expect("second");
    assert_eq!(outcome, Outcome::Escalated);
    let escalated = run.body.steps.last().expect("escalated gate");
    assert_eq!(escalated.input["reviewers"], json!("cto"));
    assert_eq!(escalated.state, StepState::Waiting);
    assert_eq!(on_reject(&run), "fail", "an escalated round's rejection is final");
    let (run, outcome) =
        h.workflows.decide_gate(NS, &run.id, gate("signoff", Decision::Reject, "cto", "stop")).await.expect("third");
    assert_eq!(outcome, Outcome::Failed);
    assert_eq!(run.state, RunState::Failed);
    assert_eq!(run.body.gate_decisions.len(), 3, "who decided and why is kept");
    for step in ["signoff", "build"] {
        let late = h.workflows.decide_gate(NS, &run.id, gate(step, Decision::Approve, "ana", "")).await;
        let late = late.expect_err("the run is over");
        let said = format!("run {} is already failed", run.id);
        assert!(matches!(&late, WorkflowError::RunFinished { .. }) && late.to_string() == said, "{step}: {late}");
    }
}

async fn an_unanswered_gate_expires(h: Harness) {
    h.put("name: expiring\nsteps:\n- id: ok\n  gate: {mode: HITL, reviewers: ops, expires_after: 200ms}\n").await;
    let run = h.run("expiring", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed);
    assert_eq!(run.body.gate_decisions[0].outcome, Outcome::Expired);
}

async fn decisions_on_gates_not_waiting_change_nothing(h: Harness) {
    // The step before the gate waits for a signal, so the gate cannot begin
    // waiting before the early decision, however slowly this test runs.
    h.put(
        "name: held\nsteps:\n- id: hold\n  wait: {signal: go}\n- id: signoff\n  gate: {mode: HITL, reviewers: ops}\n",
    )
    .await;
    let run = h.run("held", json!({})).await;
    h.waiting(&run.id).await;
    let error = h.workflows.decide_gate(NS, &run.id, gate("signoff", Decision::Approve, "ana", "")).await;
    assert!(matches!(error, Err(WorkflowError::GateNotReached { .. })), "{error:?}");
    signal(&h, &run.id, "go", "s1").await;
    let run =
        h.until(&run.id, "the gate announced", |r| r.body.steps.get(1).is_some_and(|s| s.external_id.is_some())).await;
    let mut stale = gate("signoff", Decision::Approve, "ana", "");
    stale.iteration = Some(7);
    let error = h.workflows.decide_gate(NS, &run.id, stale).await.expect_err("stale iteration");
    assert!(matches!(error, WorkflowError::GateIteration { asked: 7, .. }), "{error:?}");
    let error =
        h.workflows.decide_gate(NS, &run.id, gate("hold", Decision::Approve, "ana", "")).await.expect_err("not a gate");
    assert!(matches!(error, WorkflowError::InvalidArgument(_)), "{error:?}");
    let after = h.workflows.get_run(NS, &run.id).await.expect("run");
    assert_eq!(after.body.gate_decisions.len(), 0);
    assert_eq!(after.body.steps, run.body.steps);
}

/// A gate's `max_rejections` counts within a round of each phase that holds
/// it: when a later gate reruns that phase, the gate starts its count again.
async fn a_gate_rerun_by_an_enclosing_phase_gets_its_budget_again(h: Harness) {
    h.put(
        "name: nested\nsteps:\n- id: build\n  spawn: {agent: coder, input: build}\n\
         - id: review\n  gate: {mode: HITL, reviewers: qa, max_rejections: 1}\n\
         - id: release\n  gate: {mode: HITL, reviewers: ops, rerun_from: build}\n",
    )
    .await;
    let run = h.run("nested", json!({})).await;
    for (rounds, (step, decision)) in [
        ("review", Decision::Reject),
        ("review", Decision::Approve),
        ("release", Decision::Reject),
        ("review", Decision::Reject),
        ("review", Decision::Approve),
        ("release", Decision::Approve),
    ]
    .into_iter()
    .enumerate()
    {
        let waiting = h
            .until(&run.id, "the next gate round", |run| {
                run.state.is_finished()
                    || run.body.steps.iter().any(|s| s.state == StepState::Waiting && s.kind == StepKind::Gate)
                        && run.body.gate_decisions.len() == rounds
            })
            .await;
        assert_eq!(waiting.state, RunState::Waiting, "round {rounds}: {waiting:#?}");
        h.workflows.decide_gate(NS, &run.id, gate(step, decision, "ana", "again")).await.expect("decided");
    }
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let outcomes: Vec<Outcome> = run.body.gate_decisions.iter().map(|d| d.outcome).collect();
    use Outcome::{Continued, Rerun};
    assert_eq!(outcomes, [Rerun, Continued, Rerun, Rerun, Continued, Continued], "the second round's rejection reruns");
}
