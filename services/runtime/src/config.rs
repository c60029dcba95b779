//! Layered configuration: defaults < `chorus.toml` < `CHORUS_*` environment <
//! command-line flags. Unknown keys are rejected at every layer.
//!
//! Nested keys use `__` in the environment: `CHORUS_STORAGE__DATABASE_URL`
//! sets `storage.database_url`.

use std::path::Path;

use figment::{
    Figment,
    providers::{Env, Format as _, Serialized, Toml},
};
use serde::{Serialize, de::DeserializeOwned};

/// The file read when no `--config` is given, if it exists.
pub const DEFAULT_FILE: &str = "chorus.toml";

/// `CHORUS_*` variables that are not configuration keys: the command line's
/// own (`CHORUS_CONFIG` names the file, `CHORUS_SERVER`, `CHORUS_GATEWAY_URL`
/// and `CHORUS_TOKEN` are flags of the agent and ACP verbs, `CHORUS_URL`
/// the examples') and the test harness's.
const NOT_CONFIG: &[&str] = &["config", "server", "gateway_url", "token", "url", "test_postgres_url", "bin"];
/// And every `CHORUS_BENCH_*`, the benchmark's settings (`make bench`), which
/// a shell that ran it may still export.
const BENCH_PREFIX: &str = "bench_";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {0} does not exist")]
    MissingFile(String),
    /// Said once (not again as its own cause), each problem on a line.
    #[error("invalid configuration: {}", describe(.0))]
    Invalid(Box<figment::Error>),
}

/// Each problem of a figment error: what is wrong, the key as it is written
/// in the file (`taskstore.default_lease_ms`, without figment's profile
/// name before it) and where it came from.
fn describe(error: &figment::Error) -> String {
    let lines: Vec<String> = error
        .clone()
        .into_iter()
        .map(|problem| {
            let key =
                if problem.path.is_empty() { String::new() } else { format!(" for key `{}`", problem.path.join(".")) };
            let origin = match &problem.metadata {
                Some(metadata) => match &metadata.source {
                    Some(source) => format!(" in {source} {}", metadata.name),
                    None => format!(" in {}", metadata.name),
                },
                None => String::new(),
            };
            format!("{}{key}{origin}", problem.kind)
        })
        .collect();
    lines.join("\n")
}

/// Loads a `T` from its defaults, then `file` (or `chorus.toml` when present),
/// then the environment, then `flags` (a serializable struct whose `None`
/// fields are skipped).
pub fn load<T, F>(file: Option<&Path>, flags: &F) -> Result<T, ConfigError>
where
    T: Serialize + DeserializeOwned + Default,
    F: Serialize,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    match file {
        Some(path) if !path.exists() => return Err(ConfigError::MissingFile(path.display().to_string())),
        Some(path) => figment = figment.merge(Toml::file_exact(path)),
        None if Path::new(DEFAULT_FILE).exists() => figment = figment.merge(Toml::file_exact(DEFAULT_FILE)),
        None => {}
    }
    figment
        .merge(
            Env::prefixed("CHORUS_")
                .split("__")
                .ignore(NOT_CONFIG)
                .filter(|key| !key.as_str().to_ascii_lowercase().starts_with(BENCH_PREFIX)),
        )
        .merge(Serialized::defaults(flags))
        .extract()
        .map_err(|error| ConfigError::Invalid(Box::new(error)))
}

#[cfg(test)]
// `figment::Jail` fixes its closures' error type; it is not ours to shrink.
#[allow(clippy::result_large_err)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Demo {
        listen: String,
        inner: Inner,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Inner {
        size: u32,
        name: String,
    }

    impl Default for Demo {
        fn default() -> Self {
            Self { listen: "default".into(), inner: Inner::default() }
        }
    }

    impl Default for Inner {
        fn default() -> Self {
            Self { size: 1, name: "n".into() }
        }
    }

    #[derive(Serialize)]
    struct Flags {
        #[serde(skip_serializing_if = "Option::is_none")]
        listen: Option<String>,
    }

    #[test]
    fn layers_apply_in_order_and_unknown_keys_fail() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "listen = \"file\"\n[inner]\nsize = 5\nname = \"file\"")?;
            jail.set_env("CHORUS_INNER__NAME", "env");
            let no_flags = Flags { listen: None };
            let loaded: Demo = load(Some(Path::new("c.toml")), &no_flags).unwrap();
            assert_eq!(loaded, Demo { listen: "file".into(), inner: Inner { size: 5, name: "env".into() } });

            let flags = Flags { listen: Some("flag".into()) };
            let loaded: Demo = load(Some(Path::new("c.toml")), &flags).unwrap();
            assert_eq!(loaded.listen, "flag");

            jail.set_env("CHORUS_INNER__SIZZE", "3");
            let error = load::<Demo, _>(Some(Path::new("c.toml")), &no_flags).unwrap_err();
            assert!(error.to_string().contains("for key `inner.sizze`"), "{error}");
            assert!(std::error::Error::source(&error).is_none(), "said once, not again as its cause");

            jail.create_file("bad.toml", "[inner]\nsize = \"five\"")?;
            let error = load::<Demo, _>(Some(Path::new("bad.toml")), &no_flags).unwrap_err().to_string();
            assert!(error.contains("for key `inner.size`") && error.contains("bad.toml"), "{error}");
            assert!(!error.contains("default."), "no profile name before the key: {error}");
            Ok(())
        });
    }

    #[test]
    fn a_named_file_must_exist_and_command_line_variables_are_ignored() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("CHORUS_TEST_POSTGRES_URL", "postgres://x");
            jail.set_env("CHORUS_CONFIG", "elsewhere.toml");
            jail.set_env("CHORUS_GATEWAY_URL", "http://127.0.0.1:7800");
            jail.set_env("CHORUS_BENCH_SCENARIOS", "gateway,workflow");
            let no_flags = Flags { listen: None };
            assert!(matches!(
                load::<Demo, _>(Some(Path::new("absent.toml")), &no_flags),
                Err(ConfigError::MissingFile(_))
            ));
            let loaded: Demo = load(None, &no_flags).unwrap();
            assert_eq!(loaded, Demo::default());
            Ok(())
        });
    }
}
