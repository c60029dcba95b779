//! What a database error means to a caller, decided here and nowhere else.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbErrorKind {
    UniqueViolation,
    ForeignKeyViolation,
    /// Retryable: connection trouble, pool exhaustion, lock or serialization conflicts.
    Unavailable,
    Other,
}

/// A database error as one of a service's two storage errors: `unavailable`
/// when retrying later may help, else `other`.
pub fn storage_error<E>(
    error: sqlx::Error,
    unavailable: impl FnOnce(sqlx::Error) -> E,
    other: impl FnOnce(sqlx::Error) -> E,
) -> E {
    match classify(&error) {
        DbErrorKind::Unavailable => unavailable(error),
        DbErrorKind::UniqueViolation | DbErrorKind::ForeignKeyViolation | DbErrorKind::Other => other(error),
    }
}

/// Classifies a sqlx error.
pub fn classify(error: &sqlx::Error) -> DbErrorKind {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            DbErrorKind::Unavailable
        }
        sqlx::Error::Database(database_error) => {
            if database_error.is_unique_violation() {
                return DbErrorKind::UniqueViolation;
            }
            if database_error.is_foreign_key_violation() {
                return DbErrorKind::ForeignKeyViolation;
            }
            // SQLite: 5 busy, 6 locked, with their extended codes (517 busy
            // snapshot, ...) above the low byte. PostgreSQL: 40001
            // serialization failure, 40P01 deadlock, 55P03 lock not available.
            let code = database_error.code();
            let code = code.as_deref().unwrap_or_default();
            if database_error.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                return match code.parse::<u32>() {
                    Ok(code) if matches!(code & 0xff, 5 | 6) => DbErrorKind::Unavailable,
                    _ => DbErrorKind::Other,
                };
            }
            match code {
                "40001" | "40P01" | "55P03" => DbErrorKind::Unavailable,
                _ => DbErrorKind::Other,
            }
        }
        _ => DbErrorKind::Other,
    }
}
