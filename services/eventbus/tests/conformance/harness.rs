//! Boots an event bus on a fresh database: SQLite always, PostgreSQL when
//! `CHORUS_TEST_POSTGRES_URL` is set (then a failure to connect fails the test).

use std::{sync::Arc, time::Duration};

use chorus_eventbus::{
    EventBus, EventBusConfig,
    domain::{
        ClaimRequest, Delivery, DeliveryId, EventType, FailurePolicy, Handler, HandlerSpec, NewEvent, Pattern,
        RetryPolicy,
    },
    repository::{EventRepository, sql::SqlEventRepository},
};
use chorus_runtime::{storage::Db, testing::TestDatabase, time::now_micros, wakeup::Wakeups};
use tokio_util::sync::CancellationToken;

pub(crate) const NS: &str = "team-a";

pub(crate) struct Harness {
    pub(crate) bus: EventBus,
    pub(crate) repository: Arc<dyn EventRepository>,
    pub(crate) db: Db,
    pub(crate) shutdown: CancellationToken,
    _database: TestDatabase,
}

/// Short timings so retries and leases show within a test.
pub(crate) fn test_config() -> EventBusConfig {
    EventBusConfig {
        default_max_attempts: 3,
        default_initial_backoff_ms: 50,
        default_max_backoff_ms: 200,
        default_visibility_timeout_ms: 2_000,
        reaper_interval_ms: 50,
        poll_interval_ms: 200,
        ..EventBusConfig::default()
    }
}

impl Harness {
    pub(crate) async fn start(database: TestDatabase) -> Self {
        Self::start_with(database, test_config()).await
    }

    pub(crate) async fn start_with(database: TestDatabase, config: EventBusConfig) -> Self {
        let db = database.open(&[&chorus_eventbus::MIGRATIONS]).await;
        let repository: Arc<dyn EventRepository> = Arc::new(SqlEventRepository::new(db.clone()));
        let shutdown = CancellationToken::new();
        let bus = EventBus::new(Arc::clone(&repository), Wakeups::new(), config, shutdown.clone());
        bus.spawn_reaper();
        Self { bus, repository, db, shutdown, _database: database }
    }

    /// Publishes one event of `event_type` to [`NS`]; returns its sequence.
    pub(crate) async fn publish(&self, event_type: &str) -> i64 {
        self.publish_in(NS, event_type).await
    }

    pub(crate) async fn publish_in(&self, namespace: &str, event_type: &str) -> i64 {
        self.bus.publish(namespace, vec![event(event_type)]).await.expect("publish")[0].sequence
    }

    /// Registers a handler in [`NS`] taking every event, from the start of the log.
    pub(crate) async fn handler(&self, name: &str, after: &[&str], policy: FailurePolicy) -> Handler {
        self.bus.register_handler(spec(name, after, policy)).await.expect("register")
    }

    /// Claims up to `max` deliveries of `handler` in [`NS`] for consumer `c1`.
    pub(crate) async fn claim(&self, handler: &str, max: u32) -> Vec<Delivery> {
        self.claim_as(handler, "c1", max).await
    }

    /// Claims on a stream opened for the claim, which takes back nothing
    /// (its cursor is past every lease).
    pub(crate) async fn claim_as(&self, handler: &str, consumer: &str, max: u32) -> Vec<Delivery> {
        let opened =
            self.repository.open_stream(NS, handler, consumer, Some(i64::MAX), now_micros()).await.expect("open");
        assert!(opened.resent.is_empty(), "{:?}", opened.resent);
        let request = ClaimRequest {
            namespace: NS.into(),
            handler: handler.into(),
            consumer_id: consumer.into(),
            stream: opened.stream,
            max_in_flight: max,
            now: now_micros(),
        };
        self.repository.claim(&request).await.expect("claim").deliveries
    }

    /// The sequences a claim of `handler` gets (acking nothing).
    pub(crate) async fn claimed(&self, handler: &str) -> Vec<i64> {
        self.claim(handler, 100).await.iter().map(|d| d.id.sequence).collect()
    }

    pub(crate) async fn ack(&self, handler: &str, sequence: i64) {
        self.bus.ack(NS, &[id(handler, sequence)]).await.expect("ack");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub(crate) fn id(handler: &str, sequence: i64) -> DeliveryId {
    DeliveryId { sequence, handler: handler.into() }
}

pub(crate) fn event(event_type: &str) -> NewEvent {
    NewEvent {
        event_type: EventType::parse("type", event_type).expect("valid type"),
        source: "test".into(),
        subject: String::new(),
        payload: br#"{"n":1}"#.to_vec(),
        content_type: "application/json".into(),
        attributes: Default::default(),
        idempotency_key: None,
        time: None,
    }
}

pub(crate) fn retry(max_attempts: u32, visibility: Duration) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        visibility_timeout: visibility,
    }
}

pub(crate) fn spec(name: &str, after: &[&str], policy: FailurePolicy) -> HandlerSpec {
    HandlerSpec {
        namespace: NS.into(),
        name: name.into(),
        event_types: vec![Pattern::parse("event_types", "*").expect("pattern")],
        after: after.iter().map(|a| (*a).to_owned()).collect(),
        failure_policy: policy,
        retry: retry(3, Duration::from_secs(2)),
        start_after: Some(0),
    }
}

/// Runs each listed test against SQLite and, when configured, PostgreSQL,
/// with the event bus [`Harness::start`] makes, or the one `start` makes.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        chorus_runtime::backend_suite!(crate::harness::Harness::start; $($test),*);
    };
    (start = $start:path; $($test:ident),* $(,)?) => {
        chorus_runtime::backend_suite!($start; $($test),*);
    };
}
pub(crate) use conformance;
