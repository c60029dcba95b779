//! `chorus acp` driven as an IDE drives it: a child process spoken to in
//! raw NDJSON over its stdin and stdout, and the `chorus dev` set-up the ACP
//! tests share (a catalog with the `reviewer` agent, optionally a token).

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex, PoisonError},
};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines},
    process::{Child, ChildStdin, ChildStdout},
};

use crate::{DEADLINE, Sandbox, process::ChildProcess, server::chorus_bin};

/// The catalog of the ACP tests: the `echo` and `reviewer` workers.
const CATALOG: &str = r#"
[[gateway.agents]]
id = "echo"
name = "Echo"
description = "Answers every message with its own text"
kind = "worker"

[[gateway.agents]]
id = "reviewer"
name = "Reviewer"
description = "Reviews the files a message refers to"
kind = "worker"
"#;

/// Writes `chorus.toml` in the sandbox (which `chorus dev` reads): the ACP
/// catalog, and a bearer token `token` is the only credential for, if given.
pub fn write_config(sandbox: &Sandbox, token: Option<&str>) {
    let mut config = CATALOG.to_owned();
    if let Some(token) = token {
        config.push_str(&format!(
            "\n[gateway.auth]\nbearer_tokens = [{{ name = \"ide\", secret = \"{token}\", namespaces = [\"*\"] }}]\n"
        ));
    }
    let path = sandbox.path().join("chorus.toml");
    std::fs::write(&path, config).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
}

/// `chorus agent reviewer --server <url> --pace-ms <pace_ms>`.
pub fn reviewer(sandbox: &Sandbox, server_url: &str, pace_ms: u64) -> ChildProcess {
    let mut command = crate::process::command(chorus_bin(), sandbox.path());
    command.args(["agent", "reviewer", "--server", server_url, "--pace-ms", &pace_ms.to_string()]);
    ChildProcess::spawn("chorus agent reviewer", command)
}

/// A running `chorus acp`, killed when dropped.
#[derive(Debug)]
pub struct AcpProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Messages read while waiting for something else.
    pending: VecDeque<Value>,
}

impl AcpProcess {
    /// `chorus acp --agent <agent> --gateway <gateway> [args...]`, run in `workdir`.
    pub fn start(gateway: &str, agent: &str, workdir: &Path, args: &[&str]) -> Self {
        Self::spawn(workdir, &[&["--agent", agent, "--gateway", gateway], args].concat())
    }

    /// `chorus acp [args...]`, run in `workdir`.
    pub fn spawn(workdir: &Path, args: &[&str]) -> Self {
        let mut command = crate::process::command(chorus_bin(), workdir);
        command.arg("acp").args(args);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = command.spawn().unwrap_or_else(|error| panic!("cannot start chorus acp: {error}"));
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(pipe) = child.stderr.take() {
            let kept = Arc::clone(&stderr);
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
                    if kept.len() == 200 {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            });
        }
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        Self { child, stdin, stdout, stderr, pending: VecDeque::new() }
    }

    /// What the process logged lately.
    pub fn logs(&self) -> String {
        let kept = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }

    /// Writes one line to its stdin.
    pub async fn send_line(&mut self, line: &str) {
        self.send_bytes(line.as_bytes()).await;
    }

    /// Writes one line of raw bytes (UTF-8 or not) to its stdin.
    pub async fn send_bytes(&mut self, line: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        let written = async {
            stdin.write_all(line).await?;
            stdin.write_all(b"\n").await?;
            stdin.flush().await
        };
        if let Err(error) = written.await {
            panic!("cannot write to chorus acp: {error}\n{}", self.logs());
        }
    }

    /// Sends a JSON-RPC message.
    pub async fn send(&mut self, message: Value) {
        self.send_line(&message.to_string()).await;
    }

    /// The next message on stdout (every line must be JSON).
    pub async fn next(&mut self) -> Value {
        if let Some(message) = self.pending.pop_front() {
            return message;
        }
        let line = match tokio::time::timeout(DEADLINE, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => panic!("chorus acp closed its stdout\n{}", self.logs()),
            Ok(Err(error)) => panic!("cannot read chorus acp's stdout: {error}"),
            Err(_) => panic!("chorus acp said nothing within {DEADLINE:?}\n{}", self.logs()),
        };
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("stdout carried a non-JSON line {line:?}: {error}"))
    }

    /// Reads until the response to request `id`; returns it and what came before it.
    pub async fn response(&mut self, id: &Value) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let message = self.next().await;
            if message.get("id") == Some(id) && message.get("method").is_none() {
                return (message, before);
            }
            before.push(message);
        }
    }

    /// Reads until a message `matches`; the ones before it are kept for later.
    pub async fn wait_for(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        let mut skipped = VecDeque::new();
        loop {
            let message = self.next().await;
            if matches(&message) {
                skipped.extend(self.pending.drain(..));
                self.pending = skipped;
                return message;
            }
            skipped.push_back(message);
        }
    }

    /// Sends request `id` and returns its response and what came before it.
    pub async fn call(&mut self, id: u64, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
        self.response(&json!(id)).await
    }

    /// `initialize` with the given client capabilities; returns the result.
    pub async fn initialize(&mut self, capabilities: Value) -> Value {
        let (response, _) =
            self.call(0, "initialize", json!({ "protocolVersion": 1, "clientCapabilities": capabilities })).await;
        response.get("result").cloned().unwrap_or_else(|| panic!("initialize failed: {response}"))
    }

    /// `session/new` in `cwd`; returns the session id.
    pub async fn new_session(&mut self, id: u64, cwd: &Path) -> String {
        let (response, _) = self.call(id, "session/new", json!({ "cwd": cwd, "mcpServers": [] })).await;
        let session = response["result"]["sessionId"].as_str();
        session.unwrap_or_else(|| panic!("session/new failed: {response}")).to_owned()
    }

    /// Closes stdin and waits for the process to exit.
    pub async fn close(mut self) -> ExitStatus {
        drop(self.stdin.take());
        match tokio::time::timeout(DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => panic!("cannot wait for chorus acp: {error}"),
            Err(_) => panic!("chorus acp still ran {DEADLINE:?} after its stdin closed\n{}", self.logs()),
        }
    }

    /// Sends it `SIGTERM` and waits for it to exit.
    pub async fn terminate(mut self) -> ExitStatus {
        let pid = self.child.id().expect("chorus acp runs");
        let sent = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        assert!(sent.is_ok_and(|status| status.success()), "kill -TERM {pid} failed");
        match tokio::time::timeout(DEADLINE, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(error)) => panic!("cannot wait for chorus acp: {error}"),
            Err(_) => panic!("chorus acp still ran {DEADLINE:?} after SIGTERM\n{}", self.logs()),
        }
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

/// The error code of a JSON-RPC response (panics on a success).
pub fn error_code(response: &Value) -> i64 {
    response["error"]["code"].as_i64().unwrap_or_else(|| panic!("expected an error, got {response}"))
}

/// The texts of the `agent_message_chunk`s among `messages`, in order.
pub fn agent_texts(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|message| message["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|message| message["params"]["update"]["content"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// A file of the IDE's project: `text` written at `dir/name`.
pub fn project_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    path
}
