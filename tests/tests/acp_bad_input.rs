//! `chorus acp` given what an IDE should not send, or left by its gateway:
//! raw NDJSON over the real binary's stdin. Every bad request gets its
//! JSON-RPC error, and the process goes on serving.

use chorus_tests::{
    Sandbox, Server,
    acp::{self, AcpProcess, agent_texts, error_code},
    process::ChildProcess,
};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_lines_unknown_methods_and_unknown_sessions_get_errors_and_the_bridge_keeps_serving() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let mut ide = AcpProcess::start(server.url(), "echo", sandbox.path(), &[]);

    ide.send_line("this is not JSON").await;
    let parse = ide.next().await;
    assert_eq!((error_code(&parse), &parse["id"]), (-32700, &Value::Null), "{parse}");
    ide.send_line(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion""#).await;
    assert_eq!(error_code(&ide.next().await), -32700, "a truncated line is a parse error");
    ide.send_bytes(b"\xff\xfe not UTF-8").await;
    assert_eq!(error_code(&ide.next().await), -32700, "so is one that is not UTF-8, which ended the bridge");

    let info = ide.initialize(json!({})).await;
    assert_eq!(info["protocolVersion"], 1, "{info}");
    assert_eq!(info["authMethods"], json!([]), "an open gateway needs no token: {info}");

    let (unknown, _) = ide.call(2, "session/teleport", json!({})).await;
    assert_eq!(error_code(&unknown), -32601, "{unknown}");
    let (relative, _) = ide.call(3, "session/new", json!({ "cwd": "relative/dir", "mcpServers": [] })).await;
    assert_eq!(error_code(&relative), -32602, "cwd must be absolute: {relative}");
    let (wrong_shape, _) = ide.call(4, "session/new", json!({ "cwd": 42 })).await;
    assert_eq!(error_code(&wrong_shape), -32602, "{wrong_shape}");

    let prompt = json!({ "sessionId": "no-such-session", "prompt": [{ "type": "text", "text": "hi" }] });
    let (stranger, _) = ide.call(5, "session/prompt", prompt).await;
    assert_eq!(error_code(&stranger), -32002, "a prompt for a session never opened: {stranger}");
    let load = json!({ "sessionId": "0190c6b0-0000-7000-8000-000000000000", "cwd": "/", "mcpServers": [] });
    let (missing, _) = ide.call(6, "session/load", load.clone()).await;
    assert_eq!(error_code(&missing), -32002, "a context with no task is no session: {missing}");
    let (missing, _) = ide.call(7, "session/resume", load).await;
    assert_eq!(error_code(&missing), -32002, "{missing}");
    ide.send(json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": { "sessionId": "nobody" } })).await;

    // Still serving: a whole turn with the echo agent.
    let session = ide.new_session(8, sandbox.path()).await;
    let image = json!({ "type": "image", "data": "AAAA", "mimeType": "image/png" });
    let (refused, _) = ide.call(9, "session/prompt", json!({ "sessionId": session, "prompt": [image] })).await;
    assert_eq!(error_code(&refused), -32602, "images are not advertised, so not taken: {refused}");
    // Larger than the gateway takes (1 MiB by default): the IDE's to shorten.
    let huge = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "x".repeat(1_100_000) }] });
    let (refused, _) = ide.call(11, "session/prompt", huge).await;
    assert_eq!(error_code(&refused), -32602, "{}", refused["error"]);
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "still here" }] });
    let (answer, updates) = ide.call(10, "session/prompt", prompt).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(agent_texts(&updates), ["still here"], "{updates:#?}");
    assert!(updates.iter().all(|update| update["params"]["sessionId"] == session.as_str()), "{updates:#?}");
    assert!(ide.close().await.success(), "chorus acp exits cleanly when the IDE closes stdin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_the_gateway_does_not_have_is_named_as_not_found() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut ide = AcpProcess::start(server.url(), "nosuch", sandbox.path(), &[]);
    ide.initialize(json!({})).await;
    let (missing, _) = ide.call(2, "session/new", json!({ "cwd": sandbox.path(), "mcpServers": [] })).await;
    assert_eq!(error_code(&missing), -32002, "{missing}");
    let message = missing["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("has no agent nosuch") && message.contains("/a2a lists"), "{missing}");
    assert_eq!(missing["error"]["data"]["agent"], "nosuch", "{missing}");
    assert!(ide.close().await.success());
}

/// A stack with the reviewer agent (`pace_ms` between its steps) and a
/// `chorus acp` for it (with `acp_args`), whose session's prompt `text`
/// (request 2) is under way; and the session's id.
async fn prompting_the_reviewer(
    pace_ms: u64,
    text: &str,
    acp_args: &[&str],
) -> (Sandbox, Server, ChildProcess, AcpProcess, String) {
    let sandbox = Sandbox::new();
    acp::write_config(&sandbox, None);
    let server = sandbox.dev().no_agents().start().await;
    let reviewer = acp::reviewer(&sandbox, server.url(), pace_ms);
    let mut ide = AcpProcess::start(server.url(), "reviewer", sandbox.path(), acp_args);
    ide.initialize(json!({})).await;
    let session = ide.new_session(1, sandbox.path()).await;
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": text }] });
    ide.send(json!({ "jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt })).await;
    (sandbox, server, reviewer, ide, session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_goes_away_mid_turn_fails_that_prompt_and_the_bridge_keeps_serving() {
    // It does not come back within the second the turn waits for it.
    let (sandbox, server, _reviewer, mut ide, _session) =
        prompting_the_reviewer(2_000, "slowly, please", &["--gateway-wait", "1"]).await;
    let first = ide.wait_for(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk").await;
    assert_eq!(first["params"]["update"]["content"]["text"], "Reviewing the message.", "{first}");

    server.kill().await;
    let (failed, _) = ide.response(&json!(2)).await;
    assert_eq!(error_code(&failed), -32603, "the turn fails with the gateway: {failed}");
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not answer again within 1 s (--gateway-wait)"), "{failed}");
    assert!(failed["error"]["data"]["taskId"].is_string(), "the task it may leave running: {failed}");

    let (unreachable, _) = ide.call(3, "session/new", json!({ "cwd": sandbox.path(), "mcpServers": [] })).await;
    assert!(unreachable.get("result").is_some() || error_code(&unreachable) == -32603, "{unreachable}");
    let (unknown, _) = ide.call(4, "no/such/method", json!({})).await;
    assert_eq!(error_code(&unknown), -32601, "still answering: {unknown}");
    assert!(ide.is_running(), "the bridge outlives its gateway");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_gateway_takes_calls_fail_auth_required_until_authenticate() {
    let sandbox = Sandbox::new();
    acp::write_config(&sandbox, Some("s3cret-ide-token"));
    let server = sandbox.dev().start().await;
    let token_file = acp::project_file(sandbox.path(), "token", "not-the-token\n");
    let token_arg = token_file.to_string_lossy().into_owned();
    let mut ide = AcpProcess::start(server.url(), "echo", sandbox.path(), &["--token-file", &token_arg]);

    let info = ide.initialize(json!({})).await;
    assert_eq!(info["authMethods"][0]["id"], "chorus-token", "a gateway with auth asks for a token: {info}");
    let (refused, _) = ide.call(1, "session/new", json!({ "cwd": sandbox.path(), "mcpServers": [] })).await;
    assert_eq!(error_code(&refused), -32000, "{refused}");
    let (listed, _) = ide.call(2, "session/list", json!({})).await;
    assert_eq!(error_code(&listed), -32000, "{listed}");
    let (still, _) = ide.call(3, "authenticate", json!({ "methodId": "chorus-token" })).await;
    assert_eq!(error_code(&still), -32000, "the wrong token stays wrong: {still}");
    let (unknown, _) = ide.call(4, "authenticate", json!({ "methodId": "password" })).await;
    assert_eq!(error_code(&unknown), -32602, "{unknown}");

    std::fs::write(&token_file, "s3cret-ide-token\n").expect("token file");
    let (accepted, _) = ide.call(5, "authenticate", json!({ "methodId": "chorus-token" })).await;
    assert_eq!(accepted["result"], json!({}), "{accepted}");
    let session = ide.new_session(6, sandbox.path()).await;
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "let me in" }] });
    let (answer, updates) = ide.call(7, "session/prompt", prompt.clone()).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(agent_texts(&updates), ["let me in"]);

    // The token changes under the session (rotated, revoked): a prompt the
    // gateway refuses asks the IDE to authenticate, like any other call.
    std::fs::write(&token_file, "rotated-away\n").expect("token file");
    let (stale, _) = ide.call(8, "authenticate", json!({ "methodId": "chorus-token" })).await;
    assert_eq!(error_code(&stale), -32000, "{stale}");
    let (revoked, _) = ide.call(9, "session/prompt", prompt).await;
    assert_eq!(error_code(&revoked), -32000, "{revoked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_endpoint_refuses_a_caller_without_the_gateways_token() {
    let sandbox = Sandbox::new();
    acp::write_config(&sandbox, Some("s3cret-ide-token"));
    let server = sandbox.dev().start().await;
    let upgrade = |url: String| websocket_upgrade(url, None);
    let anonymous = upgrade(format!("{}/acp?agent=echo", server.url())).await.expect("an answer");
    assert_eq!(anonymous.status(), 401);
    let wrong = upgrade(format!("{}/acp?agent=echo&token=guess", server.url())).await.expect("an answer");
    assert_eq!(wrong.status(), 401);
    let unknown = upgrade(format!("{}/acp?agent=nobody&token=s3cret-ide-token", server.url())).await.expect("answer");
    assert_eq!(unknown.status(), 404, "an unknown agent is refused before the upgrade");
    let welcome = upgrade(format!("{}/acp?agent=echo&token=s3cret-ide-token", server.url())).await.expect("answer");
    assert_eq!(welcome.status(), 101, "the token lets the upgrade through");
}

/// A WebSocket upgrade of `url`, from a web page of `origin` if one is given.
async fn websocket_upgrade(url: String, origin: Option<&str>) -> reqwest::Result<reqwest::Response> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut request = reqwest::Client::new()
        .get(url)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==");
    if let Some(origin) = origin {
        request = request.header("Origin", origin);
    }
    request.send().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_endpoint_refuses_web_pages_of_origins_not_allowed() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().env("CHORUS_GATEWAY__CORS_ORIGINS", "[\"https://ide.example\"]").start().await;
    let url = format!("{}/acp?agent=echo", server.url());
    // No credentials are checked here: without the origin check, any page
    // its user opens could drive their sessions.
    let foreign = websocket_upgrade(url.clone(), Some("https://evil.example")).await.expect("an answer");
    assert_eq!(foreign.status(), 403);
    let body: Value = foreign.json().await.expect("a JSON error");
    assert_eq!(body["error"]["message"], "origin \"https://evil.example\" is not among gateway.cors_origins");
    let listed = websocket_upgrade(url.clone(), Some("https://ide.example")).await.expect("an answer");
    assert_eq!(listed.status(), 101, "a listed origin is let through");
    let native = websocket_upgrade(url, None).await.expect("an answer");
    assert_eq!(native.status(), 101, "a client that is no web page sends no origin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ide_that_fails_a_permission_request_ends_the_turn_and_its_task() {
    let error = json!({ "code": -32603, "message": "the IDE broke" });
    an_unusable_answer_ends_the_turn_and_its_task(
        |id| json!({ "jsonrpc": "2.0", "id": id, "error": error }),
        "the IDE broke",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_option_the_bridge_did_not_offer_ends_the_turn_and_its_task() {
    // It would reach the agent as the user's words (the reviewer took it
    // for a rejection; a workflow agent asked again, for ever).
    let bogus = json!({ "outcome": { "outcome": "selected", "optionId": "bogus" } });
    an_unusable_answer_ends_the_turn_and_its_task(
        |id| json!({ "jsonrpc": "2.0", "id": id, "result": bogus }),
        "it chose option \"bogus\", which was not offered (allow, reject)",
    )
    .await;
}

/// The reviewer asks its question; the IDE's `answer` to it (by the
/// request's id) fails the turn with `reason`, and the task is canceled.
async fn an_unusable_answer_ends_the_turn_and_its_task(answer: impl Fn(&Value) -> Value, reason: &str) {
    let (_sandbox, server, _reviewer, mut ide, session) = prompting_the_reviewer(10, "review this", &[]).await;
    let asked = ide.wait_for(|m| m["method"] == "session/request_permission").await;
    ide.send(answer(&asked["id"])).await;
    let (failed, _) = ide.response(&json!(2)).await;
    assert_eq!(error_code(&failed), -32603, "{failed}");
    assert!(failed["error"]["message"].as_str().unwrap_or_default().contains(reason), "{failed}");

    // Nobody will answer the question: the task is canceled, not left waiting.
    assert_eq!(task_states(&server, &session).await, ["TASK_STATE_CANCELED"]);
    assert!(ide.is_running(), "the bridge goes on serving");
}

/// The states of the reviewer's tasks in context `session`, newest first.
async fn task_states(server: &Server, session: &str) -> Vec<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": { "contextId": session } });
    let request = reqwest::Client::new().post(format!("{}/a2a/reviewer", server.url())).header("A2A-Version", "1.0");
    let page: Value = request.json(&body).send().await.expect("ListTasks").json().await.expect("JSON");
    let tasks = page["result"]["tasks"].as_array().unwrap_or_else(|| panic!("no tasks: {page:#}"));
    tasks.iter().map(|task| task["status"]["state"].as_str().unwrap_or_default().to_owned()).collect()
}

/// Without `--gateway`, the bridge reaches the `chorus dev` its
/// configuration describes (`listen`), as the workflow CLI does; it read the
/// file and called 127.0.0.1:7800 all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gateway_the_bridge_calls_the_one_its_configuration_listens_on() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let workdir = sandbox.path().join("ide");
    std::fs::create_dir(&workdir).expect("a workdir");
    std::fs::write(workdir.join("chorus.toml"), format!("listen = \"{}\"\n", server.address())).expect("config");
    let mut ide = AcpProcess::spawn(&workdir, &["--agent", "echo"]);
    ide.initialize(json!({})).await;
    let session = ide.new_session(1, &workdir).await;
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "found you" }] });
    let (answer, updates) = ide.call(2, "session/prompt", prompt).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}\n{}", ide.logs());
    assert_eq!(agent_texts(&updates), ["found you"]);
}

/// A prompt to an agent no worker serves says so, after a few seconds, rather
/// than spin in silence; the turn still waits, until it is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_no_worker_takes_says_it_waits_for_one() {
    let sandbox = Sandbox::new();
    acp::write_config(&sandbox, None);
    let server = sandbox.dev().no_agents().start().await;
    let mut ide = AcpProcess::start(server.url(), "reviewer", sandbox.path(), &[]);
    ide.initialize(json!({})).await;
    let session = ide.new_session(1, sandbox.path()).await;
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "anyone?" }] });
    ide.send(json!({ "jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt })).await;
    let said = ide.wait_for(|m| m["params"]["update"]["sessionUpdate"] == "agent_thought_chunk").await;
    let text = said["params"]["update"]["content"]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("No worker of agent reviewer has taken the task yet"), "{said}");
    ide.send(json!({ "jsonrpc": "2.0", "method": "session/cancel", "params": { "sessionId": session } })).await;
    let (cancelled, _) = ide.response(&json!(2)).await;
    assert_eq!(cancelled["result"]["stopReason"], "cancelled", "{cancelled}");
}

/// A bridge stopped by a signal (its IDE quitting) ends as one whose stdin
/// closed, at once: a working turn's task is canceled, one that waits for an
/// answer waits on. It exited leaving the working task running, or waited
/// for the IDE to write or close stdin before it exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_ends_the_bridge_as_a_closed_stdin_does() {
    let (_sandbox, server, _reviewer, ide, session) = prompting_the_reviewer(5_000, "slowly", &[]).await;
    while task_states(&server, &session).await != ["TASK_STATE_WORKING"] {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ide.terminate().await.success());
    assert_eq!(task_states(&server, &session).await, ["TASK_STATE_CANCELED"], "a working turn's task");

    let (_sandbox, server, _reviewer, mut ide, session) = prompting_the_reviewer(10, "review this", &[]).await;
    ide.wait_for(|m| m["method"] == "session/request_permission").await;
    assert!(ide.terminate().await.success());
    assert_eq!(task_states(&server, &session).await, ["TASK_STATE_INPUT_REQUIRED"], "a question waits on");
}

/// An IDE that goes away while its turn waits for an answer leaves the task
/// waiting (a workflow's gate, a reviewer's question: nothing runs), rather
/// than cancel it; the session, loaded again by the next `chorus acp`, says
/// a question waits, and its next prompt answers that task: it used to
/// start a new one, and the first waited for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_left_by_a_closed_ide_is_answered_by_the_session_s_next_prompt() {
    let (sandbox, server, _reviewer, mut ide, session) = prompting_the_reviewer(10, "review this", &[]).await;
    ide.wait_for(|m| m["method"] == "session/request_permission").await;
    assert!(ide.close().await.success());
    assert_eq!(task_states(&server, &session).await, ["TASK_STATE_INPUT_REQUIRED"], "the question waits on");

    let mut ide = AcpProcess::start(server.url(), "reviewer", sandbox.path(), &[]);
    ide.initialize(json!({})).await;
    let load = json!({ "sessionId": session, "cwd": sandbox.path(), "mcpServers": [] });
    let (loaded, replayed) = ide.call(1, "session/load", load).await;
    assert!(loaded.get("result").is_some(), "{loaded}");
    let said = agent_texts(&replayed);
    assert!(said.last().is_some_and(|text| text.contains("your next prompt answers it")), "{said:#?}");
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "allow" }] });
    let (answer, _) = ide.call(2, "session/prompt", prompt).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(task_states(&server, &session).await, ["TASK_STATE_COMPLETED"], "answered, not a second task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_one_agent_is_not_loaded_by_another() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let mut echo = AcpProcess::start(server.url(), "echo", sandbox.path(), &[]);
    echo.initialize(json!({})).await;
    let session = echo.new_session(1, sandbox.path()).await;
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "mine" }] });
    let (answer, _) = echo.call(2, "session/prompt", prompt).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");

    let mut other = AcpProcess::start(server.url(), "tck", sandbox.path(), &[]);
    other.initialize(json!({})).await;
    let load = json!({ "sessionId": session, "cwd": sandbox.path(), "mcpServers": [] });
    let (refused, replayed) = other.call(1, "session/load", load.clone()).await;
    assert_eq!(error_code(&refused), -32002, "echo's session is not tck's: {refused}");
    assert!(replayed.is_empty(), "nothing of echo's conversation was replayed: {replayed:#?}");
    let (refused, _) = other.call(2, "session/resume", load.clone()).await;
    assert_eq!(error_code(&refused), -32002, "{refused}");
    let (loaded, replayed) = echo.call(3, "session/load", load).await;
    assert!(loaded.get("result").is_some(), "its own agent loads it: {loaded}");
    assert!(!replayed.is_empty(), "and replays it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_the_bridge_cannot_use_is_named_in_the_auth_required_error() {
    let sandbox = Sandbox::new();
    acp::write_config(&sandbox, Some("s3cret-ide-token"));
    let server = sandbox.dev().start().await;
    let two_lines = acp::project_file(sandbox.path(), "token", "s3cret-ide-token\nsecond line\n");
    let missing = sandbox.path().join("no-such.token");
    for (file, problem) in
        [(missing, "no-such.token cannot be read"), (two_lines, "holds a line break or another control character")]
    {
        let file = file.to_string_lossy().into_owned();
        let mut ide = AcpProcess::start(server.url(), "echo", sandbox.path(), &["--token-file", &file]);
        ide.initialize(json!({})).await;
        let (refused, _) = ide.call(1, "session/new", json!({ "cwd": sandbox.path(), "mcpServers": [] })).await;
        assert_eq!(error_code(&refused), -32000, "{refused}");
        assert!(refused["error"]["message"].as_str().unwrap_or_default().contains(problem), "{refused}");
        let (again, _) = ide.call(2, "authenticate", json!({ "methodId": "chorus-token" })).await;
        assert_eq!(error_code(&again), -32000, "{again}");
        assert!(again["error"]["message"].as_str().unwrap_or_default().contains(problem), "{again}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_started_before_its_gateway_offers_the_token_method() {
    // The IDE starts before its chorus: the card cannot be read, and the
    // gateway may want a token once it is up. An IDE answers -32000 with the
    // methods initialize gave it; none would leave it stuck.
    let sandbox = Sandbox::new();
    let nowhere = format!("http://{}", chorus_tests::a2a::dead_address().await);
    let mut ide = AcpProcess::start(&nowhere, "echo", sandbox.path(), &[]);
    let info = ide.initialize(json!({})).await;
    assert_eq!(info["authMethods"][0]["id"], "chorus-token", "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_outlives_a_restart_of_its_gateway() {
    let sandbox = Sandbox::new();
    // No worker yet: the task waits, and the turn's stream with it.
    let server = sandbox.dev().no_agents().start().await;
    let address = server.address();
    let mut ide = AcpProcess::start(server.url(), "echo", sandbox.path(), &[]);
    ide.initialize(json!({})).await;
    let session = ide.new_session(1, sandbox.path()).await;
    let prompt = json!({ "sessionId": session, "prompt": [{ "type": "text", "text": "still there?" }] });
    ide.send(json!({ "jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": prompt })).await;
    let a2a = chorus_tests::a2a::A2a::new(&server);
    while a2a.task_count().await == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // A restart (a deploy): back on its address, with the echo worker now.
    server.stop().await;
    let _server = sandbox.dev().listen(address).start().await;
    let (answer, updates) = ide.response(&json!(2)).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "the turn followed its task again: {answer}");
    assert_eq!(agent_texts(&updates), ["still there?"]);
}
