//! The chorus gateway: A2A 1.0 for external agents over JSON-RPC, HTTP+JSON
//! (REST) and gRPC, with SSE streaming, push notifications, and outbound
//! delegation to external A2A agents.
//!
//! The A2A wire types are the official crates' (`a2a-lf` for JSON, `a2a-pb`
//! for gRPC); [`convert`] maps them to the task store's contract, which keeps
//! every task. The bindings ([`jsonrpc`], [`rest`], [`grpc`]) parse and
//! authenticate, then call [`service::Gateway`].

pub mod acp;
mod auth;
mod builtin;
mod catalog;
mod compat;
pub mod config;
mod convert;
mod delegate;
pub mod delegation;
mod error;
pub mod grpc;
mod http;
mod jsonrpc;
mod notify;
mod protojson;
mod push;
mod rest;
mod service;

use std::time::Duration;

use chorus_proto::taskstore::task_store_client::TaskStoreClient;
use chorus_runtime::{metrics::Metrics, transport::Transport};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub use crate::{config::GatewayConfig, delegation::DelegateGrpc, grpc::A2aGrpc, http::router, service::Gateway};

/// Builds the gateway over the task store behind `taskstore` and the
/// workflow engine behind `workflows` (in this process or not; none: the
/// catalog may hold no workflow agent), advertising
/// `base_url` (`http://host:port`) in its cards unless `public_url` is set,
/// counting what it does into `metrics`.
pub fn build(
    mut config: GatewayConfig,
    taskstore: Transport,
    workflows: Option<Transport>,
    base_url: &str,
    shutdown: CancellationToken,
    lingering: &TaskTracker,
    metrics: Metrics,
) -> Result<Gateway, String> {
    push::install_crypto_provider();
    config.auth.check()?;
    let bound_url = base_url;
    let base_url = match &config.public_url {
        Some(public) => checked_public_url(public)?,
        None => base_url.to_owned(),
    };
    let base_url = base_url.trim_end_matches('/');
    let catalog = catalog::Catalog::new(&config, base_url)?;
    let workflow_agents = catalog.ids_of(config::AgentKind::Workflow);
    let workflows = match workflows {
        Some(workflows) => workflows,
        // It would start, answer /healthz, and fail every message to them.
        None if !workflow_agents.is_empty() => {
            return Err(format!(
                "the workflow agents ({}) start runs on a workflow engine, and this process serves none: set \
                 gateway.workflow_url (CHORUS_GATEWAY__WORKFLOW_URL) to the engine's address",
                workflow_agents.join(", ")
            ));
        }
        // Never called: no agent starts runs.
        None => Transport::later().0,
    };
    if let Some(path) = &config.registry_file {
        let registry = serde_json::to_vec_pretty(&catalog.registry(base_url)).expect("the registry serializes");
        std::fs::write(path, registry).map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    }
    // The task store's answers are as large as the tasks it keeps, and a
    // task grows with every message and artifact: past the default 4 MiB
    // limit, a write that had landed would come back as a decoding error.
    let tasks = TaskStoreClient::new(taskstore).max_decoding_message_size(usize::MAX);
    let settings = &config.delegate;
    let timeout = Duration::from_millis(settings.timeout_ms);
    let own = [bound_url, base_url];
    let egress = delegate::egress_guard(settings, &own);
    let http = egress
        .client_builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|error| format!("cannot build the HTTP client: {error}"))?;
    let client = delegate::A2aClient::new(http)
        .guarded(egress, &own)
        .with_card_ttl(Duration::from_millis(settings.card_ttl_ms))
        .with_poll_backoff(
            Duration::from_millis(settings.poll_initial_ms),
            Duration::from_millis(settings.poll_max_ms),
        );
    let push = notify::PushDispatcher::new(tasks.clone(), &config.push, shutdown.clone(), metrics)?;
    push.keep_leases(lingering);
    // The turns of workflow and remote agents are followed under the same
    // name and leases as push configs.
    let turns = builtin::Turns::new(push.follower().to_owned(), Duration::from_millis(push.lease_ms()));
    let runner = builtin::Runner::new(
        tasks.clone(),
        // As tasks, runs grow with their steps' outputs.
        chorus_proto::workflow::workflow_client::WorkflowClient::new(workflows).max_decoding_message_size(usize::MAX),
        client.clone(),
        timeout,
        turns,
        shutdown.clone(),
    );
    runner.keep_following(catalog.clone(), lingering);
    // Where credentials are checked, the gateway's own agents take one more,
    // known only to this process, for the delegations it makes to them.
    let secret = config.auth.enabled().then(|| {
        let secret = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        config.auth.bearer_tokens.push(config::Credential {
            name: "chorus-internal".to_owned(),
            secret: secret.clone(),
            namespaces: vec!["*".to_owned()],
        });
        secret
    });
    let delegation = delegation::DelegateGrpc::new(client, timeout, delegation::OwnAgents::new(&own, secret));
    Ok(Gateway::new(tasks, catalog, runner, push, delegation, config, shutdown))
}

/// `gateway.public_url`, which every card advertises: an http or https URL
/// with a host (a typo there would send every client nowhere).
fn checked_public_url(public: &str) -> Result<String, String> {
    let parsed =
        reqwest::Url::parse(public).map_err(|error| format!("gateway.public_url {public:?} is not a URL: {error}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(format!("gateway.public_url {public:?} must be an http or https URL with a host"));
    }
    Ok(public.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn workflow_agents_need_a_workflow_engine() {
        let mut config = GatewayConfig::default();
        let agent =
            serde_json::json!({"id": "ops", "name": "Ops", "description": "the ops workflow", "kind": "workflow"});
        config.agents.push(serde_json::from_value(agent).expect("an agent"));
        config.default_agent = "ops".into();
        let build = |config: GatewayConfig, workflows: Option<Transport>| {
            let (taskstore, _) = Transport::later();
            build(
                config,
                taskstore,
                workflows,
                "http://127.0.0.1:1",
                CancellationToken::new(),
                &TaskTracker::new(),
                Metrics::default(),
            )
        };
        let error = build(config.clone(), None).expect_err("refused");
        assert!(error.contains("workflow agents (ops)") && error.contains("gateway.workflow_url"), "{error}");
        assert!(build(config, Some(Transport::later().0)).is_ok());
    }

    #[test]
    fn the_public_url_is_an_http_url_with_a_host() {
        assert_eq!(checked_public_url("https://agents.example.com/").as_deref(), Ok("https://agents.example.com/"));
        for bad in ["::nope", "agents.example.com", "ftp://agents.example.com", "file:///tmp"] {
            assert!(checked_public_url(bad).is_err(), "{bad} is refused");
        }
    }
}
