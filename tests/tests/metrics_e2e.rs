//! `/metrics` on a running `chorus dev`, as Prometheus scrapes it: the
//! series of gRPC calls, gateway requests, open streams, task work and the
//! database pool move as A2A and gRPC calls are made, and no series names a
//! namespace or a task.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use chorus_proto::{
    eventbus::{NackRequest, NewEvent, PublishBatchRequest, RegisterHandlerRequest, RetryPolicy, SubscribeRequest},
    hub::{Content, RegisterAgentRequest, SendDirectRequest},
    taskstore::{ClaimTasksRequest, GetTaskRequest},
    workflow::{GetRunRequest, PutDefinitionRequest, RunState, StartRunRequest, workflow_client::WorkflowClient},
};
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
    for series in [
        "chorus_tasks_finished_total{state=\"failed\"}",
        "chorus_task_lease_expiries_total{outcome=\"failed\"}",
        "chorus_workflow_runs_finished_total{state=\"failed\"}",
        "chorus_push_notifications_total{outcome=\"failed\"}",
        "chorus_outbox_lag_seconds",
        "chorus_workflow_runs_unfinished{state=\"running\"}",
        "chorus_workflow_runs_idle_seconds{state=\"waiting\"}",
        "chorus_hub_inbox_messages",
        "chorus_eventbus_backlog",
        "chorus_worker_tasks_total{outcome=\"lease_lost\"}",
    ] {
        assert_eq!(before.get(series), Some(&0.0), "{series} is there from the start");
    }

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
    let not_found = a2a.rpc("echo", "GetTask", json!({ "id": "no-such-task" }));
    assert_eq!(chorus_tests::a2a::json(not_found).await.1["error"]["code"], -32001, "an error in an HTTP 200");
    let bogus = a2a.rpc("echo", "Bogus", json!({}));
    assert_eq!(chorus_tests::a2a::json(bogus).await.1["error"]["code"], -32601);

    let after = scrape(&a2a).await;
    let grew = |series: &str| growth(&before, &after, series);
    let taskstore = "service=\"chorus.taskstore.v1.TaskStore\"";
    assert_eq!(grew(&format!("chorus_grpc_requests_total{{{taskstore},method=\"CreateTask\",code=\"Ok\"}}")), 1.0);
    assert_eq!(grew(&format!("chorus_grpc_requests_total{{{taskstore},method=\"GetTask\",code=\"Ok\"}}")), 1.0);
    assert_eq!(grew(&format!("chorus_grpc_requests_total{{{taskstore},method=\"GetTask\",code=\"NotFound\"}}")), 1.0);
    assert_eq!(grew(&format!("chorus_grpc_request_duration_seconds_count{{{taskstore},method=\"GetTask\"}}")), 2.0);
    let rpc = "chorus_http_requests_total{route=\"/a2a/{agent}\",method=\"POST\",status=\"200\"";
    assert_eq!(grew(&format!("{rpc},kind=\"http\"}}")), 3.0, "SendMessage, GetTask and Bogus");
    let calls = "chorus_a2a_jsonrpc_calls_total";
    assert_eq!(grew(&format!("{calls}{{method=\"SendMessage\",outcome=\"ok\"}}")), 1.0);
    assert_eq!(grew(&format!("{calls}{{method=\"SendStreamingMessage\",outcome=\"ok\"}}")), 1.0);
    assert_eq!(grew(&format!("{calls}{{method=\"GetTask\",outcome=\"TASK_NOT_FOUND\"}}")), 1.0);
    assert_eq!(grew(&format!("{calls}{{method=\"unknown\",outcome=\"METHOD_NOT_FOUND\"}}")), 1.0);
    assert_eq!(grew(&format!("{rpc},kind=\"sse\"}}")), 1.0, "SendStreamingMessage is one SSE response");
    let timed = "chorus_http_request_duration_seconds_count{route=\"/a2a/{agent}\",method=\"POST\"}";
    assert_eq!(grew(timed), 3.0, "the three answers are timed, the stream is not");
    assert_eq!(after.get("chorus_streams_in_flight{protocol=\"sse\"}"), Some(&0.0), "the stream was read to its end");
    assert!(grew("chorus_tasks_created_total") >= 3.0, "two A2A tasks and one by gRPC");
    assert!(grew("chorus_tasks_finished_total{state=\"completed\"}") >= 2.0, "echo completed both A2A tasks");
    assert!(grew("chorus_task_claims_total") >= 2.0, "echo claimed both A2A tasks");
    assert!(after.get("chorus_db_pool_connections{backend=\"sqlite\"}").is_some_and(|size| *size >= 1.0));
    assert!(after.contains_key("chorus_db_pool_idle_connections{backend=\"sqlite\"}"));
    assert_eq!(after.get("chorus_db_pool_waiting_calls{backend=\"sqlite\"}"), Some(&0.0), "no call waits at rest");

    let series: Vec<&String> = after.keys().collect();
    for private in [namespace.as_str(), id.as_str(), task["id"].as_str().expect("a task id")] {
        assert!(!series.iter().any(|series| series.contains(private)), "{private} is in {series:?}");
    }
    // The task for `nobody` waits for a worker: the queue's gauges show it
    // once the task store next reads them.
    scrape_until_grown(&a2a, &before, "chorus_tasks_queued", 1.0).await;
    assert!(scrape(&a2a).await.contains_key("chorus_tasks_queued_oldest_age_seconds"));
}

/// Scrapes until `series` has grown by `at_least` since `before`: what the
/// services count in the background (the outbox relay, the lease reaper).
async fn scrape_until_grown(a2a: &A2a, before: &HashMap<String, f64>, series: &str, at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while growth(before, &scrape(a2a).await, series) < at_least {
        assert!(Instant::now() < deadline, "{series} did not grow by {at_least}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_work_of_every_service() {
    let sandbox = Sandbox::new();
    let server = sandbox
        .dev()
        .no_agents()
        .env("CHORUS_TASKSTORE__REAPER_INTERVAL_MS", "20")
        .env("CHORUS_EVENTBUS__REAPER_INTERVAL_MS", "20")
        .start()
        .await;
    let a2a = A2a::new(&server);
    let namespace = unique("work");
    let before = scrape(&a2a).await;

    // A task whose worker never renews its short lease: the reaper fails it.
    let mut tasks = server.task_store().await;
    tasks.create_task(create_request(&namespace, "sleepy", "work")).await.expect("CreateTask");
    let claim = ClaimTasksRequest {
        namespace: namespace.clone(),
        agent_id: "sleepy".to_owned(),
        worker_id: unique("worker"),
        lease: Some(prost_types::Duration { seconds: 0, nanos: 150_000_000 }),
        ..ClaimTasksRequest::default()
    };
    let mut claims = tasks.claim_tasks(claim).await.expect("ClaimTasks").into_inner();
    claims.message().await.expect("the claim stream").expect("a claimed task");
    scrape_until_grown(&a2a, &before, "chorus_task_lease_expiries_total{outcome=\"failed\"}", 1.0).await;
    scrape_until_grown(&a2a, &before, "chorus_tasks_finished_total{state=\"failed\"}", 1.0).await;
    scrape_until_grown(&a2a, &before, "chorus_outbox_events_relayed_total", 2.0).await;

    // Two events of a handler with one attempt each: the consumer
    // dead-letters the first, and lets the lease of the second run out.
    let mut bus = server.event_bus().await;
    let once = RetryPolicy {
        max_attempts: 1,
        visibility_timeout: Some(prost_types::Duration { seconds: 0, nanos: 50_000_000 }),
        ..RetryPolicy::default()
    };
    let handler = RegisterHandlerRequest {
        namespace: namespace.clone(),
        name: "audit".to_owned(),
        event_types: vec!["metrics.test".to_owned()],
        retry_policy: Some(once),
        ..RegisterHandlerRequest::default()
    };
    bus.register_handler(handler).await.expect("RegisterHandler");
    let event = NewEvent { r#type: "metrics.test".to_owned(), source: "metrics".to_owned(), ..NewEvent::default() };
    let events = vec![event.clone(), event];
    bus.publish_batch(PublishBatchRequest { namespace: namespace.clone(), events }).await.expect("publish");
    let subscribe = SubscribeRequest {
        namespace: namespace.clone(),
        handler: "audit".to_owned(),
        consumer_id: unique("consumer"),
        ..SubscribeRequest::default()
    };
    let mut deliveries = bus.subscribe(subscribe).await.expect("Subscribe").into_inner();
    let delivery = deliveries.message().await.expect("the delivery stream").expect("a delivery");
    let nack = NackRequest {
        namespace: namespace.clone(),
        delivery_id: delivery.id,
        error: "unreadable".to_owned(),
        dead_letter: true,
        ..NackRequest::default()
    };
    bus.nack(nack).await.expect("Nack");
    deliveries.message().await.expect("the delivery stream").expect("a second delivery");
    scrape_until_grown(&a2a, &before, "chorus_eventbus_dead_letters_total", 2.0).await;

    // A workflow whose first step is done as it starts, and whose second sends a hub message.
    let mut workflows = WorkflowClient::new(server.channel().await);
    let source =
        "name: hello\nsteps:\n- id: check\n  condition: \"true\"\n- id: say\n  message: {topic: news, text: hi}\n";
    let put = PutDefinitionRequest { namespace: namespace.clone(), source: source.to_owned(), ..Default::default() };
    workflows.put_definition(put).await.expect("PutDefinition");
    let start = StartRunRequest { namespace: namespace.clone(), workflow: "hello".to_owned(), ..Default::default() };
    let run = workflows.start_run(start).await.expect("StartRun").into_inner();
    let finished = GetRunRequest { namespace: namespace.clone(), run_id: run.id, wait_finished: true };
    let run = workflows.get_run(finished).await.expect("GetRun").into_inner();
    assert_eq!(run.state(), RunState::Completed, "{run:#?}");
    // One that waits for a signal shows among the unfinished runs.
    let source = "name: waits\nsteps:\n- id: hold\n  wait: {signal: go}\n";
    let put = PutDefinitionRequest { namespace: namespace.clone(), source: source.to_owned(), ..Default::default() };
    workflows.put_definition(put).await.expect("PutDefinition");
    let start = StartRunRequest { namespace: namespace.clone(), workflow: "waits".to_owned(), ..Default::default() };
    workflows.start_run(start).await.expect("StartRun");
    scrape_until_grown(&a2a, &before, "chorus_workflow_runs_unfinished{state=\"waiting\"}", 1.0).await;

    // What waits: a message in an inbox nobody reads; an event for a handler nobody consumes.
    let mut hub = server.hub().await;
    let idle = RegisterAgentRequest {
        namespace: namespace.clone(),
        agent_id: "idle".to_owned(),
        agent_type: "worker".to_owned(),
        ..RegisterAgentRequest::default()
    };
    hub.register_agent(idle).await.expect("RegisterAgent");
    let content =
        Content { r#type: "job".to_owned(), payload: b"later".to_vec(), content_type: "text/plain".to_owned() };
    let direct = SendDirectRequest {
        namespace: namespace.clone(),
        sender: "metrics".to_owned(),
        recipient: "idle".to_owned(),
        content: Some(content),
        ..SendDirectRequest::default()
    };
    hub.send_direct(direct).await.expect("SendDirect");
    scrape_until_grown(&a2a, &before, "chorus_hub_inbox_messages", 1.0).await;
    let unread = RegisterHandlerRequest {
        namespace: namespace.clone(),
        name: "unread".to_owned(),
        event_types: vec!["metrics.unread".to_owned()],
        ..RegisterHandlerRequest::default()
    };
    bus.register_handler(unread).await.expect("RegisterHandler");
    let event = NewEvent { r#type: "metrics.unread".to_owned(), source: "metrics".to_owned(), ..NewEvent::default() };
    bus.publish_batch(PublishBatchRequest { namespace: namespace.clone(), events: vec![event] })
        .await
        .expect("publish");
    scrape_until_grown(&a2a, &before, "chorus_eventbus_backlog", 1.0).await;

    let after = scrape(&a2a).await;
    let grew = |series: &str| growth(&before, &after, series);
    assert_eq!(grew("chorus_eventbus_deliveries_total"), 2.0);
    assert_eq!(grew("chorus_eventbus_dead_letters_total"), 2.0);
    assert_eq!(grew("chorus_workflow_runs_started_total"), 2.0, "hello, and the one that waits");
    assert_eq!(grew("chorus_workflow_runs_finished_total{state=\"completed\"}"), 1.0);
    assert_eq!(grew("chorus_workflow_steps_completed_total"), 2.0);
    assert_eq!(grew("chorus_hub_messages_sent_total"), 2.0, "the workflow's message step and the direct message");
    assert!(!after.keys().any(|series| series.contains(&namespace)), "{after:?}");
}

/// A unary call its caller gave up on (a closed tab, a client deadline) is
/// counted, as CANCELLED, though no answer was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_caller_gives_up_on_counts_as_canceled() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let mut tasks = server.task_store().await;
    let waiting = tasks.create_task(create_request("e2e", "nobody", "wait")).await.expect("create").into_inner();
    let before = scrape(&a2a).await;
    let wait = chorus_proto::taskstore::AwaitTaskRequest {
        namespace: "e2e".to_owned(),
        id: waiting.id,
        timeout: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
        ..Default::default()
    };
    let waiting = tokio::spawn(async move { tasks.await_task(wait).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiting.abort();
    let canceled = "chorus_grpc_requests_total{service=\"chorus.taskstore.v1.TaskStore\",method=\"AwaitTask\",\
                    code=\"Cancelled\"}";
    scrape_until_grown(&a2a, &before, canceled, 1.0).await;
}
