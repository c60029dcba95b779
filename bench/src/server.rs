//! The `chorus` binary under test: built in release mode (or named by the
//! caller) and run as `chorus serve taskstore|eventbus|hub` on a scratch database,
//! or as `chorus dev` (the whole fabric, gateway included).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use tokio::{
    io::{AsyncBufReadExt as _, BufReader},
    process::{Child, Command},
};

/// How long chorus may take to connect, migrate and listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What chorus prints on stdout once it serves.
const ANNOUNCE: &str = "chorus listening on ";

/// Variables for this benchmark, not for chorus: its configuration loader
/// would refuse them as unknown `CHORUS_*` keys.
const BENCH_ENV_PREFIX: &str = "CHORUS_BENCH_";

/// The workspace this crate belongs to.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Builds the release `chorus` binary with cargo (its progress on stderr),
/// then asks cargo where it is (from its artifact report, so any target
/// directory works; the second build has nothing left to do).
async fn build_release() -> anyhow::Result<PathBuf> {
    const BUILD: [&str; 4] = ["build", "--release", "--bin", "chorus"];
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("building the release chorus binary (cargo build --release --bin chorus)…");
    let started = std::time::Instant::now();
    let status = Command::new(&cargo)
        .args(BUILD)
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .status()
        .await
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build --release --bin chorus failed: {status}");
    }
    let output = Command::new(&cargo)
        .args(BUILD)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .context("cannot run cargo")?;
    if !output.status.success() {
        bail!("cargo build --release --bin chorus failed: {}", output.status);
    }
    let executable = chorus_executable(&String::from_utf8_lossy(&output.stdout));
    eprintln!("chorus is ready ({:.0} s)", started.elapsed().as_secs_f64());
    executable.context("cargo reported no chorus executable")
}

/// The `chorus` executable in cargo's JSON messages.
fn chorus_executable(messages: &str) -> Option<PathBuf> {
    messages.lines().filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok()).find_map(|message| {
        let is_chorus = message["reason"] == "compiler-artifact" && message["target"]["name"] == "chorus";
        is_chorus.then(|| message["executable"].as_str().map(PathBuf::from)).flatten()
    })
}

/// The release chorus binary: `named` by the caller, or built.
pub(crate) async fn release_binary(named: Option<&Path>) -> anyhow::Result<PathBuf> {
    let binary = match named {
        Some(binary) => binary.to_owned(),
        None => build_release().await?,
    };
    // Absolute: chorus runs in a scratch directory.
    let binary = std::fs::canonicalize(&binary).with_context(|| format!("no chorus binary at {}", binary.display()))?;
    if !binary.is_file() {
        bail!("{} is not a file", binary.display());
    }
    Ok(binary)
}

/// Names of the `CHORUS_*` variables chorus inherits, sorted.
pub(crate) fn inherited_env() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("CHORUS_") && !name.starts_with(BENCH_ENV_PREFIX))
        .collect();
    names.sort();
    names
}

/// A running `chorus serve SERVICE` or `chorus dev`.
#[derive(Debug)]
pub(crate) struct Server {
    child: Child,
    pub(crate) pid: u32,
    pub(crate) endpoint: String,
    stderr_path: PathBuf,
}

impl Server {
    /// Starts `chorus serve <service>` on `database_url` and waits for its
    /// announcement. Its logs (RUST_LOG=warn) go to a file in `workdir`,
    /// shown if it fails.
    pub(crate) async fn start(
        binary: &Path,
        service: &str,
        database_url: &str,
        workdir: &Path,
    ) -> anyhow::Result<Self> {
        Self::start_with_env(binary, service, database_url, workdir, &[]).await
    }

    /// [`Server::start`] with settings as `CHORUS_*` variables.
    pub(crate) async fn start_with_env(
        binary: &Path,
        service: &str,
        database_url: &str,
        workdir: &Path,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let args = ["serve", service, "--listen", "127.0.0.1:0", "--database-url", database_url];
        Self::spawn(binary, &args, workdir, env).await
    }

    /// Starts `chorus dev` (every service and the built-in agents in one
    /// process) on `database_url`, or on SQLite in `workdir` when it is `None`.
    pub(crate) async fn start_dev(binary: &Path, database_url: Option<&str>, workdir: &Path) -> anyhow::Result<Self> {
        let data_dir = workdir.join("data");
        let data_dir = data_dir.to_str().context("the temp dir's path is not UTF-8")?;
        let mut args = vec!["dev", "--listen", "127.0.0.1:0", "--data-dir", data_dir];
        if let Some(url) = database_url {
            args.extend(["--database-url", url]);
        }
        Self::spawn(binary, &args, workdir, &[]).await
    }

    /// Runs `binary args` in `workdir` and waits for its announcement.
    async fn spawn(binary: &Path, args: &[&str], workdir: &Path, env: &[(&str, String)]) -> anyhow::Result<Self> {
        let stderr_path = workdir.join("chorus.stderr.log");
        let stderr =
            std::fs::File::create(&stderr_path).with_context(|| format!("cannot create {}", stderr_path.display()))?;
        let mut command = Command::new(binary);
        command
            .args(args)
            // No stray chorus.toml: the defaults plus any CHORUS_* variables.
            .current_dir(workdir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        command.envs(env.iter().map(|(key, value)| (key, value)));
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| name.starts_with(BENCH_ENV_PREFIX)) {
                command.env_remove(name);
            }
        }
        let mut child = command.spawn().with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id().context("chorus exited at once")?;
        let stdout = child.stdout.take().context("chorus stdout is piped")?;
        let announced = tokio::time::timeout(START_TIMEOUT, read_endpoint(stdout)).await;
        let endpoint = match announced {
            Ok(Ok(endpoint)) => endpoint,
            Ok(Err(error)) => bail!("{error:#}\nchorus stderr:\n{}", tail(&stderr_path)),
            Err(_) => {
                bail!("chorus did not announce itself in {START_TIMEOUT:?}\nchorus stderr:\n{}", tail(&stderr_path))
            }
        };
        Ok(Self { child, pid, endpoint, stderr_path })
    }

    /// Fails when chorus has exited (it should serve until stopped).
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait().context("cannot poll chorus")? {
            None => Ok(()),
            Some(status) => bail!("chorus exited ({status})\nchorus stderr:\n{}", tail(&self.stderr_path)),
        }
    }

    /// The end of chorus's log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        tail(&self.stderr_path)
    }

    /// Stops chorus and reaps it.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("cannot stop chorus")
    }
}

/// Reads stdout up to the announcement line; keeps draining it afterwards
/// so chorus never blocks on a full pipe.
async fn read_endpoint(stdout: tokio::process::ChildStdout) -> anyhow::Result<String> {
    let mut lines = BufReader::new(stdout).lines();
    while let Some(line) = lines.next_line().await.context("reading chorus stdout")? {
        if let Some(endpoint) = line.strip_prefix(ANNOUNCE) {
            let endpoint = endpoint.trim().to_owned();
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            return Ok(endpoint);
        }
    }
    bail!("chorus exited before it listened")
}

/// The last lines of a log file, for error messages.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executable_comes_from_the_chorus_artifact() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"chorus_proto"},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"chorus"},"executable":"/t/release/chorus"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(chorus_executable(messages), Some(PathBuf::from("/t/release/chorus")));
        assert_eq!(chorus_executable(r#"{"reason":"build-finished","success":true}"#), None);
    }
}
