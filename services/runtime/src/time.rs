//! Time as the services store it: microseconds since the Unix epoch, and its
//! conversions to and from `google.protobuf.Timestamp`.

use prost_types::Timestamp;

use crate::validate::FieldViolation;

/// Microseconds since the Unix epoch, now.
pub fn now_micros() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_micros()).unwrap_or(i64::MAX)
}

/// A stored time as a protobuf timestamp.
pub fn timestamp(micros: i64) -> Timestamp {
    let nanos = i32::try_from(micros.rem_euclid(1_000_000) * 1_000).unwrap_or_default();
    Timestamp { seconds: micros.div_euclid(1_000_000), nanos }
}

/// A protobuf timestamp from a request, checked, in microseconds.
pub fn timestamp_micros(field: &str, value: Option<Timestamp>) -> Result<Option<i64>, FieldViolation> {
    let Some(value) = value else {
        return Ok(None);
    };
    if !(0..1_000_000_000).contains(&value.nanos) {
        return Err(FieldViolation::new(field, "nanos must be within 0..1e9"));
    }
    value
        .seconds
        .checked_mul(1_000_000)
        .and_then(|micros| micros.checked_add(i64::from(value.nanos / 1_000)))
        .map(Some)
        .ok_or_else(|| FieldViolation::new(field, "is out of range"))
}

/// A duration as a person writes it in a definition or a config: `300ms`,
/// `45s`, `5m`, `2h` (the largest unit it is a whole number of).
pub fn humanize(duration: std::time::Duration) -> String {
    match duration.as_secs() {
        0 => format!("{}ms", duration.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// How long from `from` until `to` (both in microseconds): nothing when `to`
/// is not later.
pub fn until(from: i64, to: i64) -> std::time::Duration {
    std::time::Duration::from_micros(u64::try_from(to.saturating_sub(from)).unwrap_or_default())
}

/// A duration in microseconds, saturating.
pub fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        let cases = [(300, "300ms"), (45_000, "45s"), (300_000, "5m"), (7_200_000, "2h"), (90_000, "90s")];
        for (millis, text) in cases {
            assert_eq!(humanize(std::time::Duration::from_millis(millis)), text);
        }
    }

    #[test]
    fn timestamps_round_trip_through_micros() {
        for micros in [0, 1, 1_700_000_000_123_456, -5] {
            assert_eq!(timestamp_micros("t", Some(timestamp(micros))).unwrap(), Some(micros));
        }
        assert!(timestamp_micros("t", Some(Timestamp { seconds: 1, nanos: -1 })).is_err());
        assert!(timestamp_micros("t", Some(Timestamp { seconds: i64::MAX, nanos: 0 })).is_err());
        assert_eq!(timestamp_micros("t", None).unwrap(), None);
    }

    #[test]
    fn until_is_never_negative() {
        assert_eq!(until(1_000, 3_500), std::time::Duration::from_micros(2_500));
        assert_eq!(until(3_500, 1_000), std::time::Duration::ZERO);
    }
}
