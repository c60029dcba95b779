//! Boots a task store on a fresh database: SQLite always, PostgreSQL when
//! `CHORUS_TEST_POSTGRES_URL` is set (then a failure to connect fails the test).

use std::sync::Arc;

use chorus_runtime::{
    storage::{Db, StorageConfig},
    testing::{PostgresDatabase, postgres_admin_url},
    wakeup::Wakeups,
};
use chorus_taskstore::{
    TaskStore, TaskStoreConfig,
    domain::{Message, NewTask, Role, SpawnContext, Task},
    repository::{TaskRepository, sql::SqlTaskRepository},
};
use tokio_util::sync::CancellationToken;

pub(crate) use chorus_runtime::testing::POSTGRES_URL_VAR;

pub(crate) struct Harness {
    pub(crate) store: TaskStore,
    pub(crate) repository: Arc<dyn TaskRepository>,
    shutdown: CancellationToken,
    _sqlite_dir: Option<tempfile::TempDir>,
    postgres: Option<PostgresDatabase>,
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
    pub(crate) async fn sqlite_with(config: TaskStoreConfig) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/tasks.db?mode=rwc", dir.path().display());
        let mut harness = Self::start(&url, config).await;
        harness._sqlite_dir = Some(dir);
        harness
    }

    /// `None` when no PostgreSQL is configured for tests.
    pub(crate) async fn postgres_with(config: TaskStoreConfig) -> Option<Self> {
        let database = PostgresDatabase::create(&postgres_admin_url()?).await;
        let mut harness = Self::start(database.url(), config).await;
        harness.postgres = Some(database);
        Some(harness)
    }

    async fn start(url: &str, config: TaskStoreConfig) -> Self {
        let db = Db::connect(url, &StorageConfig::default()).await.expect("connect to the test database");
        db.migrate(&chorus_taskstore::MIGRATIONS).await.expect("migrate");
        let repository: Arc<dyn TaskRepository> = Arc::new(SqlTaskRepository::new(db));
        let shutdown = CancellationToken::new();
        let store = TaskStore::new(Arc::clone(&repository), Wakeups::new(), config, shutdown.clone());
        store.spawn_reaper();
        Self { store, repository, shutdown, _sqlite_dir: None, postgres: None }
    }

    /// Creates a task for `agent` in `namespace` whose first message says `text`.
    pub(crate) async fn task(&self, namespace: &str, agent: &str, text: &str) -> Task {
        self.store.create_task(new_task(namespace, agent, text)).await.expect("create task")
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
        // Dropping the database ends the store's connections (`WITH (FORCE)`).
        drop(self.postgres.take());
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
    }
}

pub(crate) fn user_message(text: &str) -> Message {
    Message::text(uuid::Uuid::new_v4().to_string(), Role::User, text)
}

pub(crate) fn agent_message(text: &str) -> Message {
    Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text)
}

/// Runs each listed test against SQLite and, when configured, PostgreSQL,
/// with the task store configured by `config` (default: [`test_config`]).
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        crate::harness::conformance!(config = crate::harness::test_config(); $($test),*);
    };
    (config = $config:expr; $($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(crate::harness::Harness::sqlite_with($config).await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Some(harness) = crate::harness::Harness::postgres_with($config).await else {
                        eprintln!("skipped: {} is not set", crate::harness::POSTGRES_URL_VAR);
                        return;
                    };
                    super::$test(harness).await;
                }
            )*
        }
    };
}
pub(crate) use conformance;
