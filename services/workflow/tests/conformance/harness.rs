//! Boots the workflow service on a fresh database: SQLite always, PostgreSQL
//! when `CHORUS_TEST_POSTGRES_URL` is set (then a failure to connect fails the test).

use std::sync::Arc;

use chorus_runtime::testing::TestDatabase;
use chorus_workflow::{WorkflowConfig, Workflows, repository::sql::SqlDefinitionRepository};

pub(crate) const NS: &str = "team-a";

pub(crate) struct Harness {
    pub(crate) workflows: Workflows,
    pub(crate) db: chorus_runtime::storage::Db,
    _database: TestDatabase,
}

impl Harness {
    pub(crate) async fn start(database: TestDatabase) -> Self {
        let db = database.open(&[&chorus_workflow::MIGRATIONS]).await;
        let workflows = Workflows::new(Arc::new(SqlDefinitionRepository::new(db.clone())), WorkflowConfig::default());
        Self { workflows, db, _database: database }
    }

    /// The same database with another configuration.
    pub(crate) fn with_config(&self, config: WorkflowConfig) -> Workflows {
        Workflows::new(Arc::new(SqlDefinitionRepository::new(self.db.clone())), config)
    }

    /// Rows in `workflow_definitions`, every namespace.
    pub(crate) async fn stored_rows(&self) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM workflow_definitions")
            .fetch_one(self.db.pool())
            .await
            .expect("count")
    }
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
