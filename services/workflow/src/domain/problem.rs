//! Problems found in a definition: where (file, line, column, field), what
//! kind (a stable code) and what was expected.

use std::fmt;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The definition cannot be stored.
    Error,
    /// Stored anyway: probably not what was meant.
    Warning,
}

/// One problem in one definition source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub severity: Severity,
    /// The file name given with the source.
    pub file: String,
    /// 1-based; 0 when the problem has no position.
    pub line: u32,
    /// 1-based; 0 when the problem has no position.
    pub column: u32,
    /// Path of the field (`steps[2].spawn.agent`); empty for a YAML syntax error.
    pub field: String,
    /// Stable machine-readable kind (`unknown_field`, `duplicate_step_id`, ...).
    pub code: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}:{}:{}: {severity}", self.file, self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, " in `{}`", self.field)?;
        }
        write!(f, " [{}]: {}", self.code, self.message)
    }
}

/// Orders problems as the contract says: errors first, then warnings, each
/// in source order.
pub fn sort_problems(problems: &mut [Problem]) {
    problems.sort_by_key(|problem| (problem.severity, problem.line == 0, problem.line, problem.column));
}

/// Whether any problem is an error.
pub fn has_errors(problems: &[Problem]) -> bool {
    problems.iter().any(|problem| problem.severity == Severity::Error)
}
