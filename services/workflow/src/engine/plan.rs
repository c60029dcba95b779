//! The engine's rules, free of I/O: from a run's records as committed to the
//! records that follow. Every change to a run — a step's result, a signal, a
//! gate decision, a timer, a cancel — is applied by a caller and then
//! [`Planner::advance`] moves the run as far as it can go without a side
//! effect; the repository commits the result in the same transaction.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{gates::reran, render::Scope};
use crate::domain::{
    Action, Decision, GateDecision, GateMode, JoinMode, MessageTarget, Outcome, Run, RunState, Slot, SpawnTarget, Step,
    StepKind, StepRecord, StepState, Wait, WorkflowSpec,
};

/// The rules for one run of one definition version, at one instant.
#[derive(Debug)]
pub(crate) struct Planner<'a> {
    pub(crate) spec: &'a WorkflowSpec,
    pub(crate) config: &'a Value,
    pub(crate) now: i64,
}

/// How a sequence of steps stands.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Flow {
    Done,
    Failed(String),
    Active,
}

/// A gate decision to apply.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub(crate) decision: Decision,
    pub(crate) decided_by: String,
    pub(crate) reason: String,
    pub(crate) data: Map<String, Value>,
    pub(crate) automatic: bool,
}

/// The step with `id` anywhere in `steps`, with the sequence that holds it
/// and the parallel step around that sequence.
pub(crate) fn find<'s>(steps: &'s [Step], id: &str, parent: Option<&'s str>) -> Option<Located<'s>> {
    for step in steps {
        if step.id == id {
            return Some(Located { step, sequence: steps, parent });
        }
        if let Action::Parallel(parallel) = &step.action {
            for branch in &parallel.branches {
                if let Some(found) = find(&branch.steps, id, Some(&step.id)) {
                    return Some(found);
                }
            }
        }
    }
    None
}

/// A step and where it sits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Located<'s> {
    pub(crate) step: &'s Step,
    pub(crate) sequence: &'s [Step],
    pub(crate) parent: Option<&'s str>,
}

/// Whether `id` is `step` or inside it.
pub(super) fn contains(step: &Step, id: &str) -> bool {
    step.id == id
        || match &step.action {
            Action::Parallel(parallel) => {
                parallel.branches.iter().any(|branch| branch.steps.iter().any(|inner| contains(inner, id)))
            }
            _ => false,
        }
}

/// The oldest signal a signal wait can take, one that arrived before the
/// wait did included; none for any other record.
fn waiting_signal<'s>(
    signals: &'s mut [crate::domain::Signal],
    record: &StepRecord,
) -> Option<&'s mut crate::domain::Signal> {
    let name = record.waiting_for_signal.as_deref()?;
    signals.iter_mut().find(|s| s.name == name && s.consumed_by_step_id.is_none())
}

pub(super) fn finish(record: &mut StepRecord, state: StepState, now: i64) {
    record.state = state;
    record.finished_at = Some(now);
    record.wake_at = None;
    record.waiting_for_signal = None;
}

/// Ends an active record as canceled, remembering a task to cancel.
pub(crate) fn cancel_record(record: &mut StepRecord, now: i64) {
    record.cancel_pending =
        record.external_id.is_some() && record.kind == StepKind::Spawn && record.state == StepState::Running;
    finish(record, StepState::Canceled, now);
}

impl Planner<'_> {
    /// Moves the run as far as it goes without a side effect. `slot`:
    /// whether a pending run may start, and if not, why.
    pub(crate) fn advance(&self, run: &mut Run, slot: Slot) {
        if run.state.is_finished() {
            return;
        }
        if run.state == RunState::Pending {
            let waiting = match slot {
                Slot::Free => None,
                Slot::Full => {
                    let limit = self.spec.concurrency.as_ref();
                    Some(limit.map(|limit| limit.holding(&run.workflow, run.concurrency_key.as_deref())))
                }
                Slot::Held => Some(Some(format!("held: `{}` is disabled", run.workflow))),
            };
            if let Some(reason) = waiting {
                run.body.pending_reason = reason;
                return;
            }
            run.body.pending_reason = None;
            run.state = RunState::Running;
        }
        if run.body.expires_at.is_some_and(|at| at <= self.now) {
            self.end(run, RunState::Failed, "the run exceeded its time to live (state.ttl)".into());
            return;
        }
        self.fire_due(run);
        self.consume_signals(run);
        match self.walk(run, &self.spec.steps, 0, None) {
            Flow::Done => self.complete(run),
            Flow::Failed(error) => self.end(run, RunState::Failed, error),
            Flow::Active => {
                // A parallel step is active while its branches are: what they do decides.
                let working = run.body.steps.iter().any(|r| {
                    r.kind != StepKind::Parallel && matches!(r.state, StepState::Running | StepState::Pending)
                });
                run.state = if working { RunState::Running } else { RunState::Waiting };
            }
        }
    }

    /// Cancels the run: its active steps end canceled.
    pub(crate) fn cancel(&self, run: &mut Run, reason: String) {
        run.body.cancel_reason = Some(reason);
        self.end(run, RunState::Canceled, String::new());
    }

    fn end(&self, run: &mut Run, state: RunState, error: String) {
        run.body.pending_reason = None;
        for record in run.body.steps.iter_mut().filter(|r| !r.state.is_finished()) {
            cancel_record(Arc::make_mut(record), self.now);
        }
        if state == RunState::Failed {
            run.body.error = Some(error);
        }
        run.state = state;
        run.finished_at = Some(self.now);
    }

    fn complete(&self, run: &mut Run) {
        let mut output = Map::new();
        for record in run.body.steps.iter().filter(|r| r.state == StepState::Completed) {
            output.insert(record.step_id.clone(), record.output.clone().unwrap_or(Value::Null));
        }
        run.body.output = Some(Value::Object(output));
        run.state = RunState::Completed;
        run.finished_at = Some(self.now);
    }

    /// Timers that are due: waits, signal timeouts, gate deadlines, retry backoffs.
    fn fire_due(&self, run: &mut Run) {
        let now = self.now;
        let mut expired = Vec::new();
        for record in run.body.steps.iter_mut() {
            if record.state != StepState::Waiting || record.wake_at.is_none_or(|at| at > now) {
                continue;
            }
            let record = Arc::make_mut(record);
            match record.kind {
                StepKind::Wait if record.waiting_for_signal.is_some() => {
                    let name = record.waiting_for_signal.clone();
                    record.output = Some(json!({ "timed_out": true, "name": name }));
                    finish(record, StepState::Completed, now);
                }
                StepKind::Wait => {
                    record.output = Some(json!({ "fired_at": now }));
                    finish(record, StepState::Completed, now);
                }
                StepKind::Gate => {
                    record.error = Some("the gate expired before anyone decided".into());
                    finish(record, StepState::Failed, now);
                    expired.push((record.step_id.clone(), record.iteration));
                }
                StepKind::Spawn | StepKind::Delegate | StepKind::Message => {
                    // A retry's backoff is over: the attempt starts.
                    record.state = StepState::Running;
                    record.wake_at = None;
                    record.started_at = Some(now);
                }
                StepKind::Condition | StepKind::Parallel => record.wake_at = None,
            }
        }
        for (step_id, iteration) in expired {
            run.body.gate_decisions.push(GateDecision {
                step_id,
                iteration,
                decision: Decision::Reject,
                outcome: Outcome::Expired,
                decided_by: "chorus".into(),
                reason: "expired".into(),
                data: Map::new(),
                automatic: true,
                decided_at: now,
            });
        }
    }

    /// Waits whose signal has arrived take it, oldest signal first.
    fn consume_signals(&self, run: &mut Run) {
        let body = &mut run.body;
        for record in body.steps.iter_mut().filter(|r| r.state == StepState::Waiting) {
            if let Some(signal) = waiting_signal(&mut body.signals, record) {
                self.take_signal(signal, Arc::make_mut(record));
            }
        }
    }

    /// A signal wait takes its signal.
    fn take_signal(&self, signal: &mut crate::domain::Signal, record: &mut StepRecord) {
        signal.consumed_by_step_id = Some(record.step_id.clone());
        record.output = Some(json!({
            "name": signal.name,
            "signal_id": signal.id,
            "payload": signal.payload,
            "sent_by": signal.sent_by,
        }));
        finish(record, StepState::Completed, self.now);
    }

    /// The latest record of `step_id` created after `after`.
    pub(super) fn latest_after(run: &Run, step_id: &str, after: u32) -> Option<usize> {
        run.body.steps.iter().rposition(|r| r.step_id == step_id && r.seq > after)
    }

    pub(super) fn walk(&self, run: &mut Run, steps: &[Step], from: u32, parent: Option<&str>) -> Flow {
        let mut after = from;
        for step in steps {
            loop {
                let Some(index) = Self::latest_after(run, &step.id, after) else {
                    self.start(run, step, parent);
                    continue;
                };
                let record = &run.body.steps[index];
                match record.state {
                    // An AUTO gate that just rejected started its phase
                    // again: the walk goes back to it, not past the gate.
                    StepState::Completed if reran(run, record) => return self.walk(run, steps, from, parent),
                    StepState::Completed | StepState::Skipped => {
                        after = record.seq;
                        break;
                    }
                    StepState::Failed | StepState::Canceled => {
                        let what = if record.state == StepState::Failed { "failed" } else { "was canceled" };
                        let error = record.error.clone().unwrap_or_default();
                        return Flow::Failed(format!("step `{}` {what}: {error}", step.id));
                    }
                    StepState::Pending | StepState::Running | StepState::Waiting => {
                        if let Action::Parallel(parallel) = &step.action
                            && self.settle_parallel(run, index, step, parallel)
                        {
                            continue;
                        }
                        return Flow::Active;
                    }
                }
            }
        }
        Flow::Done
    }

    /// Creates the next record of `step` and does what needs no side effect.
    pub(crate) fn start(&self, run: &mut Run, step: &Step, parent: Option<&str>) {
        let iteration =
            run.body.steps.iter().filter(|r| r.step_id == step.id).map(|r| r.iteration).max().unwrap_or(0) + 1;
        let scope = Scope::of(run, &self.spec.steps, self.config, &step.id, iteration, Some(&step.roots));
        let mut record = StepRecord {
            seq: u32::try_from(run.body.steps.len() + 1).unwrap_or(u32::MAX),
            step_id: step.id.clone(),
            kind: step.action.kind(),
            state: StepState::Running,
            parent_step_id: parent.map(str::to_owned),
            iteration,
            attempt: 1,
            input: Value::Null,
            output: None,
            error: None,
            skip_reason: None,
            external_id: None,
            waiting_for_signal: None,
            wake_at: None,
            cancel_pending: false,
            created_at: self.now,
            started_at: Some(self.now),
            finished_at: None,
        };
        if let Some(condition) = &step.condition {
            match scope.condition(condition) {
                Ok(true) if step.action == Action::Condition => {
                    record.output = Some(json!({ "passed": true }));
                    finish(&mut record, StepState::Completed, self.now);
                }
                Ok(true) => {}
                Ok(false) => {
                    record.skip_reason = Some(format!("condition `{condition}` was false"));
                    finish(&mut record, StepState::Skipped, self.now);
                }
                Err(error) => {
                    record.error = Some(error.to_string());
                    finish(&mut record, StepState::Failed, self.now);
                }
            }
        }
        if record.state == StepState::Running
            && let Err(error) = self.begin(run, step, &scope, &mut record)
        {
            record.error = Some(error);
            finish(&mut record, StepState::Failed, self.now);
        }
        let gate = (record.kind == StepKind::Gate && record.state == StepState::Completed).then_some(record.seq);
        run.body.steps.push(Arc::new(record));
        if let (Some(seq), Action::Gate(gate)) = (gate, &step.action)
            && gate.mode == GateMode::Auto
        {
            self.decide_auto(run, seq, step);
        }
    }

    /// Fills in a running record by kind: its rendered input and its state.
    fn begin(&self, run: &mut Run, step: &Step, scope: &Scope, record: &mut StepRecord) -> Result<(), String> {
        let render_error = |error: super::render::RenderError| error.to_string();
        // An agent named by a template must be named: an empty one is a value that is missing.
        let agent_of = |field: &str, template: &str| match scope.render(template).map_err(render_error)? {
            agent if agent.trim().is_empty() => {
                Err(format!("`{field}` `{template}` names no agent: it rendered empty (a value that is missing?)"))
            }
            agent => Ok(agent),
        };
        match &step.action {
            Action::Condition => {}
            Action::Spawn(spawn) => {
                let mut input = json!({ "input": scope.render_value(&spawn.input).map_err(render_error)? });
                match &spawn.target {
                    SpawnTarget::Agent(agent) => input["agent"] = json!(agent_of("agent", agent)?),
                    SpawnTarget::Role(role) => input["role"] = json!(role),
                }
                if let Some((feedback, previous)) = scope.rerun_fields() {
                    input["feedback"] = feedback;
                    input["previous_attempt"] = previous;
                }
                record.input = input;
            }
            Action::Delegate(delegate) => {
                let mut input = json!({
                    "agent": delegate.agent,
                    "input": scope.render_value(&delegate.input).map_err(render_error)?,
                });
                if let Some((feedback, previous)) = scope.rerun_fields() {
                    input["feedback"] = feedback;
                    input["previous_attempt"] = previous;
                }
                record.input = input;
            }
            Action::Message(message) => {
                let to = match &message.to {
                    MessageTarget::Topic(topic) => json!({ "topic": topic }),
                    MessageTarget::Agent(agent) => json!({ "agent": agent_of("to", agent)? }),
                    MessageTarget::Webhook(url) => json!({ "webhook": url }),
                    MessageTarget::Event(event_type) => json!({ "event": event_type }),
                };
                let text = message.text.as_ref().map(|text| scope.render(text)).transpose().map_err(render_error)?;
                let data = scope.render_value(&message.data).map_err(render_error)?;
                record.input = json!({ "to": to, "text": text, "data": data, "type": message.message_type });
            }
            Action::Wait(Wait::Timer(duration)) => {
                record.input = json!({ "duration_ms": duration.as_millis() });
                record.state = StepState::Waiting;
                record.wake_at = Some(self.now + chorus_runtime::time::micros(*duration));
            }
            Action::Wait(Wait::Signal { name, timeout }) => {
                record.input = json!({ "signal": name, "timeout_ms": timeout.map(|t| t.as_millis()) });
                record.state = StepState::Waiting;
                record.waiting_for_signal = Some(name.clone());
                record.wake_at = timeout.map(|t| self.now + chorus_runtime::time::micros(t));
                if let Some(signal) = waiting_signal(&mut run.body.signals, record) {
                    self.take_signal(signal, record);
                }
            }
            Action::Parallel(parallel) => {
                let branches: Vec<&str> = parallel.branches.iter().map(|b| b.name.as_str()).collect();
                let mode = if parallel.mode == JoinMode::FailFast { "fail_fast" } else { "all_settled" };
                record.input = json!({ "branches": branches, "mode": mode });
                if let Some(max) = parallel.max_concurrency {
                    record.input["max_concurrency"] = json!(max);
                }
            }
            Action::Gate(gate) => {
                let artifacts = scope.render_value(&gate.artifacts).map_err(render_error)?;
                let mode = if gate.mode == GateMode::Auto { "AUTO" } else { "HITL" };
                record.input = json!({ "mode": mode, "reviewers": gate.reviewers, "artifacts": artifacts });
                match gate.mode {
                    GateMode::Auto => {
                        let approve = gate.approve_when.as_deref().unwrap_or("false");
                        let approved = scope.condition(approve).map_err(|e| e.to_string())?;
                        record.output = Some(json!({ "approved": approved }));
                        finish(record, StepState::Completed, self.now);
                    }
                    GateMode::Hitl => {
                        let rejected = super::gates::rejections(run, &self.spec.steps, &step.id);
                        self.park_gate(record, gate, gate.reviewers.clone(), false, rejected);
                    }
                }
            }
        }
        Ok(())
    }

    /// Records the end of an attempt of a spawn, delegate or message: its
    /// output, or its error and, while attempts remain and a retry may
    /// succeed, the next attempt after a backoff.
    pub(crate) fn attempt_ended(&self, run: &mut Run, index: usize, result: Result<Value, String>, retryable: bool) {
        let record = run.body.step_mut(index);
        match result {
            Ok(output) => {
                record.output = Some(output);
                finish(record, StepState::Completed, self.now);
            }
            Err(error) => {
                record.error = Some(error);
                finish(record, StepState::Failed, self.now);
                let retry = match find(&self.spec.steps, &record.step_id, None).map(|l| &l.step.action) {
                    Some(Action::Spawn(spawn)) => spawn.retry,
                    Some(Action::Delegate(delegate)) => delegate.retry,
                    Some(Action::Message(message)) => message.retry,
                    _ => None,
                };
                let Some(retry) = retry.filter(|retry| retryable && record.attempt < retry.max_attempts) else {
                    return;
                };
                let exponent = record.attempt.saturating_sub(1).min(30);
                let backoff = retry.backoff.saturating_mul(1 << exponent).min(retry.max_backoff);
                let mut next = StepRecord::clone(record);
                next.seq = u32::try_from(run.body.steps.len() + 1).unwrap_or(u32::MAX);
                next.attempt += 1;
                next.state = StepState::Waiting;
                next.output = None;
                next.error = None;
                next.external_id = None;
                next.created_at = self.now;
                next.started_at = None;
                next.finished_at = None;
                next.wake_at = Some(self.now + chorus_runtime::time::micros(backoff));
                run.body.steps.push(Arc::new(next));
            }
        }
    }
}
