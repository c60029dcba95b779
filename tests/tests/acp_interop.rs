//! `chorus acp` driven by independent ACP clients from npm, bridged to a
//! `chorus dev` gateway and its `reviewer` worker (a separate
//! `chorus agent reviewer` process, paced so a turn can be cancelled):
//!
//! - the official TypeScript SDK (`@agentclientprotocol/sdk` 2.4.0,
//!   `peers/acp/sdk_client.mjs`): a whole session, then a second connection
//!   that lists and loads it; and its WebSocket transport against `GET /acp`;
//! - the `acpx` CLI (0.19.1): one-shot prompts with permissions granted and
//!   denied, a persistent session resumed by a later process, and a cancel.
//!
//! `make peers` installs the clients (`npm ci` of `peers/acp`) and `make test`
//! says where (`PEERS_ACP_DIR`). Without that variable (a plain `cargo test`)
//! the tests say so and skip; with it set, a client that does not run is a
//! failure.

use std::{
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::Duration,
};

use chorus_tests::{Sandbox, acp, process::command, server::chorus_bin};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

/// Where `npm ci` of `peers/acp` was run, set by `make test`.
const NODE_DIR_VAR: &str = "PEERS_ACP_DIR";
/// How long one client run may take.
const CLIENT_DEADLINE: Duration = Duration::from_secs(120);
/// The reviewer's pause between steps: long enough to cancel a turn in.
const PACE_MS: u64 = 300;
/// Its pause in a turn that a new acpx process cancels: node starts slowly
/// on a loaded machine, and the cancel ends the pause at once.
const CANCEL_PACE_MS: u64 = 20_000;
/// The gateway's bearer token in these tests.
const TOKEN: &str = "ide-token-for-tests";

/// The clients' directory (holding `node_modules`), or `None` (after saying why) when unset.
fn node_dir() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(NODE_DIR_VAR) else {
        eprintln!("skipped: {NODE_DIR_VAR} is not set; `make test` installs the ACP clients and sets it");
        return None;
    };
    let dir = PathBuf::from(dir);
    for package in ["@agentclientprotocol/sdk/package.json", "acpx/package.json", "zod/package.json"] {
        let path = dir.join("node_modules").join(package);
        assert!(path.is_file(), "{NODE_DIR_VAR}={}: no {}; run `make peers`", dir.display(), path.display());
    }
    Some(dir)
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/acp").join(name)
}

/// Runs `command` to its end within the deadline.
async fn run(mut command: tokio::process::Command, what: &str) -> Output {
    command.stdin(Stdio::null()).kill_on_drop(true);
    match tokio::time::timeout(CLIENT_DEADLINE, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => panic!("cannot run {what} (is Node.js installed?): {error}"),
        Err(_) => panic!("{what} did not finish within {CLIENT_DEADLINE:?}"),
    }
}

/// The last stdout line of a successful run, as JSON.
fn result_line(output: &Output, what: &str) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what} failed ({}):\n{stderr}\nstdout:\n{stdout}", output.status);
    let line = stdout.lines().rfind(|line| line.starts_with('{'));
    let line = line.unwrap_or_else(|| panic!("no JSON result line from {what} in:\n{stdout}"));
    serde_json::from_str(line).unwrap_or_else(|error| panic!("bad result line {line}: {error}"))
}

/// A `chorus dev` whose catalog has the reviewer, and the reviewer working for it.
async fn stack(sandbox: &Sandbox, token: Option<&str>) -> (chorus_tests::Server, chorus_tests::process::ChildProcess) {
    acp::write_config(sandbox, token);
    let server = sandbox.dev().no_agents().start().await;
    let reviewer = acp::reviewer(sandbox, server.url(), PACE_MS);
    (server, reviewer)
}

/// The gateway's A2A `ListTasks` of one context, newest first.
async fn tasks_of(server_url: &str, context_id: &str) -> Vec<Value> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": { "contextId": context_id } });
    let response = reqwest::Client::new()
        .post(format!("{server_url}/a2a/reviewer"))
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await
        .expect("ListTasks answers");
    let page: Value = response.json().await.expect("ListTasks is JSON");
    page["result"]["tasks"].as_array().cloned().unwrap_or_else(|| panic!("no tasks in {page}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_runs_a_session_and_loads_it_again_through_chorus_acp() {
    let Some(node_dir) = node_dir() else { return };
    let sandbox = Sandbox::new();
    let (server, _reviewer) = stack(&sandbox, None).await;
    let project = sandbox.path().join("project");
    std::fs::create_dir_all(project.join("lib")).expect("project dir");
    acp::project_file(&project, "notes.txt", "buy milk\nTODO: call Bob \nfix the fence\n");

    let mut node = command("node", sandbox.path());
    node.arg(script("sdk_client.mjs")).arg(&node_dir).arg(chorus_bin()).arg(server.url()).arg(&project);
    let results = result_line(&run(node, "the TypeScript SDK client").await, "the TypeScript SDK client");

    let first: Vec<&str> = results["firstTurn"].as_array().expect("turn").iter().filter_map(Value::as_str).collect();
    assert_eq!(
        first,
        [
            "Reviewing notes.txt.",
            "Read notes.txt: 3 lines.",
            "Reviewed 1 file (3 lines): 1 TODO/FIXME. Publish the review?",
            "Published: Reviewed 1 file (3 lines): 1 TODO/FIXME.",
        ],
        "the chunks arrive in the order the agent said them: {results:#}"
    );
    assert_eq!(
        results["plans"],
        json!([
            ["Read notes.txt:high:in_progress", "Ask before publishing the review:medium:pending"],
            ["Read notes.txt:high:completed", "Ask before publishing the review:medium:pending"],
            ["Read notes.txt:high:completed", "Ask before publishing the review:medium:in_progress"],
            ["Read notes.txt:high:completed", "Ask before publishing the review:medium:completed"],
        ]),
        "the agent's plan arrives as `plan` updates, kept current: {results:#}"
    );
    assert!(
        results["review"].as_str().is_some_and(|review| review.contains("| notes.txt | 3 | 8 | L2 | 0 | 1 |")),
        "the review artifact arrived as the tool call's content: {results:#}"
    );
    assert_eq!(results["permissionOptions"], json!(["allow:allow_once", "reject:reject_once"]));
    assert_eq!(
        results["secondTurn"].as_array().and_then(|said| said.last()),
        Some(&json!("The review was not published."))
    );
    assert_eq!(results["cancelledTurn"], "cancelled");
    assert_eq!(results["listed"]["title"], "Please review my notes", "{results:#}");
    assert_eq!(results["listed"]["cwd"], json!(project));
    assert_eq!(results["unknownSessionCode"], -32002);
    let replay: Vec<&str> = results["replay"].as_array().expect("replay").iter().filter_map(Value::as_str).collect();
    let position = |line: &str| replay.iter().position(|said| *said == line);
    let order = [
        position("user: Please review my notes"),
        position("agent: Published: Reviewed 1 file (3 lines): 1 TODO/FIXME."),
        position("user: And this sentence, please."),
        position("agent: The review was not published."),
        position("user: Take your time with this one."),
    ];
    assert!(order.iter().all(Option::is_some), "the whole conversation is replayed: {replay:#?}");
    assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "in the order it happened: {replay:#?}");
    // The IDE's answers to the agent's questions come back as questions
    // answered, not as words the user typed.
    assert!(!replay.iter().any(|said| ["user: allow", "user: reject"].contains(said)), "{replay:#?}");

    // What the agent saw: every message carries the IDE's context; the
    // cancelled turn's task is canceled.
    let session = results["sessionId"].as_str().expect("session id");
    let tasks = tasks_of(server.url(), session).await;
    assert_eq!(tasks.len(), 3, "one task per prompt: {tasks:#?}");
    assert_eq!(tasks[0]["status"]["state"], "TASK_STATE_CANCELED", "{:#}", tasks[0]);
    let oldest = &tasks[2];
    let context = &oldest["history"][0]["metadata"]["acp/session"];
    assert_eq!(context["cwd"], json!(project), "{oldest:#}");
    assert_eq!(context["additionalDirectories"], json!([project.join("lib")]));
    assert_eq!(context["mcpServers"][0]["name"], "files", "{oldest:#}");
}

/// `acpx --agent "chorus acp ..." <args>`, with its own home (acpx keeps
/// sessions under ~/.acpx), in `cwd`.
fn acpx(node_dir: &Path, home: &Path, cwd: &Path, server_url: &str, args: &[&str]) -> tokio::process::Command {
    let agent = format!("{} acp --agent reviewer --gateway {server_url}", chorus_bin().display());
    let mut acpx = command(node_dir.join("node_modules/.bin/acpx"), cwd);
    acpx.env("HOME", home).arg("--agent").arg(agent).args(args);
    acpx
}

/// The JSON-RPC frames of an `acpx --format json` run.
fn frames(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout).lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

fn stop_reason(frames: &[Value]) -> Option<&str> {
    frames.iter().find_map(|frame| frame["result"]["stopReason"].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acpx_prompts_resumes_and_cancels_through_chorus_acp() {
    let Some(node_dir) = node_dir() else { return };
    let sandbox = Sandbox::new();
    let (server, mut reviewer) = stack(&sandbox, None).await;
    let home = sandbox.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let url = server.url();

    // One-shot, permission granted: the whole wire trace, in order.
    let args = ["--approve-all", "--format", "json", "exec", "review this sentence"];
    let granted = run(acpx(&node_dir, &home, sandbox.path(), url, &args), "acpx exec").await;
    assert!(granted.status.success(), "acpx exec failed: {}", String::from_utf8_lossy(&granted.stderr));
    let trace = frames(&granted);
    let methods: Vec<&str> = trace.iter().filter_map(|frame| frame["method"].as_str()).collect();
    for method in ["initialize", "session/new", "session/prompt", "session/request_permission"] {
        assert!(methods.contains(&method), "{method} is on the wire: {methods:?}");
    }
    assert_eq!(
        acp::agent_texts(&trace),
        [
            "Reviewing the message.",
            "Read the message: 1 line.",
            "Reviewed 1 file (1 line): no TODO or FIXME. Publish the review?",
            "Published: Reviewed 1 file (1 line): no TODO or FIXME.",
        ]
    );
    assert_eq!(stop_reason(&trace), Some("end_turn"));

    // One-shot, permission denied: the agent hears `reject`; acpx exits 5
    // (its PERMISSION_DENIED) though the turn ended normally.
    let args = ["--deny-all", "--format", "json", "exec", "review this too"];
    let denied = run(acpx(&node_dir, &home, sandbox.path(), url, &args), "acpx exec --deny-all").await;
    assert_eq!(denied.status.code(), Some(5), "{}", String::from_utf8_lossy(&denied.stderr));
    let trace = frames(&denied);
    assert!(trace.iter().any(|frame| frame["result"]["outcome"]["optionId"] == "reject"), "{trace:#?}");
    assert_eq!(acp::agent_texts(&trace).last().map(String::as_str), Some("The review was not published."));
    assert_eq!(stop_reason(&trace), Some("end_turn"));

    // A persistent session: created, prompted by one acpx process, then
    // resumed by another once the first has gone (acpx prefers
    // session/resume to session/load; both are offered).
    let created = run(acpx(&node_dir, &home, sandbox.path(), url, &["sessions", "new"]), "acpx sessions new").await;
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let mut sessions = Vec::new();
    for text in ["first of two", "second of two"] {
        let args = ["--approve-all", "--format", "json", "--ttl", "1", "prompt", text];
        let prompted = run(acpx(&node_dir, &home, sandbox.path(), url, &args), "acpx prompt").await;
        assert!(prompted.status.success(), "acpx prompt failed: {}", String::from_utf8_lossy(&prompted.stderr));
        let trace = frames(&prompted);
        assert_eq!(stop_reason(&trace), Some("end_turn"), "{trace:#?}");
        let session = trace.iter().find_map(|frame| frame["params"]["sessionId"].as_str()).map(str::to_owned);
        sessions
            .push((session, trace.iter().filter_map(|f| f["method"].as_str().map(str::to_owned)).collect::<Vec<_>>()));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    assert_eq!(sessions[0].0, sessions[1].0, "the second prompt continues the same session");
    assert!(sessions[1].1.iter().any(|m| m == "session/resume"), "a new process resumed it: {:?}", sessions[1].1);
    let session = sessions[0].0.clone().expect("a session id");
    assert_eq!(tasks_of(url, &session).await.len(), 2, "both prompts went to one A2A context");

    // A cancel from another acpx process, mid-turn, while the reviewer
    // pauses long between steps.
    reviewer.kill().await;
    let _reviewer = acp::reviewer(&sandbox, url, CANCEL_PACE_MS);
    let args = ["--approve-all", "--format", "json", "prompt", "one to cancel"];
    let mut prompt = acpx(&node_dir, &home, sandbox.path(), url, &args);
    prompt.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut running = prompt.spawn().expect("acpx prompt starts");
    let mut lines = tokio::io::BufReader::new(running.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let first_chunk = tokio::time::timeout(CLIENT_DEADLINE, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let frame: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            let chunk = frame["params"]["update"]["sessionUpdate"] == "agent_message_chunk";
            seen.push(frame);
            if chunk {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(first_chunk, Ok(true), "the turn started streaming: {seen:#?}");
    let cancel = run(acpx(&node_dir, &home, sandbox.path(), url, &["cancel"]), "acpx cancel").await;
    assert!(cancel.status.success(), "acpx cancel failed: {}", String::from_utf8_lossy(&cancel.stderr));
    while let Ok(Ok(Some(line))) = tokio::time::timeout(CLIENT_DEADLINE, lines.next_line()).await {
        seen.push(serde_json::from_str(&line).unwrap_or(Value::Null));
    }
    let exit = running.wait().await.expect("acpx prompt exits");
    assert!(exit.success(), "acpx prompt ended {exit}");
    assert_eq!(stop_reason(&seen), Some("cancelled"), "{seen:#?}");
    assert!(seen.iter().any(|frame| frame["method"] == "session/cancel"), "the cancel reached the bridge: {seen:#?}");
    let tasks = tasks_of(url, &session).await;
    assert_eq!(tasks[0]["status"]["state"], "TASK_STATE_CANCELED", "the A2A task was canceled: {:#}", tasks[0]);
    // The persistent session keeps an acpx queue owner (and its `chorus acp`)
    // alive for minutes unless it is closed.
    let closed = run(acpx(&node_dir, &home, sandbox.path(), url, &["sessions", "close"]), "acpx sessions close").await;
    assert!(closed.status.success(), "acpx sessions close failed: {}", String::from_utf8_lossy(&closed.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_speaks_acp_over_the_gateways_websocket() {
    let Some(node_dir) = node_dir() else { return };
    let sandbox = Sandbox::new();
    acp::write_config(&sandbox, Some(TOKEN));
    let server = sandbox.dev().start().await;
    let ws = server.url().replacen("http://", "ws://", 1);
    // Node 22 has a global WebSocket; Node 20 only behind a flag.
    let mut probe = command("node", sandbox.path());
    probe.args(["-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"]);
    let has_websocket = run(probe, "node").await.status.success();
    let mut node = command("node", sandbox.path());
    if !has_websocket {
        node.arg("--experimental-websocket");
    }
    node.arg(script("ws_client.mjs"))
        .arg(&node_dir)
        .arg(format!("{ws}/acp?agent=echo&token={TOKEN}"))
        .arg(sandbox.path());
    let results = result_line(&run(node, "the WebSocket client").await, "the WebSocket client");
    assert_eq!(results["protocolVersion"], 1, "{results}");
    assert_eq!(results["stopReason"], "end_turn", "{results}");
    assert_eq!(results["said"], json!(["hello over a websocket"]), "{results}");
    assert_eq!(results["toolCalls"], json!(["echo"]), "the echo artifact as a tool call: {results}");
    assert!(results["tooBigClosedWith"].is_number(), "a message past the limit closes its connection: {results}");
}
