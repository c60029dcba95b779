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

    /// SQL that turns `expr`, a hex text made by [`hex`], back into bytes.
    pub fn unhex(self, expr: &str) -> String {
        match self {
            Self::Postgres => format!("decode({expr}, 'hex')"),
            Self::Sqlite => format!("unhex({expr})"),
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

/// Bytes as lowercase hex, for a binary value carried inside a JSON text
/// (which SQL turns back into bytes with [`Backend::unhex`]).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

/// `$first, $first+1, ...`: `count` numbered placeholders, for statements
/// built with a variable number of values.
pub fn placeholders(first: usize, count: usize) -> String {
    (first..first + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Db, StorageConfig};

    #[test]
    fn hex_spells_every_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[tokio::test]
    async fn unhex_reverses_hex_on_sqlite() {
        let db = Db::connect("sqlite::memory:", &StorageConfig::default()).await.unwrap();
        let bytes: Vec<u8> = (0..=255).collect();
        let sql = format!("SELECT {}", Backend::Sqlite.unhex("$1"));
        let back: Vec<u8> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(hex(&bytes)).fetch_one(db.pool()).await.unwrap();
        assert_eq!(back, bytes);
    }
}
