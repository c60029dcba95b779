//! The top level of a definition: name, trigger, inputs, state, concurrency.

use std::{
    collections::{BTreeMap, BTreeSet},
    str::FromStr as _,
};

use super::{
    expr::{ExprKind, Expression, TRIGGER_CONDITION},
    reader::{Node, Reader, as_text, join},
    steps,
};
use crate::domain::{Concurrency, Input, InputType, Persistence, Severity, StatePolicy, Trigger, WorkflowSpec};

const TOP_FIELDS: &[&str] = &["name", "description", "trigger", "inputs", "steps", "state", "concurrency"];
const MAX_NAME_LEN: usize = 200;

/// What the walk over a definition gathered for the expression check.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    pub(crate) expressions: Vec<Expression>,
    /// Every step id, to tell a forward reference from an unknown name, and
    /// the line it is declared on.
    pub(crate) declared: BTreeMap<String, u32>,
    /// The definition's trigger, which no event its steps publish may fire.
    pub(crate) trigger: Option<Trigger>,
    /// Every webhook URL, with where it is written: what a server checks
    /// against the addresses it calls.
    pub(crate) webhooks: Vec<(String, Placed)>,
}

/// Where a value is written: its field, line and column.
#[derive(Debug, Default)]
pub(crate) struct Placed {
    pub(crate) field: String,
    pub(crate) line: u32,
    pub(crate) column: u32,
}

/// Reads the whole document; `None` only when it is not a mapping.
pub(crate) fn definition(reader: &mut Reader, document: &Node<'_>) -> (Option<WorkflowSpec>, Walk) {
    let mut walk = Walk::default();
    let Some(fields) = reader.mapping(document, "", TOP_FIELDS) else { return (None, walk) };
    let name = reader.required(&fields, "", "name", "the workflow's name").and_then(|node| workflow_name(reader, node));
    let description = fields.get("description").and_then(|node| reader.string(node, "description")).unwrap_or_default();
    let trigger = fields.get("trigger").map_or(Some(Trigger::Manual), |node| trigger(reader, node, &mut walk));
    let inputs = fields.get("inputs").map(|node| inputs(reader, node)).unwrap_or_default();
    if let (Some(Trigger::Event { .. } | Trigger::Cron { .. }), Some(node)) = (&trigger, fields.get("inputs")) {
        for input in inputs.iter().filter(|input| input.required) {
            let message = format!(
                "the runs the trigger starts have no inputs, so each fails to start for want of `{}`: give it a \
                 default, or start such runs by hand only",
                input.name
            );
            reader.report(Severity::Warning, Some(node), &join("inputs", &input.name), "untriggerable_input", message);
        }
    }
    walk.trigger.clone_from(&trigger);
    let steps = reader
        .required(&fields, "", "steps", "a list of steps")
        .map(|node| steps::top_level(reader, node, &mut walk))
        .unwrap_or_default();
    let state = fields.get("state").map_or(Some(StatePolicy::default_policy()), |node| state(reader, node));
    let concurrency = fields.get("concurrency").and_then(|node| concurrency(reader, node, &mut walk));
    let spec = WorkflowSpec {
        name: name.unwrap_or_default(),
        description,
        trigger: trigger.unwrap_or(Trigger::Manual),
        inputs,
        steps,
        state: state.unwrap_or(StatePolicy::default_policy()),
        concurrency,
    };
    (Some(spec), walk)
}

impl StatePolicy {
    fn default_policy() -> Self {
        Self { persistence: Persistence::Durable, ttl: None, retention: None }
    }
}

fn workflow_name(reader: &mut Reader, node: &Node<'_>) -> Option<String> {
    let name = reader.string(node, "name")?;
    let valid = name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        let message = format!(
            "expected a name of at most {MAX_NAME_LEN} letters, digits, `-`, `_` or `.`, starting with a letter or digit, found `{name}`"
        );
        reader.error(Some(node), "name", "bad_name", message);
    }
    Some(name)
}

fn trigger(reader: &mut Reader, node: &Node<'_>, walk: &mut Walk) -> Option<Trigger> {
    if let Some(text) = as_text(node) {
        if text == "manual" {
            return Some(Trigger::Manual);
        }
        reader.error(
            Some(node),
            "trigger",
            "bad_value",
            format!("expected `manual` or a mapping with `event` or `cron`, found `{text}`"),
        );
        return None;
    }
    let fields = reader.mapping(node, "trigger", &["event", "filter", "condition", "cron", "manual"])?;
    let kinds: Vec<&str> = fields.keys().filter(|key| matches!(*key, "event" | "cron" | "manual")).collect();
    if kinds.len() != 1 {
        let message = format!("expected exactly one of `event`, `cron` or `manual`, found {}", kinds.len());
        reader.error(Some(node), "trigger", "bad_trigger", message);
        return None;
    }
    if let Some(cron) = fields.get("cron") {
        for extra in ["filter", "condition"] {
            if let Some(extra_node) = fields.get(extra) {
                reader.error(
                    Some(extra_node),
                    &join("trigger", extra),
                    "unknown_field",
                    format!("`{extra}` applies to `event` triggers only"),
                );
            }
        }
        let schedule = reader.string(cron, "trigger.cron")?;
        if let Err(error) = croner::Cron::from_str(&schedule) {
            let message = format!("expected a cron schedule such as `0 9 * * 1-5`, found `{schedule}`: {error}");
            reader.error(Some(cron), "trigger.cron", "bad_cron", message);
            return None;
        }
        if schedule.split_whitespace().count() > 5 {
            let message = format!(
                "`{schedule}` has {} fields: the first is seconds, and a seventh years (five start at minutes: \
                 `*/5 * * * *` is every five minutes)",
                schedule.split_whitespace().count()
            );
            reader.report(Severity::Warning, Some(cron), "trigger.cron", "cron_seconds", message);
        }
        return Some(Trigger::Cron { schedule });
    }
    if fields.has("manual") {
        return Some(Trigger::Manual);
    }
    let event_node = fields.get("event")?;
    let event_type = reader.string(event_node, "trigger.event")?;
    if let Err(violation) = chorus_runtime::validate::event_type("trigger.event", &event_type, true) {
        reader.error(
            Some(event_node),
            "trigger.event",
            "bad_event_type",
            format!("`{event_type}` {}", violation.reason),
        );
        return None;
    }
    let filter = match fields.get("filter") {
        None => Default::default(),
        Some(filter_node) => match reader.value(filter_node, "trigger.filter")? {
            serde_json::Value::Object(filter) => filter,
            _ => {
                reader.error(
                    Some(filter_node),
                    "trigger.filter",
                    "wrong_type",
                    "expected a mapping of payload fields to values",
                );
                return None;
            }
        },
    };
    let condition = fields.get("condition").and_then(|node| {
        let text = reader.string(node, TRIGGER_CONDITION)?;
        walk.expressions.push(Expression::at(node, TRIGGER_CONDITION, &text, ExprKind::Condition, &BTreeSet::new()));
        Some(text)
    });
    Some(Trigger::Event { event_type, filter, condition })
}

fn inputs(reader: &mut Reader, node: &Node<'_>) -> Vec<Input> {
    let Some(fields) = reader.mapping(node, "inputs", &[]) else { return Vec::new() };
    fields.entries().iter().filter_map(|(name, value)| input(reader, name, value)).collect()
}

fn input(reader: &mut Reader, name: &str, node: &Node<'_>) -> Option<Input> {
    let field = format!("inputs.{name}");
    if !super::steps::is_identifier(name) {
        let message = format!(
            "expected letters, digits and `_`, starting with a letter (templates name inputs as `inputs.NAME`), \
             found `{name}`"
        );
        reader.error(Some(node), &field, "bad_input_name", message);
        return None;
    }
    let fields = reader.mapping(node, &field, &["type", "required", "default", "description"])?;
    // A bad type is reported, and the input still declared (as a string,
    // never used: the definition is refused), so that the templates naming
    // it are not reported too.
    let (kind, typed) = match fields.get("type") {
        None => (InputType::String, true),
        Some(type_node) => {
            let text = reader.string(type_node, &join(&field, "type"))?;
            match InputType::parse(&text) {
                Some(kind) => (kind, true),
                None => {
                    let message = format!("expected one of {}, found `{text}`", InputType::NAMES);
                    reader.error(Some(type_node), &join(&field, "type"), "bad_value", message);
                    (InputType::String, false)
                }
            }
        }
    };
    let required =
        fields.get("required").and_then(|node| reader.boolean(node, &join(&field, "required"))).unwrap_or(false);
    let default = match fields.get("default") {
        None => None,
        Some(default_node) => {
            let value = reader.value(default_node, &join(&field, "default"))?;
            if typed && !kind.admits(&value) {
                reader.error(
                    Some(default_node),
                    &join(&field, "default"),
                    "wrong_type",
                    format!("the default is not of type {kind:?}").to_lowercase(),
                );
            }
            if required {
                reader.report(
                    Severity::Warning,
                    Some(default_node),
                    &join(&field, "default"),
                    "unused_default",
                    "a required input's default is never used".into(),
                );
            }
            Some(value)
        }
    };
    let description = fields
        .get("description")
        .and_then(|node| reader.string(node, &join(&field, "description")))
        .unwrap_or_default();
    Some(Input { name: name.to_owned(), kind, required, default, description })
}

fn state(reader: &mut Reader, node: &Node<'_>) -> Option<StatePolicy> {
    let fields = reader.mapping(node, "state", &["persistence", "ttl", "retention"])?;
    if let Some(persistence) = fields.get("persistence") {
        let text = reader.string(persistence, "state.persistence")?;
        match text.as_str() {
            "durable" => {}
            "sqlite" | "postgres" | "postgresql" => reader.report(
                Severity::Warning,
                Some(persistence),
                "state.persistence",
                "persistence_backend",
                format!("runs are kept in the configured database whatever its kind; `{text}` is read as `durable`"),
            ),
            _ => {
                // An error; the fields after it are still checked.
                reader.error(
                    Some(persistence),
                    "state.persistence",
                    "bad_value",
                    format!("expected `durable`, found `{text}`"),
                );
            }
        }
    }
    let ttl = fields.get("ttl").and_then(|node| reader.duration(node, "state.ttl"));
    let retention = fields.get("retention").and_then(|node| reader.duration(node, "state.retention"));
    Some(StatePolicy { persistence: Persistence::Durable, ttl, retention })
}

fn concurrency(reader: &mut Reader, node: &Node<'_>, walk: &mut Walk) -> Option<Concurrency> {
    let fields = reader.mapping(node, "concurrency", &["max", "key"])?;
    // The key is checked whatever the max, so that one pass reports both.
    let key = fields.get("key").and_then(|key_node| {
        let text = reader.string(key_node, "concurrency.key")?;
        walk.expressions.push(Expression::at(key_node, "concurrency.key", &text, ExprKind::Template, &BTreeSet::new()));
        Some(text)
    });
    let max = reader.required(&fields, "concurrency", "max", "the most runs at once (1 or more)")?;
    let max = reader.integer(max, "concurrency.max", 1, 100_000)?;
    Some(Concurrency { max, key })
}
