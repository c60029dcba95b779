//! How runs, steps and events read on a terminal.

use chorus_proto::workflow::{self as pb, RunEvent, StepRecord, run_event::Kind};
use prost_types::{Struct, Timestamp};

/// Who decides or applies: `$USER` (or `$LOGNAME`, `$USERNAME`), else `cli`.
pub(super) fn user() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|user| !user.is_empty()))
        .unwrap_or_else(|| "cli".to_owned())
}

/// A timestamp as `2026-11-24T14:03:29Z`.
pub(super) fn time(at: Option<&Timestamp>) -> String {
    datetime(at).map_or_else(|| "-".to_owned(), |time| time.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// A time as RFC 3339 text to the microsecond, or null when there is none.
pub(super) fn timestamp_json(at: Option<&Timestamp>) -> serde_json::Value {
    datetime(at).map_or(serde_json::Value::Null, |at| {
        serde_json::Value::String(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
    })
}

/// A struct as a JSON object, or null when there is none.
pub(super) fn struct_json(value: Option<&Struct>) -> serde_json::Value {
    value.map_or(serde_json::Value::Null, |value| serde_json::Value::Object(chorus_proto::json::struct_to_json(value)))
}

/// JSON, indented, as `--json` prints it.
pub(super) fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A listing's items as one indented JSON array.
pub(super) fn print_json(items: impl Iterator<Item = serde_json::Value>) -> super::Outcome {
    outln!("{}", pretty(&serde_json::Value::Array(items.collect())));
    Ok(())
}

/// A protobuf timestamp as a time, when there is one and it is in range.
pub(super) fn datetime(at: Option<&Timestamp>) -> Option<chrono::DateTime<chrono::Utc>> {
    let at = at?;
    chrono::DateTime::from_timestamp(at.seconds, u32::try_from(at.nanos).unwrap_or_default())
}

/// Rows as left-aligned columns.
pub(super) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or_default();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|row| row.get(c)).map(|cell| cell.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> =
            row.iter().enumerate().map(|(c, cell)| format!("{cell:<width$}", width = widths[c])).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// `completed`, `waiting`, ... from a wire enum's name.
fn lower(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}

pub(super) fn run_state(state: pb::RunState) -> String {
    lower(state.as_str_name(), "RUN_STATE_")
}

pub(super) fn step_state(state: pb::StepState) -> String {
    lower(state.as_str_name(), "STEP_STATE_")
}

fn kind(step: &StepRecord) -> String {
    lower(step.kind().as_str_name(), "STEP_KIND_")
}

/// A struct as compact JSON.
pub(super) fn json(value: Option<&Struct>) -> String {
    value.map_or_else(String::new, |value| {
        serde_json::Value::Object(chorus_proto::json::struct_to_json(value)).to_string()
    })
}

fn field(value: Option<&Struct>, key: &str) -> String {
    value.and_then(|value| value.fields.get(key)).map(chorus_proto::json::value_to_json).map(text).unwrap_or_default()
}

/// A JSON value as words: a string without its quotes.
fn text(value: serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text,
        other => other.to_string(),
    }
}

/// A gate's artifacts (what its reviewers decide on), one `name: value`
/// line each, indented by `indent`; a value of several lines keeps them,
/// indented alike. Empty when the gate shows none.
pub(super) fn artifacts(input: Option<&Struct>, indent: &str) -> String {
    let Some(Some(serde_json::Value::Object(artifacts))) =
        input.map(|input| input.fields.get("artifacts").map(chorus_proto::json::value_to_json))
    else {
        return String::new();
    };
    let mut out = String::new();
    for (name, value) in artifacts {
        let value = text(value).replace('\n', &format!("\n{indent}  "));
        out.push_str(&format!("{indent}{name}: {value}\n"));
    }
    out
}

/// A gate's reviewers, as its input lists them: `lead, security`.
pub(super) fn reviewers(input: Option<&Struct>) -> String {
    let listed = input.and_then(|input| input.fields.get("reviewers")).map(chorus_proto::json::value_to_json);
    match listed {
        Some(serde_json::Value::Array(names)) => names.into_iter().map(text).collect::<Vec<_>>().join(", "),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(other) => text(other),
    }
}

/// What a step is doing or did, in a few words.
pub(super) fn step_detail(step: &StepRecord) -> String {
    match step.state() {
        pb::StepState::Failed => step.error.clone(),
        pb::StepState::Skipped => step.skip_reason.clone(),
        pb::StepState::Waiting if !step.waiting_for_signal.is_empty() => {
            format!("signal `{}`", step.waiting_for_signal)
        }
        pb::StepState::Waiting if step.kind() == pb::StepKind::Gate => match reviewers(step.input.as_ref()) {
            reviewers if reviewers.is_empty() => "awaiting a decision".to_owned(),
            reviewers => format!("decision by {reviewers}"),
        },
        pb::StepState::Waiting => format!("until {}", time(step.wake_at.as_ref())),
        // A decided round: who decided what.
        pb::StepState::Completed if step.kind() == pb::StepKind::Gate => {
            let decided = match field(step.output.as_ref(), "decision").as_str() {
                "approve" => "approved",
                "reject" => "rejected",
                _ => "decided",
            };
            format!("{decided} by {}", field(step.output.as_ref(), "decided_by"))
        }
        pb::StepState::Completed if field(step.output.as_ref(), "timed_out") == "true" => {
            format!("timed out waiting for signal `{}`", field(step.output.as_ref(), "name"))
        }
        // A gate's record keeps the id of its gate.required event, which
        // tells a reader nothing.
        _ if !step.external_id.is_empty() => match step.kind() {
            pb::StepKind::Spawn | pb::StepKind::Delegate => format!("task {}", step.external_id),
            pb::StepKind::Gate => String::new(),
            _ => step.external_id.clone(),
        },
        _ => String::new(),
    }
}

/// A run as `chorus run get` prints it.
pub(super) fn run(run: &pb::Run) -> String {
    let mut out = format!(
        "run {}  {} v{}  {}\ncreated {}  updated {}\n",
        run.id,
        run.workflow,
        run.version,
        run_state(run.state()),
        time(run.created_at.as_ref()),
        time(run.updated_at.as_ref())
    );
    for (what, text) in [("input", json(run.input.as_ref())), ("output", json(run.output.as_ref()))] {
        if !text.is_empty() && text != "{}" {
            out.push_str(&format!("{what}: {text}\n"));
        }
    }
    for (what, text) in [("error", &run.error), ("canceled", &run.cancel_reason), ("pending", &run.pending_reason)] {
        if !text.is_empty() {
            out.push_str(&format!("{what}: {text}\n"));
        }
    }
    let mut rows = vec![["SEQ", "STEP", "KIND", "ITER", "TRY", "STATE", ""].map(str::to_owned).to_vec()];
    // A step is indented by how deeply parallels hold it.
    let parents: std::collections::HashMap<&str, &str> =
        run.steps.iter().map(|s| (s.step_id.as_str(), s.parent_step_id.as_str())).collect();
    for step in &run.steps {
        let depth = std::iter::successors(Some(step.parent_step_id.as_str()), |id| parents.get(id).copied())
            .take_while(|id| !id.is_empty())
            .take(run.steps.len())
            .count();
        let name = format!("{}{}", "  ".repeat(depth), step.step_id);
        rows.push(vec![
            step.seq.to_string(),
            name,
            kind(step),
            step.iteration.to_string(),
            step.attempt.to_string(),
            step_state(step.state()),
            step_detail(step),
        ]);
    }
    out.push_str(&table(&rows));
    for step in run.steps.iter().filter(|s| s.kind() == pb::StepKind::Gate && s.state() == pb::StepState::Waiting) {
        let shown = artifacts(step.input.as_ref(), "  ");
        if !shown.is_empty() {
            out.push_str(&format!("gate {}#{} decides on:\n{shown}", step.step_id, step.iteration));
        }
    }
    for decision in &run.gate_decisions {
        out.push_str(&format!("gate {}#{}: {}\n", decision.step_id, decision.iteration, decision_line(decision)));
    }
    for signal in &run.signals {
        let taken = if signal.consumed_by_step_id.is_empty() {
            "kept".to_owned()
        } else {
            format!("taken by {}", signal.consumed_by_step_id)
        };
        out.push_str(&format!("signal {} ({}) from {}: {taken}\n", signal.name, signal.id, signal.sent_by));
    }
    out
}

fn decision_line(decision: &pb::GateDecision) -> String {
    let verdict = lower(decision.decision().as_str_name(), "DECISION_");
    let outcome = lower(decision.outcome().as_str_name(), "OUTCOME_");
    let reason = if decision.reason.is_empty() { String::new() } else { format!(": {}", decision.reason) };
    format!("{verdict} by {} → {outcome}{reason}", decision.decided_by)
}

/// A step record as a watch names it: `build #1.2` (iteration 1, attempt 2),
/// after the parallel step that holds it (`fan/s17 #1.1`).
pub(super) fn step_name(step: &StepRecord) -> String {
    let parent = if step.parent_step_id.is_empty() { String::new() } else { format!("{}/", step.parent_step_id) };
    format!("{parent}{} #{}.{}", step.step_id, step.iteration, step.attempt)
}

/// What a watch prints for an event, after its time.
pub(super) fn event(event: &RunEvent) -> String {
    match event.kind() {
        Kind::RunStateChanged => format!("run {}", run_state(event.state())),
        Kind::StepUpdated => {
            let step = event.step.clone().unwrap_or_default();
            let detail = step_detail(&step);
            let detail = if detail.is_empty() { String::new() } else { format!("  {detail}") };
            format!("{} {}{detail}", step_name(&step), step_state(step.state()))
        }
        Kind::GateDecided => {
            let decision = event.gate_decision.clone().unwrap_or_default();
            format!("gate {}#{}: {}", decision.step_id, decision.iteration, decision_line(&decision))
        }
        Kind::SignalReceived => {
            let signal = event.signal.clone().unwrap_or_default();
            format!("signal {} from {}", signal.name, signal.sent_by)
        }
        Kind::Unspecified => "(unknown change)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use chorus_proto::json::struct_from_json;
    use serde_json::json;

    use super::*;

    fn record(kind: pb::StepKind, state: pb::StepState, output: serde_json::Value, external_id: &str) -> StepRecord {
        let mut step = StepRecord {
            step_id: "s".into(),
            iteration: 1,
            attempt: 1,
            output: output.as_object().cloned().map(struct_from_json),
            external_id: external_id.into(),
            ..StepRecord::default()
        };
        step.set_kind(kind);
        step.set_state(state);
        step
    }

    #[test]
    fn a_step_says_what_it_did_in_words() {
        let rejected = json!({"decision": "reject", "decided_by": "ana", "reason": "add tests"});
        let gate = record(pb::StepKind::Gate, pb::StepState::Completed, rejected, "event:93");
        assert_eq!(step_detail(&gate), "rejected by ana");
        let canceled = record(pb::StepKind::Gate, pb::StepState::Canceled, json!(null), "event:93");
        assert_eq!(step_detail(&canceled), "", "the gate's event id tells a reader nothing");
        let mut open = record(pb::StepKind::Gate, pb::StepState::Waiting, json!(null), "event:93");
        assert_eq!(step_detail(&open), "awaiting a decision");
        open.input = json!({"reviewers": ["lead", "security"]}).as_object().cloned().map(struct_from_json);
        assert_eq!(step_detail(&open), "decision by lead, security");
        let timed_out = json!({"timed_out": true, "name": "resume"});
        let wait = record(pb::StepKind::Wait, pb::StepState::Completed, timed_out, "");
        assert_eq!(step_detail(&wait), "timed out waiting for signal `resume`");
        let spawn = record(pb::StepKind::Spawn, pb::StepState::Running, json!(null), "01a2");
        assert_eq!(step_detail(&spawn), "task 01a2");
        assert_eq!(step_name(&spawn), "s #1.1");
        let branch = StepRecord { parent_step_id: "fan".into(), ..spawn };
        assert_eq!(step_name(&branch), "fan/s #1.1", "a branch's step names the parallel step holding it");
    }

    #[test]
    fn a_step_is_indented_by_how_deeply_parallels_hold_it() {
        let step = |id: &str, parent: &str| {
            let mut step = record(pb::StepKind::Wait, pb::StepState::Completed, json!(null), "");
            (step.step_id, step.parent_step_id) = (id.into(), parent.into());
            step
        };
        let steps = vec![step("outer", ""), step("inner", "outer"), step("deep", "inner"), step("after", "")];
        let shown = run(&pb::Run { steps, ..pb::Run::default() });
        let column = shown.lines().find_map(|line| line.find("STEP")).expect("a STEP column");
        let indent = |id: &str| {
            let line = shown.lines().find(|line| line.contains(&format!(" {id} "))).expect("the step's row");
            line.find(id).map(|at| at - column)
        };
        let indents = ["outer", "inner", "deep", "after"].map(indent);
        assert_eq!(indents, [Some(0), Some(2), Some(4), Some(0)], "{shown}");
    }
}
