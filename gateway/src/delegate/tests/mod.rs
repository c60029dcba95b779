//! The client against a real A2A agent on a socket (see `agent`).

mod agent;
mod flows;

use a2a::{
    AgentCard, CancelTaskRequest, GetTaskRequest, Message, Part, Role, SendMessageRequest, SendMessageResponse,
    StreamResponse, TaskState,
};
use futures_util::StreamExt;
use serde_json::json;

use self::agent::{Agent, Setup};
use super::{A2aClient, Binding, Credentials, DelegateError, Endpoint, pick_interface};

fn client() -> A2aClient {
    let _ = rustls::crypto::ring::default_provider().install_default();
    A2aClient::new(reqwest::Client::new())
}

fn user(text: &str) -> Message {
    Message::new(Role::User, vec![Part::text(text)])
}

fn request(text: &str) -> SendMessageRequest {
    SendMessageRequest { message: user(text), configuration: None, metadata: None, tenant: None }
}

fn get(id: &str) -> GetTaskRequest {
    GetTaskRequest { id: id.to_owned(), history_length: None, tenant: None }
}

fn cancel(id: &str) -> CancelTaskRequest {
    CancelTaskRequest { id: id.to_owned(), metadata: None, tenant: None }
}

const JSONRPC: Setup = Setup { streaming: true, jsonrpc: true, tenant: None };
const REST: Setup = Setup { streaming: true, jsonrpc: false, tenant: None };

/// Starts an agent and picks its interface from its card.
async fn start(setup: Setup) -> (Agent, Endpoint) {
    let agent = agent::start(setup).await;
    let card = client().fetch_card(&agent.base_url).await.expect("card");
    let endpoint = pick_interface(&card).expect("an interface");
    (agent, endpoint)
}

fn header<'a>(call: &'a agent::Call, name: &str) -> &'a str {
    call.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("<missing>")
}

fn sent_task(response: SendMessageResponse) -> a2a::Task {
    match response {
        SendMessageResponse::Task(task) => task,
        SendMessageResponse::Message(message) => panic!("expected a task, got message {message:?}"),
    }
}

#[tokio::test]
async fn the_card_is_read_from_the_well_known_path_or_the_given_card_url() {
    let agent = agent::start(JSONRPC).await;
    let client = client();
    let from_base = client.fetch_card(&format!("{}/", agent.base_url)).await.expect("card from the base URL");
    let card_url = format!("{}/.well-known/agent-card.json", agent.base_url);
    let from_card_url = client.fetch_card(&card_url).await.expect("card from its own URL");
    assert_eq!(from_base.name, "Echo Agent");
    assert_eq!(from_base, from_card_url);
    assert_eq!(agent.state.card_hits.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_0_3_card_is_refused_with_a_clear_reason() {
    let agent = agent::start(JSONRPC).await;
    let error = client().fetch_card(&format!("{}/legacy", agent.base_url)).await.expect_err("a 0.3 card");
    let DelegateError::Protocol { detail, .. } = &error else { panic!("expected Protocol, got {error:?}") };
    assert!(detail.contains("A2A 0.3 format"), "{detail}");
}

#[tokio::test]
async fn credentials_stay_out_of_debug_output_and_bad_ones_are_refused() {
    let bearer = Credentials::Bearer("s3cret".into());
    let api_key = Credentials::ApiKey { header: "X-Key".into(), value: "k3y".into() };
    let shown = format!("{bearer:?} {api_key:?}");
    assert!(!shown.contains("s3cret") && !shown.contains("k3y") && shown.contains("X-Key"), "{shown}");

    let endpoint = Endpoint { url: "http://127.0.0.1:9/rpc".into(), binding: Binding::JsonRpc, tenant: None };
    let bad = Credentials::ApiKey { header: "X Key".into(), value: "k3y".into() };
    let error = client().send(&endpoint, request("hello"), Some(&bad)).await.expect_err("bad header name");
    assert!(matches!(error, DelegateError::InvalidCredentials { .. }), "{error:?}");
    assert!(!error.to_string().contains("k3y"), "{error}");
}

fn card(interfaces: serde_json::Value) -> AgentCard {
    serde_json::from_value(json!({
        "name": "a", "description": "a", "version": "1", "supportedInterfaces": interfaces,
        "capabilities": {}, "defaultInputModes": [], "defaultOutputModes": [], "skills": []
    }))
    .expect("a card")
}

#[test]
fn the_card_s_first_1_0_interface_chorus_speaks_wins_and_its_tenant_is_kept() {
    let rpc_first = card(json!([
        {"url": "http://a/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        {"url": "a:443", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": "http://a/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0", "tenant": "acme"},
        {"url": "http://a/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ]));
    let expected = Endpoint { url: "http://a/rpc".into(), binding: Binding::JsonRpc, tenant: Some("acme".into()) };
    assert_eq!(pick_interface(&rpc_first).expect("jsonrpc"), expected);

    let rest_first = card(json!([
        {"url": "a:443", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": "http://a/rest", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
        {"url": "http://a/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
    ]));
    let expected = Endpoint { url: "http://a/rest".into(), binding: Binding::HttpJson, tenant: None };
    assert_eq!(pick_interface(&rest_first).expect("http+json"), expected, "the card's order is its preference");
}

#[test]
fn a_card_without_a_usable_interface_says_what_it_offers() {
    let legacy = card(json!([
        {"url": "a:443", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
        {"url": "http://a/", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
    ]));
    let error = pick_interface(&legacy).expect_err("no usable interface");
    assert!(matches!(&error, DelegateError::NoInterface { offered } if offered.len() == 2), "{error:?}");
    assert_eq!(
        error.to_string(),
        "the agent card offers no JSON-RPC or HTTP+JSON interface for A2A 1.0 (it offers: GRPC 1.0, JSONRPC 0.3)"
    );
}

#[tokio::test]
async fn jsonrpc_calls_carry_the_version_header_credentials_and_tenant() {
    let (agent, endpoint) = start(Setup { tenant: Some("acme"), ..JSONRPC }).await;
    assert_eq!(endpoint.binding, Binding::JsonRpc);
    let credentials = Credentials::Bearer("secret-token".into());
    let client = client();

    let task = sent_task(client.send(&endpoint, request("slow"), Some(&credentials)).await.expect("send"));
    assert_eq!(task.status.state, TaskState::Working);
    let seen = client.get_task(&endpoint, get(&task.id), Some(&credentials)).await.expect("get");
    assert_eq!((seen.id.as_str(), seen.status.state), (task.id.as_str(), TaskState::Working));
    let canceled = client.cancel_task(&endpoint, cancel(&task.id), Some(&credentials)).await.expect("cancel");
    assert_eq!(canceled.status.state, TaskState::Canceled);

    let calls = agent.state.calls();
    let methods: Vec<_> = calls.iter().map(|c| c.method.as_str()).collect();
    assert_eq!(methods, ["SendMessage", "GetTask", "CancelTask"]);
    for call in &calls {
        assert_eq!(header(call, "a2a-version"), "1.0");
        assert_eq!(header(call, "content-type"), "application/json");
        assert_eq!(header(call, "authorization"), "Bearer secret-token");
        assert_eq!(call.params["tenant"], "acme", "{}", call.method);
    }
    assert_eq!(calls[0].params["message"]["role"], "ROLE_USER");
    assert_eq!(calls[0].params["message"]["parts"], json!([{"text": "slow"}]));
    assert_eq!(calls[1].params["id"], task.id.as_str());
}

#[tokio::test]
async fn http_json_calls_use_the_rest_routes_under_the_tenant() {
    let (agent, endpoint) = start(Setup { tenant: Some("acme"), ..REST }).await;
    assert_eq!(endpoint.binding, Binding::HttpJson);
    let credentials = Credentials::ApiKey { header: "X-API-Key".into(), value: "k-123".into() };
    let client = client();

    let task = sent_task(client.send(&endpoint, request("slow"), Some(&credentials)).await.expect("send"));
    let seen = client
        .get_task(&endpoint, GetTaskRequest { history_length: Some(2), ..get(&task.id) }, Some(&credentials))
        .await
        .expect("get");
    assert_eq!(seen.status.state, TaskState::Working);
    let canceled = client.cancel_task(&endpoint, cancel(&task.id), Some(&credentials)).await.expect("cancel");
    assert_eq!(canceled.status.state, TaskState::Canceled);

    let calls = agent.state.calls();
    let methods: Vec<_> = calls.iter().map(|c| c.method.clone()).collect();
    let id = &task.id;
    let expected = [
        "POST /rest/acme/message:send".to_owned(),
        format!("GET /rest/acme/tasks/{id}?historyLength=2"),
        format!("POST /rest/acme/tasks/{id}:cancel"),
    ];
    assert_eq!(methods, expected);
    for call in &calls {
        assert_eq!(header(call, "a2a-version"), "1.0");
        assert_eq!(header(call, "x-api-key"), "k-123");
    }
    assert_eq!(header(&calls[0], "content-type"), "application/a2a+json");
    assert_eq!(calls[0].params["tenant"], "acme");
    assert_eq!(calls[0].params["message"]["parts"], json!([{"text": "slow"}]));
}

#[tokio::test]
async fn a2a_errors_surface_as_remote_on_both_bindings() {
    for setup in [JSONRPC, REST] {
        let (_agent, endpoint) = start(setup).await;
        let error = client().get_task(&endpoint, get("nope"), None).await.expect_err("unknown task");
        let DelegateError::Remote { code, message } = &error else { panic!("expected Remote, got {error:?}") };
        assert_eq!((*code, message.as_str()), (-32001, "task not found: nope"), "{:?}", endpoint.binding);
        assert_eq!(error.to_string(), "the A2A agent returned error -32001: task not found: nope");
    }
}

#[tokio::test]
async fn http_failures_are_status_protocol_and_transport_errors() {
    let agent = agent::start(JSONRPC).await;
    let client = client();
    let at =
        |path: &str| Endpoint { url: format!("{}{path}", agent.base_url), binding: Binding::JsonRpc, tenant: None };

    let error = client.send(&at("/broken"), request("hello"), None).await.expect_err("502");
    assert!(matches!(&error, DelegateError::Status { status: 502, body, .. } if body.contains("upstream is down")));
    let error = client.send(&at("/garbage"), request("hello"), None).await.expect_err("not JSON");
    assert!(matches!(error, DelegateError::Protocol { .. }), "{error:?}");
    let mut stream = Box::pin(client.stream(&at("/garbage"), request("hello"), None));
    let error = stream.next().await.expect("an item").expect_err("not an event stream");
    let said = error.to_string();
    assert!(said.contains("expected an event stream") && said.contains("not a JSON-RPC 2.0 response"), "{said}");

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/rpc", closed.local_addr().expect("address"));
    drop(closed);
    let endpoint = Endpoint { url: url.clone(), binding: Binding::JsonRpc, tenant: None };
    let error = client.send(&endpoint, request("hello"), None).await.expect_err("nothing listens");
    assert!(matches!(&error, DelegateError::Http { .. }), "{error:?}");
    assert!(error.to_string().starts_with(&format!("the request to the A2A agent at {url} failed: ")), "{error}");
}

/// The kind and state of a stream event, for order assertions.
fn describe(event: &StreamResponse) -> String {
    match event {
        StreamResponse::Task(task) => format!("task {:?}", task.status.state),
        StreamResponse::Message(message) => format!("message {:?}", message.text()),
        StreamResponse::StatusUpdate(update) => format!("status {:?}", update.status.state),
        StreamResponse::ArtifactUpdate(update) => format!("artifact {:?}", update.artifact.parts[0].as_text()),
    }
}

#[tokio::test]
async fn the_stream_yields_the_task_then_its_updates_in_order_on_both_bindings() {
    for setup in [JSONRPC, REST] {
        let (agent, endpoint) = start(setup).await;
        let events: Vec<_> = client().stream(&endpoint, request("hello"), None).collect().await;
        let events: Vec<_> = events.into_iter().map(|e| describe(&e.expect("an event"))).collect();
        let expected = ["task Submitted", "status Working", "artifact Some(\"hello\")", "status Completed"];
        assert_eq!(events, expected, "{:?}", endpoint.binding);
        let call = &agent.state.calls()[0];
        assert_eq!(header(call, "accept"), "text/event-stream");
        assert_eq!(header(call, "a2a-version"), "1.0");
    }
}

#[tokio::test]
async fn a_refused_stream_and_an_error_event_surface_as_remote() {
    for setup in [JSONRPC, REST] {
        let (_agent, endpoint) = start(setup).await;
        let refused: Vec<_> = client().stream(&endpoint, request("refuse"), None).collect().await;
        assert!(matches!(refused.as_slice(), [Err(DelegateError::Remote { code: -32004, .. })]), "{refused:?}");

        let crashed: Vec<_> = client().stream(&endpoint, request("crash"), None).collect().await;
        assert!(
            matches!(
                crashed.as_slice(),
                [
                    Ok(StreamResponse::Task(_)),
                    Ok(StreamResponse::StatusUpdate(_)),
                    Err(DelegateError::Remote { code: -32603, .. })
                ]
            ),
            "{:?}: {crashed:?}",
            endpoint.binding
        );
    }
}

/// A client guarded as the gateway's: `own` are its base URLs.
fn guarded(own: &[&str]) -> A2aClient {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let settings = crate::config::DelegateConfig::default();
    let guard = super::egress_guard(&settings, own);
    A2aClient::new(guard.client_builder().build().expect("a client")).guarded(guard, own)
}

#[tokio::test]
async fn a_guarded_client_calls_no_private_address_but_the_gateway_s_own() {
    let agent = agent::start(JSONRPC).await;
    let hits = || agent.state.card_hits.load(std::sync::atomic::Ordering::SeqCst);
    let by_name = agent.base_url.replace("127.0.0.1", "localhost");
    for url in [agent.base_url.as_str(), by_name.as_str(), "http://169.254.169.254/latest"] {
        let error = guarded(&["http://127.0.0.1:1"]).fetch_card(url).await.expect_err("refused");
        let DelegateError::Refused { reason, .. } = &error else { panic!("expected Refused, got {error:?}") };
        assert!(reason.contains("not a public address; set gateway.delegate.allow_private"), "{reason}");
    }
    assert_eq!(hits(), 0, "nothing reached the agent");
    let own = guarded(&[agent.base_url.as_str()]).fetch_card(&agent.base_url).await.expect("the gateway's own agent");
    assert_eq!(own.name, "Echo Agent");
    let settings = crate::config::DelegateConfig { allowed_hosts: vec!["localhost".to_owned()], ..Default::default() };
    let guard = super::egress_guard(&settings, &[]);
    let listed = A2aClient::new(guard.client_builder().build().expect("a client")).guarded(guard, &[]);
    assert_eq!(listed.fetch_card(&by_name).await.expect("an allowed host").name, "Echo Agent");
    assert_eq!(hits(), 2);
}
