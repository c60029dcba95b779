//! The workflow engine in `chorus dev`: the shipped example workflows load,
//! the seed-001 pipeline runs through its gates with the built-in phase
//! agents, a `delegate` step reaches an A2A agent through the gateway, a
//! watch follows a run to its end, and bad input changes nothing.

use std::time::Duration;

use chorus_proto::workflow::{
    self as pb, DecideGateRequest, GetRunRequest, ListDefinitionsRequest, PutDefinitionRequest, RunState,
    StartRunRequest, StepKind, StepState, WatchRunRequest, workflow_client::WorkflowClient,
};
use chorus_runtime::testing::PostgresDatabase;
use chorus_tests::{Sandbox, tasks::get_task};
use tokio::time::Instant;
use tonic::{Code, transport::Channel};

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(60);

fn text(value: &str) -> prost_types::Value {
    prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(value.into())) }
}

async fn start(client: &mut WorkflowClient<Channel>, workflow: &str, input: &[(&str, &str)]) -> pb::Run {
    let mut fields = prost_types::Struct::default();
    for (key, value) in input {
        fields.fields.insert((*key).into(), text(value));
    }
    let request =
        StartRunRequest { namespace: NS.into(), workflow: workflow.into(), input: Some(fields), ..Default::default() };
    client.start_run(request).await.expect("start").into_inner()
}

async fn get(client: &mut WorkflowClient<Channel>, run_id: &str) -> pb::Run {
    let request = GetRunRequest { namespace: NS.into(), run_id: run_id.into(), wait_finished: false };
    client.get_run(request).await.expect("get").into_inner()
}

/// Approves each gate as it waits, until the run ends.
async fn approve_until_done(client: &mut WorkflowClient<Channel>, run_id: &str) -> pb::Run {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let run = get(client, run_id).await;
        if matches!(run.state(), RunState::Completed | RunState::Failed | RunState::Canceled) {
            return run;
        }
        for step in run.steps.iter().filter(|s| s.kind() == StepKind::Gate && s.state() == StepState::Waiting) {
            let request = DecideGateRequest {
                namespace: NS.into(),
                run_id: run_id.into(),
                step_id: step.step_id.clone(),
                decision: pb::Decision::Approve.into(),
                decided_by: "e2e".into(),
                iteration: Some(step.iteration),
                ..Default::default()
            };
            client.decide_gate(request).await.expect("approve");
        }
        assert!(Instant::now() < deadline, "the run did not finish: {run:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A sandbox whose `workflows/` folder holds the shipped examples.
fn with_examples() -> Sandbox {
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("dir");
    for (file, source) in [
        ("software-delivery.yaml", include_str!("../../workflows/software-delivery.yaml")),
        ("deployment.yaml", include_str!("../../workflows/deployment.yaml")),
        ("pr-review.yaml", include_str!("../../workflows/pr-review.yaml")),
    ] {
        std::fs::write(sandbox.path().join("workflows").join(file), source).expect("write");
    }
    sandbox
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_dev_runs_the_example_workflows_and_delegates_through_the_gateway() {
    let sandbox = with_examples();
    let server = sandbox.dev().start().await;
    let mut client = WorkflowClient::new(server.channel().await);

    let listed = client
        .list_definitions(ListDefinitionsRequest { namespace: NS.into(), ..Default::default() })
        .await
        .expect("list")
        .into_inner();
    let names: Vec<&str> = listed.definitions.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["deployment", "pr-review", "software-delivery"]);

    let run = start(&mut client, "software-delivery", &[("epic", "search")]).await;
    let run = approve_until_done(&mut client, &run.id).await;
    assert_eq!(run.state(), RunState::Completed, "{run:#?}");
    let automatic = run.gate_decisions.iter().filter(|d| d.automatic).count();
    assert_eq!((run.gate_decisions.len(), automatic), (7, 2), "five HITL and two AUTO transitions");
    let output = run.output.expect("output");
    assert!(output.fields.contains_key("deployment"), "{output:?}");

    // The built-in reviewer asks no question of a workflow's task (no one
    // would answer): pr-review runs to its end, its review as data.
    let run = start(&mut client, "pr-review", &[]).await;
    let run = approve_until_done(&mut client, &run.id).await;
    assert_eq!(run.state(), RunState::Completed, "{run:#?}");
    let review = run.steps.iter().find(|step| step.step_id == "review").and_then(|step| step.output.as_ref());
    let confidence = review.and_then(|output| output.fields.get("confidence")).and_then(|value| match value.kind {
        Some(prost_types::value::Kind::NumberValue(confidence)) => Some(confidence),
        _ => None,
    });
    assert_eq!(confidence, Some(0.9), "{run:#?}");

    let delegate = "name: ask-echo\nsteps:\n- id: ask\n  delegate: {agent: echo, input: \"hello from a workflow\"}\n";
    let put = PutDefinitionRequest { namespace: NS.into(), source: delegate.into(), ..Default::default() };
    client.put_definition(put).await.expect("put");
    let run = start(&mut client, "ask-echo", &[]).await;
    let request = WatchRunRequest { namespace: NS.into(), run_id: run.id.clone(), ..Default::default() };
    let mut watch = client.watch_run(request).await.expect("watch").into_inner();
    let mut last = None;
    while let Some(event) = tokio::time::timeout(DEADLINE, watch.message()).await.expect("in time").expect("event") {
        last = Some(event);
    }
    let last = last.expect("events");
    assert_eq!(last.state(), RunState::Completed, "the watch ends with the run");
    let run = get(&mut client, &run.id).await;
    let answer = run.steps[0].output.as_ref().expect("output");
    let said = answer.fields.get("text").and_then(|v| match &v.kind {
        Some(prost_types::value::Kind::StringValue(text)) => Some(text.as_str()),
        _ => None,
    });
    assert_eq!(said, Some("hello from a workflow"), "{run:#?}");
    assert_eq!(run.steps[0].kind(), StepKind::Delegate);
    // The step names the agent's task, which can be looked up.
    let mut tasks = server.task_store().await;
    let remote = get_task(&mut tasks, "default", &run.steps[0].external_id).await;
    let state = remote.status.map(|status| status.state());
    assert_eq!(state, Some(chorus_proto::taskstore::TaskState::Completed), "{run:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_definitions_and_decisions_change_nothing() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut client = WorkflowClient::new(server.channel().await);
    for source in [
        "name: x\nsteps: [\n",
        "name: x\nsteps:\n- id: a\n  teleport: {to: mars}\n",
        "name: x\nsteps:\n- id: a\n  message: {topic: t, text: \"{{ b.output }}\"}\n- id: b\n  condition: \"true\"\n",
        "name: x\nsteps:\n- id: a\n  message: {topic: t, text: \"{{ unclosed \"}\n",
        "name: x\nsteps:\n- id: p\n  parallel:\n    branches:\n    - name: one\n      steps:\n      - id: a\n        condition: \"true\"\n    - name: two\n      steps:\n      - id: b\n        message: {topic: t, text: \"{{ a.output }}\"}\n",
    ] {
        let put = PutDefinitionRequest { namespace: NS.into(), source: source.into(), ..Default::default() };
        let status = client.put_definition(put).await.expect_err(source);
        assert_eq!(status.code(), Code::InvalidArgument, "{source}: {status:?}");
    }
    let listed = client
        .list_definitions(ListDefinitionsRequest { namespace: NS.into(), ..Default::default() })
        .await
        .expect("list")
        .into_inner();
    assert!(listed.definitions.iter().all(|d| d.name != "x"), "nothing stored");

    let gated =
        "name: gated\nsteps:\n- id: hold\n  wait: {signal: go}\n- id: ok\n  gate: {mode: HITL, reviewers: ops}\n";
    let put = PutDefinitionRequest { namespace: NS.into(), source: gated.into(), ..Default::default() };
    client.put_definition(put).await.expect("put");
    let run = start(&mut client, "gated", &[]).await;
    let decide = DecideGateRequest {
        namespace: NS.into(),
        run_id: run.id.clone(),
        step_id: "ok".into(),
        decision: pb::Decision::Approve.into(),
        decided_by: "e2e".into(),
        ..Default::default()
    };
    let status = client.decide_gate(decide).await.expect_err("the gate is not waiting");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let after = get(&mut client, &run.id).await;
    assert!(after.gate_decisions.is_empty());
    assert_eq!(after.steps.len(), 1, "only the wait has a record");
}

/// Branches that call this process's hub at the same time, on SQLite: the
/// engine calls its neighbours in process, and a call must not wait for the
/// one writer the engine holds meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_branches_calling_the_hub_at_once_complete_on_sqlite() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut client = WorkflowClient::new(server.channel().await);
    let source = r"
name: fanout
steps:
- id: p
  parallel:
    branches:
    - name: one
      steps:
      - id: a
        message: {topic: news, text: one}
    - name: two
      steps:
      - id: b
        message: {topic: news, text: two}
"
    .to_owned();
    let put = PutDefinitionRequest { namespace: NS.into(), source, ..Default::default() };
    client.put_definition(put).await.expect("put");
    let run = start(&mut client, "fanout", &[]).await;
    let wait = GetRunRequest { namespace: NS.into(), run_id: run.id.clone(), wait_finished: true };
    let mut request = tonic::Request::new(wait);
    request.set_timeout(Duration::from_secs(20));
    let done = client.get_run(request).await.expect("the run finishes").into_inner();
    assert_eq!(done.state(), RunState::Completed, "{done:#?}");
}

/// The states of the tasks of the agent `ghost`, once they are all `want`.
async fn ghost_tasks_become(a2a: &chorus_tests::a2a::A2a, count: usize, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = a2a.call("ghost", "ListTasks", serde_json::json!({})).await;
        let tasks = listed["tasks"].as_array().expect("tasks");
        let states: Vec<&str> = tasks.iter().map(chorus_tests::a2a::state).collect();
        if states.len() == count && states.iter().all(|state| *state == want) {
            return;
        }
        assert!(Instant::now() < deadline, "not {count} tasks {want}: {listed:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A delegate step past its timeout fails, and one whose run is canceled
/// ends; either way the task it made is canceled then, not when the
/// gateway's own delegation timeout (5 minutes) passes: `chorus dev` calls
/// the gateway in process, where giving up on a call must end its handler
/// as a reset stream does over the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegate_step_given_up_cancels_the_task_it_made() {
    let sandbox = Sandbox::new();
    let catalog = "[gateway]\ndefault_agent = \"ghost\"\n[[gateway.agents]]\nid = \"ghost\"\nname = \"Ghost\"\n\
                   description = \"No worker serves it.\"\nkind = \"worker\"\n";
    chorus_tests::a2a::write_chorus_toml(sandbox.path(), catalog);
    let server = sandbox.dev().no_agents().start().await;
    let mut client = WorkflowClient::new(server.channel().await);
    let a2a = chorus_tests::a2a::A2a::new(&server);
    for (name, timeout) in [("brief", "1s"), ("patient", "5m")] {
        let source =
            format!("name: {name}\nsteps:\n- id: ask\n  delegate: {{agent: ghost, input: boo, timeout: {timeout}}}\n");
        let put = PutDefinitionRequest { namespace: NS.into(), source, ..Default::default() };
        client.put_definition(put).await.expect("put");
    }

    let run = start(&mut client, "brief", &[]).await;
    let wait = GetRunRequest { namespace: NS.into(), run_id: run.id.clone(), wait_finished: true };
    let done = client.get_run(wait).await.expect("the run finishes").into_inner();
    assert_eq!(done.state(), RunState::Failed, "{done:#?}");
    assert!(done.steps[0].error.contains("no answer within 1s"), "{done:#?}");
    ghost_tasks_become(&a2a, 1, "TASK_STATE_CANCELED").await;

    let run = start(&mut client, "patient", &[]).await;
    let deadline = Instant::now() + DEADLINE;
    while a2a.call("ghost", "ListTasks", serde_json::json!({})).await["tasks"].as_array().map(Vec::len) != Some(2) {
        assert!(Instant::now() < deadline, "the second step made no task");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cancel = pb::CancelRunRequest { namespace: NS.into(), run_id: run.id.clone(), ..Default::default() };
    client.cancel_run(cancel).await.expect("cancel");
    ghost_tasks_become(&a2a, 2, "TASK_STATE_CANCELED").await;
}

/// Each start logs every definition it loads, unchanged ones too. With a
/// log filter per layer, the line after the first put's queries went
/// missing on PostgreSQL from the second start on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_start_logs_each_definition_it_loads() {
    let Some(database) = PostgresDatabase::create_or_skip().await else { return };
    let sandbox = with_examples();
    for start in ["first", "second"] {
        let engine = sandbox.serve("workflow", database.url()).env("RUST_LOG", "info,sqlx=warn,h2=warn").start().await;
        let deadline = Instant::now() + DEADLINE;
        while !engine.output().contains("workflow engine started") {
            assert!(Instant::now() < deadline, "no engine start logged:\n{}", engine.output());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let output = engine.output();
        let loaded: Vec<&str> = output
            .lines()
            .filter(|line| line.contains("workflow definition loaded"))
            .filter_map(|line| line.split("workflow=").nth(1)?.split(' ').next())
            .collect();
        assert_eq!(loaded, ["deployment", "pr-review", "software-delivery"], "{start} start:\n{output}");
        engine.stop().await;
    }
}

/// Every connection the engine held is ended by the server (a failover, an
/// operator's pg_terminate_backend): the engine reconnects and runs go on.
/// Its warm connections, reused every poll, were handed out broken for ever:
/// health answered NOT_SERVING and every call failed until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_connections_were_ended_reconnects() {
    let Some(database) = PostgresDatabase::create_or_skip().await else { return };
    let sandbox = Sandbox::new();
    let engine = sandbox.serve("workflow", database.url()).start().await;
    let mut client = WorkflowClient::new(engine.channel().await);
    let source = "name: quick\nsteps:\n- id: a\n  condition: \"true\"\n";
    let put = PutDefinitionRequest { namespace: NS.into(), source: source.into(), ..Default::default() };
    client.put_definition(put).await.expect("put");
    let run = start(&mut client, "quick", &[]).await;
    assert_eq!(finished(&mut client, &run.id).await.state(), RunState::Completed);

    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(database.url()).await.expect("admin connection");
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(database.name())
    .fetch_all(&mut admin)
    .await
    .expect("end the engine's connections");
    assert!(!ended.is_empty(), "the engine held connections");

    let deadline = Instant::now() + Duration::from_secs(20);
    let run = loop {
        let request = StartRunRequest { namespace: NS.into(), workflow: "quick".into(), ..Default::default() };
        match client.start_run(request).await {
            Ok(run) => break run.into_inner(),
            Err(status) => assert!(Instant::now() < deadline, "no run starts after the outage: {status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(finished(&mut client, &run.id).await.state(), RunState::Completed);
    engine.assert_serving().await;
}

async fn finished(client: &mut WorkflowClient<Channel>, run_id: &str) -> pb::Run {
    let request = GetRunRequest { namespace: NS.into(), run_id: run_id.into(), wait_finished: true };
    client.get_run(request).await.expect("get").into_inner()
}

/// A run's delegate step to one of the gateway's own agents acts in the
/// run's namespace: the agent's task is that namespace's, not the default's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegate_step_to_a_catalog_agent_acts_in_the_runs_namespace() {
    let sandbox = Sandbox::new();
    chorus_tests::a2a::write_chorus_toml(sandbox.path(), "[gateway]\nnamespaces = [\"default\", \"team-a\"]\n");
    let server = sandbox.dev().start().await;
    let mut client = WorkflowClient::new(server.channel().await);
    let delegate = "name: ask-echo\nsteps:\n- id: ask\n  delegate: {agent: echo, input: \"team a asks\"}\n";
    let put = PutDefinitionRequest { namespace: "team-a".into(), source: delegate.into(), ..Default::default() };
    client.put_definition(put).await.expect("put");
    let request = StartRunRequest { namespace: "team-a".into(), workflow: "ask-echo".into(), ..Default::default() };
    let run = client.start_run(request).await.expect("start").into_inner();
    // The demo agents serve the default namespace: team A's echo is this test's.
    let mut tasks = server.task_store().await;
    let claim = chorus_proto::taskstore::ClaimTasksRequest {
        namespace: "team-a".into(),
        agent_id: "echo".into(),
        worker_id: "team-a-echo".into(),
        capacity: 1,
        ..Default::default()
    };
    let mut claims = tasks.claim_tasks(claim).await.expect("claim").into_inner();
    let claimed = tokio::time::timeout(DEADLINE, claims.message()).await.expect("in time").expect("a claim");
    let claimed = claimed.expect("team A's task");
    let asked = claimed.task.expect("the task");
    assert_eq!(chorus_tests::tasks::text_of(asked.history.first()), "team a asks");
    let complete = chorus_proto::taskstore::CompleteTaskRequest {
        namespace: "team-a".into(),
        task_id: asked.id.clone(),
        lease_id: claimed.lease_id,
        ..Default::default()
    };
    tasks.complete_task(complete).await.expect("complete");
    let request = GetRunRequest { namespace: "team-a".into(), run_id: run.id, wait_finished: true };
    let run = client.get_run(request).await.expect("get").into_inner();
    assert_eq!(run.state(), RunState::Completed, "{run:#?}");
    assert_eq!(run.steps[0].external_id, asked.id);
    let elsewhere = chorus_proto::taskstore::GetTaskRequest {
        namespace: NS.into(),
        id: run.steps[0].external_id.clone(),
        ..Default::default()
    };
    let status = tasks.get_task(elsewhere).await.expect_err("not the default namespace's task");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}
