//! What a database error means to a caller, decided here and nowhere else,
//! and how one that stops a process reads.

use super::ServiceMigrations;

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

/// Each message says its cause in its own words, so the cause is not also
/// its `source`: a report of the error's chain said it twice.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("unsupported database url {url}: use postgres://… or sqlite://…")]
    UnsupportedUrl { url: String },
    #[error("cannot create data directory {dir}: {cause}")]
    DataDir { dir: String, cause: std::io::Error },
    #[error("cannot connect to {url}: {}", reason(cause))]
    Connect { url: String, cause: sqlx::Error },
    #[error("migrations of {service} failed: {}", migrate_reason(service, cause))]
    Migrate { service: &'static str, cause: sqlx::migrate::MigrateError },
}

/// Why a connection or a statement failed, in an operator's words where
/// sqlx's are its pool's.
pub(super) fn reason(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::PoolTimedOut => "the database did not answer in time (storage.acquire_timeout_ms): it accepts \
                                      TCP connections but no session starts; is it overloaded, or is this its port?"
            .to_owned(),
        // The server's words, without where in its own code it said them.
        sqlx::Error::Database(error) => error.message().to_owned(),
        other => other.to_string(),
    }
}

/// Why migrations failed, in an operator's words where sqlx's name its own
/// table or leave the cause to guess.
fn migrate_reason(service: &str, error: &sqlx::migrate::MigrateError) -> String {
    use sqlx::migrate::MigrateError;
    let table = ServiceMigrations::table(service);
    match error {
        MigrateError::VersionMissing(version) => format!(
            "the database holds {service} migration {version}, which this chorus does not have: a newer chorus \
             migrated it. Run that version or a later one (chorus does not migrate down)"
        ),
        MigrateError::VersionMismatch(version) => format!(
            "{service} migration {version} in the database ({table}) differs from this chorus's: the database was \
             migrated by another build of this version"
        ),
        MigrateError::Dirty(version) => format!(
            "{service} migration {version} is partially applied (a run failed part way): repair the schema by hand, \
             then delete its row from {table}"
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use crate::storage::{Db, MigrationFile, ServiceMigrations, StorageConfig};

    /// The server's refusal, once: in the message alone (no chain repeating
    /// it), without the line of PostgreSQL's code that raised it.
    #[tokio::test]
    async fn a_database_that_does_not_exist_is_said_once_in_the_servers_words() {
        let Ok(url) = std::env::var(crate::testing::POSTGRES_URL_VAR) else { return };
        let url = crate::testing::database_url(&url, "chorus_no_such_database");
        let error = Db::connect(&url, &StorageConfig::default()).await.expect_err("no such database");
        let text = error.to_string();
        assert!(text.ends_with(r#": database "chorus_no_such_database" does not exist"#), "{text}");
        assert!(std::error::Error::source(&error).is_none(), "the message says the cause: {text}");
    }

    /// A database a newer chorus migrated (a rollback of the binary) is
    /// named as such, and changes nothing.
    #[tokio::test]
    async fn a_database_migrated_by_a_newer_chorus_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig { data_dir: dir.path().display().to_string(), ..Default::default() };
        let db = Db::connect(&config.effective_url().unwrap(), &config).await.unwrap();
        const NEWER: &[MigrationFile] = &[
            MigrationFile { version: 1, description: "t", sql: "CREATE TABLE demo_t (x BIGINT)" },
            MigrationFile { version: 2, description: "u", sql: "CREATE TABLE demo_u (x BIGINT)" },
        ];
        db.migrate(&ServiceMigrations { service: "demo", postgres: NEWER, sqlite: NEWER }).await.unwrap();
        let older = ServiceMigrations { service: "demo", postgres: &NEWER[..1], sqlite: &NEWER[..1] };
        let error = db.migrate(&older).await.unwrap_err().to_string();
        assert!(error.contains("holds demo migration 2, which this chorus does not have: a newer chorus"), "{error}");
    }
}
