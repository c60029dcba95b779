//! Templates and conditions: one expression language (minijinja), compiled
//! at definition time, with references checked against earlier steps.

use std::{collections::BTreeSet, sync::LazyLock};

use minijinja::{Environment, UndefinedBehavior};

use super::reader::{Node, Reader, position};
use crate::domain::Severity;

/// Names every expression may use besides earlier steps.
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
    /// The names it uses, or why it does not compile: compiled once, here.
    pub(crate) variables: Result<BTreeSet<String>, String>,
}

impl Expression {
    pub(crate) fn at(node: &Node<'_>, field: &str, text: &str, kind: ExprKind, visible: &BTreeSet<String>) -> Self {
        let (line, column) = position(node);
        let variables = variables(text, kind);
        Self { field: field.to_owned(), line, column, text: text.to_owned(), kind, visible: visible.clone(), variables }
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

/// The one environment expressions are checked and rendered in: building
/// one registers every builtin filter and test, which cost more than
/// rendering a short template.
pub(crate) fn environment() -> &'static Environment<'static> {
    static ENVIRONMENT: LazyLock<Environment<'static>> = LazyLock::new(|| {
        let mut env = Environment::new();
        // A missing field — of a skipped step, an absent input — renders
        // empty and tests false, as in the seed's examples, however deep the path.
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env
    });
    &ENVIRONMENT
}

/// The names an expression uses, or why it does not compile.
fn variables(text: &str, kind: ExprKind) -> Result<BTreeSet<String>, String> {
    let env = environment();
    let variables = match kind {
        ExprKind::Template => env.template_from_str(text).map(|t| t.undeclared_variables(false)),
        ExprKind::Condition => {
            env.compile_expression_owned(condition_source(text)).map(|e| e.undeclared_variables(false))
        }
    };
    variables
        .map(|names| names.into_iter().collect())
        .map_err(|error| error.detail().map_or_else(|| error.kind().to_string(), str::to_owned))
}

/// Every name the expressions that compile use.
pub(crate) fn roots(expressions: &[Expression]) -> BTreeSet<String> {
    expressions.iter().filter_map(|expression| expression.variables.as_ref().ok()).flatten().cloned().collect()
}

/// Checks what every expression refers to. `declared` holds every step id
/// of the definition.
pub(crate) fn check(reader: &mut Reader, expressions: &[Expression], declared: &BTreeSet<String>) {
    for expression in expressions {
        match &expression.variables {
            Ok(variables) => references(reader, expression, declared, variables),
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

fn references(reader: &mut Reader, expression: &Expression, declared: &BTreeSet<String>, roots: &BTreeSet<String>) {
    for root in roots {
        if RESERVED_ROOTS.contains(&root.as_str())
            || BUILTIN_GLOBALS.contains(&root.as_str())
            || expression.visible.contains(root)
        {
            continue;
        }
        if declared.contains(root) {
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
