//! What people and programs do to a run once it started: cancel it, signal
//! it, decide its gates.

use chorus_runtime::validate::FieldViolation;

use super::{GateCall, SignalCall, Workflows};
use crate::{
    domain::{Outcome, Run, Signal, StepKind, StepState, WorkflowSpec},
    engine::plan::Verdict,
    error::{Result, WorkflowError},
};

impl Workflows {
    /// Cancels an unfinished run and the tasks its steps spawned.
    pub async fn cancel_run(&self, namespace: &str, run_id: &str, reason: &str, canceled_by: &str) -> Result<Run> {
        let (_, spec) = self.existing(namespace, run_id).await?;
        let reason = match (reason.is_empty(), canceled_by.is_empty()) {
            (true, true) => "canceled".to_owned(),
            (true, false) => format!("canceled by {canceled_by}"),
            (false, true) => reason.to_owned(),
            (false, false) => format!("{reason} (canceled by {canceled_by})"),
        };
        let run = self
            .transition(namespace, run_id, &spec, None, |planner, run| {
                if run.state.is_finished() {
                    return Err(finished(run));
                }
                planner.cancel(run, reason.clone());
                Ok(())
            })
            .await?;
        tracing::info!(run_id, workflow = %run.workflow, canceled_by, reason, "run canceled");
        Ok(run)
    }

    /// Sends a signal; `true` when its id had been received already.
    pub async fn signal_run(&self, namespace: &str, run_id: &str, call: SignalCall) -> Result<bool> {
        let (run, spec) = self.existing(namespace, run_id).await?;
        // Kept for a wait that can never come, it would go unread.
        if !crate::domain::waits_for_signal(&spec.steps, &call.name) {
            return Err(WorkflowError::InvalidArgument(FieldViolation::new(
                "name",
                format!("no step of workflow {} (version {}) waits for signal `{}`", spec.name, run.version, call.name),
            )));
        }
        let mut duplicate = false;
        self.transition(namespace, run_id, &spec, None, |planner, run| {
            if let Some(sent) = run.body.signals.iter().find(|s| s.id == call.signal_id) {
                let mismatch = match (sent.name == call.name, sent.payload == call.payload) {
                    (true, true) => None,
                    (false, _) => Some("another name"),
                    (true, false) => Some("another payload"),
                };
                if let Some(mismatch) = mismatch {
                    let (signal_id, run_id) = (call.signal_id.clone(), run.id.clone());
                    return Err(WorkflowError::SignalIdInUse { signal_id, run_id, mismatch });
                }
                duplicate = true;
                return Ok(());
            }
            if run.state.is_finished() {
                return Err(finished(run));
            }
            run.body.signals.push(Signal {
                id: call.signal_id.clone(),
                name: call.name.clone(),
                payload: call.payload.clone(),
                sent_by: call.sent_by.clone(),
                received_at: planner.now,
                consumed_by_step_id: None,
            });
            Ok(())
        })
        .await?;
        if !duplicate {
            tracing::info!(run_id, signal = %call.name, signal_id = %call.signal_id, sent_by = %call.sent_by, "run signaled");
        }
        Ok(duplicate)
    }

    /// Approves or rejects a waiting gate; the outcome is in the run's decisions.
    pub async fn decide_gate(&self, namespace: &str, run_id: &str, call: GateCall) -> Result<(Run, Outcome)> {
        let (_, spec) = self.existing(namespace, run_id).await?;
        let mut outcome = Outcome::Continued;
        let run = self
            .transition(namespace, run_id, &spec, None, |planner, run| {
                let index = waiting_gate(run, &spec, &call)?;
                let verdict = Verdict {
                    decision: call.decision,
                    decided_by: call.decided_by.clone(),
                    reason: call.reason.clone(),
                    data: call.data.clone(),
                    automatic: false,
                };
                outcome = planner.decide(run, index, &verdict);
                Ok(())
            })
            .await?;
        tracing::info!(run_id, step_id = %call.step_id, decided_by = %call.decided_by, ?outcome, "gate decided");
        Ok((run, outcome))
    }
}

fn finished(run: &Run) -> WorkflowError {
    WorkflowError::RunFinished { run_id: run.id.clone(), state: run.state.as_str() }
}

/// The index of the waiting record of the gate `call` names.
fn waiting_gate(run: &Run, spec: &WorkflowSpec, call: &GateCall) -> Result<usize> {
    let Some(index) = run.body.steps.iter().rposition(|r| r.step_id == call.step_id) else {
        if crate::engine::plan::find(&spec.steps, &call.step_id, None).is_none() {
            return Err(WorkflowError::InvalidArgument(FieldViolation::new(
                "step_id",
                format!("workflow {} (version {}) has no step `{}`", spec.name, run.version, call.step_id),
            )));
        }
        if run.state.is_finished() {
            return Err(finished(run));
        }
        return Err(WorkflowError::GateNotReached { run_id: run.id.clone(), step_id: call.step_id.clone() });
    };
    let record = &run.body.steps[index];
    if record.kind != StepKind::Gate {
        return Err(WorkflowError::InvalidArgument(FieldViolation::new(
            "step_id",
            format!("`{}` is not a gate", call.step_id),
        )));
    }
    if record.state != StepState::Waiting && run.state.is_finished() {
        return Err(finished(run));
    }
    if record.state != StepState::Waiting {
        let state = serde_json::to_value(record.state).unwrap_or_default();
        let state = state.as_str().unwrap_or_default().to_owned();
        return Err(WorkflowError::GateNotWaiting { step_id: call.step_id.clone(), state });
    }
    if let Some(asked) = call.iteration.filter(|i| *i != record.iteration) {
        let step_id = call.step_id.clone();
        return Err(WorkflowError::GateIteration { step_id, waiting: record.iteration, asked });
    }
    Ok(index)
}
