//! When a run needs an engine next, and which changes a watch sees.

use std::sync::Arc;

use crate::domain::{GateDecision, Run, RunChange, RunState, StepKind, StepRecord, StepState};

/// Whether an engine must hold the run now: a side effect to issue, a task or
/// remote agent to await, a gate to announce, or a task to cancel.
pub(crate) fn needs_driver(run: &Run) -> bool {
    run.body.steps.iter().any(|record| needs_effect(record))
}

/// Whether a record waits for a side effect of the engine's: one to issue,
/// a task or remote agent to await, a gate to announce, a task to cancel.
pub(crate) fn needs_effect(record: &StepRecord) -> bool {
    record.cancel_pending
        || match record.state {
            StepState::Running => matches!(record.kind, StepKind::Spawn | StepKind::Delegate | StepKind::Message),
            StepState::Waiting => record.kind == StepKind::Gate && record.external_id.is_none(),
            StepState::Pending
            | StepState::Completed
            | StepState::Failed
            | StepState::Skipped
            | StepState::Canceled => false,
        }
}

/// When an engine must look at the run next: now when it needs a driver,
/// else at its earliest timer or deadline; `None` when only an outside
/// change (a signal, a decision, a finished run freeing a slot) moves it.
pub(crate) fn due_at(run: &Run, now: i64) -> Option<i64> {
    if needs_driver(run) {
        return Some(now);
    }
    if run.state.is_finished() {
        return None;
    }
    next_timer(run)
}

/// The run's earliest timer: a wait, a retry's backoff, a gate's expiry, or
/// its time-to-live.
pub(crate) fn next_timer(run: &Run) -> Option<i64> {
    let timers = run.body.steps.iter().filter(|r| r.state == StepState::Waiting).filter_map(|r| r.wake_at);
    let deadline = run.body.expires_at.filter(|_| run.state != crate::domain::RunState::Pending);
    timers.chain(deadline).min()
}

/// What changed between two versions of a run, in the order a watch sees it:
/// cause before effect. A run that starts running does so before its steps;
/// signals come before the steps that take them; a gate's decision comes
/// right before its round ends (after the steps it judged); a run that
/// resumes (a timer, a signal, a decision) runs again right before the first
/// step that is not over, and any other change of the run's state comes last.
pub(crate) fn changes(before: &Run, after: &Run) -> Vec<RunChange> {
    let mut changes = Vec::new();
    let started = before.state == RunState::Pending && after.state == RunState::Running;
    if started {
        changes.push(RunChange::RunStateChanged);
    }
    let mut resumed = before.state != RunState::Running && after.state == RunState::Running && !started;
    for signal in &after.body.signals {
        if !before.body.signals.iter().any(|s| s.id == signal.id) {
            changes.push(RunChange::SignalReceived { signal: signal.clone() });
        }
    }
    let mut steps: Vec<Arc<StepRecord>> = Vec::new();
    for step in &after.body.steps {
        let index = usize::try_from(step.seq).unwrap_or(usize::MAX).wrapping_sub(1);
        if before.body.steps.get(index) != Some(step) {
            steps.push(Arc::clone(step));
        }
    }
    finish_after_nested(&mut steps, after);
    let mut decisions: Vec<&GateDecision> =
        after.body.gate_decisions.iter().skip(before.body.gate_decisions.len()).collect();
    for step in steps {
        if step.kind == StepKind::Gate && step.state.is_finished() {
            let of_round =
                |decision: &mut &GateDecision| decision.step_id == step.step_id && decision.iteration == step.iteration;
            for decision in decisions.extract_if(.., of_round) {
                changes.push(RunChange::GateDecided { decision: decision.clone() });
            }
        }
        if resumed && !step.state.is_finished() {
            changes.push(RunChange::RunStateChanged);
            resumed = false;
        }
        changes.push(RunChange::StepUpdated { step });
    }
    changes.extend(decisions.into_iter().map(|decision| RunChange::GateDecided { decision: decision.clone() }));
    let announced = started || (after.state == RunState::Running && !resumed);
    if before.state != after.state && !announced {
        changes.push(RunChange::RunStateChanged);
    }
    changes
}

/// Orders changed records (in sequence order) so that a step finishing in
/// this change comes after the changes nested in it: a parallel step
/// finishes with its last branch step, in one write, and has the lower
/// sequence number, yet a watch should see the branch end first. The
/// innermost finished step moves first, so nested parallels unwind in order.
fn finish_after_nested(steps: &mut Vec<Arc<StepRecord>>, run: &Run) {
    if !steps.iter().any(|step| step.kind == StepKind::Parallel && step.state.is_finished()) {
        return;
    }
    let parent_of = |step_id: &str| {
        run.body.steps.iter().find(|record| record.step_id == step_id).and_then(|record| record.parent_step_id.clone())
    };
    let nested_in = |record: &StepRecord, ancestor: &str| {
        let mut at = record.parent_step_id.clone();
        while let Some(step_id) = at {
            if step_id == ancestor {
                return true;
            }
            at = parent_of(&step_id);
        }
        false
    };
    let mut finished: Vec<Arc<StepRecord>> =
        steps.iter().filter(|step| step.kind == StepKind::Parallel && step.state.is_finished()).cloned().collect();
    finished.sort_by_key(|step| std::cmp::Reverse(step.seq));
    for parallel in finished {
        let Some(from) = steps.iter().position(|step| Arc::ptr_eq(step, &parallel)) else { continue };
        let last_nested = steps.iter().rposition(|step| nested_in(step, &parallel.step_id));
        if let Some(to) = last_nested.filter(|to| *to > from) {
            let moved = steps.remove(from);
            steps.insert(to, moved);
        }
    }
}
