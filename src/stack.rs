//! Starts services: binds the port, opens storage, runs migrations, mounts
//! every chosen service on one server and serves until shutdown.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use chorus_eventbus::{EventBus, grpc::EventBusGrpc, repository::sql::SqlEventRepository};
use chorus_gateway::A2aGrpc;
use chorus_hub::{Hub, grpc::HubGrpc, repository::sql::SqlHubRepository};
use chorus_proto::{eventbus::event_bus_client::EventBusClient, taskstore::task_store_server::TaskStoreServer};
use chorus_runtime::{
    server::{ReadinessProbe, ServerBuilder, serving_probe},
    storage::Db,
    transport::Transport,
    wakeup::Wakeups,
};
use chorus_taskstore::{TaskStore, grpc::TaskStoreGrpc, repository::sql::SqlTaskRepository};
use chorus_workflow::{
    Workflows,
    effects::{ClientEffects, Endpoints},
    engine::TriggerSource,
    error::WorkflowError,
    grpc::WorkflowGrpc,
    repository::{sql::SqlDefinitionRepository, sql_runs::SqlRunRepository},
};
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::{server::NamedService, transport::Channel};

use crate::config::ChorusConfig;

mod storage;

/// The task store's name in gRPC health checks.
const TASKSTORE_SERVICE: &str = <TaskStoreServer<TaskStoreGrpc> as NamedService>::NAME;

/// What runs in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Service {
    /// The task store (`chorus.taskstore.v1`).
    Taskstore,
    /// The event bus (`chorus.eventbus.v1`).
    Eventbus,
    /// The hub (`chorus.hub.v1`).
    Hub,
    /// The A2A gateway (JSON-RPC, HTTP+JSON and `lf.a2a.v1` gRPC).
    Gateway,
    /// The workflow engine: definitions, runs and the engine that drives them (`chorus.workflow.v1`).
    Workflow,
}

/// The services `chorus dev` runs: every one that exists.
pub(crate) const ALL_SERVICES: &[Service] =
    &[Service::Eventbus, Service::Hub, Service::Taskstore, Service::Gateway, Service::Workflow];

/// A bound, ready-to-serve stack.
pub(crate) struct Stack {
    listener: TcpListener,
    server: ServerBuilder,
    pub(crate) address: SocketAddr,
    /// The task store this process serves, for clients in the same process.
    pub(crate) local_taskstore: Option<Transport>,
    /// The embedded database's directory, held while this process serves.
    _data_dir_lock: Option<std::fs::File>,
    /// What runs on after shutdown to hand leases back (the outbox relay's,
    /// the gateway's push configs'), so that another replica takes over at
    /// once: waited for, up to [`LINGER`], before the process exits.
    lingering: TaskTracker,
}

/// The longest the process waits for its lingering tasks after it stopped serving.
const LINGER: Duration = Duration::from_secs(3);

/// How a service reaches another: the one its configuration names (`key`
/// the setting), else this process's own, called in process when it runs
/// here and over this process's address when not; with a word on which.
fn reach(
    configured: Option<&String>,
    local: Option<&Transport>,
    address: SocketAddr,
    key: &str,
) -> anyhow::Result<(Transport, String)> {
    if let (None, Some(local)) = (configured, local) {
        return Ok((local.clone(), "in process".to_owned()));
    }
    let url = configured.cloned().unwrap_or_else(|| format!("http://{address}"));
    // Without a scheme, an address parses and every call then fails with a
    // bare "transport error"; and the services speak plain HTTP/2 only.
    anyhow::ensure!(
        url.starts_with("http://"),
        "{key} {url:?} must start with http:// (chorus services call each other over plain HTTP/2; TLS, where \
         needed, ends in front of them)"
    );
    let channel =
        Channel::from_shared(url.clone()).with_context(|| format!("{key} {url:?} is not a URL"))?.connect_lazy();
    Ok((Transport::remote(channel), url))
}

impl Service {
    /// How `chorus serve` names it.
    fn name(self) -> String {
        use clap::ValueEnum as _;
        self.to_possible_value().map(|value| value.get_name().to_owned()).unwrap_or_default()
    }

    /// Whether the service keeps state in the database (the gateway keeps
    /// its in the task store).
    fn needs_storage(self) -> bool {
        match self {
            Self::Taskstore | Self::Eventbus | Self::Hub | Self::Workflow => true,
            Self::Gateway => false,
        }
    }
}

/// Checks that what this process's services call is here or has its
/// address configured. A gateway without a task store is refused: it would
/// start, answer `/healthz`, and fail every call. A workflow engine may run
/// alone (webhook, wait and gate steps need no other service), so the
/// services it cannot reach are named in a warning, each step kind that
/// needs one failing at run time.
fn check_reachable(config: &ChorusConfig, services: &[Service]) -> anyhow::Result<()> {
    let here = |service: Service| services.contains(&service);
    anyhow::ensure!(
        !here(Service::Gateway) || here(Service::Taskstore) || config.gateway.taskstore_url.is_some(),
        "the gateway keeps its tasks in a task store, and this process serves none: set gateway.taskstore_url \
         (CHORUS_GATEWAY__TASKSTORE_URL) to the task store's address"
    );
    if !here(Service::Workflow) {
        return Ok(());
    }
    let workflow = &config.workflow;
    let calls = [
        (Service::Taskstore, &workflow.taskstore_url, "workflow.taskstore_url (spawn steps)"),
        (Service::Hub, &workflow.hub_url, "workflow.hub_url (message steps to topics and agents)"),
        (Service::Eventbus, &workflow.eventbus_url, "workflow.eventbus_url (event triggers, gate events)"),
        (Service::Gateway, &workflow.gateway_url, "workflow.gateway_url (delegate steps)"),
    ];
    let unreachable: Vec<&str> =
        calls.into_iter().filter(|(callee, url, _)| !here(*callee) && url.is_none()).map(|(.., what)| what).collect();
    if !unreachable.is_empty() {
        tracing::warn!(
            unset = %unreachable.join(", "),
            "the workflow engine calls services this process does not serve; steps that need them will fail"
        );
    }
    Ok(())
}

/// The largest A2A request body the gateway takes: `gateway.max_body_bytes`, at most
/// `server.max_message_bytes`, past which its message could not reach the task store.
fn a2a_body_limit(config: &ChorusConfig) -> usize {
    let (body, message) = (config.gateway.max_body_bytes, config.server.max_message_bytes);
    if body > message {
        tracing::warn!(
            "gateway.max_body_bytes ({body}) is larger than server.max_message_bytes ({message}), which the task \
             store takes at most: A2A bodies are limited to {message} bytes"
        );
    }
    body.min(message)
}

/// The database of a process whose services need one.
fn opened(db: Option<&Db>) -> anyhow::Result<&Db> {
    db.context("the database was not opened")
}

/// This machine's name, for names that must be unique among live processes.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "chorus".to_owned())
}

/// A failed definitions load, with each problem on its own line.
fn startup_error(error: WorkflowError) -> anyhow::Error {
    match error {
        WorkflowError::InvalidDefinition { file, problems } => {
            let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("invalid workflow definitions in {file}:\n{}", lines.join("\n"))
        }
        other => anyhow::Error::new(other).context("cannot load workflow definitions"),
    }
}

impl Stack {
    /// Binds `config.listen`, connects storage and builds `services`.
    pub(crate) async fn build(
        config: &ChorusConfig,
        services: &[Service],
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        check_reachable(config, services)?;
        let listener =
            TcpListener::bind(&config.listen).await.with_context(|| format!("cannot listen on {}", config.listen))?;
        let address = listener.local_addr()?;
        let mut server = ServerBuilder::new(config.server.clone());
        let lingering = TaskTracker::new();
        let metrics = server.metrics();
        let (db, data_dir_lock) = storage::open(config, services, &mut server).await?;
        let mut local_taskstore = None;
        let mut local_eventbus = None;
        let mut local_hub = None;
        let mut local_delegation = None;
        // The gateway, built before the workflow engine, starts its runs.
        let mut local_workflows = services.contains(&Service::Workflow).then(Transport::later);
        // The task store whose changes go to the event bus, once every
        // service is built.
        let mut relay: Option<TaskStore> = None;
        for service in services {
            match service {
                Service::Taskstore => {
                    let db = opened(db.as_ref())?;
                    db.migrate(&chorus_taskstore::MIGRATIONS).await?;
                    let wakeups = Wakeups::new();
                    db.bridge_wakeups("chorus_taskstore", &wakeups, shutdown.clone());
                    let repository = Arc::new(SqlTaskRepository::new(db.clone()));
                    let store = TaskStore::new(repository, wakeups, config.taskstore.clone(), shutdown.clone())
                        .with_metrics(metrics.clone());
                    store.align_log_clock().await?;
                    store.spawn_reaper();
                    relay = Some(store.clone());
                    let grpc = TaskStoreGrpc::new(store).into_server(config.server.max_message_bytes);
                    local_taskstore = Some(Transport::in_process(grpc.clone()));
                    server.add_grpc_service(grpc);
                }
                Service::Eventbus => {
                    let db = opened(db.as_ref())?;
                    db.migrate(&chorus_eventbus::MIGRATIONS).await?;
                    let wakeups = Wakeups::new();
                    db.bridge_wakeups("chorus_eventbus", &wakeups, shutdown.clone());
                    let repository = Arc::new(SqlEventRepository::new(db.clone()));
                    let bus = EventBus::new(repository, wakeups, config.eventbus.clone(), shutdown.clone())
                        .with_metrics(metrics.clone());
                    bus.spawn_reaper();
                    let grpc = EventBusGrpc::new(bus).into_server(config.server.max_message_bytes);
                    local_eventbus = Some(Transport::in_process(grpc.clone()));
                    server.add_grpc_service(grpc);
                }
                Service::Gateway => {
                    let (blocking, limit) = (config.gateway.blocking_timeout_ms, config.server.request_timeout_ms);
                    anyhow::ensure!(
                        blocking < limit,
                        "gateway.blocking_timeout_ms ({blocking}) must be shorter than server.request_timeout_ms \
                         ({limit}), which ends every call: raise that too"
                    );
                    if config.gateway.public_url.is_none() && address.ip().is_unspecified() {
                        tracing::warn!(
                            %address,
                            "agent cards advertise this address, which no client can call: set gateway.public_url \
                             (CHORUS_GATEWAY__PUBLIC_URL) to the one clients use"
                        );
                    }
                    let (taskstore, target) = reach(
                        config.gateway.taskstore_url.as_ref(),
                        local_taskstore.as_ref(),
                        address,
                        "gateway.taskstore_url",
                    )?;
                    let workflows = match (config.gateway.workflow_url.as_ref(), &local_workflows) {
                        (None, None) => None,
                        (configured, local) => {
                            let local = local.as_ref().map(|(transport, _)| transport);
                            Some(reach(configured, local, address, "gateway.workflow_url")?.0)
                        }
                    };
                    let mut gateway_config = config.gateway.clone();
                    gateway_config.cors_origins = chorus_runtime::server::origins(&config.gateway.cors_origins)
                        .map_err(|error| anyhow::anyhow!("gateway.cors_origins: {error}"))?;
                    let origins = gateway_config.cors_origins.clone();
                    if !origins.is_empty() {
                        tracing::info!(?origins, "web pages of these origins may call chorus (grpc-web, A2A, ACP)");
                    }
                    gateway_config.max_body_bytes = a2a_body_limit(config);
                    gateway_config.push.follower_id.get_or_insert_with(|| format!("{}/{address}", host_name()));
                    if gateway_config.registry_file.is_none() && db.is_some() && config.storage.database_url.is_empty()
                    {
                        gateway_config.registry_file =
                            Some(PathBuf::from(&config.storage.data_dir).join("agents.json"));
                    }
                    let taskstore_probe = taskstore.clone();
                    let gateway = chorus_gateway::build(
                        gateway_config,
                        taskstore,
                        workflows,
                        &format!("http://{address}"),
                        shutdown.clone(),
                        &lingering,
                        metrics.clone(),
                    )
                    .map_err(|error| anyhow::anyhow!("gateway: {error}"))?;
                    server.add_grpc_service(A2aGrpc::new(gateway.clone()).into_server(config.server.max_message_bytes));
                    let delegation = gateway.delegation().into_server(config.server.max_message_bytes);
                    local_delegation = Some(Transport::in_process(delegation.clone()));
                    server.add_grpc_service(delegation);
                    server.merge_http(chorus_gateway::router(gateway.clone()));
                    server.enable_grpc_web(&origins, vec![gateway.api_key_header()]);
                    // The gateway's port is the public one: where it checks
                    // credentials, the services beside it check them too.
                    if let Some(guard) = gateway.operator_guard() {
                        server.guard_own_services(guard);
                    }
                    // A gateway whose task store runs elsewhere is ready only
                    // while that task store is.
                    if local_taskstore.is_none() || config.gateway.taskstore_url.is_some() {
                        server.add_readiness_probe(serving_probe(taskstore_probe, TASKSTORE_SERVICE, target.clone()));
                    }
                    tracing::info!(taskstore = %target, "A2A gateway mounted");
                }
                Service::Hub => {
                    let db = opened(db.as_ref())?;
                    db.migrate(&chorus_hub::MIGRATIONS).await?;
                    let wakeups = Wakeups::new();
                    db.bridge_wakeups("chorus_hub", &wakeups, shutdown.clone());
                    let repository = Arc::new(SqlHubRepository::new(db.clone()));
                    let hub = Hub::new(repository, wakeups, config.hub.clone(), shutdown.clone())
                        .with_metrics(metrics.clone());
                    hub.spawn_reaper();
                    let grpc = HubGrpc::new(hub).into_server(config.server.max_message_bytes);
                    local_hub = Some(Transport::in_process(grpc.clone()));
                    server.add_grpc_service(grpc);
                }
                Service::Workflow => {
                    let db = opened(db.as_ref())?;
                    db.migrate(&chorus_workflow::MIGRATIONS).await?;
                    let wakeups = Wakeups::new();
                    db.bridge_wakeups("chorus_workflow", &wakeups, shutdown.clone());
                    let mut workflow = config.workflow.clone();
                    workflow.engine_id.get_or_insert_with(|| format!("{}/{address}", host_name()));
                    let workflow = &workflow;
                    // A service of this process is called in process, each
                    // call on a task of its own (the engine may hold SQLite's
                    // writer while it awaits a call that needs it); one
                    // elsewhere over the network, with the engine's token.
                    let callee = |url: &Option<String>, local: Option<&Transport>, key: &str| {
                        let local = local.cloned().map(Transport::detached);
                        let (transport, _) = reach(url.as_ref(), local.as_ref(), address, &format!("workflow.{key}"))?;
                        match (&workflow.token, url.is_some() || local.is_none()) {
                            (Some(token), true) => {
                                transport.with_bearer(token).context("workflow.token cannot be sent in a header")
                            }
                            _ => Ok(transport),
                        }
                    };
                    let eventbus = callee(&workflow.eventbus_url, local_eventbus.as_ref(), "eventbus_url")?;
                    let endpoints = Endpoints {
                        taskstore: callee(&workflow.taskstore_url, local_taskstore.as_ref(), "taskstore_url")?,
                        hub: callee(&workflow.hub_url, local_hub.as_ref(), "hub_url")?,
                        eventbus: eventbus.clone(),
                        gateway: callee(&workflow.gateway_url, local_delegation.as_ref(), "gateway_url")?,
                        gateway_url: workflow.gateway_url.clone().unwrap_or_else(|| format!("http://{address}")),
                        allow_private_webhooks: workflow.allow_private_webhooks,
                        webhook_timeout: Duration::from_millis(workflow.webhook_timeout_ms),
                    };
                    let effects =
                        ClientEffects::new(endpoints).map_err(|error| anyhow::anyhow!("workflow: {error}"))?;
                    let workflows = Workflows::new(
                        Arc::new(SqlDefinitionRepository::new(db.clone())),
                        Arc::new(SqlRunRepository::new(db.clone())),
                        Arc::new(effects),
                        wakeups,
                        workflow.clone(),
                    )
                    .with_metrics(metrics.clone())
                    .with_shutdown(shutdown.clone());
                    workflows.load_definitions_dir().await.map_err(startup_error)?;
                    let triggers = TriggerSource { bus: EventBusClient::new(eventbus) };
                    chorus_workflow::engine::spawn(workflows.clone(), Some(triggers), shutdown.clone());
                    let grpc = WorkflowGrpc::new(workflows).into_server(config.server.max_message_bytes);
                    if let Some((_, later)) = local_workflows.take() {
                        later.set(Transport::in_process(grpc.clone()));
                    }
                    server.add_grpc_service(grpc);
                }
            }
        }
        // The task store publishes its changes to the configured bus, else
        // to this process's own when it runs one.
        let eventbus_url = config.taskstore.eventbus_url.as_ref();
        if let Some(store) = relay
            && (eventbus_url.is_some() || local_eventbus.is_some())
        {
            let (bus, target) = reach(eventbus_url, local_eventbus.as_ref(), address, "taskstore.eventbus_url")?;
            let relay = store.spawn_outbox_relay(EventBusClient::new(bus), format!("{}/{address}", host_name()));
            lingering.spawn(async move {
                let _ = relay.await;
            });
            tracing::info!(eventbus = %target, "task changes are published to the event bus");
        }
        Ok(Self { listener, server, address, local_taskstore, _data_dir_lock: data_dir_lock, lingering })
    }

    /// What `/metrics` serves, for the built-in agents to count into.
    pub(crate) fn metrics(&self) -> chorus_runtime::metrics::Metrics {
        self.server.metrics()
    }

    /// Serves until `shutdown`, then waits for the lingering tasks.
    /// Makes `/healthz` depend on `probe` too.
    pub(crate) fn add_readiness_probe(&mut self, probe: ReadinessProbe) {
        self.server.add_readiness_probe(probe);
    }

    pub(crate) async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let served = self.server.serve(self.listener, shutdown).await.context("server failed");
        self.lingering.close();
        if tokio::time::timeout(LINGER, self.lingering.wait()).await.is_err() {
            tracing::warn!("leases not handed back within {LINGER:?}; other replicas take over when they run out");
        }
        served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_without_a_task_store_is_refused() {
        let mut config = ChorusConfig::default();
        let error = check_reachable(&config, &[Service::Gateway]).expect_err("no task store to call");
        assert!(error.to_string().contains("gateway.taskstore_url"), "{error}");
        assert!(check_reachable(&config, &[Service::Taskstore, Service::Gateway]).is_ok());
        assert!(check_reachable(&config, ALL_SERVICES).is_ok());
        config.gateway.taskstore_url = Some("http://tasks:7800".to_owned());
        assert!(check_reachable(&config, &[Service::Gateway]).is_ok());
    }

    #[test]
    fn an_a2a_body_is_at_most_a_message_the_task_store_takes() {
        let mut config = ChorusConfig::default();
        assert_eq!(a2a_body_limit(&config), config.gateway.max_body_bytes);
        config.server.max_message_bytes = 64 * 1024;
        assert_eq!(a2a_body_limit(&config), 64 * 1024);
    }

    #[tokio::test]
    async fn a_service_url_needs_its_scheme() {
        let address: SocketAddr = "127.0.0.1:7800".parse().expect("address");
        for url in ["127.0.0.1:7801", "localhost:7801", "https://tasks:7801"] {
            let error = reach(Some(&url.to_owned()), None, address, "gateway.taskstore_url").expect_err("refused");
            assert!(error.to_string().starts_with(&format!("gateway.taskstore_url {url:?} must start with http://")));
        }
        assert!(reach(Some(&"http://tasks:7801".to_owned()), None, address, "gateway.taskstore_url").is_ok());
        assert!(reach(None, None, address, "gateway.taskstore_url").is_ok(), "this process's own address");
    }

    #[test]
    fn a_workflow_engine_may_run_alone() {
        assert!(check_reachable(&ChorusConfig::default(), &[Service::Workflow]).is_ok());
    }
}
