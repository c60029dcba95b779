//! Checks for proto input at the handler edge. Each failure names its field.

use std::time::Duration;

/// A request field that is missing or malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldViolation {
    pub field: String,
    pub reason: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }

    pub fn required(field: impl Into<String>) -> Self {
        Self::new(field, "is required")
    }

    /// The same violation inside a nested message: `message.parts[0]`.
    pub fn nested(self, parent: &str) -> Self {
        Self { field: format!("{parent}.{}", self.field), ..self }
    }
}

impl crate::error::ServiceError for FieldViolation {
    fn error_code(&self) -> crate::error::ErrorCode {
        crate::error::ErrorCode::InvalidArgument
    }

    fn field(&self) -> Option<&str> {
        Some(&self.field)
    }
}

impl From<FieldViolation> for tonic::Status {
    fn from(violation: FieldViolation) -> Self {
        crate::error::into_status(violation)
    }
}

/// Longest accepted identifier (namespace, agent, task, ...).
pub const MAX_ID_LEN: usize = 200;

/// A namespace: 1–63 characters of `a-z 0-9 - _ .`, starting alphanumeric.
pub fn namespace(value: &str) -> Result<String, FieldViolation> {
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c);
    if value.is_empty() {
        return Err(FieldViolation::required("namespace"));
    }
    if value.len() > 63 || !value.chars().all(valid_char) || !value.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(FieldViolation::new(
            "namespace",
            "must be 1-63 characters of a-z, 0-9, '-', '_' or '.', starting with a letter or digit",
        ));
    }
    Ok(value.to_owned())
}

/// Whether `c` is an invisible format character: a bidirectional control, a
/// zero-width one, a soft hyphen, a tag (Unicode's `Cf` category, in effect).
/// In an id they make two ids that look alike differ, or one id show as
/// another (`Trojan Source`).
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// A non-empty identifier of printable characters, at most [`MAX_ID_LEN`]
/// bytes, with no invisible ones.
pub fn id(field: &str, value: &str) -> Result<String, FieldViolation> {
    if value.is_empty() {
        return Err(FieldViolation::required(field));
    }
    if value.len() > MAX_ID_LEN {
        return Err(FieldViolation::new(field, format!("must be at most {MAX_ID_LEN} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(FieldViolation::new(field, "must not contain control characters"));
    }
    if let Some(c) = value.chars().find(|&c| is_invisible(c)) {
        return Err(FieldViolation::new(
            field,
            format!("must not contain invisible characters (U+{:04X}: bidirectional or zero-width)", u32::from(c)),
        ));
    }
    Ok(value.to_owned())
}

/// Like [`id`], but empty means absent.
pub fn optional_id(field: &str, value: &str) -> Result<Option<String>, FieldViolation> {
    if value.is_empty() {
        return Ok(None);
    }
    id(field, value).map(Some)
}

/// Whether `content_type` names JSON: `application/json`, whatever its case
/// or parameters (`; charset=utf-8`).
/// Longest event type or pattern.
const MAX_EVENT_TYPE: usize = 200;

/// An event type such as `task.completed`, 1..200 characters of
/// `A-Z a-z 0-9 . _ : / -`; as a `pattern`, `*` too.
pub fn event_type(field: &str, value: &str, pattern: bool) -> Result<(), FieldViolation> {
    if value.is_empty() {
        return Err(FieldViolation::required(field));
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || "._:/-".contains(c) || (pattern && c == '*');
    if value.len() > MAX_EVENT_TYPE || !value.chars().all(valid) {
        let star = if pattern { ", '-' or '*'" } else { " or '-'" };
        return Err(FieldViolation::new(
            field,
            format!("must be 1-{MAX_EVENT_TYPE} characters of letters, digits, '.', '_', ':', '/'{star}"),
        ));
    }
    Ok(())
}

pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// A payload labelled JSON must be JSON; an empty one is no payload.
pub fn json_payload(field: &str, content_type: &str, payload: &[u8]) -> Result<(), FieldViolation> {
    if payload.is_empty() || !is_json(content_type) {
        return Ok(());
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(payload).map(drop).map_err(|error| {
        FieldViolation::new(field, format!("is not JSON ({error}); give its content_type if it is not"))
    })
}

/// The most entries a list filter may hold (event types, senders, kinds):
/// each becomes a condition of one statement, and databases bound those.
pub const MAX_FILTER_ENTRIES: usize = 256;

/// Checks a list filter's length against [`MAX_FILTER_ENTRIES`].
pub fn filter_len(field: &str, len: usize) -> Result<(), FieldViolation> {
    if len > MAX_FILTER_ENTRIES {
        return Err(FieldViolation::new(field, format!("at most {MAX_FILTER_ENTRIES} entries, found {len}")));
    }
    Ok(())
}

/// A count of at most `max`; zero (unset) means `default`.
pub fn count(field: &str, value: u32, default: u32, max: u32) -> Result<u32, FieldViolation> {
    match value {
        0 => Ok(default),
        value if value <= max => Ok(value),
        value => Err(FieldViolation::new(field, format!("must be at most {max}, not {value}"))),
    }
}

/// The longest `google.protobuf.Duration`: 10,000 years.
const MAX_DURATION_SECONDS: u64 = 315_576_000_000;

/// A non-negative protobuf duration within the type's range (10,000 years;
/// beyond it, deadlines computed from it overflow), or `default` when absent.
pub fn duration(
    field: &str,
    value: Option<prost_types::Duration>,
    default: Duration,
) -> Result<Duration, FieldViolation> {
    let Some(value) = value else {
        return Ok(default);
    };
    // As google.protobuf.Duration defines them: nanos within a second, of
    // the sign of the seconds (here, not negative).
    if !(0..1_000_000_000).contains(&value.nanos) {
        return Err(FieldViolation::new(field, "must have nanos from 0 to 999,999,999"));
    }
    Duration::try_from(value)
        .ok()
        .filter(|duration| duration.as_secs() < MAX_DURATION_SECONDS)
        .ok_or_else(|| FieldViolation::new(field, "must be a non-negative duration of less than 10,000 years"))
}

/// As [`duration`], and a zero duration also means `default`.
pub fn nonzero_duration(
    field: &str,
    value: Option<prost_types::Duration>,
    default: Duration,
) -> Result<Duration, FieldViolation> {
    let duration = duration(field, value, default)?;
    Ok(if duration.is_zero() { default } else { duration })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        assert!(namespace("team-a.prod_1").is_ok());
        assert_eq!(namespace("").unwrap_err().reason, "is required");
        assert!(namespace("Team").is_err());
        assert!(namespace("-x").is_err());
        assert!(namespace(&"a".repeat(64)).is_err());
    }

    #[test]
    fn ids() {
        assert!(id("task_id", "abc").is_ok());
        assert_eq!(id("task_id", "").unwrap_err().field, "task_id");
        assert!(id("task_id", "a\u{7}b").is_err());
        for invisible in ["admin\u{202E}nimda", "ta\u{200B}sk", "\u{FEFF}task", "a\u{2066}b", "x\u{E0041}"] {
            let refused = id("task_id", invisible).unwrap_err();
            assert!(refused.reason.contains("invisible"), "{invisible:?}: {refused}");
        }
        assert!(id("agent_id", "café-日本-🙂").is_ok(), "visible letters and symbols are fine");
        assert!(id("task_id", &"x".repeat(MAX_ID_LEN + 1)).is_err());
        assert_eq!(optional_id("context_id", "").unwrap(), None);
    }

    #[test]
    fn payloads_labelled_json_are_json() {
        assert!(json_payload("payload", "application/json", br#"{"a": 1}"#).is_ok());
        assert!(json_payload("payload", "Application/JSON; charset=utf-8", b"[1, 2]").is_ok());
        assert!(json_payload("payload", "application/json", b"").is_ok(), "no payload");
        assert!(json_payload("payload", "text/plain", b"not json").is_ok());
        let refused = json_payload("content.payload", "application/json", b"not json").unwrap_err();
        assert_eq!(refused.field, "content.payload");
        assert!(json_payload("payload", "application/json", b"{\"a\": 1} trailing").is_err());
    }

    #[test]
    fn durations() {
        let negative = prost_types::Duration { seconds: -1, nanos: 0 };
        assert!(duration("lease", Some(negative), Duration::ZERO).is_err());
        assert_eq!(duration("lease", None, Duration::from_secs(3)).unwrap(), Duration::from_secs(3));
        let huge = prost_types::Duration { seconds: i64::MAX, nanos: 999_999_999 };
        assert!(duration("lease", Some(huge), Duration::ZERO).is_err());
        let longest = prost_types::Duration { seconds: 315_575_999_999, nanos: 0 };
        assert!(duration("lease", Some(longest), Duration::ZERO).is_ok());
        // Malformed: nanos past a second, or of the other sign than the seconds.
        for (seconds, nanos) in [(1, -5), (0, 2_000_000_000), (0, 1_420_103_679)] {
            let malformed = prost_types::Duration { seconds, nanos };
            let refused = duration("lease", Some(malformed), Duration::ZERO).unwrap_err();
            assert_eq!(refused.reason, "must have nanos from 0 to 999,999,999", "{seconds} s {nanos} ns");
        }
        let precise = prost_types::Duration { seconds: 1, nanos: 500_000_000 };
        assert_eq!(duration("lease", Some(precise), Duration::ZERO).unwrap(), Duration::from_millis(1500));
    }
}
