//! Reading YAML nodes with positions: every accessor reports what it
//! expected, where, as a [`Problem`], and keeps going.

use std::time::Duration;

use saphyr::{MarkedYaml, Scalar, YamlData};
use serde_json::{Map, Number, Value};

use crate::domain::{Problem, Severity};

pub(crate) type Node<'a> = MarkedYaml<'a>;

/// Collects problems for one source file.
#[derive(Debug)]
pub(crate) struct Reader {
    file: String,
    pub(crate) problems: Vec<Problem>,
}

/// A mapping's entries by key, in source order.
pub(crate) struct Fields<'n, 'a> {
    pub(crate) node: &'n Node<'a>,
    entries: Vec<(String, &'n Node<'a>)>,
    keys: Vec<&'n Node<'a>>,
}

impl<'n, 'a> Fields<'n, 'a> {
    pub(crate) fn get(&self, key: &str) -> Option<&'n Node<'a>> {
        self.entries.iter().find(|(name, _)| name == key).map(|(_, value)| *value)
    }

    /// The node of `key` itself, to point at a field's name.
    pub(crate) fn key_node(&self, key: &str) -> Option<&'n Node<'a>> {
        let index = self.entries.iter().position(|(name, _)| name == key)?;
        self.keys.get(index).copied()
    }

    pub(crate) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(name, _)| name.as_str())
    }

    pub(crate) fn entries(&self) -> &[(String, &'n Node<'a>)] {
        &self.entries
    }
}

/// `parent.child`, or `child` at the top.
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() { child.to_owned() } else { format!("{parent}.{child}") }
}

/// The text of a string scalar.
pub(crate) fn as_text<'n>(node: &'n Node<'_>) -> Option<&'n str> {
    match &node.data {
        YamlData::Value(Scalar::String(text)) => Some(text),
        YamlData::Representation(text, ..) => Some(text),
        _ => None,
    }
}

/// What a node is, for "expected X, found Y".
fn kind_of(node: &Node<'_>) -> &'static str {
    match &node.data {
        YamlData::Value(Scalar::Null) => "nothing",
        YamlData::Value(Scalar::Boolean(_)) => "a boolean",
        YamlData::Value(Scalar::Integer(_)) => "an integer",
        YamlData::Value(Scalar::FloatingPoint(_)) => "a number",
        YamlData::Value(Scalar::String(_)) | YamlData::Representation(..) => "a string",
        YamlData::Sequence(_) => "a list",
        YamlData::Mapping(_) => "a mapping",
        YamlData::Tagged(..) => "a tagged value",
        YamlData::Alias(_) | YamlData::BadValue => "an unsupported value",
    }
}

impl Reader {
    pub(crate) fn new(file: &str) -> Self {
        Self { file: file.to_owned(), problems: Vec::new() }
    }

    pub(crate) fn file(&self) -> &str {
        &self.file
    }

    /// A problem at `node` (or without a position).
    pub(crate) fn report(
        &mut self,
        severity: Severity,
        node: Option<&Node<'_>>,
        field: &str,
        code: &str,
        message: String,
    ) {
        // A problem of no node (of the whole document) is at its start.
        let (line, column) = node.map_or((1, 1), |node| position(node));
        self.problems.push(Problem {
            severity,
            file: self.file.clone(),
            line,
            column,
            field: field.to_owned(),
            code: code.to_owned(),
            message,
        });
    }

    pub(crate) fn error(&mut self, node: Option<&Node<'_>>, field: &str, code: &str, message: impl Into<String>) {
        self.report(Severity::Error, node, field, code, message.into());
    }

    fn expected(&mut self, node: &Node<'_>, field: &str, what: &str) {
        let message = format!("expected {what}, found {}", kind_of(node));
        self.error(Some(node), field, "wrong_type", message);
    }

    /// The mapping at `node`; keys outside `allowed` are `unknown_field` problems.
    pub(crate) fn mapping<'n, 'a>(
        &mut self,
        node: &'n Node<'a>,
        field: &str,
        allowed: &[&str],
    ) -> Option<Fields<'n, 'a>> {
        let YamlData::Mapping(mapping) = &node.data else {
            self.expected(node, field, "a mapping");
            return None;
        };
        let mut entries = Vec::with_capacity(mapping.len());
        let mut keys = Vec::with_capacity(mapping.len());
        for (key, value) in mapping {
            let Some(name) = as_text(key) else {
                self.expected(key, field, "a string key");
                continue;
            };
            if !allowed.is_empty() && !allowed.contains(&name) {
                let message = format!("unknown field `{name}`; expected one of: {}", allowed.join(", "));
                self.error(Some(key), &join(field, name), "unknown_field", message);
                continue;
            }
            entries.push((name.to_owned(), value));
            keys.push(key);
        }
        Some(Fields { node, entries, keys })
    }

    /// A required field: reported at the mapping when absent.
    pub(crate) fn required<'n, 'a>(
        &mut self,
        fields: &Fields<'n, 'a>,
        parent: &str,
        key: &str,
        what: &str,
    ) -> Option<&'n Node<'a>> {
        let value = fields.get(key);
        if value.is_none() {
            let message = format!("missing field `{key}`: expected {what}");
            self.error(Some(fields.node), &join(parent, key), "missing_field", message);
        }
        value
    }

    pub(crate) fn sequence<'n, 'a>(&mut self, node: &'n Node<'a>, field: &str) -> Option<&'n [Node<'a>]> {
        match &node.data {
            YamlData::Sequence(items) => Some(items),
            _ => {
                self.expected(node, field, "a list");
                None
            }
        }
    }

    /// A non-empty string.
    pub(crate) fn string(&mut self, node: &Node<'_>, field: &str) -> Option<String> {
        match as_text(node) {
            Some(text) if !text.trim().is_empty() => Some(text.to_owned()),
            Some(_) => {
                self.error(Some(node), field, "empty_value", "expected a non-empty string");
                None
            }
            None => {
                self.expected(node, field, "a string");
                None
            }
        }
    }

    pub(crate) fn boolean(&mut self, node: &Node<'_>, field: &str) -> Option<bool> {
        if let YamlData::Value(Scalar::Boolean(value)) = &node.data {
            return Some(*value);
        }
        self.expected(node, field, "true or false");
        None
    }

    /// An integer in `min..=max`.
    pub(crate) fn integer(&mut self, node: &Node<'_>, field: &str, min: u32, max: u32) -> Option<u32> {
        let value = match &node.data {
            YamlData::Value(Scalar::Integer(value)) => *value,
            _ => {
                self.expected(node, field, &format!("an integer from {min} to {max}"));
                return None;
            }
        };
        match u32::try_from(value) {
            Ok(value) if (min..=max).contains(&value) => Some(value),
            _ => {
                self.error(
                    Some(node),
                    field,
                    "out_of_range",
                    format!("expected an integer from {min} to {max}, found {value}"),
                );
                None
            }
        }
    }

    /// A duration such as `30s`, `5m`, `24h`, `7d` or `500ms`, of at most
    /// [`MAX_DURATION`].
    pub(crate) fn duration(&mut self, node: &Node<'_>, field: &str) -> Option<Duration> {
        if let YamlData::Value(Scalar::Integer(_) | Scalar::FloatingPoint(_)) = &node.data {
            let message = format!("expected a duration with its unit, such as 30s or 5m, found {}", kind_of(node));
            self.error(Some(node), field, "bad_duration", message);
            return None;
        }
        let text = self.string(node, field)?;
        let Some(parsed) = parse_duration(&text) else {
            let message = format!("expected a positive duration such as 30s, 5m, 24h or 7d, found `{text}`");
            self.error(Some(node), field, "bad_duration", message);
            return None;
        };
        if parsed > MAX_DURATION {
            let message = format!("expected a duration of at most 100 years (36500d), found `{text}`");
            self.error(Some(node), field, "out_of_range", message);
            return None;
        }
        Some(parsed)
    }

    /// One of `choices`.
    pub(crate) fn choice<T: Copy>(&mut self, node: &Node<'_>, field: &str, choices: &[(&str, T)]) -> Option<T> {
        let text = self.string(node, field)?;
        let found = choices.iter().find(|(name, _)| name.eq_ignore_ascii_case(&text)).map(|(_, value)| *value);
        if found.is_none() {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            let message = format!("expected one of {}, found `{text}`", names.join(", "));
            self.error(Some(node), field, "bad_value", message);
        }
        found
    }

    /// Any YAML value as JSON.
    pub(crate) fn value(&mut self, node: &Node<'_>, field: &str) -> Option<Value> {
        Some(match &node.data {
            YamlData::Value(Scalar::Null) => Value::Null,
            YamlData::Value(Scalar::Boolean(value)) => Value::Bool(*value),
            YamlData::Value(Scalar::Integer(value)) => Value::from(*value),
            YamlData::Value(Scalar::FloatingPoint(value)) => Number::from_f64(value.into_inner()).map(Value::Number)?,
            YamlData::Value(Scalar::String(text)) | YamlData::Representation(text, ..) => {
                Value::String(text.to_string())
            }
            YamlData::Sequence(items) => {
                let values: Vec<Value> = items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, item)| self.value(item, &format!("{field}[{i}]")))
                    .collect();
                Value::Array(values)
            }
            YamlData::Mapping(_) => {
                let fields = self.mapping(node, field, &[])?;
                let mut object = Map::new();
                for (key, value) in fields.entries() {
                    if let Some(value) = self.value(value, &join(field, key)) {
                        object.insert(key.clone(), value);
                    }
                }
                Value::Object(object)
            }
            YamlData::Tagged(..) | YamlData::Alias(_) | YamlData::BadValue => {
                self.expected(node, field, "a plain YAML value");
                return None;
            }
        })
    }
}

/// 1-based line and column of a node.
pub(crate) fn position(node: &Node<'_>) -> (u32, u32) {
    let start = node.span.start;
    (u32::try_from(start.line()).unwrap_or(u32::MAX), u32::try_from(start.col() + 1).unwrap_or(u32::MAX))
}

/// The longest duration a definition may give (100 years of 365 days): far
/// beyond any wait a run makes, and a time so far ahead stays a date every
/// client can show.
const MAX_DURATION: Duration = Duration::from_secs(36_500 * 86_400);

/// `30s`, `5m`, `24h`, `7d`, `500ms`; a positive whole number and a unit.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, unit) = text.split_at(split);
    let amount: u64 = digits.parse().ok().filter(|amount| *amount > 0)?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(amount.checked_mul(millis)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit_and_a_positive_amount() {
        assert_eq!(parse_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("0s"), None);
        assert_eq!(parse_duration("5 weeks"), None);
    }
}
