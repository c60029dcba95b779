//! `/metrics` on a running `chorus dev`, as Prometheus scrapes it: the
//! series of gRPC calls, gateway requests, open streams, task work and the
//! database pool move as A2A and gRPC calls are made, and no series names a
//! namespace or a task.

use std::collections::HashMap;

use chorus_proto::taskstore::GetTaskRequest;
use chorus_tests::{
    Sandbox,
    a2a::{A2a, events, message, state, unique},
    tasks::create_request,
};
use reqwest::{StatusCode, header::CONTENT_TYPE};
use serde_json::json;

/// Every sample of the page, by series (`name{labels}`); panics on a line
/// that is neither a comment nor `series value`.
async fn scrape(a2a: &A2a) -> HashMap<String, f64> {
    let response = a2a.get("/metrics").send().await.expect("GET /metrics");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers().get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
    assert_eq!(content_type, Some("text/plain; version=0.0.4; charset=utf-8"));
    let page = response.text().await.expect("a text page");
    let samples = page.lines().filter(|line| !line.starts_with('#') && !line.is_empty());
    samples
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line:?}"));
            (series.to_owned(), value.parse().unwrap_or_else(|_| panic!("not a number: {line:?}")))
        })
        .collect()
}

/// How much `series` grew between two scrapes (absent: zero).
fn growth(before: &HashMap<String, f64>, after: &HashMap<String, f64>, series: &str) -> f64 {
    let value = |page: &HashMap<String, f64>| page.get(series).copied().unwrap_or_default();
    value(after) - value(before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_a2a_and_grpc_calls_and_name_no_tenant() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().start().await;
    let a2a = A2a::new(&server);
    let before = scrape(&a2a).await;

    let task = a2a.send("echo", message(&unique("metrics"), "hello")).await;
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{task:#}");
    let stream = a2a.rpc("echo", "SendStreamingMessage", json!({ "message": message(&unique("stream"), "hi") }));
    assert!(!events(stream).await.is_empty(), "the stream sends events");
    let mut tasks = server.task_store().await;
    let namespace = unique("tenant");
    let created = tasks.create_task(create_request(&namespace, "nobody", "queued")).await.expect("CreateTask");
    let id = created.into_inner().id;
    let request = GetTaskRequest { namespace: namespace.clone(), id: id.clone(), history_length: None };
    tasks.get_task(request).await.expect("GetTask");
    let missing = GetTaskRequest { namespace: namespace.clone(), id: "no-such-task".to_owned(), history_length: None };
    assert_eq!(tasks.get_task(missing).await.expect_err("no such task").code(), tonic::Code::NotFound);

    let after = scrape(&a2a).await;
    let grew = |series: &str| growth(&before, &after, series);
    let taskstore = "service=\"chorus.taskstore.v1.TaskStore\"";
    assert_eq!(grew(&format!("chorus_grpc_requests_total{{{taskstore},method=\"CreateTask\",code=\"Ok\"}}")), 1.0);
    assert_eq!(grew(&format!("chorus_grpc_requests_total{{{taskstore},method=\"GetTask\",code=\"Ok\"}}")), 1.0);
    assert_eq!(grew(&format!("chorus_grpc_requests_total{{{taskstore},method=\"GetTask\",code=\"NotFound\"}}")), 1.0);
    assert_eq!(grew(&format!("chorus_grpc_request_duration_seconds_count{{{taskstore},method=\"GetTask\"}}")), 2.0);
    let rpc = "chorus_http_requests_total{route=\"/a2a/{agent}\",method=\"POST\",status=\"200\"";
    assert_eq!(grew(&format!("{rpc},kind=\"http\"}}")), 1.0, "SendMessage is one JSON-RPC request");
    assert_eq!(grew(&format!("{rpc},kind=\"sse\"}}")), 1.0, "SendStreamingMessage is one SSE response");
    assert_eq!(after.get("chorus_streams_in_flight{protocol=\"sse\"}"), Some(&0.0), "the stream was read to its end");
    assert!(grew("chorus_tasks_created_total") >= 3.0, "two A2A tasks and one by gRPC");
    assert!(grew("chorus_tasks_finished_total{state=\"completed\"}") >= 2.0, "echo completed both A2A tasks");
    assert!(grew("chorus_task_claims_total") >= 2.0, "echo claimed both A2A tasks");
    assert!(after.get("chorus_db_pool_connections{backend=\"sqlite\"}").is_some_and(|size| *size >= 1.0));
    assert!(after.contains_key("chorus_db_pool_idle_connections{backend=\"sqlite\"}"));

    let series: Vec<&String> = after.keys().collect();
    for private in [namespace.as_str(), id.as_str(), task["id"].as_str().expect("a task id")] {
        assert!(!series.iter().any(|series| series.contains(private)), "{private} is in {series:?}");
    }
}
