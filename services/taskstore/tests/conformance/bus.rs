//! The real event bus, served on a loopback port over its own SQLite
//! database, behind a link that can lose answers: a publish that commits on
//! the bus can still look failed to the relay, as when a connection breaks
//! after the commit.

use std::{
    convert::Infallible,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use chorus_eventbus::{
    EventBus, EventBusConfig,
    domain::{Event, EventQuery},
    grpc::EventBusGrpc,
    repository::sql::SqlEventRepository,
};
use chorus_proto::eventbus::{event_bus_client::EventBusClient, event_bus_server::EventBusServer};
use chorus_runtime::{
    storage::{Db, StorageConfig},
    transport::Transport,
    wakeup::Wakeups,
};
use futures_util::future::BoxFuture;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{
    body::Body,
    server::NamedService,
    transport::{Channel, Server, server::TcpIncoming},
};

/// A running bus and what crossed the link to it.
pub(crate) struct Bus {
    bus: EventBus,
    link: Link,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

/// Counts calls and turns the answers of the next `lose` calls into UNAVAILABLE.
#[derive(Clone)]
struct Link {
    inner: EventBusServer<EventBusGrpc>,
    calls: Arc<AtomicU32>,
    lose: Arc<AtomicU32>,
}

impl NamedService for Link {
    const NAME: &'static str = <EventBusServer<EventBusGrpc> as NamedService>::NAME;
}

impl tower::Service<http::Request<Body>> for Link {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<http::Request<Body>>::poll_ready(&mut self.inner, context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = tower::Service::<http::Request<Body>>::call(&mut self.inner, request);
        let lose = Arc::clone(&self.lose);
        Box::pin(async move {
            let response = answer.await?;
            let lost = lose.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            Ok(if lost { tonic::Status::unavailable("the answer was lost").into_http() } else { response })
        })
    }
}

impl Bus {
    /// Serves a bus on a free loopback port; returns it and a client of it.
    pub(crate) async fn start() -> (Self, EventBusClient<Transport>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/bus.db?mode=rwc", dir.path().display());
        let db = Db::connect(&url, &StorageConfig::default()).await.expect("open the bus database");
        db.migrate(&chorus_eventbus::MIGRATIONS).await.expect("migrate the bus");
        let shutdown = CancellationToken::new();
        let bus = EventBus::new(
            Arc::new(SqlEventRepository::new(db)),
            Wakeups::new(),
            EventBusConfig::default(),
            shutdown.clone(),
        );
        let link = Link {
            inner: EventBusGrpc::new(bus.clone()).into_server(4 << 20),
            calls: Arc::default(),
            lose: Arc::default(),
        };
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind a free port");
        let address = listener.local_addr().expect("bound address");
        let server = Server::builder().add_service(link.clone());
        let stop = shutdown.clone();
        tokio::spawn(server.serve_with_incoming_shutdown(TcpIncoming::from(listener), stop.cancelled_owned()));
        let channel = Channel::from_shared(format!("http://{address}")).expect("a valid url").connect_lazy();
        (Self { bus, link, shutdown, _dir: dir }, EventBusClient::new(Transport::remote(channel)))
    }

    /// The answers to the next `calls` calls are lost (their work is done).
    pub(crate) fn lose_answers(&self, calls: u32) {
        self.link.lose.store(calls, Ordering::SeqCst);
    }

    /// Calls that reached the bus so far.
    pub(crate) fn calls(&self) -> u32 {
        self.link.calls.load(Ordering::SeqCst)
    }

    /// The namespace's log.
    pub(crate) async fn log(&self, namespace: &str) -> Vec<Event> {
        let query = EventQuery { namespace: namespace.to_owned(), after: 0, types: Vec::new(), limit: 1000 };
        self.bus.read_events(&query).await.expect("read the bus log").events
    }

    /// Waits until the namespace's log holds at least `count` events; returns it.
    pub(crate) async fn wait_for(&self, namespace: &str, count: usize) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log(namespace).await;
            if log.len() >= count {
                return log;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the bus has {} of {count} events in {namespace}",
                log.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
