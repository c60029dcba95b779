//! Authentication and tenant scoping end to end: `chorus dev` with a bearer
//! token for operators and an API key scoped to one namespace (from its
//! `chorus.toml`), called over JSON-RPC, HTTP+JSON and gRPC.

use a2a_pb::proto as pb;
use chorus_tests::{
    Sandbox,
    a2a::{
        A2a, assert_error_info, assert_grpc_error, assert_rest_error, assert_rpc_error, grpc_request, json, message,
        state, text, unique, write_chorus_toml,
    },
};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tonic::{Code, metadata::MetadataValue};

const AUTH: &str = r#"
[gateway.auth]
bearer_tokens = [{ name = "ops", secret = "s3cret", namespaces = ["*"] }]
api_keys = [{ name = "team-a", secret = "key-a", namespaces = ["team-a"] }]
"#;

/// The namespaces the tests act in: team B's is served, though no
/// credential names it (an operator's covers it).
const NAMESPACES: &str = r#"
[gateway]
namespaces = ["default", "team-a", "team-b"]
"#;

/// What team A's task says; no refused answer may show it.
const PLANS: &str = "team a's secret plans";

fn team_a(request: RequestBuilder) -> RequestBuilder {
    request.header("X-API-Key", "key-a")
}

fn ops(request: RequestBuilder) -> RequestBuilder {
    request.bearer_auth("s3cret")
}

/// Sends a JSON-RPC `request` that is refused before it runs: HTTP `status`
/// and a JSON-RPC error body with `reason`, and nothing of team A's task.
async fn assert_refused(request: RequestBuilder, status: StatusCode, reason: &str) {
    let (answered, body) = json(request).await;
    assert_eq!(answered, status, "{body:#}");
    assert!(body.get("result").is_none(), "{body:#}");
    assert_error_info(&body["error"]["data"], reason);
    assert!(!body.to_string().contains(PLANS), "a refused call shows no task data: {body:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_required_and_scoped_to_their_namespaces() {
    let sandbox = Sandbox::new();
    write_chorus_toml(sandbox.path(), &format!("{NAMESPACES}{AUTH}"));
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);

    // Team A's key acts in team A's namespace without naming it.
    let send = json!({ "message": message(&unique("tck-complete-task"), PLANS) });
    let (status, created) = json(team_a(a2a.rpc("tck", "SendMessage", send.clone()))).await;
    assert_eq!(status, StatusCode::OK, "{created:#}");
    let task = created["result"]["task"].clone();
    assert_eq!(state(&task), "TASK_STATE_COMPLETED", "{created:#}");
    let id = task["id"].clone();
    let in_team_a = json!({ "id": id, "tenant": "team-a" });
    let noted = &task["history"][0]["metadata"]["chorus.caller"];
    assert_eq!(noted, "team-a", "a message notes the credential it came with: {task:#}");
    let mut forged = send.clone();
    forged["message"]["metadata"] = json!({ "chorus.caller": "ops" });
    assert_refused(team_a(a2a.rpc("tck", "SendMessage", forged)), StatusCode::OK, "INVALID_PARAMS").await;

    assert_refused(a2a.rpc("tck", "GetTask", in_team_a.clone()), StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    assert_refused(a2a.rpc("tck", "SendMessage", send.clone()), StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    let (_, refused) = json(a2a.rpc("tck", "GetTask", in_team_a.clone())).await;
    assert_eq!(refused["id"], chorus_tests::a2a::REQUEST_ID, "the refusal answers its request: {refused:#}");
    let wrong_token = a2a.rpc("tck", "GetTask", in_team_a.clone()).bearer_auth("nope");
    assert_refused(wrong_token, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    let wrong_key = a2a.rpc("tck", "GetTask", in_team_a.clone()).header("X-API-Key", "key-b");
    assert_refused(wrong_key, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    for anonymous in [a2a.rpc("tck", "GetTask", in_team_a.clone()), a2a.rest(Method::GET, "tck", "tasks")] {
        let answer = anonymous.send().await.expect("answered");
        let challenge = answer.headers().get("www-authenticate").and_then(|value| value.to_str().ok());
        assert_eq!(challenge, Some("Bearer realm=\"chorus\""), "a 401 says how to authenticate");
    }
    let path = format!("team-a/tasks/{}", id.as_str().unwrap_or_default());
    let (status, body) = json(a2a.rest(Method::GET, "tck", &path)).await;
    assert_rest_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    assert!(!body.to_string().contains(PLANS), "{body:#}");

    // Like /healthz, /metrics asks for no credential: it names no tenant.
    let metrics = a2a.get("/metrics").send().await.expect("answered");
    assert_eq!(metrics.status(), StatusCode::OK);
    let page = metrics.text().await.expect("a text page");
    let refused = "chorus_http_requests_total{route=\"/a2a/{agent}\",method=\"POST\",status=\"401\",kind=\"http\"}";
    assert!(page.contains(refused), "refused calls are counted:\n{page}");
    assert!(!page.contains("team-a"), "{page}");

    // Team A's key does not reach team B.
    let elsewhere = team_a(a2a.rpc("tck", "GetTask", json!({ "id": id, "tenant": "team-b" })));
    assert_refused(elsewhere, StatusCode::FORBIDDEN, "PERMISSION_DENIED").await;
    let (status, body) = json(team_a(a2a.rest(Method::GET, "tck", "team-b/tasks"))).await;
    assert_rest_error(status, &body, StatusCode::FORBIDDEN, "PERMISSION_DENIED");
    // Over REST the tenant may also be the request's field, in the query or
    // the body; one that contradicts the path is refused.
    let (status, body) = json(team_a(a2a.rest(Method::GET, "tck", "tasks?tenant=team-b"))).await;
    assert_rest_error(status, &body, StatusCode::FORBIDDEN, "PERMISSION_DENIED");
    let (status, body) = json(ops(a2a.rest(Method::GET, "tck", "tasks?tenant=team-a"))).await;
    assert_eq!(status, StatusCode::OK, "{body:#}");
    assert!(body.to_string().contains(PLANS), "the operator lists team A's tasks by the field: {body:#}");
    let mut named = send.clone();
    named["tenant"] = json!("team-b");
    let (status, body) = json(ops(a2a.rest(Method::POST, "tck", "team-a/message:send")).json(&named)).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    let (status, body) = json(ops(a2a.rest(Method::POST, "tck", "message:send?tenant=team-a")).json(&named)).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_PARAMS");
    // A cancel's body names its tenant too: team A's task is found, and is done.
    let cancel = format!("tasks/{}:cancel", id.as_str().unwrap_or_default());
    let (status, body) = json(ops(a2a.rest(Method::POST, "tck", &cancel)).json(&json!({ "tenant": "team-a" }))).await;
    assert_rest_error(status, &body, StatusCode::BAD_REQUEST, "TASK_NOT_CANCELABLE");
    // A tenant naming another agent than the URL is refused.
    let elsewhere = ops(a2a.rpc("tck", "GetTask", json!({ "id": id, "tenant": "team-a/echo" })));
    assert_refused(elsewhere, StatusCode::OK, "INVALID_PARAMS").await;

    // A task lives in its namespace only: other namespaces do not see it.
    for other in [json!({ "id": id, "tenant": "team-b" }), json!({ "id": id })] {
        let (status, body) = json(ops(a2a.rpc("tck", "GetTask", other))).await;
        assert_eq!(status, StatusCode::OK, "{body:#}");
        assert_rpc_error(&body["error"], -32001, "TASK_NOT_FOUND");
        assert!(!body.to_string().contains(PLANS), "{body:#}");
    }
    let (_, listed) = json(ops(a2a.rpc("tck", "ListTasks", json!({})))).await;
    assert_eq!(listed["result"]["totalSize"], 0, "the default namespace has no task: {listed:#}");
    // One the gateway does not serve is not found, even for a credential of every namespace.
    let (_, body) = json(ops(a2a.rpc("tck", "ListTasks", json!({ "tenant": "team-z" })))).await;
    assert_rpc_error(&body["error"], -32602, "NAMESPACE_NOT_FOUND");
    let (_, read) = json(ops(a2a.rpc("tck", "GetTask", in_team_a.clone()))).await;
    assert_eq!(text(&read["result"]["history"][0]), PLANS, "the operator reads team A's task there: {read:#}");
    let (_, own) = json(team_a(a2a.rpc("tck", "ListTasks", json!({})))).await;
    assert_eq!(own["result"]["totalSize"], 1, "{own:#}");

    // Cards stay public and say how to authenticate.
    let (status, card) = json(a2a.get("/.well-known/agent-card.json")).await;
    assert_eq!(status, StatusCode::OK);
    let schemes = &card["securitySchemes"];
    assert_eq!(schemes["bearer"]["httpAuthSecurityScheme"]["scheme"], "bearer", "{card:#}");
    let api_key = &schemes["apiKey"]["apiKeySecurityScheme"];
    assert_eq!((&api_key["name"], &api_key["location"]), (&json!("X-API-Key"), &json!("header")), "{card:#}");
    assert!(card["securityRequirements"].as_array().is_some_and(|requirements| requirements.len() == 2));
    assert_eq!(card["capabilities"]["extendedAgentCard"], true);
    let (status, _) = json(a2a.get("/a2a/tck/.well-known/agent-card.json")).await;
    assert_eq!(status, StatusCode::OK);
    let extended = ops(a2a.rpc("tck", "GetExtendedAgentCard", json!({})));
    let (_, extended) = json(extended).await;
    assert_eq!(extended["result"]["name"], "A2A TCK agent", "{extended:#}");
    // The extended card's gRPC interface names the caller's own tenant, which
    // its credential may use (the public card's is the default namespace's).
    let grpc_tenant = |card: &Value| card["supportedInterfaces"][2]["tenant"].clone();
    assert_eq!(grpc_tenant(&card), json!(null), "the default agent in the default namespace: {card:#}");
    assert_eq!(grpc_tenant(&extended["result"]), "default/tck", "{extended:#}");
    let (_, mine) = json(team_a(a2a.rpc("tck", "GetExtendedAgentCard", json!({})))).await;
    assert_eq!(grpc_tenant(&mine["result"]), "team-a/tck", "{mine:#}");
    assert_refused(a2a.rpc("tck", "GetExtendedAgentCard", json!({})), StatusCode::UNAUTHORIZED, "UNAUTHENTICATED")
        .await;
}

fn get_task(id: &Value, tenant: &str) -> tonic::Request<pb::GetTaskRequest> {
    let id = id.as_str().unwrap_or_default().to_owned();
    grpc_request(pb::GetTaskRequest { tenant: tenant.to_owned(), id, history_length: None })
}

fn with<T>(mut request: tonic::Request<T>, key: &'static str, value: &'static str) -> tonic::Request<T> {
    request.metadata_mut().insert(key, MetadataValue::from_static(value));
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_need_credentials_too() {
    let sandbox = Sandbox::new();
    write_chorus_toml(sandbox.path(), &format!("{NAMESPACES}{AUTH}"));
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let send = json!({ "message": message(&unique("tck-complete-task"), PLANS) });
    let (_, created) = json(team_a(a2a.rpc("tck", "SendMessage", send))).await;
    let id = created["result"]["task"]["id"].clone();
    let mut client = A2a::grpc(&server).await;

    assert_grpc_error(client.get_task(get_task(&id, "team-a")).await, Code::Unauthenticated, "UNAUTHENTICATED");
    let wrong = with(get_task(&id, "team-a"), "authorization", "Bearer nope");
    assert_grpc_error(client.get_task(wrong).await, Code::Unauthenticated, "UNAUTHENTICATED");
    let elsewhere = with(get_task(&id, "team-b"), "x-api-key", "key-a");
    assert_grpc_error(client.get_task(elsewhere).await, Code::PermissionDenied, "PERMISSION_DENIED");
    let other_namespace = with(get_task(&id, "team-b"), "authorization", "Bearer s3cret");
    assert_grpc_error(client.get_task(other_namespace).await, Code::NotFound, "TASK_NOT_FOUND");

    // The tenant names the agent too (the card's `team-a/tck`); the default
    // agent (echo) does not serve the tck agent's task.
    let default_agent = with(get_task(&id, ""), "x-api-key", "key-a");
    assert_grpc_error(client.get_task(default_agent).await, Code::NotFound, "TASK_NOT_FOUND");
    let own = with(get_task(&id, "team-a/tck"), "x-api-key", "key-a");
    let task = client.get_task(own).await.expect("team A reads its task").into_inner();
    assert_eq!(task.status.map(|status| status.state()), Some(pb::TaskState::Completed));
    let operator = with(get_task(&id, "team-a/tck"), "authorization", "Bearer s3cret");
    assert_eq!(client.get_task(operator).await.expect("the operator reads it").into_inner().id, task.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_named_by_chorus_config_is_read() {
    let sandbox = Sandbox::new();
    let elsewhere = sandbox.path().join("etc");
    std::fs::create_dir_all(&elsewhere).expect("a config directory");
    let config = write_chorus_toml(&elsewhere, AUTH);
    // `chorus --config` is also `CHORUS_CONFIG` (its clap `env`).
    let server = sandbox.dev().no_agents().env("CHORUS_CONFIG", &config).start().await;
    let a2a = A2a::new(&server);
    let (status, card) = json(a2a.get("/.well-known/agent-card.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(card["securitySchemes"]["bearer"].is_object(), "the file's credentials are in force: {card:#}");
    let (status, _) = json(a2a.rpc("tck", "ListTasks", json!({}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

const SPAWNS: &str = "name: spawns\nsteps:\n- id: ask\n  spawn: {agent: echo, input: \"hello\"}\n";

/// A delegate step naming an agent of the gateway's own catalog.
const DELEGATES: &str = "name: delegates\nsteps:\n- id: ask\n  delegate: {agent: spawns, input: \"go\"}\n";

const SPAWNS_AGENT: &str = r#"
[gateway]
default_agent = "spawns"

[[gateway.agents]]
id = "spawns"
name = "Spawns"
description = "A workflow that asks the echo agent"
kind = "workflow"
"#;

/// The workflow CLI against `server` with `env`: its exit code and stderr.
async fn workflow_list(server: &chorus_tests::Server, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(chorus_tests::server::chorus_bin());
    command.args(["workflow", "list", "--server", server.url()]).env_remove("CHORUS_TOKEN").envs(env.iter().copied());
    let output = command.output().await.expect("run the CLI");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chorus_own_services_beside_the_gateway_take_credentials_for_the_namespace_a_request_names() {
    use chorus_proto::{
        taskstore::{
            ClaimPushConfigsRequest, ClaimTasksRequest, CompleteTaskRequest, ListTasksRequest, WatchTaskRequest,
        },
        workflow::{
            GetRunRequest, ListRunsRequest, RunState, StartRunRequest, run_origin::Kind as RunOriginKind,
            workflow_client::WorkflowClient,
        },
    };
    use chorus_tests::tasks::create_request;
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("dir");
    std::fs::write(sandbox.path().join("workflows/spawns.yaml"), SPAWNS).expect("write");
    std::fs::write(sandbox.path().join("workflows/delegates.yaml"), DELEGATES).expect("write");
    write_chorus_toml(sandbox.path(), &format!("{AUTH}{SPAWNS_AGENT}"));
    let server = sandbox.dev().start().await;

    let mut tasks = server.task_store().await;
    let list = || ListTasksRequest { namespace: "team-a".into(), ..Default::default() };
    let anonymous = tasks.list_tasks(list()).await.expect_err("no credentials");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    chorus_tests::status::assert_reason(&anonymous, "gateway.chorus.dev", "UNAUTHENTICATED");
    // Team A's key acts in team A: its client creates and watches, its worker claims and completes.
    let team_a_task = create_request("team-a", "planner", PLANS);
    let created = tasks.create_task(with(tonic::Request::new(team_a_task), "x-api-key", "key-a")).await;
    let created = created.expect("team A creates in team A").into_inner();
    let listed = tasks.list_tasks(with(tonic::Request::new(list()), "x-api-key", "key-a")).await;
    assert_eq!(listed.expect("team A lists team A").into_inner().tasks.len(), 1);
    let watch = WatchTaskRequest { namespace: "team-a".into(), task_id: created.id.clone(), ..Default::default() };
    let mut events = tasks.watch_task(with(tonic::Request::new(watch), "x-api-key", "key-a")).await.expect("watch");
    assert!(events.get_mut().message().await.expect("an event").is_some(), "the watch streams team A's task");
    let claim = ClaimTasksRequest {
        namespace: "team-a".into(),
        agent_id: "planner".into(),
        worker_id: "team-a-worker".into(),
        capacity: 1,
        ..Default::default()
    };
    let mut claims = tasks.claim_tasks(with(tonic::Request::new(claim), "x-api-key", "key-a")).await.expect("claim");
    let claimed = claims.get_mut().message().await.expect("a claim").expect("team A's task");
    let complete = CompleteTaskRequest {
        namespace: "team-a".into(),
        task_id: created.id.clone(),
        lease_id: claimed.lease_id,
        ..Default::default()
    };
    tasks.complete_task(with(tonic::Request::new(complete), "x-api-key", "key-a")).await.expect("team A completes");
    // ...and nowhere else, nor across namespaces.
    let elsewhere = create_request("team-b", "echo", "not ours");
    let refused = tasks.create_task(with(tonic::Request::new(elsewhere), "x-api-key", "key-a")).await;
    let refused = refused.expect_err("team B is not team A's");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("not granted namespace team-b"), "{refused:?}");
    let named = chorus_tests::status::assert_reason(&refused, "gateway.chorus.dev", "NAMESPACE_NOT_GRANTED");
    assert_eq!(named.get("namespace").map(String::as_str), Some("team-b"));
    let across = ClaimPushConfigsRequest { follower: "gw".into(), lease_ms: 1_000, limit: 1 };
    let across = tasks.claim_push_configs(with(tonic::Request::new(across), "x-api-key", "key-a")).await;
    let across = across.expect_err("a method across namespaces");
    assert_eq!(across.code(), Code::PermissionDenied, "{across:?}");
    assert!(across.message().contains("every namespace"), "{across:?}");
    let team_b = ListTasksRequest { namespace: "team-b".into(), ..Default::default() };
    let listed = tasks.list_tasks(with(tonic::Request::new(team_b), "authorization", "Bearer s3cret")).await;
    assert!(listed.expect("the operator lists").into_inner().tasks.is_empty(), "the refused create made nothing");

    // Health stays open for probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    health.check(tonic_health::pb::HealthCheckRequest::default()).await.expect("health needs no credentials");

    // A browser's grpc-web call is checked the same way.
    let a2a = A2a::new(&server);
    let team_b = ListTasksRequest { namespace: "team-b".into(), ..Default::default() };
    let (list_tasks, teleport) = ("ListTasks", "Teleport");
    for (method, key, request, status) in [
        (list_tasks, "", list(), "16"),
        (list_tasks, "key-a", list(), "0"),
        (list_tasks, "key-a", team_b, "7"),
        // No such method, for anyone: UNIMPLEMENTED.
        (teleport, "key-a", list(), "12"),
    ] {
        let mut headers = vec![("origin", "https://elsewhere.example")];
        if !key.is_empty() {
            headers.push(("x-api-key", key));
        }
        let path = format!("/chorus.taskstore.v1.TaskStore/{method}");
        let answer = chorus_tests::grpc_web::call(&a2a, &path, &request, &headers).await;
        // A refusal comes as headers alone; an answer's status is in the body's trailer frame.
        let header = answer.headers().get("grpc-status").map(|value| value.to_str().expect("ascii").to_owned());
        let body = String::from_utf8_lossy(&answer.bytes().await.expect("the body")).into_owned();
        let answered = header.or_else(|| body.split("grpc-status:").nth(1).map(str::to_owned));
        let answered = answered.map(|code| code.chars().take_while(char::is_ascii_digit).collect::<String>());
        assert_eq!(answered.as_deref(), Some(status), "{method} {key:?} {request:?}: {body}");
    }

    // The operator's run: the engine spawns the echo task in process.
    let channel = server.channel().await;
    let transport = chorus_runtime::transport::Transport::remote(channel).with_bearer("s3cret").expect("header");
    let mut workflows = WorkflowClient::new(transport);
    // Who started it is what the request says, attested by the credential.
    let origin = chorus_proto::workflow::RunOrigin { started_by: "ana".into(), ..Default::default() };
    let start = StartRunRequest {
        namespace: "default".into(),
        workflow: "spawns".into(),
        origin: Some(origin),
        ..Default::default()
    };
    let run = workflows.start_run(start).await.expect("start").into_inner();
    let get = GetRunRequest { namespace: "default".into(), run_id: run.id.clone(), wait_finished: true };
    let done = workflows.get_run(get).await.expect("get").into_inner();
    assert_eq!(done.state(), RunState::Completed, "{done:?}");
    assert_eq!(done.origin.expect("origin").started_by, "ana (credential ops)");
    // A delegate step to one of the gateway's own agents passes its auth.
    let start = StartRunRequest { namespace: "default".into(), workflow: "delegates".into(), ..Default::default() };
    let run = workflows.start_run(start).await.expect("start").into_inner();
    let get = GetRunRequest { namespace: "default".into(), run_id: run.id.clone(), wait_finished: true };
    let done = workflows.get_run(get).await.expect("get").into_inner();
    assert_eq!(done.state(), RunState::Completed, "{done:?}");

    // The gateway starts a workflow agent's run in process too.
    let send = json!({ "message": message(&unique("start"), "go") });
    let (status, answer) = json(ops(a2a.rpc("spawns", "SendMessage", send))).await;
    assert_eq!(status, StatusCode::OK, "{answer:#}");
    assert_eq!(state(&answer["result"]["task"]), "TASK_STATE_COMPLETED", "{answer:#}");
    // Its run names the credential the message came with.
    let listed = ListRunsRequest { namespace: "default".into(), workflow: "spawns".into(), ..Default::default() };
    let runs = workflows.list_runs(listed).await.expect("list").into_inner().runs;
    let origins: Vec<_> =
        runs.iter().filter_map(|run| run.origin.as_ref()).map(|o| (o.kind(), &*o.started_by)).collect();
    assert!(origins.contains(&(RunOriginKind::A2a, "a2a:ops")), "{origins:?}");

    // The CLI sends the token of CHORUS_TOKEN (or --token-file).
    let (code, stderr) = workflow_list(&server, &[]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("credentials"), "{stderr}");
    let (code, stderr) = workflow_list(&server, &[("CHORUS_TOKEN", "s3cret")]).await;
    assert_eq!(code, Some(0), "{stderr}");
}

/// A tenant naming a namespace the gateway does not serve (a typo, a 0.3
/// REST client's `/v1/` prefix) is not found: it created a task no worker
/// would ever take, which a blocking send waited a minute for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_the_gateway_does_not_serve_is_not_found() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let send = json!({ "message": message("m-v1", "hi") });
    let (status, body) = json(a2a.rest(Method::POST, "echo", "v1/message:send").json(&send)).await;
    assert_rest_error(status, &body, StatusCode::NOT_FOUND, "NAMESPACE_NOT_FOUND");
    let message_text = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message_text.contains("\"v1\"") && message_text.contains("serves: default"), "{body:#}");
    let named = json!({ "message": message("m-bogus", "hi"), "tenant": "bogus" });
    let error = a2a.call_error("echo", "SendMessage", named).await;
    assert_eq!((&error["code"], &error["data"][0]["reason"]), (&json!(-32602), &json!("NAMESPACE_NOT_FOUND")));
    assert_eq!(a2a.task_count().await, 0, "a refused request created no task");
}
