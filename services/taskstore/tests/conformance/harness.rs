//! Boots a task store on a fresh database: SQLite always, PostgreSQL when
//! `CHORUS_TEST_POSTGRES_URL` is set (then a failure to connect fails the test).

use std::{sync::Arc, time::Duration};

use chorus_runtime::{metrics::Metrics, storage::Db, testing::TestDatabase, wakeup::Wakeups};
use chorus_taskstore::{
    TaskStore, TaskStoreConfig,
    domain::{Artifact, ClaimRequest, Claimed, Message, NewTask, Part, Role, SpawnContext, Task},
    repository::{TaskRepository, sql::SqlTaskRepository},
};
use tokio_util::sync::CancellationToken;

pub(crate) struct Harness {
    pub(crate) store: TaskStore,
    pub(crate) repository: Arc<dyn TaskRepository>,
    /// The database under the store, for what only a raw transaction shows.
    pub(crate) db: Db,
    /// What the store counts.
    pub(crate) metrics: Metrics,
    shutdown: CancellationToken,
    _database: TestDatabase,
}

/// Short timings so lease and wait behaviour shows within a test.
pub(crate) fn test_config() -> TaskStoreConfig {
    TaskStoreConfig {
        default_lease_ms: 2_000,
        reaper_interval_ms: 50,
        poll_interval_ms: 200,
        default_spawn_timeout_ms: 5_000,
        ..TaskStoreConfig::default()
    }
}

impl Harness {
    /// A task store configured with [`test_config`].
    pub(crate) async fn start(database: TestDatabase) -> Self {
        Self::start_with(database, test_config()).await
    }

    pub(crate) async fn start_with(database: TestDatabase, config: TaskStoreConfig) -> Self {
        let db = database.open(&[&chorus_taskstore::MIGRATIONS]).await;
        let repository: Arc<dyn TaskRepository> = Arc::new(SqlTaskRepository::new(db.clone()));
        let shutdown = CancellationToken::new();
        let metrics = Metrics::default();
        let store = TaskStore::new(Arc::clone(&repository), Wakeups::new(), config, shutdown.clone())
            .with_metrics(metrics.clone());
        store.spawn_reaper();
        Self { store, repository, db, metrics, shutdown, _database: database }
    }

    /// Creates a task for `agent` in `namespace` whose first message says `text`.
    pub(crate) async fn task(&self, namespace: &str, agent: &str, text: &str) -> Task {
        self.store.create_task(new_task(namespace, agent, text)).await.expect("create task")
    }

    /// Claims the oldest queued task of `agent` as a new worker would, under
    /// a lease of 30 s.
    pub(crate) async fn claim(&self, namespace: &str, agent: &str) -> Claimed {
        let worker = format!("{agent}-{}", uuid::Uuid::new_v4());
        let request = ClaimRequest {
            namespace: namespace.to_owned(),
            ..crate::workers::claim_request(agent, &worker, 1, Duration::from_secs(30), 0)
        };
        crate::workers::next_claim(&mut self.store.claim_stream(request)).await
    }

    /// A task its creator runs: its agent's writes need no lease.
    pub(crate) async fn own_task(&self, namespace: &str, agent: &str, text: &str) -> Task {
        self.store.create_task(own_task(namespace, agent, text)).await.expect("create task")
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub(crate) fn new_task(namespace: &str, agent: &str, text: &str) -> NewTask {
    NewTask {
        namespace: namespace.to_owned(),
        agent_id: agent.to_owned(),
        context_id: None,
        message: user_message(text),
        metadata: None,
        spawn_context: SpawnContext::Agent,
        trace_context: Default::default(),
        idempotency_key: None,
        answer: None,
        follower: None,
        run_by_creator: false,
    }
}

/// A new task its creator runs.
pub(crate) fn own_task(namespace: &str, agent: &str, text: &str) -> NewTask {
    NewTask { run_by_creator: true, ..new_task(namespace, agent, text) }
}

pub(crate) fn user_message(text: &str) -> Message {
    Message::text(uuid::Uuid::new_v4().to_string(), Role::User, text)
}

/// An unnamed artifact of one text part.
pub(crate) fn text_artifact(id: &str, text: &str) -> Artifact {
    Artifact {
        artifact_id: id.into(),
        name: None,
        description: None,
        parts: vec![Part::text(text)],
        metadata: None,
        extensions: Vec::new(),
    }
}

pub(crate) fn agent_message(text: &str) -> Message {
    Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text)
}

/// Runs each listed test against SQLite and, when configured, PostgreSQL,
/// with the task store [`Harness::start`] makes, or the one `start` makes.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        chorus_runtime::backend_suite!(crate::harness::Harness::start; $($test),*);
    };
    (start = $start:path; $($test:ident),* $(,)?) => {
        chorus_runtime::backend_suite!($start; $($test),*);
    };
}
pub(crate) use conformance;
