//! Pieces of SQL text that both backends share, and the values bound to them.

use super::Backend;

impl Backend {
    /// A subquery yielding the elements of the JSON array bound to `param`
    /// (e.g. `$3`), each cast to `sql_type` (`BIGINT`, `TEXT`). One
    /// parameter whatever the list's length, so the statement's text — and
    /// its cached plan — stay the same; `IN ($3, $4, …)` would make a new
    /// statement, parsed and planned anew, for every length.
    pub fn json_elements(self, param: &str, sql_type: &str) -> String {
        match self {
            Self::Postgres => format!("SELECT CAST(jsonb_array_elements_text(CAST({param} AS jsonb)) AS {sql_type})"),
            Self::Sqlite => format!("SELECT CAST(value AS {sql_type}) FROM json_each({param})"),
        }
    }
}

/// How many values to bind for a list of `count`: the next power of two, the
/// list padded with repeats of its last value. `IN ($3, $4, …)` is a new
/// statement — parsed and planned anew, and crowding the statement cache —
/// for every distinct length; padding keeps it to a handful.
pub fn padded_len(count: usize) -> usize {
    count.max(1).next_power_of_two()
}

/// `$first, $first+1, ...`: `count` numbered placeholders, for statements
/// built with a variable number of values.
pub fn placeholders(first: usize, count: usize) -> String {
    (first..first + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}
