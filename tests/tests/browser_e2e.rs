//! What a web page sees of chorus: every answer to a listed origin carries
//! CORS headers (grpc-web calls, A2A over HTTP, errors, unknown methods), a
//! caller's deadline is DEADLINE_EXCEEDED in grpc-web framing, and an origin
//! no browser could send stops the start with a hint.

use std::time::Duration;

use chorus_proto::taskstore::AwaitTaskRequest;
use chorus_tests::{
    DEADLINE, Sandbox, Server,
    a2a::A2a,
    tasks::{create_request, create_task},
};
use reqwest::{Response, header::HeaderMap};
use tonic::Code;

const PAGE: &str = "http://app.example.test";
const NS: &str = "e2e";

async fn listed_server(sandbox: &Sandbox) -> Server {
    sandbox.dev().no_agents().env("CHORUS_GATEWAY__CORS_ORIGINS", format!("[\"{PAGE}\"]")).start().await
}

/// A grpc-web call (binary) of `path` with `message`, from `origin`.
async fn grpc_web(a2a: &A2a, path: &str, message: &impl prost::Message, origin: &str, timeout: &str) -> Response {
    let mut headers = vec![("origin", origin)];
    if !timeout.is_empty() {
        headers.push(("grpc-timeout", timeout));
    }
    chorus_tests::grpc_web::call(a2a, path, message, &headers).await
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> &'h str {
    headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_page_reads_every_answer_and_an_unlisted_one_none() {
    let sandbox = Sandbox::new();
    let server = listed_server(&sandbox).await;
    let a2a = A2a::new(&server);
    let mut tasks = server.task_store().await;
    let waiting = create_task(&mut tasks, NS, "nobody", "wait for me").await;

    // A wait longer than the page's deadline: DEADLINE_EXCEEDED, framed for grpc-web, with CORS.
    let five_seconds = prost_types::Duration { seconds: 5, nanos: 0 };
    let wait = AwaitTaskRequest {
        namespace: NS.into(),
        id: waiting.id.clone(),
        timeout: Some(five_seconds),
        ..Default::default()
    };
    let answer = grpc_web(&a2a, "/chorus.taskstore.v1.TaskStore/AwaitTask", &wait, PAGE, "300m").await;
    let headers = answer.headers();
    assert_eq!(header(headers, "access-control-allow-origin"), PAGE, "{headers:?}");
    assert!(header(headers, "content-type").starts_with("application/grpc-web"), "{headers:?}");
    assert_eq!(header(headers, "grpc-status"), (Code::DeadlineExceeded as i32).to_string(), "{headers:?}");

    // A method no service has: UNIMPLEMENTED, readable too.
    let unknown = grpc_web(&a2a, "/chorus.taskstore.v2.TaskStore/ListTasks", &wait, PAGE, "").await;
    let headers = unknown.headers();
    assert_eq!(header(headers, "access-control-allow-origin"), PAGE, "{headers:?}");
    assert!(header(headers, "content-type").starts_with("application/grpc-web"), "{headers:?}");
    assert_eq!(header(headers, "grpc-status"), (Code::Unimplemented as i32).to_string(), "{headers:?}");

    // A2A over JSON-RPC: the preflight, private network access included, then the call.
    let preflight = a2a
        .http()
        .request(reqwest::Method::OPTIONS, format!("{}/a2a/echo", a2a.base()))
        .header("origin", PAGE)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,a2a-version")
        .header("access-control-request-private-network", "true")
        .send()
        .await
        .expect("a preflight");
    let headers = preflight.headers();
    assert!(preflight.status().is_success(), "{preflight:?}");
    assert_eq!(header(headers, "access-control-allow-origin"), PAGE, "{headers:?}");
    assert!(header(headers, "access-control-allow-headers").contains("a2a-version"), "{headers:?}");
    assert_eq!(header(headers, "access-control-allow-private-network"), "true", "{headers:?}");
    let get = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}});
    let called = a2a.http().post(format!("{}/a2a/echo", a2a.base())).header("origin", PAGE);
    let called = called.header("a2a-version", "1.0").json(&get).send().await;
    let called = called.expect("a JSON-RPC call");
    assert_eq!(header(called.headers(), "access-control-allow-origin"), PAGE, "{called:?}");

    // A page elsewhere gets no CORS headers: its browser shows it nothing.
    let elsewhere = grpc_web(&a2a, "/chorus.taskstore.v2.TaskStore/ListTasks", &wait, "http://evil.example", "").await;
    assert_eq!(header(elsewhere.headers(), "access-control-allow-origin"), "", "{elsewhere:?}");
    server.assert_serving().await;
}

/// A native gRPC client's deadline comes back DEADLINE_EXCEEDED, not CANCELLED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_deadline_is_deadline_exceeded() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut tasks = server.task_store().await;
    let waiting = tasks.create_task(create_request(NS, "nobody", "wait")).await.expect("create").into_inner();
    let five_seconds = prost_types::Duration { seconds: 5, nanos: 0 };
    let wait =
        AwaitTaskRequest { namespace: NS.into(), id: waiting.id, timeout: Some(five_seconds), ..Default::default() };
    let mut request = tonic::Request::new(wait);
    request.set_timeout(Duration::from_millis(300));
    let status = tasks.await_task(request).await.expect_err("past its deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("grpc-timeout"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_no_browser_sends_stops_the_start_with_a_hint() {
    let sandbox = Sandbox::new();
    for (origins, says) in [
        ("[\"http://app.example.test/\"]", "write http://app.example.test"),
        ("[\"app.example.test\"]", "is not an origin"),
        ("[\"https://*.example.test\"]", "no wildcard"),
    ] {
        let refused = tokio::process::Command::new(chorus_tests::server::chorus_bin())
            .args(["dev", "--no-agents", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(sandbox.data_dir())
            .current_dir(sandbox.path())
            .env("CHORUS_GATEWAY__CORS_ORIGINS", origins)
            .kill_on_drop(true)
            .output();
        let refused = tokio::time::timeout(DEADLINE, refused).await;
        let refused = refused.unwrap_or_else(|_| panic!("chorus started with {origins}")).expect("run chorus");
        assert!(!refused.status.success(), "{origins}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("gateway.cors_origins") && stderr.contains(says), "{origins}: {stderr}");
    }
}
