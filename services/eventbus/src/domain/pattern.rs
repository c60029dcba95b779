//! Event types and the patterns handlers take them by.

use std::fmt;

use chorus_runtime::validate::{self, FieldViolation};

/// An event type such as `task.completed`: 1..200 characters of
/// `A-Z a-z 0-9 . _ : / -`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventType(String);

impl EventType {
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldViolation> {
        validate::event_type(field, value, false)?;
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An exact event type or a pattern in which `*` matches any run of
/// characters, dots included: `task.*`, `*.failed`, `*`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pattern(String);

impl Pattern {
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldViolation> {
        validate::event_type(field, value, true)?;
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn matches(&self, event_type: &str) -> bool {
        chorus_runtime::glob::matches(&self.0, event_type)
    }

    /// The pattern as a SQL `LIKE … ESCAPE '\'` operand.
    pub fn to_like(&self) -> String {
        let mut like = String::with_capacity(self.0.len() + 4);
        for c in self.0.chars() {
            match c {
                '*' => like.push('%'),
                '_' | '%' | '\\' => {
                    like.push('\\');
                    like.push(c);
                }
                c => like.push(c),
            }
        }
        like
    }

    /// The pattern as a SQLite `GLOB` operand: the characters a pattern may
    /// hold are literal in GLOB except `*`, which means the same.
    pub fn to_glob(&self) -> String {
        self.0.clone()
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(value: &str) -> Pattern {
        Pattern::parse("p", value).unwrap()
    }

    #[test]
    fn patterns_match_runs_of_any_characters() {
        assert!(pattern("task.completed").matches("task.completed"));
        assert!(!pattern("task.completed").matches("task.completed.x"));
        assert!(pattern("task.*").matches("task.completed"));
        assert!(pattern("task.*").matches("task."));
        assert!(!pattern("task.*").matches("task"));
        assert!(pattern("*.failed").matches("task.sub.failed"));
        assert!(pattern("*").matches("anything.at.all"));
        assert!(pattern("a*b*c").matches("abc"));
        assert!(pattern("a*b*c").matches("a.x.b.y.c"));
        assert!(!pattern("a*b*c").matches("a.c.b"));
        assert!(!pattern("ab*ba").matches("aba"));
    }

    #[test]
    fn sql_forms_escape_what_sql_would_read_as_wildcards() {
        assert_eq!(pattern("turn_after.*").to_like(), "turn\\_after.%");
        assert_eq!(pattern("tool:called").to_glob(), "tool:called");
    }

    #[test]
    fn bad_types_are_rejected() {
        assert!(EventType::parse("t", "").is_err());
        assert!(EventType::parse("t", "task.*").is_err());
        assert!(EventType::parse("t", "task completed").is_err());
        assert!(EventType::parse("t", &"a".repeat(201)).is_err());
        assert!(Pattern::parse("p", "task[0]").is_err());
        assert!(Pattern::parse("p", "task?").is_err());
    }
}
