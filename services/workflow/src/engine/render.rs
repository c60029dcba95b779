//! Templates and conditions at run time: the same minijinja language the
//! definition was checked with, over `inputs`, `trigger`, `config`, `run`,
//! earlier steps, and on a rerun `feedback` and `previous`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Map, Value};

use super::plan::find;
use crate::{
    domain::{Action, Decision, Run, Step, StepKind, StepRecord, StepState},
    parse::{condition_holds, condition_source, environment},
};

/// What templates of one step see.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    context: minijinja::Value,
}

/// A name templates see.
#[derive(Serialize)]
#[serde(untagged)]
enum Entry<'a> {
    Json(&'a Value),
    Object(&'a Map<String, Value>),
    Run { id: &'a str, workflow: &'a str, version: u32 },
    Seen(Seen<'a>),
    Owned(Value),
}

/// A finished step as templates see it.
#[derive(Serialize)]
struct Seen<'a> {
    /// Missing for a step that has none (skipped, failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a Value>,
    state: StepState,
    error: Option<&'a str>,
    iteration: u32,
    attempt: u32,
    /// A parallel step's branches, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    branches: Option<BTreeMap<&'a str, BranchSeen<'a>>>,
}

/// A branch of a finished parallel step as templates see it: how it ended,
/// and the output of its last step that completed (a skipped one is passed
/// over), so that a step after the join can reach every branch's result.
#[derive(Serialize)]
struct BranchSeen<'a> {
    state: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a Value>,
}

/// A template or condition that could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RenderError(String);

impl Scope {
    /// The scope of a record of `step_id` in `iteration`, holding only the
    /// names in `roots` (`None`: every name) besides a rerun's `feedback` and
    /// `previous`. `steps` are the definition's, where parallel steps find
    /// their branches.
    pub(crate) fn of(
        run: &Run,
        steps: &[Step],
        config: &Value,
        step_id: &str,
        iteration: u32,
        roots: Option<&BTreeSet<String>>,
    ) -> Self {
        let body = &run.body;
        let used = |name: &str| roots.is_none_or(|roots| roots.contains(name));
        // Borrowed, and converted once: the run's data is not copied first,
        // and what the templates do not name is not converted at all (every
        // finished step's output, for each step started).
        let mut context: BTreeMap<&str, Entry<'_>> = BTreeMap::new();
        let names = [
            ("inputs", Entry::Object(&body.input)),
            ("trigger", Entry::Json(&body.trigger)),
            ("config", Entry::Json(config)),
            ("run", Entry::Run { id: &run.id, workflow: &run.workflow, version: run.version }),
        ];
        context.extend(names.into_iter().filter(|(name, _)| used(name)));
        for record in &body.steps {
            if !record.state.is_finished() || record.state == StepState::Canceled || !used(&record.step_id) {
                continue;
            }
            let seen = Seen {
                output: record.output.as_ref(),
                state: record.state,
                error: record.error.as_deref(),
                iteration: record.iteration,
                attempt: record.attempt,
                branches: branches(run, steps, record),
            };
            // Records are in seq order: the latest of a step wins.
            context.insert(&record.step_id, Entry::Seen(seen));
        }
        if iteration > 1 {
            if let Some(rejection) = body.gate_decisions.iter().rev().find(|d| d.decision == Decision::Reject) {
                context.insert("feedback", Entry::Owned(feedback(rejection)));
            }
            let previous = body
                .steps
                .iter()
                .rev()
                .find(|record| record.step_id == step_id && record.iteration < iteration)
                .and_then(|record| record.output.as_ref());
            context.insert("previous", Entry::Json(previous.unwrap_or(&Value::Null)));
        }
        Self { context: minijinja::Value::from(minijinja::value::Serde(&context)) }
    }

    /// A scope of plain data (`{"event": ...}` for trigger conditions).
    pub(crate) fn from_json(context: Value) -> Self {
        Self { context: minijinja::Value::from(minijinja::value::Serde(context)) }
    }

    /// `feedback` and `previous` as a rerun step's input carries them.
    pub(crate) fn rerun_fields(&self) -> Option<(Value, Value)> {
        let feedback = self.context.get_attr("feedback").ok().filter(|v| !v.is_undefined())?;
        let previous = self.context.get_attr("previous").ok().unwrap_or_default();
        Some((to_json(&feedback), to_json(&previous)))
    }

    /// Renders a template string.
    pub(crate) fn render(&self, template: &str) -> Result<String, RenderError> {
        environment()
            .render_str(template, &self.context)
            .map_err(|error| RenderError(format!("template `{template}`: {}", describe(&error))))
    }

    /// Renders every string in `value`; a string that is exactly one
    /// placeholder keeps the type of what it names (`"{{ review.output }}"`
    /// is that object, not its text).
    pub(crate) fn render_value(&self, value: &Value) -> Result<Value, RenderError> {
        Ok(match value {
            Value::String(text) => match whole_placeholder(text) {
                Some(expression) => self.evaluate(expression, text)?,
                None if text.contains("{{") || text.contains("{%") => Value::String(self.render(text)?),
                None => value.clone(),
            },
            Value::Array(items) => {
                Value::Array(items.iter().map(|item| self.render_value(item)).collect::<Result<_, _>>()?)
            }
            Value::Object(map) => Value::Object(
                map.iter().map(|(key, item)| Ok((key.clone(), self.render_value(item)?))).collect::<Result<_, _>>()?,
            ),
            Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
        })
    }

    fn evaluate(&self, expression: &str, text: &str) -> Result<Value, RenderError> {
        let compiled = environment()
            .compile_expression(expression)
            .map_err(|error| RenderError(format!("template `{text}`: {}", describe(&error))))?;
        let value = compiled
            .eval(&self.context)
            .map_err(|error| RenderError(format!("template `{text}`: {}", describe(&error))))?;
        Ok(if value.is_undefined() { Value::Null } else { to_json(&value) })
    }

    /// Evaluates a condition (`{{ a.output.x }} < 0.8`, or a bare expression).
    pub(crate) fn condition(&self, text: &str) -> Result<bool, RenderError> {
        condition_holds(&condition_source(text), &self.context)
            .map_err(|error| RenderError(format!("condition `{text}`: {}", describe(&error))))
    }
}

/// The branches of a finished parallel step's record; `None` for any other record.
fn branches<'a>(run: &'a Run, steps: &'a [Step], record: &'a StepRecord) -> Option<BTreeMap<&'a str, BranchSeen<'a>>> {
    if record.kind != StepKind::Parallel {
        return None;
    }
    let Action::Parallel(parallel) = &find(steps, &record.step_id, None)?.step.action else { return None };
    let states = record.output.as_ref()?;
    let completed = |step: &Step| {
        let latest = run.body.steps.iter().rev().find(|r| r.step_id == step.id && r.seq > record.seq)?;
        (latest.state == StepState::Completed).then_some(latest.output.as_ref()).flatten()
    };
    let seen = parallel.branches.iter().map(|branch| {
        let output = branch.steps.iter().rev().find_map(completed);
        (branch.name.as_str(), BranchSeen { state: &states[&branch.name], output })
    });
    Some(seen.collect())
}

/// A rejection as rerun steps see it.
fn feedback(rejection: &crate::domain::GateDecision) -> Value {
    serde_json::json!({
        "gate": rejection.step_id,
        "reason": rejection.reason,
        "decided_by": rejection.decided_by,
        "data": rejection.data,
    })
}

fn whole_placeholder(text: &str) -> Option<&str> {
    let inner = text.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    (!inner.contains("{{") && !inner.contains("}}")).then_some(inner.trim())
}

fn to_json(value: &minijinja::Value) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn describe(error: &minijinja::Error) -> String {
    error.detail().map_or_else(|| error.kind().to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Run, RunBody, RunState};

    fn run(input: Value) -> Run {
        Run {
            namespace: "default".into(),
            id: "r1".into(),
            workflow: "w".into(),
            version: 1,
            state: RunState::Running,
            idempotency_key: None,
            concurrency_key: None,
            body: RunBody { input: input.as_object().cloned().unwrap_or_default(), ..RunBody::default() },
            created_at: 0,
            updated_at: 0,
            finished_at: None,
        }
    }

    #[test]
    fn templates_conditions_and_whole_placeholders() {
        let scope =
            Scope::of(&run(serde_json::json!({"n": 3, "who": "ann"})), &[], &serde_json::json!({"x": 1}), "s", 1, None);
        assert_eq!(scope.render("hi {{ inputs.who }}").unwrap(), "hi ann");
        assert!(scope.condition("{{ inputs.n }} > 2").unwrap());
        assert!(!scope.condition("inputs.n < 2").unwrap());
        assert!(!scope.condition("{{ missing.output.x }}").unwrap(), "missing names test false");
        assert_eq!(scope.render("[{{ inputs.none.deeper }}]").unwrap(), "[]");
        let value = scope.render_value(&serde_json::json!({"all": "{{ inputs }}", "n": "{{ inputs.n }}"})).unwrap();
        assert_eq!(value, serde_json::json!({"all": {"n": 3, "who": "ann"}, "n": 3}));
        assert!(scope.condition("{{ inputs.n }} <").is_err());
    }

    #[test]
    fn a_comparison_with_a_missing_side_is_false_whatever_the_operator() {
        let scope = Scope::of(&run(serde_json::json!({"n": 3})), &[], &Value::Null, "s", 1, None);
        for op in ["==", "!=", "<", "<=", ">", ">="] {
            assert!(!scope.condition(&format!("{{{{ inputs.missing }}}} {op} 0.8")).unwrap(), "missing {op} 0.8");
            assert!(!scope.condition(&format!("0.8 {op} missing.output.x")).unwrap(), "0.8 {op} missing");
        }
        assert!(scope.condition("{{ inputs.n }} >= 3 and inputs.n != 4 and inputs.n == 3").unwrap());
        assert!(scope.condition("inputs.missing is not defined or inputs.missing < 1").unwrap(), "a guard");
        assert!(scope.condition("not ({{ inputs.missing }} < 1)").unwrap(), "the comparison is false, not the whole");
    }

    #[test]
    fn objects_and_lists_in_text_read_as_json() {
        let scope =
            Scope::of(&run(serde_json::json!({"who": "ann", "tags": ["a", "b"]})), &[], &Value::Null, "s", 1, None);
        assert_eq!(scope.render("got {{ inputs }}").unwrap(), r#"got {"tags":["a","b"],"who":"ann"}"#);
        assert_eq!(scope.render("{{ inputs.tags }}!").unwrap(), r#"["a","b"]!"#);
        assert_eq!(scope.render("{{ inputs.who }} {{ 1.5 }} {{ true }}").unwrap(), "ann 1.5 true");
    }

    #[test]
    fn a_render_that_would_run_for_ever_runs_out_of_fuel() {
        let scope = Scope::of(&run(serde_json::json!({"n": 100_000})), &[], &Value::Null, "s", 1, None);
        let spin = "{% for i in range(inputs.n) %}{% for j in range(inputs.n) %}{% endfor %}{% endfor %}done";
        let error = scope.render(spin).expect_err("out of fuel").to_string();
        assert!(error.contains("fuel"), "{error}");
        let ten = "{% for i in range(10) %}{{ i }}{% endfor %}";
        assert_eq!(scope.render(ten).unwrap(), "0123456789", "an ordinary loop has fuel to spare");
    }

    #[test]
    fn a_missing_value_has_no_length() {
        let scope =
            Scope::of(&run(serde_json::json!({"who": "ann", "tags": ["a", "b"]})), &[], &Value::Null, "s", 1, None);
        assert_eq!(scope.render("{{ inputs.missing | length }}/{{ skipped.output | count }}").unwrap(), "0/0");
        assert_eq!(scope.render("{{ inputs.who | length }}/{{ inputs.tags | length }}").unwrap(), "3/2");
        assert!(scope.condition("{{ inputs.missing | length }} == 0").unwrap());
        assert!(scope.render("{{ 5 | length }}").is_err(), "a number still has no length");
    }

    #[test]
    fn a_scope_holds_only_the_names_its_step_uses() {
        let roots = BTreeSet::from(["inputs".to_owned()]);
        let scope =
            Scope::of(&run(serde_json::json!({"who": "ann"})), &[], &serde_json::json!({"x": 1}), "s", 1, Some(&roots));
        assert_eq!(scope.render("{{ inputs.who }}/{{ config.x }}/{{ run.id }}").unwrap(), "ann//");
    }
}
