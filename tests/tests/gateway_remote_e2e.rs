//! Outbound A2A end to end, between two real `chorus dev` processes: B's
//! catalog has a `remote` agent that proxies A's echo agent, and B's
//! `chorus.gateway.v1.Gateway/Delegate` sends a message to A's tck agent,
//! follows it, and cancels what runs past its deadline.

use std::time::{Duration, Instant};

use chorus_proto::{
    gateway::{DelegateRequest, delegate_response, gateway_client::GatewayClient},
    taskstore::{Role, Task, TaskState},
};
use chorus_tests::{
    Sandbox, Server,
    a2a::{
        A2a, assert_grpc_error, dead_address, echo_and_remote_catalog, message, remote_agent, state, text, unique,
        write_chorus_toml,
    },
    tasks::{state as task_state, status_text, text_message},
};
use serde_json::{Value, json};
use tonic::{Code, transport::Channel};

fn delegate(agent_url: String, message_id: &str, text: &str, timeout: Duration) -> DelegateRequest {
    let mut message = text_message(Role::User, text);
    message.message_id = message_id.to_owned();
    DelegateRequest {
        agent_url,
        message: Some(message),
        timeout: Some(prost_types::Duration::try_from(timeout).expect("a timeout in range")),
        ..DelegateRequest::default()
    }
}

async fn delegated_task(client: &mut GatewayClient<Channel>, request: DelegateRequest) -> Task {
    let response = client.delegate(request).await.unwrap_or_else(|status| panic!("Delegate failed: {status:?}"));
    match response.into_inner().result {
        Some(delegate_response::Result::Task(task)) => task,
        other => panic!("Delegate answered no task: {other:?}"),
    }
}

async fn two_choruses() -> (Sandbox, Server, Sandbox, Server) {
    let sandbox_a = Sandbox::new();
    let a = sandbox_a.dev().name("chorus A").start().await;
    let sandbox_b = Sandbox::new();
    write_chorus_toml(sandbox_b.path(), &echo_and_remote_catalog("far", "Far echo", &format!("{}/a2a/echo", a.url())));
    let b = sandbox_b.dev().no_agents().name("chorus B").start().await;
    (sandbox_a, a, sandbox_b, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_forwards_its_turns_to_another_chorus() {
    let (_sandbox_a, a, _sandbox_b, b) = two_choruses().await;
    let (on_a, on_b) = (A2a::new(&a), A2a::new(&b));

    let (_, far_card) = chorus_tests::a2a::json(on_b.get("/a2a/far/.well-known/agent-card.json")).await;
    assert_eq!(far_card["name"], "Far echo", "{far_card:#}");
    let task = on_b.send("far", message("far-1", "hello from B")).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");
    assert_eq!(text(&task["artifacts"][0]), "hello from B", "A's echo came back: {task:#}");
    assert_eq!(text(&task["status"]["message"]), "hello from B");

    let on_a_tasks = on_a.call("echo", "ListTasks", json!({ "includeArtifacts": true })).await;
    let [remote] = on_a_tasks["tasks"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        panic!("A ran one task: {on_a_tasks:#}");
    };
    assert_eq!(state(remote), "TASK_STATE_COMPLETED");
    assert_eq!(text(&remote["history"][0]), "hello from B");
    assert_eq!(remote["artifacts"][0]["name"], "echo", "A's echo worker did the work");
    assert_ne!(remote["id"], task["id"], "B's task mirrors A's; they are two tasks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegate_follows_a_remote_task_and_cancels_it_past_its_deadline() {
    let (_sandbox_a, a, _sandbox_b, b) = two_choruses().await;
    let on_a = A2a::new(&a);
    let mut gateway = GatewayClient::new(b.channel().await);
    let tck = format!("{}/a2a/tck", a.url());

    let id = unique("tck-complete-task");
    let done =
        delegated_task(&mut gateway, delegate(tck.clone(), &id, "are you there?", Duration::from_secs(20))).await;
    assert_eq!((task_state(&done), status_text(&done).as_str()), (TaskState::Completed, "Hello from TCK"));
    let on_a_task = on_a.call("tck", "GetTask", json!({ "id": done.id })).await;
    assert_eq!(state(&on_a_task), "TASK_STATE_COMPLETED", "the task is A's: {on_a_task:#}");
    assert_eq!(on_a_task["history"][0]["messageId"], id.as_str());

    let dead = format!("http://{}/a2a/echo", dead_address().await);
    let unreachable = gateway.delegate(delegate(dead, "d-1", "anyone?", Duration::from_secs(10))).await;
    assert_grpc_error(unreachable, Code::Unavailable, "UNAVAILABLE");

    let slow = unique("test-resubscribe-message-id");
    let started = Instant::now();
    let late = gateway.delegate(delegate(tck, &slow, "take 4 s", Duration::from_secs(1))).await;
    let waited = started.elapsed();
    let status = late.as_ref().expect_err("the delegation times out").clone();
    assert_grpc_error(late, Code::DeadlineExceeded, "DEADLINE_EXCEEDED");
    assert!(waited < Duration::from_secs(4), "the 1 s deadline cut it short, not the 4 s task: {waited:?}");
    let canceled = on_a.call("tck", "ListTasks", json!({ "status": "TASK_STATE_CANCELED" })).await;
    let [task] = canceled["tasks"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        panic!("A's task was canceled: {canceled:#}");
    };
    assert_eq!(task["history"][0]["messageId"], slow.as_str());
    let task_id = task["id"].as_str().unwrap_or_default();
    assert!(status.message().contains(task_id), "the error names the remote task: {status:?}");

    // A's agent would have completed it at 4 s; canceled is final.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(started.elapsed()) + Duration::from_millis(500)).await;
    let after = on_a.call("tck", "GetTask", json!({ "id": task_id })).await;
    assert_eq!(state(&after), "TASK_STATE_CANCELED", "{after:#}");
}

/// Without `gateway.delegate.allow_private`, a gateway calls no loopback,
/// private or link-local address (a remote agent's, a Delegate call's), but
/// its own: a workflow's delegate step to a catalog agent goes through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_private_no_private_agent_is_called_but_the_gateway_s_own() {
    let sandbox_a = Sandbox::new();
    let a = sandbox_a.dev().name("chorus A").start().await;
    let sandbox_b = Sandbox::new();
    write_chorus_toml(sandbox_b.path(), &echo_and_remote_catalog("far", "Far echo", &format!("{}/a2a/echo", a.url())));
    let b = sandbox_b.dev().name("chorus B").env("CHORUS_GATEWAY__DELEGATE__ALLOW_PRIVATE", "false").start().await;
    let (on_a, on_b) = (A2a::new(&a), A2a::new(&b));

    let task = on_b.send("far", message("far-refused", "hello from B")).await;
    assert_eq!(state(&task), "TASK_STATE_FAILED", "{task:#}");
    let reason = text(&task["status"]["message"]);
    assert!(reason.contains("is a loopback address, not a public address"), "{reason}");
    assert!(reason.contains("gateway.delegate.allow_private"), "it says how to allow it: {reason}");

    let mut gateway = GatewayClient::new(b.channel().await);
    let to_a = gateway.delegate(delegate(format!("{}/a2a/tck", a.url()), "d-a", "hi", Duration::from_secs(10))).await;
    assert_grpc_error(to_a, Code::InvalidArgument, "INVALID_PARAMS");
    let on_a_tasks = on_a.call("echo", "ListTasks", json!({})).await;
    assert_eq!(on_a_tasks["tasks"], json!([]), "nothing reached A: {on_a_tasks:#}");

    let own = format!("{}/a2a/echo", b.url());
    let done = delegated_task(&mut gateway, delegate(own, &unique("own"), "to myself", Duration::from_secs(20))).await;
    assert_eq!((task_state(&done), status_text(&done).as_str()), (TaskState::Completed, "to myself"));
}

/// A caller that goes away (a workflow step's timeout, its run canceled)
/// drops its Delegate call: the remote task is asked to cancel, not left
/// running for nobody until the delegation's own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_whose_caller_goes_away_cancels_the_remote_task() {
    let (_sandbox_a, a, _sandbox_b, b) = two_choruses().await;
    let on_a = A2a::new(&a);
    let mut gateway = GatewayClient::new(b.channel().await);
    let slow = unique("test-resubscribe-message-id");
    let call = gateway.delegate(delegate(format!("{}/a2a/tck", a.url()), &slow, "take 4 s", Duration::from_secs(60)));
    assert!(tokio::time::timeout(Duration::from_secs(1), call).await.is_err(), "the caller gives up first");

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let canceled = on_a.call("tck", "ListTasks", json!({ "status": "TASK_STATE_CANCELED" })).await;
        if let [task] = canceled["tasks"].as_array().map(Vec::as_slice).unwrap_or_default() {
            assert_eq!(task["history"][0]["messageId"], slow.as_str());
            break;
        }
        assert!(Instant::now() < deadline, "A's task was not canceled: {canceled:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A gateway killed while a remote agent works on its task, and started
/// again under its name, follows the remote task it had linked to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_follows_the_remote_task_it_forwarded_to_its_end() {
    let sandbox_a = Sandbox::new();
    let a = sandbox_a.dev().name("chorus A").start().await;
    let sandbox_b = Sandbox::new();
    write_chorus_toml(sandbox_b.path(), &echo_and_remote_catalog("far", "Far tck", &format!("{}/a2a/tck", a.url())));
    let b = sandbox_b.dev().no_agents().name("chorus B").start().await;
    let address = b.address();
    let on_b = A2a::new(&b);
    let slow = message(&unique("test-resubscribe-message-id"), "take 4 s");
    let sent = json!({ "message": slow, "configuration": { "returnImmediately": true } });
    let task = on_b.call("far", "SendMessage", sent).await["task"].clone();
    let linked = |read: &Value| read["status"]["message"]["metadata"]["chorus.remote"]["taskId"].is_string();
    far_task_until(&on_b, &task, "linked to its remote task", linked).await;
    b.kill().await;

    let b = sandbox_b.dev().no_agents().name("chorus B").listen(address).start().await;
    let on_b = A2a::new(&b);
    let done = far_task_until(&on_b, &task, "following its remote task", |read| state(read) != "TASK_STATE_WORKING");
    assert_eq!(state(&done.await), "TASK_STATE_COMPLETED");
}

/// Canceling a remote agent's task cancels the remote task behind it, once:
/// in flight (the turn cancels its own) and waiting for input (no turn is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canceling_a_remote_agent_s_task_cancels_the_remote_task_once() {
    let sandbox_a = Sandbox::new();
    let a = sandbox_a.dev().name("chorus A").start().await;
    let tck = format!("{}/a2a/tck", a.url());
    let sandbox_b = Sandbox::new();
    let catalog = echo_and_remote_catalog("far", "Far tck", &tck) + &remote_agent("asks", "Asks", &tck);
    write_chorus_toml(sandbox_b.path(), &catalog);
    let b = sandbox_b.dev().no_agents().name("chorus B").start().await;
    let (on_a, on_b) = (A2a::new(&a), A2a::new(&b));

    let slow = message(&unique("test-resubscribe-message-id"), "take 4 s");
    let sent = json!({ "message": slow, "configuration": { "returnImmediately": true } });
    let working = on_b.call("far", "SendMessage", sent).await["task"].clone();
    let linked = |read: &Value| read["status"]["message"]["metadata"]["chorus.remote"]["taskId"].is_string();
    let linked = far_task_until(&on_b, &working, "linked to its remote task", linked).await;
    let waiting = on_b.send("asks", message(&unique("tck-input-required"), "ask me")).await;
    assert_eq!(state(&waiting), "TASK_STATE_INPUT_REQUIRED", "{waiting:#}");
    let asked = waiting["status"]["message"]["metadata"]["chorus.remote"]["taskId"].clone();

    for (agent, task) in [("far", &working), ("asks", &waiting)] {
        let canceled = on_b.call(agent, "CancelTask", json!({ "id": task["id"] })).await;
        assert_eq!(state(&canceled), "TASK_STATE_CANCELED", "{canceled:#}");
    }
    let remote = linked["status"]["message"]["metadata"]["chorus.remote"]["taskId"].clone();
    for id in [remote, asked] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let read = on_a.call("tck", "GetTask", json!({ "id": id })).await;
            if state(&read) == "TASK_STATE_CANCELED" {
                break;
            }
            assert!(Instant::now() < deadline, "A's task was not canceled: {read:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let page = on_a.get("/metrics").send().await.expect("GET /metrics").text().await.expect("a page");
    let cancels: f64 = page
        .lines()
        .filter(|line| line.starts_with("chorus_a2a_jsonrpc_calls_total{method=\"CancelTask\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(cancels, 2.0, "each remote task was asked to cancel once: {page}");
}

/// B's task `task` of agent `far`, read until `done` says it is `what`.
async fn far_task_until(on_b: &A2a, task: &Value, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let read = on_b.call("far", "GetTask", json!({ "id": task["id"] })).await;
        if done(&read) {
            return read;
        }
        assert!(Instant::now() < deadline, "the task is not {what}: {read:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A remote agent's progress shows on the chorus task as it comes: each
/// working status message, before the remote task asks its question.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_s_progress_shows_on_the_chorus_task_as_it_comes() {
    let sandbox_a = Sandbox::new();
    chorus_tests::acp::write_config(&sandbox_a, None);
    let a = sandbox_a.dev().name("chorus A").start().await;
    let sandbox_b = Sandbox::new();
    let far = format!("{}/a2a/reviewer", a.url());
    write_chorus_toml(sandbox_b.path(), &echo_and_remote_catalog("far", "Far reviewer", &far));
    let b = sandbox_b.dev().no_agents().name("chorus B").start().await;
    let on_b = A2a::new(&b);
    let task = on_b.send("far", message(&unique("review"), "fn main() {}")).await;
    assert_eq!(state(&task), "TASK_STATE_INPUT_REQUIRED", "{task:#}");
    let history: Vec<&str> = task["history"].as_array().into_iter().flatten().map(text).collect();
    assert!(history.iter().any(|said| said.starts_with("Remote task ")), "the remote task is linked: {history:#?}");
    assert!(history.contains(&"Reviewing the message."), "its progress came through: {history:#?}");
    assert!(text(&task["status"]["message"]).contains("Publish the review?"), "{task:#}");
}

/// A remote agent that checks credentials is called with those the
/// catalog names: the value of an environment variable, never the file's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_is_called_with_the_credentials_its_configuration_names() {
    let sandbox_a = Sandbox::new();
    let auth = "[gateway.auth]\nbearer_tokens = [{ name = \"b\", secret = \"far-token-1\", namespaces = [\"*\"] }]\n";
    write_chorus_toml(sandbox_a.path(), auth);
    let a = sandbox_a.dev().name("chorus A").start().await;
    let sandbox_b = Sandbox::new();
    let far = echo_and_remote_catalog("far", "Far echo", &format!("{}/a2a/echo", a.url()));
    let b_auth =
        "[gateway.auth]\nbearer_tokens = [{ name = \"client\", secret = \"client-token\", namespaces = [\"*\"] }]\n";
    write_chorus_toml(sandbox_b.path(), &format!("{far}bearer_token_env = \"FAR_TOKEN\"\n{b_auth}"));
    let b = sandbox_b.dev().no_agents().name("chorus B").env("FAR_TOKEN", "far-token-1").start().await;
    let send = json!({ "message": message(&unique("far-auth"), "hello with a token") });
    let (_, sent) =
        chorus_tests::a2a::json(A2a::new(&b).rpc("far", "SendMessage", send).bearer_auth("client-token")).await;
    let task = &sent["result"]["task"];
    assert_eq!(state(task), "TASK_STATE_COMPLETED", "{sent:#}");
    assert_eq!(text(&task["artifacts"][0]), "hello with a token");
    // Which of B's credentials sent the message stays B's to know.
    let (_, listed) =
        chorus_tests::a2a::json(A2a::new(&a).rpc("echo", "ListTasks", json!({})).bearer_auth("far-token-1")).await;
    let first = &listed["result"]["tasks"][0]["history"][0];
    assert_eq!(first["metadata"]["chorus.caller"], "b", "A notes its own caller, not B's: {listed:#}");
}

/// A's catalog: the built-in TCK agent, which streams artifacts, and the
/// `design` phase agent, whose answer carries a data part.
const TCK_AND_DESIGN: &str = r#"[gateway]
default_agent = "tck"

[[gateway.agents]]
id = "tck"
name = "TCK"
description = "The conformance kit's agent"
kind = "builtin"

[[gateway.agents]]
id = "design"
name = "Design"
description = "A phase agent"
kind = "worker"
"#;

/// What a remote agent answers comes through whole and once: the data part
/// of its final message, and each artifact it streamed, which the outcome
/// does not stream again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_s_data_and_streamed_artifacts_come_through_once() {
    let sandbox_a = Sandbox::new();
    write_chorus_toml(sandbox_a.path(), TCK_AND_DESIGN);
    let a = sandbox_a.dev().name("chorus A").start().await;
    let sandbox_b = Sandbox::new();
    let catalog = format!(
        "{}{}",
        echo_and_remote_catalog("far", "Far TCK", &format!("{}/a2a/tck", a.url())),
        chorus_tests::a2a::remote_agent("far-design", "Far design", &format!("{}/a2a/design", a.url()))
    );
    write_chorus_toml(sandbox_b.path(), &catalog);
    let b = sandbox_b.dev().no_agents().name("chorus B").start().await;
    let on_b = A2a::new(&b);

    let designed = on_b.send("far-design", message(&unique("design"), "design it")).await;
    assert_eq!(state(&designed), "TASK_STATE_COMPLETED", "{designed:#}");
    let parts = &designed["status"]["message"]["parts"];
    assert!(text(&designed["status"]["message"]).starts_with("design done"), "{designed:#}");
    let data = parts.as_array().into_iter().flatten().find_map(|part| part.get("data"));
    assert_eq!(data.map(|data| &data["architecture"]), Some(&json!("service + queue")), "the data part: {parts:#}");

    let params = json!({ "message": message(&unique("tck-stream-artifact-chunked"), "chunks") });
    let events = chorus_tests::a2a::events(on_b.rpc("far", "SendStreamingMessage", params)).await;
    let chunks: Vec<&Value> = events.iter().filter_map(|event| event["result"].get("artifactUpdate")).collect();
    let last = chunks.iter().filter(|chunk| chunk["lastChunk"] == json!(true)).count();
    assert!(chunks.len() >= 2, "the chunks came through: {events:#?}");
    assert_eq!(last, 1, "the artifact ends once, not again as the outcome: {chunks:#?}");
}
