//! Boots the workflow service and engine on a fresh database — SQLite always,
//! PostgreSQL when `CHORUS_TEST_POSTGRES_URL` is set (then a failure to
//! connect fails the test) — beside a real task store, hub and event bus on a
//! loopback port, with a worker agent that answers spawned tasks.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use chorus_eventbus::{EventBus, EventBusConfig, grpc::EventBusGrpc, repository::sql::SqlEventRepository};
use chorus_hub::{Hub, HubConfig, grpc::HubGrpc, repository::sql::SqlHubRepository};
use chorus_proto::{
    gateway::{DelegateRequest, DelegateResponse, gateway_server},
    hub::{ReceiveRequest, RegisterAgentRequest, SubscribeRequest, hub_client::HubClient},
    taskstore::{Part, part::Content},
};
use chorus_runtime::transport::Transport;
use chorus_runtime::{
    server::{ServerBuilder, ServerConfig},
    testing::TestDatabase,
    wakeup::Wakeups,
};
use chorus_taskstore::{TaskStore, TaskStoreConfig, grpc::TaskStoreGrpc, repository::sql::SqlTaskRepository};
use chorus_worker::{HandlerError, Reply, TaskContext, Worker, text_part};
use chorus_workflow::{
    WorkflowConfig, Workflows,
    domain::{Run, RunState},
    effects::{ClientEffects, Endpoints},
    engine::TriggerSource,
    repository::{sql::SqlDefinitionRepository, sql_runs::SqlRunRepository},
    service::StartCall,
};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub(crate) const NS: &str = "team-a";
/// The agent the test worker works for.
pub(crate) const AGENT: &str = "coder";

pub(crate) struct Harness {
    pub(crate) workflows: Workflows,
    pub(crate) db: chorus_runtime::storage::Db,
    pub(crate) address: SocketAddr,
    shutdown: CancellationToken,
    _database: TestDatabase,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Fast claims and polls, so crash-free tests never wait long.
pub(crate) fn test_config() -> WorkflowConfig {
    WorkflowConfig { lease_ms: 1_000, poll_ms: 50, allow_private_webhooks: true, ..WorkflowConfig::default() }
}

impl Harness {
    /// The services, a worker and an engine.
    pub(crate) async fn start(database: TestDatabase) -> Self {
        let harness = Self::bare(database).await;
        chorus_workflow::engine::spawn(harness.workflows.clone(), Some(harness.triggers()), harness.shutdown.clone());
        harness
    }

    /// The services and a worker, and no engine: runs start but nothing
    /// drives them until a test spawns an engine.
    pub(crate) async fn bare(database: TestDatabase) -> Self {
        let migrations = [
            &chorus_taskstore::MIGRATIONS,
            &chorus_hub::MIGRATIONS,
            &chorus_eventbus::MIGRATIONS,
            &chorus_workflow::MIGRATIONS,
        ];
        let db = database.open(&migrations).await;
        let shutdown = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let mut server = ServerBuilder::new(ServerConfig::default());
        let limit = 4 << 20;
        let store = TaskStore::new(
            Arc::new(SqlTaskRepository::new(db.clone())),
            Wakeups::new(),
            TaskStoreConfig::default(),
            shutdown.clone(),
        );
        store.spawn_reaper();
        server.add_grpc_service(TaskStoreGrpc::new(store).into_server(limit));
        server.add_grpc_service(hub_service(&db, &shutdown));
        let bus = EventBus::new(
            Arc::new(SqlEventRepository::new(db.clone())),
            Wakeups::new(),
            EventBusConfig::default(),
            shutdown.clone(),
        );
        server.add_grpc_service(EventBusGrpc::new(bus).into_server(limit));
        server.add_grpc_service(gateway_server::GatewayServer::new(UnreachableAgents));
        tokio::spawn(server.serve(listener, shutdown.clone()));
        let workflows = build(&db, address, address, test_config());
        let harness = Self { workflows, db, address, shutdown, _database: database };
        harness.start_worker(AGENT).await;
        harness
    }

    /// Another service (and engine) on the same database with `config`.
    pub(crate) fn with_config(&self, config: WorkflowConfig) -> Workflows {
        build(&self.db, self.address, self.address, config)
    }

    /// An engine whose hub is at `hub` (where none may serve yet).
    pub(crate) fn spawn_engine_with_hub(&self, hub: SocketAddr) -> Workflows {
        let workflows = build(&self.db, self.address, hub, test_config());
        chorus_workflow::engine::spawn(workflows.clone(), None, self.shutdown.child_token());
        workflows
    }

    /// A hub agent `watcher` subscribed to `topic`, through the harness's hub.
    pub(crate) async fn watcher(&self, topic: &str) -> Watcher {
        let mut hub = HubClient::connect(self.url()).await.expect("hub");
        let register = RegisterAgentRequest {
            namespace: NS.into(),
            agent_id: "watcher".into(),
            agent_type: "observer".into(),
            ..Default::default()
        };
        hub.register_agent(register).await.expect("register");
        let subscribe = SubscribeRequest { namespace: NS.into(), agent_id: "watcher".into(), topic: topic.into() };
        hub.subscribe(subscribe).await.expect("subscribe");
        Watcher(hub)
    }

    /// Serves the hub, on the harness's database, on `listener` as well.
    pub(crate) fn serve_hub(&self, listener: tokio::net::TcpListener) {
        let mut server = ServerBuilder::new(ServerConfig::default());
        server.add_grpc_service(hub_service(&self.db, &self.shutdown));
        tokio::spawn(server.serve(listener, self.shutdown.clone()));
    }

    /// The same database, another engine (a second replica).
    pub(crate) fn spawn_engine(&self, config: WorkflowConfig) -> (Workflows, CancellationToken) {
        let workflows = self.with_config(config);
        let stop = self.shutdown.child_token();
        chorus_workflow::engine::spawn(workflows.clone(), Some(self.triggers()), stop.clone());
        (workflows, stop)
    }

    /// Event triggers read the harness's bus.
    fn triggers(&self) -> TriggerSource {
        let channel = Channel::from_shared(self.url()).expect("url").connect_lazy();
        TriggerSource { bus: chorus_proto::eventbus::event_bus_client::EventBusClient::new(Transport::remote(channel)) }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// A worker for `agent` that answers by the task's text (see [`answer`]).
    pub(crate) async fn start_worker(&self, agent: &str) {
        let client = chorus_worker::connect(&self.url()).await.expect("worker connects");
        let worker = Worker::new(client, agent).namespace(NS).capacity(16);
        tokio::spawn(worker.run(answer, self.shutdown.clone()));
    }

    /// Rows in `workflow_definitions`, every namespace.
    pub(crate) async fn stored_rows(&self) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM workflow_definitions")
            .fetch_one(&mut *self.db.acquire().await.expect("a connection"))
            .await
            .expect("count")
    }

    /// Puts a definition into [`NS`].
    pub(crate) async fn put(&self, source: &str) {
        self.workflows.put(NS, source, "test.yaml", "test").await.expect("a valid definition");
    }

    /// Starts a run of `workflow` with `input`.
    pub(crate) async fn run(&self, workflow: &str, input: Value) -> Run {
        let call = StartCall {
            namespace: NS.into(),
            workflow: workflow.into(),
            input: input.as_object().cloned().unwrap_or_default(),
            ..StartCall::default()
        };
        self.workflows.start_run(call).await.expect("the run starts")
    }

    /// Waits until `done` holds for the run (at most 20 s).
    pub(crate) async fn until(&self, run_id: &str, what: &str, done: impl Fn(&Run) -> bool) -> Run {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let run = self.workflows.get_run(NS, run_id).await.expect("the run exists");
            if done(&run) {
                return run;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}: {run:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the run is finished.
    pub(crate) async fn finished(&self, run_id: &str) -> Run {
        self.until(run_id, "the run to finish", |run| run.state.is_finished()).await
    }

    /// Waits until the run waits (on a gate, a signal or a timer).
    pub(crate) async fn waiting(&self, run_id: &str) -> Run {
        self.until(run_id, "the run to wait", |run| run.state == RunState::Waiting).await
    }
}

/// A hub agent that watches a topic (see [`Harness::watcher`]).
pub(crate) struct Watcher(HubClient<Channel>);

impl Watcher {
    /// The texts of the messages it received, waiting up to a second for the first.
    pub(crate) async fn texts(&mut self) -> Vec<String> {
        let receive = ReceiveRequest {
            namespace: NS.into(),
            agent_id: "watcher".into(),
            timeout: Some(prost_types::Duration { seconds: 1, nanos: 0 }),
            ..Default::default()
        };
        let received = self.0.receive(receive).await.expect("receive").into_inner().messages;
        received
            .iter()
            .map(|message| {
                let content = message.content.as_ref().expect("content");
                let payload = serde_json::from_slice::<Value>(&content.payload).expect("json");
                payload["text"].as_str().unwrap_or_default().to_owned()
            })
            .collect()
    }
}

fn hub_service(
    db: &chorus_runtime::storage::Db,
    shutdown: &CancellationToken,
) -> chorus_proto::hub::hub_server::HubServer<HubGrpc> {
    let repository = Arc::new(SqlHubRepository::new(db.clone()));
    let hub = Hub::new(repository, Wakeups::new(), HubConfig::default(), shutdown.clone());
    HubGrpc::new(hub).into_server(4 << 20)
}

fn build(db: &chorus_runtime::storage::Db, address: SocketAddr, hub: SocketAddr, config: WorkflowConfig) -> Workflows {
    let connect = |at: SocketAddr| Channel::from_shared(format!("http://{at}")).expect("url").connect_lazy();
    let channel = Transport::remote(connect(address));
    let endpoints = Endpoints {
        taskstore: channel.clone(),
        hub: Transport::remote(connect(hub)),
        eventbus: channel.clone(),
        gateway: channel,
        gateway_url: format!("http://{address}"),
        allow_private_webhooks: config.allow_private_webhooks,
        webhook_timeout: Duration::from_secs(5),
    };
    let effects = ClientEffects::new(endpoints).expect("effects");
    Workflows::new(
        Arc::new(SqlDefinitionRepository::new(db.clone())),
        Arc::new(SqlRunRepository::new(db.clone())),
        Arc::new(effects),
        Wakeups::new(),
        config,
    )
}

/// A gateway whose every delegation finds its agent unreachable, as the
/// gateway answers then.
struct UnreachableAgents;

#[tonic::async_trait]
impl gateway_server::Gateway for UnreachableAgents {
    async fn delegate(
        &self,
        request: tonic::Request<DelegateRequest>,
    ) -> Result<tonic::Response<DelegateResponse>, tonic::Status> {
        let agent = request.into_inner().agent_url;
        Err(tonic::Status::unavailable(format!("cannot reach {agent}: connection refused")))
    }
}

/// The test worker: `fail` in the text fails the task; `slow` keeps it
/// working until canceled; `flaky` fails the first attempt of its step;
/// anything else completes with a summary, a confidence (0.5 when the text
/// starts with `unsure`) and whether the message carried gate feedback.
async fn answer(task: TaskContext) -> Result<Reply, HandlerError> {
    let text = task.text();
    let message = task.task().history.first().cloned().unwrap_or_default();
    let metadata = message.metadata.as_ref().map(chorus_proto::json::struct_to_json).unwrap_or_default();
    let feedback = message.parts.iter().find_map(|part| match &part.content {
        Some(Content::Data(data)) => chorus_proto::json::value_to_json(data).get("feedback").cloned(),
        _ => None,
    });
    if text.contains("fail") {
        return Err(HandlerError::fatal("asked to fail"));
    }
    if text.contains("flaky") && metadata.get("attempt") == Some(&json!(1)) {
        return Err(HandlerError::fatal("flaky first attempt"));
    }
    if text.contains("slow") {
        task.cancelled().await;
        return Err(HandlerError::fatal("canceled"));
    }
    let mut data = Map::new();
    data.insert("summary".into(), json!(format!("did: {text}")));
    data.insert("confidence".into(), json!(if text.starts_with("unsure") { 0.5 } else { 0.95 }));
    data.insert("feedback".into(), feedback.unwrap_or(Value::Null));
    let data = Part {
        content: Some(Content::Data(chorus_proto::json::value_from_json(Value::Object(data)))),
        ..Part::default()
    };
    Ok(Reply::new().with_part(text_part(format!("did: {text}"))).with_part(data))
}

/// A small valid definition named `name` whose one message says `text`.
pub(crate) fn definition(name: &str, text: &str) -> String {
    format!("name: {name}\nsteps:\n  - id: say\n    message:\n      topic: news\n      text: \"{text}\"\n")
}

/// Runs each listed test against SQLite and, when configured, PostgreSQL.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        chorus_runtime::backend_suite!(crate::harness::Harness::start; $($test),*);
    };
}
pub(crate) use conformance;
