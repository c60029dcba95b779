//! The gateway with a real, independent A2A implementation on the other
//! side: the Python `a2a-sdk` 1.3.0 (PyPI), from the venv `make peers`
//! provisions (`PEERS_PYTHON`).
//!
//! - its client (`peers/a2a_client.py`) drives `chorus dev` over JSON-RPC,
//!   HTTP+JSON and gRPC: blocking send, streaming, get, list, cancel and
//!   push configs, with a webhook of its own that the gateway notifies;
//! - its server (`peers/echo_agent.py`) is the external agent a `remote`
//!   catalog entry proxies, and the target of `Gateway/Delegate`.
//!
//! Without `PEERS_PYTHON` (a plain `cargo test`) the tests say so and
//! skip; with it set, a peer that does not run is a failure.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use chorus_proto::{
    gateway::{DelegateRequest, delegate_response, gateway_client::GatewayClient},
    taskstore::{Message, Part, Role, TaskState, part::Content},
};
use chorus_tests::{
    DEADLINE, Sandbox, Server,
    process::{ChildProcess, command},
};
use serde_json::{Value, json};

/// The venv's interpreter, set by `make test`.
const PYTHON_VAR: &str = "PEERS_PYTHON";
/// How long the client script may take for all three bindings (it starts
/// Python, imports the SDK, and makes about 50 calls; 3 s here).
const CLIENT_DEADLINE: Duration = Duration::from_secs(120);
/// What `echo_agent.py` prints, followed by its URL, once it listens.
const AGENT_READY: &str = "a2a-sdk echo agent listening on ";
const BINDINGS: [&str; 3] = ["JSONRPC", "HTTP+JSON", "GRPC"];
/// How long a proxied cancel may take to reach the remote agent, and how
/// often the remote agent is asked meanwhile.
const REMOTE_CANCEL_DEADLINE: Duration = Duration::from_secs(10);
const REMOTE_POLL: Duration = Duration::from_millis(100);

/// The peers' Python, or `None` (after saying why) when the variable is unset.
fn python() -> Option<PathBuf> {
    let Some(python) = std::env::var_os(PYTHON_VAR) else {
        eprintln!("skipped: {PYTHON_VAR} is not set; `make test` provisions the a2a-sdk venv and sets it");
        return None;
    };
    let python = PathBuf::from(python);
    assert!(python.is_file(), "{PYTHON_VAR}={} is not a file: run `make peers`", python.display());
    Some(python)
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers").join(name)
}

/// Runs `python script args` to its end; returns its stdout, or panics with
/// its exit status and output when it fails.
async fn run_script(python: &Path, workdir: &Path, name: &str, args: &[&str]) -> String {
    let mut command = command(python, workdir);
    command.arg(script(name)).args(args).stdin(Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(CLIENT_DEADLINE, command.output()).await;
    let output = match output {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => panic!("cannot run {} {name}: {error}", python.display()),
        Err(_) => panic!("{name} did not finish within {CLIENT_DEADLINE:?}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name} failed ({}):\n{stderr}\nstdout:\n{stdout}", output.status);
    stdout
}

/// The one JSON line a peer script prints on success.
fn result_line(stdout: &str) -> Value {
    let line = stdout.lines().rfind(|line| line.starts_with('{'));
    let line = line.unwrap_or_else(|| panic!("no JSON result line in:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|error| panic!("bad result line {line}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_client_sends_streams_cancels_and_is_notified_over_every_binding() {
    let Some(python) = python() else { return };
    let sandbox = Sandbox::new();
    // The client's webhook listens on loopback.
    let server = sandbox.dev().env("CHORUS_GATEWAY__PUSH__ALLOW_PRIVATE", "true").start().await;

    let stdout = run_script(&python, sandbox.path(), "a2a_client.py", &[server.url()]).await;
    let results = result_line(&stdout);

    assert_eq!(results["ok"], true, "{results}");
    assert_eq!(results["default_card"], "Echo", "the gateway's own card is the default agent's");
    for binding in BINDINGS {
        let result = &results["bindings"][binding];
        let echo = &result["echo"];
        assert_eq!(echo["state"], "TASK_STATE_COMPLETED", "{binding}: {result}");
        assert_eq!(echo["artifact"], "hello from the python a2a-sdk", "{binding}: {result}");
        assert_eq!(echo["listed"], 1, "{binding}: ListTasks by context: {result}");
        let stream = &result["stream"];
        assert_eq!(stream["events"][0], "task", "{binding}: the stream starts with the Task: {result}");
        let last = stream["states"].as_array().and_then(|states| states.last());
        assert_eq!(last, Some(&json!("TASK_STATE_COMPLETED")), "{binding}: the stream ends completed: {result}");
        assert_eq!(stream["get"], "TASK_STATE_COMPLETED", "{binding}: {result}");
        let cancel = &result["cancel"];
        assert_eq!(cancel["before"], "TASK_STATE_INPUT_REQUIRED", "{binding}: {result}");
        assert_eq!(cancel["after"], "TASK_STATE_CANCELED", "{binding}: {result}");
        assert_eq!(cancel["get"], "TASK_STATE_CANCELED", "{binding}: {result}");
        let push = &result["push"];
        assert_eq!(push["listed"], 1, "{binding}: {result}");
        // A StreamResponse of the cancel: its status update, or the task.
        let notified = push["notified"].as_str();
        assert!(matches!(notified, Some("status_update" | "task")), "{binding}: the webhook heard: {result}");
        assert_eq!(push["left"], 0, "{binding}: {result}");
    }
    server.assert_serving().await;
}

/// `echo_agent.py` on a free port, and its base URL.
async fn start_python_agent(python: &Path, workdir: &Path) -> (ChildProcess, String) {
    let mut command = command(python, workdir);
    command.arg(script("echo_agent.py")).arg("0");
    let mut agent = ChildProcess::spawn("a2a-sdk echo agent", command);
    let line = agent.stdout_line(AGENT_READY).await;
    let url = line[AGENT_READY.len()..].trim().to_owned();
    (agent, url)
}

fn http() -> reqwest::Client {
    // reqwest is built without a TLS provider; building a client wants one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(DEADLINE).build().unwrap_or_else(|error| panic!("HTTP client: {error}"))
}

/// A JSON-RPC 1.0 call; returns `result`, or panics with the error answer.
async fn rpc(http: &reqwest::Client, url: &str, method: &str, params: Value) -> Value {
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let response = http.post(url).header("A2A-Version", "1.0").json(&request).send().await;
    let response = response.unwrap_or_else(|error| panic!("{method} to {url}: {error}"));
    let status = response.status();
    let body: Value = response.json().await.unwrap_or_else(|error| panic!("{method} to {url}: not JSON: {error}"));
    assert!(status.is_success() && body.get("error").is_none(), "{method} to {url} answered {status}: {body}");
    body["result"].clone()
}

/// The texts of a JSON task's artifacts.
fn artifact_texts(task: &Value) -> Vec<&str> {
    let artifacts = task["artifacts"].as_array().map(Vec::as_slice).unwrap_or_default();
    let parts = artifacts.iter().flat_map(|artifact| artifact["parts"].as_array().into_iter().flatten());
    parts.filter_map(|part| part["text"].as_str()).collect()
}

/// `chorus dev` whose catalog has the remote agent `py`: the Python agent.
struct Proxy {
    server: Server,
    agent_url: String,
    http: reqwest::Client,
    _agent: ChildProcess,
    _sandbox: Sandbox,
}

impl Proxy {
    async fn start(python: &Path) -> Self {
        let sandbox = Sandbox::new();
        let (agent, agent_url) = start_python_agent(python, sandbox.path()).await;
        // `chorus dev` reads ./chorus.toml in its working directory, the sandbox.
        std::fs::write(
            sandbox.path().join("chorus.toml"),
            chorus_tests::a2a::echo_and_remote_catalog("py", "Py", &agent_url),
        )
        .expect("write chorus.toml");
        let server = sandbox.dev().start().await;
        Self { server, agent_url, http: http(), _agent: agent, _sandbox: sandbox }
    }

    /// A JSON-RPC call of the gateway's endpoint of `py`.
    async fn call(&self, method: &str, params: Value) -> Value {
        rpc(&self.http, &format!("{}/a2a/py", self.server.url()), method, params).await
    }

    /// A blocking SendMessage of `text` to `py`, in `task_id` if given.
    async fn send(&self, text: &str, task_id: Option<&str>) -> Value {
        let mut message =
            json!({"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER", "parts": [{"text": text}]});
        if let Some(task_id) = task_id {
            message["taskId"] = json!(task_id);
        }
        self.call("SendMessage", json!({"message": message})).await["task"].clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_proxies_a_remote_python_agent_and_delegates_to_it() {
    let Some(python) = python() else { return };
    let proxy = Proxy::start(&python).await;

    // SendMessage to the remote agent's chorus endpoint: a chorus task whose
    // turn the Python agent took.
    let task = proxy.send("hello", None).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(artifact_texts(&task), ["py:hello"], "{task}");
    assert_eq!(task["status"]["message"]["parts"][0]["text"], "py:hello", "{task}");
    let chorus_id = task["id"].as_str().expect("a task id").to_owned();
    let got = proxy.call("GetTask", json!({"id": chorus_id})).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED", "GetTask from chorus: {got}");
    assert_eq!(artifact_texts(&got), ["py:hello"], "{got}");

    // Gateway/Delegate: the Python agent's own task comes back.
    let request = DelegateRequest {
        agent_url: proxy.agent_url.clone(),
        message: Some(Message {
            role: Role::User.into(),
            parts: vec![Part { content: Some(Content::Text("delegated".to_owned())), ..Part::default() }],
            ..Message::default()
        }),
        timeout: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
        ..DelegateRequest::default()
    };
    let mut gateway = GatewayClient::new(proxy.server.channel().await);
    let answer = gateway.delegate(request).await.unwrap_or_else(|status| panic!("Delegate: {status:?}"));
    let Some(delegate_response::Result::Task(remote)) = answer.into_inner().result else {
        panic!("Delegate to an agent that makes tasks answered no task");
    };
    assert_eq!(remote.status.as_ref().map(|status| status.state()), Some(TaskState::Completed), "{remote:?}");
    let parts = remote.artifacts.iter().flat_map(|artifact| &artifact.parts);
    let contents: Vec<&Content> = parts.filter_map(|part| part.content.as_ref()).collect();
    assert_eq!(contents, [&Content::Text("py:delegated".to_owned())], "{remote:?}");
    assert_ne!(remote.id, chorus_id);
    // The task is the Python agent's: it knows it by that id.
    let held = rpc(&proxy.http, &format!("{}/", proxy.agent_url), "GetTask", json!({"id": remote.id})).await;
    assert_eq!(held["status"]["state"], "TASK_STATE_COMPLETED", "the Python agent's own task: {held}");
    assert_eq!(artifact_texts(&held), ["py:delegated"], "{held}");
    proxy.server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_remote_agents_artifacts_keep_their_names() {
    let Some(python) = python() else { return };
    let proxy = Proxy::start(&python).await;

    let task = proxy.send("named", None).await;
    assert_eq!(artifact_texts(&task), ["py:named"], "{task}");
    // The Python agent names its artifact `echo`; a caller of the proxy sees
    // the artifact the agent made.
    assert_eq!(task["artifacts"][0]["name"], "echo", "the remote artifact's name: {task}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxied_remote_agent_gets_the_answer_to_its_question_in_the_same_task() {
    let Some(python) = python() else { return };
    let proxy = Proxy::start(&python).await;

    // "ask:" makes the Python agent ask for more before it answers.
    let asked = proxy.send("ask:question", None).await;
    assert_eq!(asked["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{asked}");
    assert_eq!(asked["status"]["message"]["parts"][0]["text"], "py:what else?", "{asked}");
    let chorus_id = asked["id"].as_str().expect("a task id");

    // The answer goes into the chorus task; the remote agent must get it in
    // its own task, the one that asked, and so answers from both turns.
    let answered = proxy.send("answer", Some(chorus_id)).await;
    assert_eq!(answered["id"], chorus_id, "{answered}");
    assert_eq!(answered["status"]["state"], "TASK_STATE_COMPLETED", "{answered}");
    assert_eq!(
        artifact_texts(&answered),
        ["py:ask:question+answer"],
        "the answer reached the remote agent outside the task that asked: {answered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canceling_a_proxied_task_cancels_the_remote_agents_task() {
    let Some(python) = python() else { return };
    let proxy = Proxy::start(&python).await;
    let asked = proxy.send("ask:then cancel", None).await;
    assert_eq!(asked["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{asked}");

    let canceled = proxy.call("CancelTask", json!({"id": asked["id"]})).await;
    assert_eq!(canceled["status"]["state"], "TASK_STATE_CANCELED", "{canceled}");

    // The Python agent holds one task, the one that asked; the cancel must
    // reach it (the gateway may forward it after answering).
    let agent = format!("{}/", proxy.agent_url);
    let deadline = tokio::time::Instant::now() + REMOTE_CANCEL_DEADLINE;
    loop {
        let listed = rpc(&proxy.http, &agent, "ListTasks", json!({})).await;
        let states: Vec<&Value> =
            listed["tasks"].as_array().into_iter().flatten().map(|task| &task["status"]["state"]).collect();
        assert_eq!(states.len(), 1, "the Python agent's tasks: {listed}");
        if states[0] == "TASK_STATE_CANCELED" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the remote task is still {} after the proxied cancel",
            states[0]
        );
        tokio::time::sleep(REMOTE_POLL).await;
    }
}
