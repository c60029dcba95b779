//! AUTO gates: a gate that judges the work before it by an expression,
//! approving (the run goes on) or rejecting (the phase runs again, and
//! nothing after the gate starts until a round approves).

use chorus_workflow::domain::{Outcome, RunChange, RunState, StepState};
use futures_util::StreamExt as _;
use serde_json::json;

use crate::harness::{Harness, NS};

chorus_runtime::backend_suite!(crate::harness::Harness::start;
    an_auto_gate_that_holds_lets_the_run_go_on,
    an_auto_gate_that_rejects_reruns_its_phase_and_starts_nothing_after_it,
    an_auto_gate_with_nothing_before_it_fails_the_run_when_it_rejects,
);

/// `design` answers with confidence 0.95, or 0.5 when its input starts "unsure".
fn checked(input: &str) -> String {
    format!(
        "name: checked\nsteps:\n\
         - id: design\n  spawn: {{agent: coder, input: \"{input}\"}}\n\
         - id: sure\n  gate: {{mode: AUTO, approve_when: \"{{{{ design.output.confidence }}}} > 0.8\", max_rejections: 1}}\n\
         - id: build\n  spawn: {{agent: coder, input: build}}\n"
    )
}

async fn an_auto_gate_that_holds_lets_the_run_go_on(h: Harness) {
    h.put(&checked("design it")).await;
    let run = h.run("checked", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let steps: Vec<(&str, StepState)> = run.body.steps.iter().map(|s| (s.step_id.as_str(), s.state)).collect();
    assert_eq!(
        steps,
        [("design", StepState::Completed), ("sure", StepState::Completed), ("build", StepState::Completed)]
    );
    let decisions: Vec<(&str, Outcome)> =
        run.body.gate_decisions.iter().map(|d| (d.decided_by.as_str(), d.outcome)).collect();
    assert_eq!(decisions, [("auto", Outcome::Continued)]);
    // A watch sees cause before effect: the work judged ends, the gate
    // decides, its round ends, the next step starts.
    let events = h.workflows.watch_run(NS, &run.id, 0).await.expect("watch").collect::<Vec<_>>().await;
    let changes: Vec<String> = events
        .into_iter()
        .map(|event| match event.expect("an event").change {
            RunChange::StepUpdated { step } => format!("{} {:?}", step.step_id, step.state),
            RunChange::GateDecided { decision } => format!("decided {}", decision.step_id),
            RunChange::SignalReceived { .. } => "signal".to_owned(),
            RunChange::RunStateChanged => "run".to_owned(),
        })
        .collect();
    let at = |change: &str| changes.iter().position(|c| c == change).unwrap_or_else(|| panic!("{change}: {changes:?}"));
    assert!(at("design Completed") < at("decided sure"), "{changes:?}");
    assert!(at("decided sure") < at("sure Completed"), "{changes:?}");
    assert!(at("sure Completed") < at("build Running"), "{changes:?}");
}

async fn an_auto_gate_that_rejects_reruns_its_phase_and_starts_nothing_after_it(h: Harness) {
    h.put(&checked("unsure design")).await;
    let run = h.run("checked", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed, "{run:#?}");
    let steps: Vec<(&str, u32, StepState)> =
        run.body.steps.iter().map(|s| (s.step_id.as_str(), s.iteration, s.state)).collect();
    assert_eq!(
        steps,
        [
            ("design", 1, StepState::Completed),
            ("sure", 1, StepState::Completed),
            ("design", 2, StepState::Completed),
            ("sure", 2, StepState::Failed),
        ],
        "the phase ran again and nothing after the gate started"
    );
    let rerun = &run.body.steps[2];
    assert_eq!(rerun.input["feedback"]["decided_by"], json!("auto"), "the rerun was told why: {rerun:#?}");
    let outcomes: Vec<Outcome> = run.body.gate_decisions.iter().map(|d| d.outcome).collect();
    assert_eq!(outcomes, [Outcome::Rerun, Outcome::Failed]);
}

/// With no phase before it to run again, a rejection is final: the run
/// fails, rather than wait for a decision nobody was asked for.
async fn an_auto_gate_with_nothing_before_it_fails_the_run_when_it_rejects(h: Harness) {
    h.put("name: guarded\nsteps:\n- id: guard\n  gate: {mode: AUTO, approve_when: \"1 > 2\", max_rejections: 2}\n- id: build\n  spawn: {agent: coder, input: build}\n").await;
    let run = h.run("guarded", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed, "{run:#?}");
    let steps: Vec<(&str, StepState)> = run.body.steps.iter().map(|s| (s.step_id.as_str(), s.state)).collect();
    assert_eq!(steps, [("guard", StepState::Failed)]);
    let outcomes: Vec<Outcome> = run.body.gate_decisions.iter().map(|d| d.outcome).collect();
    assert_eq!(outcomes, [Outcome::Failed]);
}
