//! The SQL hub repository: one implementation for PostgreSQL and SQLite.

mod agents;
mod consumers;
mod delegations;
mod messages;
mod repository;
mod rows;
mod send;
mod state;

use chorus_runtime::storage::{Backend, Db, ServiceMigrations, Tx, placeholders};

use crate::error::Result;

/// The hub's embedded migrations.
pub const MIGRATIONS: ServiceMigrations = chorus_runtime::service_migrations!(
    "hub",
    [
        (1, "hub", "0001_hub.sql"),
        (2, "consumer streams", "0002_consumer_streams.sql"),
        (3, "message audience", "0003_message_audience.sql"),
    ]
);

/// Hub storage on a [`Db`].
#[derive(Debug, Clone)]
pub struct SqlHubRepository {
    db: Db,
}

impl SqlHubRepository {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    fn postgres(&self) -> bool {
        self.db.backend() == Backend::Postgres
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(self.db.begin().await?)
    }

    /// A transaction that only hands out leases: its commit need not wait
    /// for the disk, as a lease lost in a crash only means the message is
    /// handed out again, which at-least-once delivery allows.
    async fn begin_lease(&self) -> Result<Tx> {
        Ok(self.db.begin_relaxed().await?)
    }
}

#[cfg(test)]
chorus_runtime::every_migration_is_registered!(MIGRATIONS);
