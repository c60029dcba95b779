//! When a run needs an engine next, and which changes a watch sees.

use std::sync::Arc;

use crate::domain::{Run, RunChange, StepKind, StepRecord, StepState};

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

/// What changed between two versions of a run, in the order a watch sees it.
pub(crate) fn changes(before: &Run, after: &Run) -> Vec<RunChange> {
    let mut changes = Vec::new();
    for signal in &after.body.signals {
        if !before.body.signals.iter().any(|s| s.id == signal.id) {
            changes.push(RunChange::SignalReceived { signal: signal.clone() });
        }
    }
    for decision in after.body.gate_decisions.iter().skip(before.body.gate_decisions.len()) {
        changes.push(RunChange::GateDecided { decision: decision.clone() });
    }
    for step in &after.body.steps {
        let index = usize::try_from(step.seq).unwrap_or(usize::MAX).wrapping_sub(1);
        if before.body.steps.get(index) != Some(step) {
            changes.push(RunChange::StepUpdated { step: Arc::clone(step) });
        }
    }
    if before.state != after.state {
        changes.push(RunChange::RunStateChanged);
    }
    changes
}
