//! W3C trace context flows with no span export configured: a worker gets
//! the trace of the request that created its task, whether that request
//! was an A2A call with a `traceparent` header or a gRPC CreateTask with
//! `traceparent` metadata, from a `chorus dev` that has no OTLP endpoint.

use std::time::Duration;

use chorus_proto::taskstore::{ClaimTasksRequest, ClaimedTask};
use chorus_tests::{
    Sandbox,
    a2a::{A2a, message, unique, write_chorus_toml},
    tasks::create_request,
};
use serde_json::json;

/// A W3C `traceparent` of a sampled span in trace `trace_id`.
fn traceparent(trace_id: &str) -> String {
    format!("00-{trace_id}-00f067aa0ba902b7-01")
}

/// A trace id no other test uses: 32 hex digits.
fn trace_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The trace id of a claimed task's `traceparent` (`00-TRACE-SPAN-FLAGS`).
fn claimed_trace(claimed: &ClaimedTask) -> &str {
    let traceparent = claimed.trace_context.get("traceparent").map(String::as_str).unwrap_or_default();
    traceparent.split('-').nth(1).unwrap_or_else(|| panic!("no traceparent: {:?}", claimed.trace_context))
}

/// Sends `agent` an A2A message carrying `trace` through `server`; the task's id.
async fn send_traced(server: &chorus_tests::Server, agent: &str, trace: &str) -> String {
    let params =
        json!({ "message": message(&unique("traced"), "hello"), "configuration": { "returnImmediately": true } });
    let sent = A2a::new(server).rpc(agent, "SendMessage", params).header("traceparent", traceparent(trace));
    let answer: serde_json::Value = sent.send().await.expect("SendMessage").json().await.expect("a JSON answer");
    answer["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("no task: {answer:#}")).to_owned()
}

/// The next task a new worker of `agent` claims in `namespace`.
async fn claim_one(tasks: &mut chorus_tests::tasks::Client, namespace: &str, agent_id: &str) -> ClaimedTask {
    let claim = ClaimTasksRequest {
        namespace: namespace.to_owned(),
        agent_id: agent_id.to_owned(),
        worker_id: unique("worker"),
        ..ClaimTasksRequest::default()
    };
    let mut claims = tasks.claim_tasks(claim).await.expect("ClaimTasks").into_inner();
    let claimed = tokio::time::timeout(Duration::from_secs(10), claims.message()).await;
    claimed.expect("a claim in time").expect("the claim stream").expect("a claimed task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_continue_the_callers_trace_with_no_otlp_endpoint() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().env("OTEL_EXPORTER_OTLP_ENDPOINT", "").start().await;
    let mut tasks = server.task_store().await;

    let grpc_trace = trace_id();
    let namespace = unique("traced");
    let mut create = tonic::Request::new(create_request(&namespace, "tracer", "hello"));
    create.metadata_mut().insert("traceparent", traceparent(&grpc_trace).parse().expect("ASCII"));
    let created = tasks.create_task(create).await.expect("CreateTask").into_inner();

    let a2a_trace = trace_id();
    let a2a_task = send_traced(&server, "echo", &a2a_trace).await;

    for (namespace, agent_id, task_id, trace) in
        [(namespace.as_str(), "tracer", created.id.as_str(), &grpc_trace), ("default", "echo", &a2a_task, &a2a_trace)]
    {
        let claimed = claim_one(&mut tasks, namespace, agent_id).await;
        assert_eq!(claimed.task.as_ref().map(|task| task.id.as_str()), Some(task_id));
        assert_eq!(claimed_trace(&claimed), trace, "the worker continues the caller's trace");
    }
}

/// A gateway and a task store run apart: the task the gateway creates for
/// an A2A call carries the caller's trace to the task store and its worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_apart_from_its_task_store_passes_the_caller_s_trace_on() {
    let sandbox = Sandbox::new();
    let catalog = "[gateway]\ndefault_agent = \"tracer\"\n\n[[gateway.agents]]\nid = \"tracer\"\nname = \"Tracer\"\n\
                   description = \"Claimed by the test\"\nkind = \"worker\"\n";
    write_chorus_toml(sandbox.path(), catalog);
    let database = format!("sqlite://{}?mode=rwc", sandbox.path().join("tasks.db").display());
    let taskstore = sandbox.serve_taskstore(&database).env("OTEL_EXPORTER_OTLP_ENDPOINT", "").start().await;
    let gateway = sandbox
        .serve("gateway", &database)
        .env("CHORUS_GATEWAY__TASKSTORE_URL", taskstore.url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        .start()
        .await;

    let trace = trace_id();
    let task_id = send_traced(&gateway, "tracer", &trace).await;
    let claimed = claim_one(&mut taskstore.task_store().await, "default", "tracer").await;
    assert_eq!(claimed.task.as_ref().map(|task| task.id.as_str()), Some(task_id.as_str()));
    assert_eq!(claimed_trace(&claimed), trace, "the task store and the worker continue the caller's trace");
}
