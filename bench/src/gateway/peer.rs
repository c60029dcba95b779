//! The peer chorus is measured against: the a2a-sdk (Python, 1.3.0) echo
//! server of `../shared/peers`, run from its own directory by the Python of
//! a venv this module makes when it is missing, on one uvicorn worker.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::process::{Child, Command};

use super::send::http_client;
use crate::server::tail;

/// The a2a-sdk release the peer is measured on.
const A2A_SDK_VERSION: &str = "1.3.0";

/// What the venv installs.
const REQUIREMENTS: [&str; 2] = ["a2a-sdk[http-server,grpc,sqlite,postgresql]==1.3.0", "uvicorn"];

/// How long the server may take to import, connect and listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What the peer is, for the report.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeerInfo {
    pub(crate) script: String,
    pub(crate) python: String,
    pub(crate) a2a_sdk: String,
    pub(crate) uvicorn: String,
}

/// A venv ready to run the server.
#[derive(Debug)]
pub(crate) struct PeerSetup {
    python: PathBuf,
    script: PathBuf,
    pub(crate) info: PeerInfo,
}

/// Finds the server script and makes the venv if it is missing.
pub(crate) async fn prepare(system_python: &Path, venv: &Path, script: &Path) -> anyhow::Result<PeerSetup> {
    let script = std::fs::canonicalize(script)
        .with_context(|| format!("no a2a-sdk echo server at {} (see --peer-server)", script.display()))?;
    let python = venv.join("bin").join("python");
    if !python.is_file() {
        eprintln!("making a venv with a2a-sdk {A2A_SDK_VERSION} in {} (once)…", venv.display());
        let venv_arg = venv.as_os_str();
        run_quietly(Command::new(system_python).args(["-m".as_ref(), "venv".as_ref(), venv_arg])).await?;
        run_quietly(Command::new(venv.join("bin").join("pip")).args(["install", "--quiet"]).args(REQUIREMENTS)).await?;
    }
    let versions = run_quietly(Command::new(&python).args([
        "-c",
        "import sys, importlib.metadata as m; print(sys.version.split()[0], m.version('a2a-sdk'), m.version('uvicorn'))",
    ]))
    .await
    .with_context(|| format!("{} is not a usable venv: remove it to have it made again", venv.display()))?;
    let [python_version, a2a_sdk, uvicorn] = versions.split_whitespace().collect::<Vec<_>>()[..] else {
        bail!("unexpected versions from {}: {versions}", python.display());
    };
    if a2a_sdk != A2A_SDK_VERSION {
        bail!("{} has a2a-sdk {a2a_sdk}, not {A2A_SDK_VERSION}: remove it to have it made again", venv.display());
    }
    let info = PeerInfo {
        script: script.display().to_string(),
        python: python_version.to_owned(),
        a2a_sdk: a2a_sdk.to_owned(),
        uvicorn: uvicorn.to_owned(),
    };
    Ok(PeerSetup { python, script, info })
}

/// Runs a set-up command; its stdout, or its output in the error.
async fn run_quietly(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let output = command.stdin(Stdio::null()).output().await.with_context(|| format!("cannot run {shown}"))?;
    if !output.status.success() {
        bail!(
            "{shown} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The URL the a2a-sdk's `DatabaseTaskStore` takes for a PostgreSQL
/// database: SQLAlchemy with asyncpg.
pub(crate) fn asyncpg_url(url: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url.split_once("://").context("the PostgreSQL URL has no scheme")?;
    if scheme != "postgres" && scheme != "postgresql" {
        bail!("not a PostgreSQL URL (postgres://…)");
    }
    Ok(format!("postgresql+asyncpg://{rest}"))
}

/// Where the server keeps its tasks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PeerStore<'a> {
    /// `InMemoryTaskStore`.
    Memory,
    /// `DatabaseTaskStore` on a SQLite file in the server's working folder
    /// (aiosqlite), as chorus's is in its own. SQLAlchemy leaves SQLite's
    /// defaults: a rollback journal and `synchronous=FULL`, stricter than
    /// chorus's WAL with `synchronous=NORMAL`.
    Sqlite,
    /// `DatabaseTaskStore` on this PostgreSQL database (`postgresql+asyncpg://`).
    Postgres(&'a str),
}

/// A running a2a-sdk echo server.
#[derive(Debug)]
pub(crate) struct Peer {
    child: Child,
    pub(crate) pid: u32,
    /// Its JSON-RPC endpoint.
    pub(crate) url: String,
    log_path: PathBuf,
}

impl Peer {
    /// Starts the server on a free port with its tasks in `store` and waits
    /// until it serves its agent card. Its output (and a SQLite store) goes
    /// to files in `workdir`; the output is shown if it fails.
    pub(crate) async fn start(setup: &PeerSetup, store: PeerStore<'_>, workdir: &Path) -> anyhow::Result<Self> {
        let port = free_port()?;
        let log_path = workdir.join("a2a-sdk.log");
        let log = std::fs::File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut command = Command::new(&setup.python);
        command
            .arg(&setup.script)
            .current_dir(setup.script.parent().unwrap_or_else(|| Path::new(".")))
            .env("PORT", port.to_string())
            .env_remove("A2A_DB_URL")
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("cannot share the log file")?)
            .stderr(log)
            .kill_on_drop(true);
        match store {
            PeerStore::Memory => {}
            PeerStore::Sqlite => {
                command.env("A2A_DB_URL", format!("sqlite+aiosqlite:///{}", workdir.join("tasks.db").display()));
            }
            PeerStore::Postgres(url) => {
                // asyncpg, like libpq, tries TLS first; chorus's sqlx has no
                // TLS backend, so both talk to PostgreSQL in plain text.
                command.env("A2A_DB_URL", url).env("PGSSLMODE", crate::postgres::PLAIN_TEXT);
            }
        }
        let child = command.spawn().with_context(|| format!("cannot start {}", setup.python.display()))?;
        let pid = child.id().context("the a2a-sdk server exited at once")?;
        let mut peer = Self { child, pid, url: format!("http://127.0.0.1:{port}/"), log_path };
        peer.wait_until_serving().await?;
        Ok(peer)
    }

    async fn wait_until_serving(&mut self) -> anyhow::Result<()> {
        let client = http_client(1)?;
        let card = format!("{}.well-known/agent-card.json", self.url);
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            let response = client.get(&card).timeout(Duration::from_secs(2)).send().await;
            if response.is_ok_and(|response| response.status().is_success()) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("the a2a-sdk server did not serve in {START_TIMEOUT:?}\nits log:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails when the server has exited.
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait().context("cannot poll the a2a-sdk server")? {
            None => Ok(()),
            Some(status) => bail!("the a2a-sdk server exited ({status})\nits log:\n{}", self.log_tail()),
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        tail(&self.log_path)
    }

    /// Stops the server and reaps it.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("cannot stop the a2a-sdk server")
    }
}

/// A port nothing listens on now (the server takes its port as a number).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr().context("cannot read the free port")?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls_become_asyncpg_urls() {
        assert_eq!(
            asyncpg_url("postgres://postgres@127.0.0.1:5432/db").expect("a URL"),
            "postgresql+asyncpg://postgres@127.0.0.1:5432/db"
        );
        assert_eq!(asyncpg_url("postgresql://h/db").expect("a URL"), "postgresql+asyncpg://h/db");
        assert!(asyncpg_url("sqlite://x.db").is_err());
    }
}
