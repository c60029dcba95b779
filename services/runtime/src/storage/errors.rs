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

/// Classifies a sqlx error; one that broke its connection is noted, so that
/// no connection goes on being handed out unchecked (see [`super::lane`]).
pub fn classify(error: &sqlx::Error) -> DbErrorKind {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => {
            super::lane::note_connection_lost();
            DbErrorKind::Unavailable
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => DbErrorKind::Unavailable,
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
            // 57P01-03: the server is ending the session (shut down, or the
            // backend terminated); class 08: the connection failed.
            if matches!(code, "57P01" | "57P02" | "57P03") || code.starts_with("08") {
                super::lane::note_connection_lost();
                return DbErrorKind::Unavailable;
            }
            match code {
                "40001" | "40P01" | "55P03" => DbErrorKind::Unavailable,
                _ => DbErrorKind::Other,
            }
        }
        _ => DbErrorKind::Other,
    }
}
