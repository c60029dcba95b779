//! The real task store, booted in-process on a SQLite file and a real socket,
//! and the calls a test makes to it as a user would.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};

use chorus_proto::taskstore::{
    CancelTaskRequest, CreateTaskRequest, GetTaskRequest, Message, Role, Task, TaskEvent, WatchTaskRequest,
};
use chorus_runtime::{
    server::{ServerBuilder, ServerConfig},
    storage::{Db, StorageConfig},
    wakeup::Wakeups,
};
use chorus_taskstore::{TaskStore, TaskStoreConfig, grpc::TaskStoreGrpc, repository::sql::SqlTaskRepository};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::{body::Body, server::NamedService};

use super::within;
use crate::{Client, text_part};

/// The largest request the test store takes (a server's default is 4 MiB):
/// room for a task of 5 MB, as a user may create.
pub(super) const SERVER_LIMIT: usize = 8 << 20;

/// Short timings, so that expired leases and lost wake-ups show within a test.
fn store_config() -> TaskStoreConfig {
    TaskStoreConfig { reaper_interval_ms: 50, poll_interval_ms: 200, ..TaskStoreConfig::default() }
}

/// A task store serving on `url` until dropped; [`stop`](Self::stop) and
/// [`restart`](Self::restart) take it away and bring it back on the same
/// address and database.
pub(super) struct LiveStore {
    pub(super) url: String,
    addr: SocketAddr,
    database_url: String,
    client: Client,
    calls: Arc<Mutex<Vec<Call>>>,
    serving: Option<Serving>,
    _dir: tempfile::TempDir,
}

struct Serving {
    shutdown: CancellationToken,
    db: Db,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// A call that reached the server, as the test instrumentation saw it.
#[derive(Debug, Clone)]
pub(super) struct Call {
    /// The RPC's name: `CompleteTask`, `RenewLease`, ...
    pub(super) method: String,
    pub(super) traceparent: Option<String>,
}

impl LiveStore {
    pub(super) async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let database_url = format!("sqlite://{}/t.db?mode=rwc", dir.path().display());
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind a local port");
        let addr = listener.local_addr().expect("bound address");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let serving = serve(listener, &database_url, &calls).await;
        let url = format!("http://{addr}");
        let client = crate::connect(&url).await.expect("connect to the task store");
        Self { url, addr, database_url, client, calls, serving: Some(serving), _dir: dir }
    }

    /// Shuts the server down gracefully, as a deploy would: streams end,
    /// connections close, the port is free.
    pub(super) async fn stop(&mut self) {
        let Some(serving) = self.serving.take() else {
            return;
        };
        serving.shutdown.cancel();
        let served = within("the server to stop", serving.server).await.expect("the server does not panic");
        served.expect("the server stops cleanly");
        serving.db.close().await;
    }

    /// Serves again on the same address, over the same database.
    pub(super) async fn restart(&mut self) {
        self.stop().await;
        let listener = TcpListener::bind(self.addr).await.expect("bind the same address again");
        self.serving = Some(serve(listener, &self.database_url, &self.calls).await);
    }

    /// Every call that reached the server so far.
    ///
    /// Test instrumentation on the real server, for what the task store API
    /// does not show: the headers of incoming calls, and calls it refused
    /// without changing the task.
    pub(super) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Creates a task for `agent_id` whose message says `text`, as part of
    /// the trace `traceparent` when given.
    pub(super) async fn create(&self, namespace: &str, agent_id: &str, text: &str, traceparent: Option<&str>) -> Task {
        let message = Message {
            message_id: uuid::Uuid::new_v4().to_string(),
            role: Role::User.into(),
            parts: vec![text_part(text)],
            ..Message::default()
        };
        let create = CreateTaskRequest {
            namespace: namespace.to_owned(),
            agent_id: agent_id.to_owned(),
            message: Some(message),
            ..CreateTaskRequest::default()
        };
        let mut request = tonic::Request::new(create);
        if let Some(traceparent) = traceparent {
            request.metadata_mut().insert("traceparent", traceparent.parse().expect("an ASCII traceparent"));
        }
        self.client.clone().create_task(request).await.expect("create a task").into_inner()
    }

    pub(super) async fn get(&self, namespace: &str, id: &str) -> Task {
        let request = GetTaskRequest { namespace: namespace.to_owned(), id: id.to_owned(), history_length: None };
        self.client.clone().get_task(request).await.expect("get the task").into_inner()
    }

    pub(super) async fn cancel(&self, namespace: &str, id: &str) {
        let request = CancelTaskRequest { namespace: namespace.to_owned(), id: id.to_owned(), reason: "test".into() };
        self.client.clone().cancel_task(request).await.expect("cancel the task");
    }

    /// Every change of the task up to its final state (the watch ends there).
    pub(super) async fn events_until_done(&self, namespace: &str, id: &str) -> Vec<TaskEvent> {
        let request =
            WatchTaskRequest { namespace: namespace.to_owned(), task_id: id.to_owned(), ..Default::default() };
        let mut client = self.client.clone();
        within("the task to finish", async move {
            let mut stream = client.watch_task(request).await.expect("watch the task").into_inner();
            let mut events = Vec::new();
            while let Some(event) = stream.message().await.expect("the watch stream") {
                events.push(event);
            }
            events
        })
        .await
    }

    /// The task once it has finished.
    pub(super) async fn finished(&self, namespace: &str, id: &str) -> Task {
        self.events_until_done(namespace, id).await;
        self.get(namespace, id).await
    }
}

impl Drop for LiveStore {
    fn drop(&mut self) {
        if let Some(serving) = &self.serving {
            serving.shutdown.cancel();
        }
    }
}

/// Boots the task store on `listener` the way `chorus` does.
async fn serve(listener: TcpListener, database_url: &str, calls: &Arc<Mutex<Vec<Call>>>) -> Serving {
    let db = Db::connect(database_url, &StorageConfig::default()).await.expect("open the database");
    db.migrate(&chorus_taskstore::MIGRATIONS).await.expect("migrate");
    let shutdown = CancellationToken::new();
    let repository = Arc::new(SqlTaskRepository::new(db.clone()));
    let store = TaskStore::new(repository, Wakeups::new(), store_config(), shutdown.clone());
    store.spawn_reaper();
    let mut server = ServerBuilder::new(ServerConfig::default());
    // Requests of up to 16 MiB, as `server.max_message_bytes` may allow:
    // tasks larger than gRPC's default 4 MiB can then be made.
    server.add_grpc_service(Recorded {
        inner: TaskStoreGrpc::new(store).into_server(SERVER_LIMIT),
        calls: Arc::clone(calls),
    });
    let server = tokio::spawn(server.serve(listener, shutdown.clone()));
    Serving { shutdown, db, server }
}

/// Test instrumentation: records each incoming call, then passes it on
/// untouched to the real service.
#[derive(Clone)]
struct Recorded<S> {
    inner: S,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl<S: NamedService> NamedService for Recorded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for Recorded<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
        let traceparent = request.headers().get("traceparent").and_then(|value| value.to_str().ok());
        let call = Call { method, traceparent: traceparent.map(str::to_owned) };
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push(call);
        self.inner.call(request)
    }
}
