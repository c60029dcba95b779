//! Templates and conditions: one expression language (minijinja), compiled
//! at definition time, with references checked against earlier steps.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::LazyLock,
};

use minijinja::{
    AutoEscape, Environment, ErrorKind, UndefinedBehavior, Value,
    machinery::{self, Instruction, Instructions},
    value::ValueKind,
};

use super::reader::{Node, Reader, position};
use crate::domain::Severity;

/// Names every expression may use besides earlier steps.
/// The field of a trigger's condition, the one expression that sees `event`.
pub(crate) const TRIGGER_CONDITION: &str = "trigger.condition";

pub(crate) const RESERVED_ROOTS: &[&str] = &["trigger", "inputs", "config", "run", "feedback", "previous", "event"];

/// Globals minijinja itself provides.
const BUILTIN_GLOBALS: &[&str] = &["range", "dict", "namespace", "debug", "loop"];

/// How an expression is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExprKind {
    /// Text with `{{ ... }}` placeholders.
    Template,
    /// A boolean: `{{ review.output.confidence }} < 0.8` or `review.output.ok`.
    Condition,
}

/// One expression found in a definition, with what it may see.
#[derive(Debug, Clone)]
pub(crate) struct Expression {
    pub(crate) field: String,
    pub(crate) line: u32,
    pub(crate) column: u32,
    pub(crate) text: String,
    pub(crate) kind: ExprKind,
    /// Step ids it may refer to: the steps before it on its path.
    pub(crate) visible: BTreeSet<String>,
    /// What it uses, or why it does not compile: compiled once, here.
    pub(crate) compiled: Result<Compiled, String>,
}

/// What an expression that compiles uses.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    /// The names it refers to.
    pub(crate) variables: BTreeSet<String>,
    /// The inputs it names (`inputs.environment`).
    pub(crate) inputs: BTreeSet<String>,
    /// The filters and tests it applies that do not exist: (`filter` or
    /// `test`, name).
    pub(crate) unknown: BTreeSet<(&'static str, String)>,
}

impl Expression {
    pub(crate) fn at(node: &Node<'_>, field: &str, text: &str, kind: ExprKind, visible: &BTreeSet<String>) -> Self {
        let (line, column) = position(node);
        let compiled = compile(text, kind);
        Self { field: field.to_owned(), line, column, text: text.to_owned(), kind, visible: visible.clone(), compiled }
    }
}

/// A condition as a minijinja expression: `{{ x }}` placeholders become `(x)`.
pub(crate) fn condition_source(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let Some(end) = rest[start..].find("}}") else { break };
        out.push_str(&rest[..start]);
        out.push('(');
        out.push_str(rest[start + 2..start + end].trim());
        out.push(')');
        rest = &rest[start + end + 2..];
    }
    out.push_str(rest);
    out
}

/// What the `{{ }}` placeholders of `text` hold, trimmed.
fn placeholders(text: &str) -> impl Iterator<Item = &str> {
    text.split("{{").skip(1).filter_map(|part| Some(part.split_once("}}")?.0.trim()))
}

/// A comparison of two values that are both there.
type Compare = fn(&Value, &Value) -> bool;

/// What a condition's comparisons call instead of minijinja's operators
/// (see [`condition_instructions`]): a comparison with a missing side is
/// false, whatever the operator; minijinja orders a missing value before
/// any other (`missing < 0.8` held). No template can call them: their names
/// are not identifiers.
const COMPARISONS: [(&str, Compare); 6] = [
    ("chorus:==", |a, b| a == b),
    ("chorus:!=", |a, b| a != b),
    ("chorus:<", |a, b| a < b),
    ("chorus:<=", |a, b| a <= b),
    ("chorus:>", |a, b| a > b),
    ("chorus:>=", |a, b| a >= b),
];

/// The instructions one render may run (minijinja's fuel): some ten
/// milliseconds of work, a loop over some hundred thousand items; far more
/// than a step's template needs.
const RENDER_FUEL: u64 = 1_000_000;

/// The one environment expressions are checked and rendered in: building
/// one registers every builtin filter and test, which cost more than
/// rendering a short template.
pub(crate) fn environment() -> &'static Environment<'static> {
    static ENVIRONMENT: LazyLock<Environment<'static>> = LazyLock::new(|| {
        let mut env = Environment::new();
        // A missing field — of a skipped step, an absent input — renders
        // empty and tests false, as in the seed's examples, however deep the
        // path; a condition that compares one is false.
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        // A template's work is bounded, whatever a run's inputs ask of its
        // loops: past the budget the render fails, and so does its step.
        env.set_fuel(Some(RENDER_FUEL));
        // An object, a list or a boolean in text reads as JSON (`{"ok":true}`),
        // which an agent can parse, not as minijinja's Python-like `{'ok': True}`.
        env.set_formatter(|out, state, value| match value.kind() {
            ValueKind::Map | ValueKind::Seq | ValueKind::Bool => {
                let json = serde_json::to_string(value).map_err(|error| {
                    minijinja::Error::new(ErrorKind::BadSerialization, "cannot render as JSON").with_source(error)
                })?;
                out.write_str(&json).map_err(minijinja::Error::from)
            }
            _ => minijinja::escape_formatter(out, state, value),
        });
        for (name, compare) in COMPARISONS {
            env.add_function(name, move |a: &Value, b: &Value| !a.is_undefined() && !b.is_undefined() && compare(a, b));
        }
        // A missing value is empty: its length is 0, not an error that fails the run.
        for name in ["length", "count"] {
            env.add_filter(name, |value: &Value| -> Result<usize, minijinja::Error> {
                if value.is_undefined() || value.is_none() {
                    return Ok(0);
                }
                value.len().ok_or_else(|| {
                    let message = format!("cannot calculate length of value of type {}", value.kind());
                    minijinja::Error::new(ErrorKind::InvalidOperation, message)
                })
            });
        }
        env
    });
    &ENVIRONMENT
}

/// A condition's minijinja `source` compiled as minijinja does, except that
/// each comparison (`==`, `!=`, `<`, `<=`, `>`, `>=`) calls its function in
/// [`COMPARISONS`]. In a chained comparison (`a < b < c`) only the last link
/// does; the others keep minijinja's order.
pub(crate) fn condition_instructions(source: &str) -> Result<Instructions<'_>, minijinja::Error> {
    let mut generator = machinery::CodeGenerator::new("<condition>", source);
    generator.compile_expr(&machinery::parse_expr(source)?);
    let (mut instructions, _) = generator.finish();
    for index in 0.. {
        let Some(instruction) = instructions.get_mut(index) else { break };
        let name = match instruction {
            Instruction::Eq => "chorus:==",
            Instruction::Ne => "chorus:!=",
            Instruction::Lt => "chorus:<",
            Instruction::Lte => "chorus:<=",
            Instruction::Gt => "chorus:>",
            Instruction::Gte => "chorus:>=",
            _ => continue,
        };
        *instruction = Instruction::CallFunction(name, Some(2));
    }
    Ok(instructions)
}

/// Whether a condition's minijinja `source` holds in `context`.
pub(crate) fn condition_holds(source: &str, context: &Value) -> Result<bool, minijinja::Error> {
    let instructions = condition_instructions(source)?;
    let mut printed = String::new();
    let output = &mut machinery::make_string_output(&mut printed);
    let (value, _) =
        machinery::eval(environment(), &instructions, context.clone(), &BTreeMap::new(), output, AutoEscape::None)?;
    Ok(value.is_some_and(|value| value.is_true()))
}

/// What an expression uses, or why it does not compile. Filters and tests
/// are looked up only as a template runs: the ones it applies are read from
/// its compiled instructions, and looked up here.
fn compile(text: &str, kind: ExprKind) -> Result<Compiled, String> {
    let env = environment();
    let describe = |error: minijinja::Error| error.detail().map_or_else(|| error.kind().to_string(), str::to_owned);
    let (variables, paths, unknown) = match kind {
        ExprKind::Template => {
            let template = env.template_from_str(text).map_err(describe)?;
            let compiled = machinery::get_compiled_template(&template);
            let unknown =
                std::iter::once(&compiled.instructions).chain(compiled.blocks.values()).flat_map(unknown_calls);
            (template.undeclared_variables(false), template.undeclared_variables(true), unknown.collect())
        }
        ExprKind::Condition => {
            let source = condition_source(text);
            // An error inside a placeholder is told of the placeholder alone,
            // not of the parentheses it became (an `unexpected )` the
            // condition does not hold).
            let expression = env.compile_expression(&source).map_err(|error| {
                let inner = placeholders(text).find_map(|inner| env.compile_expression(inner).err());
                describe(inner.unwrap_or(error))
            })?;
            let instructions = condition_instructions(&source).map_err(describe)?;
            let unknown = unknown_calls(&instructions).into_iter().collect();
            (expression.undeclared_variables(false), expression.undeclared_variables(true), unknown)
        }
    };
    let inputs = paths.iter().filter_map(|path| path.strip_prefix("inputs.")?.split('.').next()).map(str::to_owned);
    Ok(Compiled { variables: variables.into_iter().collect(), inputs: inputs.collect(), unknown })
}

/// The filters and tests `instructions` apply that the environment lacks.
fn unknown_calls(instructions: &Instructions<'_>) -> Vec<(&'static str, String)> {
    let template = environment().template_from_str("").expect("an empty template compiles");
    let mut state = template.new_state();
    // Applying one the environment lacks fails with that kind of error before
    // anything runs; one it has runs on no arguments, and builtins are pure.
    let mut unknown = Vec::new();
    for instruction in (0..).map_while(|index| instructions.get(index)) {
        let (what, name, outcome, lacking) = match instruction {
            Instruction::ApplyFilter(name, ..) => {
                ("filter", name, state.apply_filter(name, &[]).map(drop), ErrorKind::UnknownFilter)
            }
            Instruction::PerformTest(name, ..) => {
                ("test", name, state.perform_test(name, &[]).map(drop), ErrorKind::UnknownTest)
            }
            _ => continue,
        };
        if outcome.is_err_and(|error| error.kind() == lacking) {
            unknown.push((what, (*name).to_owned()));
        }
    }
    unknown
}

/// Every name the expressions that compile use.
pub(crate) fn roots(expressions: &[Expression]) -> BTreeSet<String> {
    expressions
        .iter()
        .filter_map(|expression| expression.compiled.as_ref().ok())
        .flat_map(|c| &c.variables)
        .cloned()
        .collect()
}

/// Checks what every expression refers to. `declared` holds every step id
/// of the definition, `inputs` the names of its inputs when they could be
/// read (a run takes no other, so any other would render empty).
pub(crate) fn check(
    reader: &mut Reader,
    expressions: &[Expression],
    declared: &BTreeMap<String, u32>,
    inputs: Option<&BTreeSet<&str>>,
) {
    for expression in expressions {
        match &expression.compiled {
            Ok(compiled) => {
                references(reader, expression, declared, &compiled.variables);
                if let Some(inputs) = inputs {
                    unknown_inputs(reader, expression, &compiled.inputs, inputs);
                }
                for (what, name) in &compiled.unknown {
                    let message = format!("unknown {what} `{name}` in `{}`", expression.text);
                    push(reader, expression, &format!("unknown_{what}"), message);
                }
            }
            Err(detail) => {
                let what = match expression.kind {
                    ExprKind::Template => "template",
                    ExprKind::Condition => "condition",
                };
                let message = format!("invalid {what} `{}`: {detail}", expression.text);
                push(reader, expression, "bad_expression", message);
            }
        }
    }
}

fn unknown_inputs(reader: &mut Reader, expression: &Expression, used: &BTreeSet<String>, inputs: &BTreeSet<&str>) {
    for input in used.iter().filter(|input| !inputs.contains(input.as_str())) {
        let known = inputs.iter().copied().collect::<Vec<_>>().join(", ");
        let known = if known.is_empty() { "none".to_owned() } else { known };
        let message = format!("`inputs.{input}` is not an input of this workflow; declared: {known}");
        push(reader, expression, "unknown_input", message);
    }
}

fn push(reader: &mut Reader, expression: &Expression, code: &str, message: String) {
    reader.problems.push(crate::domain::Problem {
        severity: Severity::Error,
        file: reader.file().to_owned(),
        line: expression.line,
        column: expression.column,
        field: expression.field.clone(),
        code: code.to_owned(),
        message,
    });
}

fn references(
    reader: &mut Reader,
    expression: &Expression,
    declared: &BTreeMap<String, u32>,
    roots: &BTreeSet<String>,
) {
    for root in roots {
        if root == "event" && expression.field != TRIGGER_CONDITION {
            let message = "`event` names the event only in `trigger.condition`; steps see its payload as `trigger`";
            push(reader, expression, "unknown_reference", message.to_owned());
            continue;
        }
        if RESERVED_ROOTS.contains(&root.as_str())
            || BUILTIN_GLOBALS.contains(&root.as_str())
            || expression.visible.contains(root)
        {
            continue;
        }
        if declared.contains_key(root) {
            let message = format!(
                "step `{root}` does not finish before this one (it comes later, or runs in another branch of \
                 the same parallel); expected a reference to an earlier step"
            );
            push(reader, expression, "forward_reference", message);
            continue;
        }
        let allowed: Vec<&str> =
            RESERVED_ROOTS.iter().copied().chain(expression.visible.iter().map(String::as_str)).collect();
        let message =
            format!("`{root}` is not an earlier step or a known name; expected one of: {}", allowed.join(", "));
        push(reader, expression, "unknown_reference", message);
    }
}
