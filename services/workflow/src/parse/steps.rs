//! Steps: their kinds, fields, ids and what each may refer to.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{
    expr::{self, ExprKind, Expression, RESERVED_ROOTS},
    reader::{Fields, Node, Reader, join, position},
    top::{self, Walk},
};
use crate::domain::{Action, Branch, Delegate, JoinMode, Parallel, Retry, Spawn, SpawnTarget, Step, Wait};

mod gate;
mod message;

/// The most branches one parallel step takes: the engine looks at every
/// branch on each change of its run.
const MAX_BRANCHES: usize = 1_000;

const KINDS: &[&str] = &["spawn", "delegate", "message", "wait", "parallel", "gate"];
const STEP_FIELDS: &[&str] =
    &["id", "description", "condition", "spawn", "delegate", "message", "wait", "parallel", "gate"];

/// The definition's `steps`.
pub(crate) fn top_level(reader: &mut Reader, node: &Node<'_>, walk: &mut Walk) -> Vec<Step> {
    list(reader, node, "steps", BTreeSet::new(), walk)
}

/// A list of steps run in order; each sees `visible` plus the steps before it.
/// A gate can rerun only those steps before it (in this list).
fn list(
    reader: &mut Reader,
    node: &Node<'_>,
    field: &str,
    mut visible: BTreeSet<String>,
    walk: &mut Walk,
) -> Vec<Step> {
    let Some(items) = reader.sequence(node, field) else { return Vec::new() };
    if items.is_empty() {
        reader.error(Some(node), field, "empty_value", "expected at least one step");
    }
    let mut earlier = BTreeMap::new();
    let mut steps = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let path = format!("{field}[{index}]");
        let seen = Seen { visible: &visible, earlier: &earlier, previous: steps.last() };
        let (id, step) = step(reader, item, &path, seen, walk);
        let Some(step) = step else {
            // Its problems are reported; the steps after it may still name
            // it without being told it comes later.
            if let Some(id) = id {
                earlier.insert(id.clone(), id.clone());
                visible.insert(id);
            }
            continue;
        };
        let mut held = BTreeSet::new();
        collect_ids(std::slice::from_ref(&step), &mut held);
        earlier.extend(held.iter().map(|id| (id.clone(), step.id.clone())));
        visible.extend(held);
        steps.push(step);
    }
    steps
}

/// The step ids a step may name: those it sees, and those of the steps
/// before it in its own list (with theirs inside, each mapped to the step of
/// the list that holds it), which a gate can rerun.
#[derive(Clone, Copy)]
struct Seen<'v> {
    visible: &'v BTreeSet<String>,
    earlier: &'v BTreeMap<String, String>,
    /// The step just before, in the same list (what a gate reruns by default).
    previous: Option<&'v Step>,
}

fn collect_ids(steps: &[Step], into: &mut BTreeSet<String>) {
    for step in steps {
        into.insert(step.id.clone());
        if let Action::Parallel(parallel) = &step.action {
            for branch in &parallel.branches {
                collect_ids(&branch.steps, into);
            }
        }
    }
}

/// The step at `node`, and its id, known even when the step is not valid.
fn step(
    reader: &mut Reader,
    node: &Node<'_>,
    path: &str,
    seen: Seen<'_>,
    walk: &mut Walk,
) -> (Option<String>, Option<Step>) {
    let first_expression = walk.expressions.len();
    let Some(fields) = reader.mapping(node, path, &[]) else { return (None, None) };
    let unknown: Vec<&str> = fields.keys().filter(|key| !STEP_FIELDS.contains(key)).collect();
    let kinds: Vec<&str> = fields.keys().filter(|key| KINDS.contains(key)).collect();
    for key in &unknown {
        let (code, message) = match kinds.is_empty() {
            true => ("unknown_step_kind", format!("unknown step kind `{key}`; expected one of: {}", KINDS.join(", "))),
            false => ("unknown_field", format!("unknown field `{key}`; expected one of: {}", STEP_FIELDS.join(", "))),
        };
        let key_node = fields.key_node(key);
        reader.error(key_node, &join(path, key), code, message);
    }
    let id = reader.required(&fields, path, "id", "the step's id").and_then(|id| step_id(reader, id, path, walk));
    let condition = fields.get("condition").and_then(|cond| {
        let field = join(path, "condition");
        let text = reader.string(cond, &field)?;
        walk.expressions.push(Expression::at(cond, &field, &text, ExprKind::Condition, seen.visible));
        Some(text)
    });
    if kinds.len() > 1 {
        let message = format!("a step has one kind; found {}", kinds.join(" and "));
        reader.error(Some(node), path, "multiple_step_kinds", message);
        return (id, None);
    }
    let action = match kinds.first() {
        None if condition.is_some() => Some(Action::Condition),
        None => {
            if unknown.is_empty() {
                let message =
                    format!("missing the step's kind: expected one of {} (or only a condition)", KINDS.join(", "));
                reader.error(Some(node), path, "missing_step_kind", message);
            }
            None
        }
        Some(kind) => fields.get(kind).and_then(|body| {
            let field = join(path, kind);
            let mut scope = Scope { reader, walk, seen, field: &field };
            scope.action(kind, body)
        }),
    };
    let roots = expr::roots(&walk.expressions[first_expression..]);
    let step = match (&id, action) {
        (Some(id), Some(action)) => Some(Step { id: id.clone(), condition, action, roots }),
        _ => None,
    };
    (id, step)
}

/// Letters, digits and `_`, starting with a letter or `_`: a name templates
/// can use as written (`review.output`, `inputs.env`).
pub(super) fn is_identifier(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn step_id(reader: &mut Reader, node: &Node<'_>, path: &str, walk: &mut Walk) -> Option<String> {
    let field = join(path, "id");
    let id = reader.string(node, &field)?;
    if !is_identifier(&id) {
        let message = format!(
            "expected letters, digits and `_`, starting with a letter (templates name steps by id), found `{id}`"
        );
        reader.error(Some(node), &field, "bad_step_id", message);
        return None;
    }
    if RESERVED_ROOTS.contains(&id.as_str()) {
        reader.error(
            Some(node),
            &field,
            "reserved_step_id",
            format!("`{id}` is a reserved name in templates; choose another id"),
        );
        return None;
    }
    if let Some(first) = walk.declared.get(&id) {
        reader.error(
            Some(node),
            &field,
            "duplicate_step_id",
            format!("step id `{id}` is already used, on line {first}; step ids must be unique"),
        );
        return None;
    }
    walk.declared.insert(id.clone(), position(node).0);
    Some(id)
}

/// Reading one step's body.
struct Scope<'r, 'w, 'v, 'f> {
    reader: &'r mut Reader,
    walk: &'w mut Walk,
    seen: Seen<'v>,
    field: &'f str,
}

impl Scope<'_, '_, '_, '_> {
    fn action(&mut self, kind: &str, body: &Node<'_>) -> Option<Action> {
        match kind {
            "spawn" => self.spawn(body).map(Action::Spawn),
            "delegate" => self.delegate(body).map(Action::Delegate),
            "message" => self.message(body).map(Action::Message),
            "wait" => self.wait(body).map(Action::Wait),
            "parallel" => self.parallel(body).map(Action::Parallel),
            _ => self.gate(body).map(Action::Gate),
        }
    }

    fn path(&self, key: &str) -> String {
        join(self.field, key)
    }

    fn string(&mut self, fields: &Fields<'_, '_>, key: &str) -> Option<String> {
        let node = fields.get(key)?;
        self.reader.string(node, &self.path(key))
    }

    /// A string used as written, which must not look like a template: a
    /// `{{ }}` there would reach a URL, a topic or a role as it is.
    fn literal(&mut self, fields: &Fields<'_, '_>, key: &str) -> Option<String> {
        let text = self.string(fields, key)?;
        if text.contains("{{") || text.contains("{%") {
            let message = format!("`{key}` is not a template: its text is used as written, `{{{{ }}}}` included");
            self.reader.error(fields.get(key), &self.path(key), "not_a_template", message);
        }
        Some(text)
    }

    fn template(&mut self, fields: &Fields<'_, '_>, key: &str, kind: ExprKind) -> Option<String> {
        let node = fields.get(key)?;
        let field = self.path(key);
        let text = self.reader.string(node, &field)?;
        self.walk.expressions.push(Expression::at(node, &field, &text, kind, self.seen.visible));
        Some(text)
    }

    /// A YAML value whose strings are templates.
    fn templated_value(&mut self, fields: &Fields<'_, '_>, key: &str) -> Value {
        let Some(node) = fields.get(key) else { return Value::Null };
        let field = self.path(key);
        let Some(value) = self.reader.value(node, &field) else { return Value::Null };
        let mut strings = Vec::new();
        strings_of(&value, &field, &mut strings);
        for (path, text) in strings {
            self.walk.expressions.push(Expression::at(node, &path, &text, ExprKind::Template, self.seen.visible));
        }
        value
    }

    fn duration(&mut self, fields: &Fields<'_, '_>, key: &str) -> Option<std::time::Duration> {
        let node = fields.get(key)?;
        self.reader.duration(node, &self.path(key))
    }

    fn retry(&mut self, fields: &Fields<'_, '_>) -> Option<Retry> {
        let node = fields.get("retry")?;
        let field = self.path("retry");
        let retry = self.reader.mapping(node, &field, &["max_attempts", "backoff", "max_backoff"])?;
        let attempts = self.reader.required(&retry, &field, "max_attempts", "attempts in all, 1 to 100")?;
        let max_attempts = self.reader.integer(attempts, &join(&field, "max_attempts"), 1, 100)?;
        let backoff = retry.get("backoff").and_then(|n| self.reader.duration(n, &join(&field, "backoff")));
        let max_backoff = retry.get("max_backoff").and_then(|n| self.reader.duration(n, &join(&field, "max_backoff")));
        let backoff = backoff.unwrap_or(std::time::Duration::from_secs(1));
        Some(Retry { max_attempts, backoff, max_backoff: max_backoff.unwrap_or(backoff * 60).max(backoff) })
    }

    fn exactly_one<'k>(&mut self, fields: &Fields<'_, '_>, choices: &[&'k str]) -> Option<&'k str> {
        let found: Vec<&'k str> = choices.iter().copied().filter(|key| fields.has(key)).collect();
        if found.len() == 1 {
            return found.first().copied();
        }
        let message = format!("expected exactly one of `{}`, found {}", choices.join("`, `"), found.len());
        let code = if found.is_empty() { "missing_field" } else { "conflicting_fields" };
        self.reader.error(Some(fields.node), self.field, code, message);
        None
    }

    fn spawn(&mut self, body: &Node<'_>) -> Option<Spawn> {
        let fields = self.reader.mapping(body, self.field, &["agent", "role", "input", "timeout", "retry"])?;
        let target = match self.exactly_one(&fields, &["agent", "role"]) {
            Some("agent") => self.template(&fields, "agent", ExprKind::Template).map(SpawnTarget::Agent),
            Some(_) => self.literal(&fields, "role").map(SpawnTarget::Role),
            None => None,
        };
        self.reader.required(
            &fields,
            self.field,
            "input",
            "the task's input (text or a mapping; strings are templates)",
        );
        let input = self.templated_value(&fields, "input");
        let timeout = self.duration(&fields, "timeout");
        let retry = self.retry(&fields);
        Some(Spawn { target: target?, input, timeout, retry })
    }

    fn delegate(&mut self, body: &Node<'_>) -> Option<Delegate> {
        let fields = self.reader.mapping(body, self.field, &["agent", "input", "timeout", "retry"])?;
        let agent = self
            .reader
            .required(&fields, self.field, "agent", "the A2A agent (its id or card URL)")
            .and(self.literal(&fields, "agent"));
        self.reader.required(&fields, self.field, "input", "the message to send (strings are templates)");
        let input = self.templated_value(&fields, "input");
        let timeout = self.duration(&fields, "timeout");
        let retry = self.retry(&fields);
        Some(Delegate { agent: agent?, input, timeout, retry })
    }

    fn wait(&mut self, body: &Node<'_>) -> Option<Wait> {
        let fields = self.reader.mapping(body, self.field, &["duration", "signal", "timeout"])?;
        match self.exactly_one(&fields, &["duration", "signal"])? {
            "duration" => {
                if let Some(node) = fields.get("timeout") {
                    self.reader.error(
                        Some(node),
                        &self.path("timeout"),
                        "unknown_field",
                        "`timeout` applies to signal waits only",
                    );
                }
                self.duration(&fields, "duration").map(Wait::Timer)
            }
            _ => {
                let name = self.literal(&fields, "signal")?;
                Some(Wait::Signal { name, timeout: self.duration(&fields, "timeout") })
            }
        }
    }

    fn parallel(&mut self, body: &Node<'_>) -> Option<Parallel> {
        let fields = self.reader.mapping(body, self.field, &["branches", "mode", "max_concurrency"])?;
        let mode = match fields.get("mode") {
            None => Some(JoinMode::FailFast),
            Some(node) => self.reader.choice(
                node,
                &self.path("mode"),
                &[("fail_fast", JoinMode::FailFast), ("all_settled", JoinMode::AllSettled)],
            ),
        };
        let max_concurrency = match fields.get("max_concurrency") {
            None => Some(None),
            Some(node) => self.reader.integer(node, &self.path("max_concurrency"), 1, 10_000).map(Some),
        };
        let branches_field = self.path("branches");
        let node =
            self.reader.required(&fields, self.field, "branches", "a list of branches, each with a name and steps")?;
        let items = self.reader.sequence(node, &branches_field)?;
        if items.len() < 2 {
            self.reader.error(Some(node), &branches_field, "too_few_branches", "expected at least two branches");
        }
        if items.len() > MAX_BRANCHES {
            let message = format!("{} branches; a parallel step takes at most {MAX_BRANCHES}", items.len());
            self.reader.error(Some(node), &branches_field, "too_many_branches", message);
        }
        let mut names = BTreeSet::new();
        let mut branches = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let path = format!("{branches_field}[{index}]");
            let Some(branch) = self.reader.mapping(item, &path, &["name", "steps"]) else { continue };
            let name = self
                .reader
                .required(&branch, &path, "name", "the branch's name")
                .and_then(|n| self.reader.string(n, &join(&path, "name")));
            let steps_node = self.reader.required(&branch, &path, "steps", "the branch's steps");
            // A branch sees what its parallel step sees, never a sibling branch.
            let steps =
                steps_node.map(|n| list(self.reader, n, &join(&path, "steps"), self.seen.visible.clone(), self.walk));
            let Some(name) = name else { continue };
            if !names.insert(name.clone()) {
                let node = branch.get("name");
                self.reader.error(
                    node,
                    &join(&path, "name"),
                    "duplicate_branch",
                    format!("branch name `{name}` is already used in this parallel step"),
                );
            }
            branches.push(Branch { name, steps: steps.unwrap_or_default() });
        }
        Some(Parallel { branches, mode: mode?, max_concurrency: max_concurrency? })
    }
}

/// Every string in `value` that holds a template, with its path.
fn strings_of(value: &Value, path: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::String(text) if text.contains("{{") || text.contains("{%") => out.push((path.to_owned(), text.clone())),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                strings_of(item, &format!("{path}[{index}]"), out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                strings_of(item, &join(path, key), out);
            }
        }
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}
