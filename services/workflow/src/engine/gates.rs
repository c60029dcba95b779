//! Gates: AUTO and HITL decisions, reruns of the phase before a rejected
//! gate, escalation, and the records of gates that wait.

use std::sync::Arc;

use serde_json::{Map, json};

use super::plan::{Located, Planner, Verdict, contains, find, finish};
use crate::domain::{
    Action, Decision, Gate, GateDecision, OnExhausted, Outcome, Run, Step, StepKind, StepRecord, StepState,
};

impl Planner<'_> {
    /// Parks a HITL gate's round for `reviewers`; its input says what a
    /// rejection of this round does (`on_reject`: rerun, escalate or fail),
    /// after the `rejected` rounds before it.
    pub(super) fn park_gate(
        &self,
        record: &mut StepRecord,
        gate: &Gate,
        reviewers: Option<String>,
        escalated: bool,
        rejected: usize,
    ) {
        record.state = StepState::Waiting;
        record.input["reviewers"] = json!(reviewers);
        record.input["escalated"] = json!(escalated);
        let exhausted = u32::try_from(rejected + 1).unwrap_or(u32::MAX) > gate.max_rejections;
        let on_reject = match (escalated, exhausted, gate.on_exhausted) {
            (true, _, _) | (false, true, OnExhausted::Fail) => "fail",
            (false, true, OnExhausted::Escalate) => "escalate",
            (false, false, _) => "rerun",
        };
        record.input["on_reject"] = json!(on_reject);
        record.wake_at = gate.expires_after.map(|after| self.now + chorus_runtime::time::micros(after));
        if let Some(at) = record.wake_at {
            record.input["expires_at"] = json!(at);
        }
    }

    /// An AUTO gate was evaluated: its output says whether it approved.
    pub(super) fn decide_auto(&self, run: &mut Run, seq: u32, step: &Step) {
        let index = usize::try_from(seq - 1).unwrap_or_default();
        let approved = run.body.steps[index].output.as_ref().and_then(|o| o["approved"].as_bool()).unwrap_or(false);
        let Action::Gate(gate) = &step.action else { return };
        run.body.step_mut(index).state = StepState::Waiting;
        let reason = match approved {
            true => "approve_when held".to_owned(),
            false => format!("approve_when `{}` was false", gate.approve_when.as_deref().unwrap_or_default()),
        };
        let decision = if approved { Decision::Approve } else { Decision::Reject };
        let verdict = Verdict { decision, decided_by: "auto".into(), reason, data: Map::new(), automatic: true };
        self.decide(run, index, &verdict);
    }

    /// Applies a decision to the waiting gate record at `index`.
    pub(crate) fn decide(&self, run: &mut Run, index: usize, verdict: &Verdict) -> Outcome {
        let record = &run.body.steps[index];
        let step_id = record.step_id.clone();
        let iteration = record.iteration;
        let escalated = record.input["escalated"].as_bool().unwrap_or(false);
        let located = find(&self.spec.steps, &step_id, None);
        let (gate, sequence, parent) = match located {
            Some(Located { step: Step { action: Action::Gate(gate), .. }, sequence, parent }) => {
                (gate, sequence, parent)
            }
            _ => return Outcome::Failed,
        };
        let rejections = rejections(run, &self.spec.steps, &step_id) + 1;
        let summary = json!({
            "decision": verdict.decision,
            "decided_by": verdict.decided_by,
            "reason": verdict.reason,
            "data": verdict.data,
        });
        let outcome = match verdict.decision {
            Decision::Approve => Outcome::Continued,
            Decision::Reject if escalated => Outcome::Failed,
            Decision::Reject if u32::try_from(rejections).unwrap_or(u32::MAX) > gate.max_rejections => {
                match gate.on_exhausted {
                    OnExhausted::Escalate => Outcome::Escalated,
                    OnExhausted::Fail => Outcome::Failed,
                }
            }
            // An AUTO gate with no phase before it to run again would judge
            // the same again: its rejection is final.
            Decision::Reject if verdict.automatic && rerun_target(gate, &step_id, sequence).is_none() => {
                Outcome::Failed
            }
            Decision::Reject => Outcome::Rerun,
        };
        let record = run.body.step_mut(index);
        record.output = Some(summary);
        if outcome == Outcome::Failed {
            record.error = Some(format!(
                "rejected by {}{}: {}",
                verdict.decided_by,
                if escalated { " after escalation" } else { "" },
                verdict.reason
            ));
            finish(record, StepState::Failed, self.now);
        } else {
            finish(record, StepState::Completed, self.now);
        }
        run.body.gate_decisions.push(GateDecision {
            step_id: step_id.clone(),
            iteration,
            decision: verdict.decision,
            outcome,
            decided_by: verdict.decided_by.clone(),
            reason: verdict.reason.clone(),
            data: verdict.data.clone(),
            automatic: verdict.automatic,
            decided_at: self.now,
        });
        match outcome {
            Outcome::Rerun => self.rerun(run, gate, &step_id, sequence, parent),
            Outcome::Escalated => self.reopen_gate(run, &step_id, parent, gate, gate.escalate_to.clone(), true),
            Outcome::Continued | Outcome::Failed | Outcome::Expired => {}
        }
        outcome
    }

    /// Starts the phase before a rejected gate again (a new iteration).
    fn rerun(&self, run: &mut Run, gate: &Gate, gate_id: &str, sequence: &[Step], parent: Option<&str>) {
        match rerun_target(gate, gate_id, sequence) {
            Some(step) => self.start(run, step, parent),
            None => {
                let reviewers = gate.reviewers.clone();
                self.reopen_gate(run, gate_id, parent, gate, reviewers, false);
            }
        }
    }

    /// A new waiting record of a gate, for `reviewers`.
    fn reopen_gate(
        &self,
        run: &mut Run,
        gate_id: &str,
        parent: Option<&str>,
        gate: &Gate,
        reviewers: Option<String>,
        escalated: bool,
    ) {
        let Some(previous) = run.body.steps.iter().rev().find(|r| r.step_id == gate_id) else { return };
        let mut record = StepRecord::clone(previous);
        record.seq = u32::try_from(run.body.steps.len() + 1).unwrap_or(u32::MAX);
        record.iteration += 1;
        record.output = None;
        record.error = None;
        record.external_id = None;
        record.parent_step_id = parent.map(str::to_owned);
        record.created_at = self.now;
        record.started_at = Some(self.now);
        record.finished_at = None;
        record.input["mode"] = json!("HITL");
        self.park_gate(&mut record, gate, reviewers, escalated, rejections(run, &self.spec.steps, gate_id));
        run.body.steps.push(Arc::new(record));
    }
}

/// How many times the gate `step_id` was rejected (an expiry is no
/// rejection) since another gate last reran a phase that holds it: each
/// round of an enclosing phase gives the gate its whole budget again.
pub(super) fn rejections(run: &Run, steps: &[Step], step_id: &str) -> usize {
    let mut count = 0;
    for decision in &run.body.gate_decisions {
        if decision.step_id == step_id {
            count += usize::from(decision.decision == Decision::Reject && decision.outcome != Outcome::Expired);
        } else if decision.outcome == Outcome::Rerun && reruns(steps, &decision.step_id, step_id) {
            count = 0;
        }
    }
    count
}

/// Whether a rejection of the gate `gate_id` runs the step `step_id` again.
fn reruns(steps: &[Step], gate_id: &str, step_id: &str) -> bool {
    let Some(Located { step: Step { action: Action::Gate(gate), .. }, sequence, .. }) = find(steps, gate_id, None)
    else {
        return false;
    };
    let Some(target) = rerun_target(gate, gate_id, sequence) else { return false };
    let mut phase = sequence.iter().skip_while(|step| step.id != target.id).take_while(|step| step.id != gate_id);
    phase.any(|step| contains(step, step_id))
}

/// The first step of the phase a rejection of the gate `gate_id` (in
/// `sequence`) runs again: `rerun_from`, else the step just before it.
fn rerun_target<'s>(gate: &Gate, gate_id: &str, sequence: &'s [Step]) -> Option<&'s Step> {
    let position = sequence.iter().position(|s| s.id == gate_id).unwrap_or_default();
    match &gate.rerun_from {
        Some(target) => sequence[..position].iter().find(|s| contains(s, target)),
        None => position.checked_sub(1).map(|p| &sequence[p]),
    }
}

/// Whether `record` is a gate round whose rejection started its phase again.
pub(super) fn reran(run: &Run, record: &StepRecord) -> bool {
    record.kind == StepKind::Gate
        && run.body.gate_decisions.iter().any(|decision| {
            decision.step_id == record.step_id
                && decision.iteration == record.iteration
                && decision.outcome == Outcome::Rerun
        })
}
