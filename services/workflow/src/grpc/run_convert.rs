//! Runs: domain ↔ wire conversions.

use std::sync::Arc;

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use chorus_proto::{
    json::{is_finite, struct_from_json, struct_to_json},
    workflow as pb,
};
use chorus_runtime::{time::timestamp, validate::FieldViolation};
use serde_json::{Map, Value};

use crate::domain::{
    Decision, GateDecision, OriginKind, Outcome, Run, RunChange, RunCursor, RunEvent, RunOrigin, RunState, Signal,
    StepKind, StepRecord, StepState,
};

pub(super) fn state_out(state: RunState) -> pb::RunState {
    match state {
        RunState::Pending => pb::RunState::Pending,
        RunState::Running => pb::RunState::Running,
        RunState::Waiting => pb::RunState::Waiting,
        RunState::Completed => pb::RunState::Completed,
        RunState::Failed => pb::RunState::Failed,
        RunState::Canceled => pb::RunState::Canceled,
    }
}

pub(super) fn state_in(field: &str, value: i32) -> Result<RunState, FieldViolation> {
    match pb::RunState::try_from(value) {
        Ok(pb::RunState::Pending) => Ok(RunState::Pending),
        Ok(pb::RunState::Running) => Ok(RunState::Running),
        Ok(pb::RunState::Waiting) => Ok(RunState::Waiting),
        Ok(pb::RunState::Completed) => Ok(RunState::Completed),
        Ok(pb::RunState::Failed) => Ok(RunState::Failed),
        Ok(pb::RunState::Canceled) => Ok(RunState::Canceled),
        Ok(pb::RunState::Unspecified) | Err(_) => Err(FieldViolation::new(field, "is not a run state")),
    }
}

fn kind_out(kind: StepKind) -> pb::StepKind {
    match kind {
        StepKind::Spawn => pb::StepKind::Spawn,
        StepKind::Delegate => pb::StepKind::Delegate,
        StepKind::Message => pb::StepKind::Message,
        StepKind::Condition => pb::StepKind::Condition,
        StepKind::Wait => pb::StepKind::Wait,
        StepKind::Parallel => pb::StepKind::Parallel,
        StepKind::Gate => pb::StepKind::Gate,
    }
}

fn step_state_out(state: StepState) -> pb::StepState {
    match state {
        StepState::Pending => pb::StepState::Pending,
        StepState::Running => pb::StepState::Running,
        StepState::Waiting => pb::StepState::Waiting,
        StepState::Completed => pb::StepState::Completed,
        StepState::Failed => pb::StepState::Failed,
        StepState::Skipped => pb::StepState::Skipped,
        StepState::Canceled => pb::StepState::Canceled,
    }
}

/// A JSON value as a struct: objects as they are, anything else under `value`.
fn struct_of(value: Value) -> prost_types::Struct {
    match value {
        Value::Object(map) => struct_from_json(map),
        other => {
            let mut map = Map::new();
            map.insert("value".into(), other);
            struct_from_json(map)
        }
    }
}

pub(super) fn step_out(record: StepRecord) -> pb::StepRecord {
    pb::StepRecord {
        seq: record.seq,
        step_id: record.step_id,
        kind: kind_out(record.kind).into(),
        state: step_state_out(record.state).into(),
        parent_step_id: record.parent_step_id.unwrap_or_default(),
        iteration: record.iteration,
        attempt: record.attempt,
        input: Some(struct_of(record.input)),
        output: record.output.map(struct_of),
        error: record.error.unwrap_or_default(),
        skip_reason: record.skip_reason.unwrap_or_default(),
        external_id: record.external_id.unwrap_or_default(),
        waiting_for_signal: record.waiting_for_signal.unwrap_or_default(),
        wake_at: record.wake_at.map(timestamp),
        created_at: Some(timestamp(record.created_at)),
        started_at: record.started_at.map(timestamp),
        finished_at: record.finished_at.map(timestamp),
    }
}

pub(super) fn decision_out(decision: GateDecision) -> pb::GateDecision {
    use pb::gate_decision::Outcome as Wire;
    let outcome = match decision.outcome {
        Outcome::Continued => Wire::Continued,
        Outcome::Rerun => Wire::Rerun,
        Outcome::Escalated => Wire::Escalated,
        Outcome::Failed => Wire::Failed,
        Outcome::Expired => Wire::Expired,
    };
    pb::GateDecision {
        step_id: decision.step_id,
        iteration: decision.iteration,
        decision: decision_kind_out(decision.decision).into(),
        outcome: outcome.into(),
        decided_by: decision.decided_by,
        reason: decision.reason,
        data: Some(struct_from_json(decision.data)),
        automatic: decision.automatic,
        decided_at: Some(timestamp(decision.decided_at)),
    }
}

fn decision_kind_out(decision: Decision) -> pb::Decision {
    match decision {
        Decision::Approve => pb::Decision::Approve,
        Decision::Reject => pb::Decision::Reject,
    }
}

pub(super) fn decision_in(value: i32) -> Result<Decision, FieldViolation> {
    match pb::Decision::try_from(value) {
        Ok(pb::Decision::Approve) => Ok(Decision::Approve),
        Ok(pb::Decision::Reject) => Ok(Decision::Reject),
        Ok(pb::Decision::Unspecified) | Err(_) => Err(FieldViolation::new("decision", "must be APPROVE or REJECT")),
    }
}

pub(super) fn signal_out(signal: Signal) -> pb::Signal {
    pb::Signal {
        id: signal.id,
        name: signal.name,
        payload: Some(struct_from_json(signal.payload)),
        sent_by: signal.sent_by,
        received_at: Some(timestamp(signal.received_at)),
        consumed_by_step_id: signal.consumed_by_step_id.unwrap_or_default(),
    }
}

fn origin_out(origin: RunOrigin) -> pb::RunOrigin {
    use pb::run_origin::Kind;
    let kind = match origin.kind {
        OriginKind::Api => Kind::Api,
        OriginKind::Cron => Kind::Cron,
        OriginKind::Event => Kind::Event,
        OriginKind::A2a => Kind::A2a,
    };
    pb::RunOrigin {
        kind: kind.into(),
        started_by: origin.started_by,
        event_sequence: origin.event_sequence.unwrap_or_default(),
        event_type: origin.event_type.unwrap_or_default(),
        task_id: origin.task_id.unwrap_or_default(),
    }
}

pub(super) fn origin_in(origin: Option<pb::RunOrigin>) -> RunOrigin {
    use pb::run_origin::Kind;
    let Some(origin) = origin else { return RunOrigin::default() };
    let kind = match origin.kind() {
        Kind::Unspecified | Kind::Api => OriginKind::Api,
        Kind::Cron => OriginKind::Cron,
        Kind::Event => OriginKind::Event,
        Kind::A2a => OriginKind::A2a,
    };
    RunOrigin {
        kind,
        started_by: origin.started_by,
        event_sequence: (origin.event_sequence != 0).then_some(origin.event_sequence),
        event_type: Some(origin.event_type).filter(|t| !t.is_empty()),
        task_id: Some(origin.task_id).filter(|t| !t.is_empty()),
    }
}

pub(super) fn run_out(run: Run) -> pb::Run {
    let body = run.body;
    pb::Run {
        namespace: run.namespace,
        id: run.id,
        workflow: run.workflow,
        version: run.version,
        state: state_out(run.state).into(),
        input: Some(struct_from_json(body.input)),
        output: body.output.map(struct_of),
        error: body.error.unwrap_or_default(),
        cancel_reason: body.cancel_reason.unwrap_or_default(),
        pending_reason: body.pending_reason.unwrap_or_default(),
        origin: Some(origin_out(body.origin)),
        idempotency_key: run.idempotency_key.unwrap_or_default(),
        steps: body.steps.into_iter().map(Arc::unwrap_or_clone).map(step_out).collect(),
        gate_decisions: body.gate_decisions.into_iter().map(decision_out).collect(),
        signals: body.signals.into_iter().map(signal_out).collect(),
        created_at: Some(timestamp(run.created_at)),
        updated_at: Some(timestamp(run.updated_at)),
        finished_at: run.finished_at.map(timestamp),
    }
}

pub(super) fn event_out(event: RunEvent) -> pb::RunEvent {
    use pb::run_event::Kind;
    let mut out = pb::RunEvent {
        cursor: event.cursor.to_string(),
        run_id: event.run_id,
        state: state_out(event.state).into(),
        time: Some(timestamp(event.time)),
        ..pb::RunEvent::default()
    };
    match event.change {
        RunChange::RunStateChanged => out.kind = Kind::RunStateChanged.into(),
        RunChange::StepUpdated { step } => {
            out.kind = Kind::StepUpdated.into();
            out.step = Some(step_out(Arc::unwrap_or_clone(step)));
        }
        RunChange::GateDecided { decision } => {
            out.kind = Kind::GateDecided.into();
            out.gate_decision = Some(decision_out(decision));
        }
        RunChange::SignalReceived { signal } => {
            out.kind = Kind::SignalReceived.into();
            out.signal = Some(signal_out(signal));
        }
    }
    out
}

/// A request's struct as a JSON object; NaN and infinities are refused.
pub(super) fn object_in(field: &str, value: Option<prost_types::Struct>) -> Result<Map<String, Value>, FieldViolation> {
    let Some(value) = value else { return Ok(Map::new()) };
    if !value.fields.values().all(is_finite) {
        return Err(FieldViolation::new(field, "numbers must be finite (JSON has no NaN or Infinity)"));
    }
    Ok(struct_to_json(&value))
}

pub(super) fn cursor_in(value: &str) -> Result<i64, FieldViolation> {
    if value.is_empty() {
        return Ok(0);
    }
    value
        .parse()
        .ok()
        .filter(|cursor: &i64| *cursor >= 0)
        .ok_or_else(|| FieldViolation::new("after_cursor", "is not a cursor of this run"))
}

pub(super) fn run_token_out(cursor: RunCursor) -> String {
    URL_SAFE_NO_PAD.encode(format!("r:{}:{}", cursor.created_at, cursor.id))
}

pub(super) fn run_token_in(value: &str) -> Result<Option<RunCursor>, FieldViolation> {
    if value.is_empty() {
        return Ok(None);
    }
    let bad = || FieldViolation::new("page_token", "is not a token this service returned");
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(value).map_err(|_| bad())?).map_err(|_| bad())?;
    let (created_at, id) = text.strip_prefix("r:").and_then(|rest| rest.split_once(':')).ok_or_else(bad)?;
    Ok(Some(RunCursor { created_at: created_at.parse().map_err(|_| bad())?, id: id.to_owned() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_origin_kind_has_its_own_wire_kind() {
        for kind in [OriginKind::Api, OriginKind::Cron, OriginKind::Event, OriginKind::A2a] {
            let wire = origin_out(RunOrigin { kind, ..RunOrigin::default() });
            assert_eq!(origin_in(Some(wire)).kind, kind);
        }
    }
}
