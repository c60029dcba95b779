//! Storage settings, the database a URL selects, and URLs as logs may show them.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::StorageError;

/// Storage settings.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// `postgres://…` or `sqlite://path`; empty: SQLite in `data_dir`.
    pub database_url: String,
    /// Where the embedded SQLite file lives when no URL is given.
    pub data_dir: String,
    /// Pool size on PostgreSQL (a SQLite file has one writer connection and
    /// four read-only ones).
    pub max_connections: u32,
    /// How long a request waits for a pooled connection.
    pub acquire_timeout_ms: u64,
    /// The scheduling priority (nice, -20 to 19) a SQLite file's connection
    /// threads ask for on Linux; 0 leaves them as they are.
    #[serde(deserialize_with = "nice")]
    pub sqlite_thread_nice: i32,
    /// When a SQLite commit is answered: once in the WAL (`normal`: a crash
    /// of chorus loses nothing, one of the machine may lose the last
    /// commits), or once the WAL is synced to disk (`full`).
    pub sqlite_synchronous: SqliteSynchronous,
}

/// SQLite's `PRAGMA synchronous` in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    Normal,
    Full,
}

impl SqliteSynchronous {
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            Self::Normal => "PRAGMA synchronous = NORMAL",
            Self::Full => "PRAGMA synchronous = FULL",
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            database_url: String::new(),
            data_dir: ".chorus".to_owned(),
            max_connections: 24,
            acquire_timeout_ms: 10_000,
            sqlite_thread_nice: -10,
            sqlite_synchronous: SqliteSynchronous::Normal,
        }
    }
}

/// A nice value: from -20 (runs soonest) to 19.
fn nice<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    let nice = i32::deserialize(deserializer)?;
    if (-20..=19).contains(&nice) {
        Ok(nice)
    } else {
        Err(serde::de::Error::custom(format!("{nice} is not a nice value: use -20 to 19")))
    }
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConfig")
            .field("database_url", &redact_url(&self.database_url))
            .field("data_dir", &self.data_dir)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .field("sqlite_thread_nice", &self.sqlite_thread_nice)
            .field("sqlite_synchronous", &self.sqlite_synchronous)
            .finish()
    }
}

impl StorageConfig {
    /// The URL to connect to: the configured one, or SQLite under `data_dir`.
    /// The folder and the database are made readable by their owner alone
    /// (they hold every task, and the credentials of push configs); SQLite
    /// gives its WAL the database's permissions.
    pub fn effective_url(&self) -> Result<String, StorageError> {
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};

        if !self.database_url.is_empty() {
            return Ok(self.database_url.clone());
        }
        let data_dir = |cause| StorageError::DataDir { dir: self.data_dir.clone(), cause };
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.data_dir).map_err(data_dir)?;
        let file = format!("{}/chorus.db", self.data_dir);
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&file) {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(data_dir(error)),
        }
        Ok(format!("sqlite://{file}"))
    }
}

/// A PostgreSQL `url` with `application_name=<name>` added when it names
/// none, so that `pg_stat_activity` tells whose each connection is; any
/// other URL as it is.
pub fn with_application_name(url: &str, name: &str) -> String {
    let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let query = url.split_once('?').map_or("", |(_, query)| query);
    if !postgres || query.split('&').any(|pair| pair.starts_with("application_name=")) {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// Replaces the password in a URL, for logs and `Debug`: the one in its
/// user info (`user:password@`) and a `password` query parameter, which
/// PostgreSQL's URLs also take.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", redact_query(&redact_userinfo(rest))),
        None => redact_query(url),
    }
}

/// The part of a URL after its scheme, its user info's password omitted.
/// As URL parsers read it, the user info ends at the last `@` of the
/// authority, which ends at the first `/`, `?` or `#`. When that authority
/// is no `host:port` (a password holding one of those three, which no
/// parser accepts but an error message repeats), all up to the last `@`
/// may be the password.
fn redact_userinfo(rest: &str) -> String {
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = match authority.rfind('@') {
        Some(at) => Some(at),
        None if !is_host_port(authority) => rest.rfind('@'),
        None => None,
    };
    let Some((userinfo, host)) = at.map(|at| rest.split_at(at)) else { return rest.to_owned() };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{user}:OMITTED{host}"),
        None => rest.to_owned(),
    }
}

/// Whether `authority` reads as a host, with a port or not.
fn is_host_port(authority: &str) -> bool {
    let port = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && !port.ends_with(']') => port,
        _ => return true,
    };
    port.bytes().all(|byte| byte.is_ascii_digit())
}

fn redact_query(url: &str) -> String {
    let Some((address, query)) = url.split_once('?') else { return url.to_owned() };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _password)) if key.eq_ignore_ascii_case("password") => format!("{key}=OMITTED"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{address}?{}", pairs.join("&"))
}

/// Which database a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else {
            Err(StorageError::UnsupportedUrl { url: redact_url(url) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_connections_are_named_unless_the_url_names_them() {
        let name = |url: &str| with_application_name(url, "chorus-hub");
        assert_eq!(name("postgres://h/db"), "postgres://h/db?application_name=chorus-hub");
        assert_eq!(
            name("postgresql://h/db?sslmode=disable"),
            "postgresql://h/db?sslmode=disable&application_name=chorus-hub"
        );
        assert_eq!(name("postgres://h/db?application_name=mine"), "postgres://h/db?application_name=mine");
        assert_eq!(name("postgres://h/db?x=1&application_name=mine"), "postgres://h/db?x=1&application_name=mine");
        assert_eq!(name("sqlite:///tmp/chorus.db"), "sqlite:///tmp/chorus.db", "SQLite has no sessions to name");
    }

    #[test]
    fn the_default_database_is_its_owners_alone() {
        use std::os::unix::fs::PermissionsExt as _;

        let root = tempfile::tempdir().expect("a folder");
        let data_dir = root.path().join("a/.chorus").display().to_string();
        let config = StorageConfig { data_dir: data_dir.clone(), ..StorageConfig::default() };
        let url = config.effective_url().expect("a URL");
        assert_eq!(url, format!("sqlite://{data_dir}/chorus.db"));
        let mode = |path: String| std::fs::metadata(path).expect("made").permissions().mode() & 0o777;
        assert_eq!(mode(data_dir.clone()), 0o700);
        assert_eq!(mode(format!("{data_dir}/chorus.db")), 0o600);
        assert_eq!(config.effective_url().expect("again"), url, "an existing database is kept");
    }

    #[test]
    fn urls_select_backends() {
        assert_eq!(Backend::from_url("postgres://u@h/db").unwrap(), Backend::Postgres);
        assert_eq!(Backend::from_url("sqlite::memory:").unwrap(), Backend::Sqlite);
        assert!(Backend::from_url("mysql://x").is_err());
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact_url("postgres://u:hunter2@h/db"), "postgres://u:OMITTED@h/db");
        assert_eq!(
            redact_url("postgres://u@h/db?password=hunter2&sslmode=disable"),
            "postgres://u@h/db?password=OMITTED&sslmode=disable"
        );
        assert_eq!(
            redact_url("postgres://u:x@h/db?sslmode=disable&PASSWORD=hunter2"),
            "postgres://u:OMITTED@h/db?sslmode=disable&PASSWORD=OMITTED"
        );
        assert_eq!(
            redact_url("postgres://h/db?user=a@b"),
            "postgres://h/db?user=a@b",
            "an @ in the query is no user info"
        );
        assert_eq!(redact_url("sqlite://.chorus/chorus.db?mode=rwc"), "sqlite://.chorus/chorus.db?mode=rwc");
        // Passwords holding what URLs use as separators: an @ (which parsers
        // accept, the user info ending at the last one), or a ?, / or #
        // (which they refuse, and errors repeat).
        for (url, redacted) in [
            ("postgres://u:p@ss@h:5432/db", "postgres://u:OMITTED@h:5432/db"),
            ("postgres://u:p@ss:w0rd@h/db?sslmode=disable", "postgres://u:OMITTED@h/db?sslmode=disable"),
            ("postgres://u:pa?ss@h:5999/x", "postgres://u:OMITTED@h:5999/x"),
            ("postgres://u:pa/ss@h/x", "postgres://u:OMITTED@h/x"),
            ("postgres://u:pa#ss@h/x", "postgres://u:OMITTED@h/x"),
            ("postgres://u@[::1]:5432/db", "postgres://u@[::1]:5432/db"),
            ("postgres://[::1]/db?user=a@b", "postgres://[::1]/db?user=a@b"),
            ("postgres://h:5432/db?user=a@b&password=x", "postgres://h:5432/db?user=a@b&password=OMITTED"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
        let config = StorageConfig { database_url: "postgres://u:hunter2@h/db".into(), ..Default::default() };
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn a_thread_nice_outside_minus_20_to_19_is_refused() {
        let parse = |toml: &str| {
            figment::Figment::from(<figment::providers::Toml as figment::providers::Format>::string(toml))
                .extract::<StorageConfig>()
                .map_err(|error| error.to_string())
        };
        assert_eq!(parse("sqlite_thread_nice = -20").unwrap().sqlite_thread_nice, -20);
        assert_eq!(parse("").unwrap().sqlite_thread_nice, -10);
        let error = parse("sqlite_thread_nice = 20").unwrap_err();
        assert!(error.contains("not a nice value"), "{error}");
        assert!(parse("sqlite_thread_nice = -21").is_err());
    }
}
