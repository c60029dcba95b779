//! A service's embedded migrations, one list per backend, and the migrator
//! that runs them into the service's own ledger table.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};

use super::Backend;

/// One embedded migration file.
#[derive(Debug, Clone, Copy)]
pub struct MigrationFile {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

/// A service's migrations, one list per backend.
#[derive(Debug, Clone, Copy)]
pub struct ServiceMigrations {
    pub service: &'static str,
    pub postgres: &'static [MigrationFile],
    pub sqlite: &'static [MigrationFile],
}

/// A service's [`ServiceMigrations`], embedded from the calling crate's
/// `migrations/postgres/` and `migrations/sqlite/` folders, which hold one
/// file of each name per backend:
/// `service_migrations!("hub", [(1, "hub", "0001_hub.sql")])`.
#[macro_export]
macro_rules! service_migrations {
    ($service:literal, [$(($version:literal, $description:literal, $file:literal)),+ $(,)?]) => {
        $crate::storage::ServiceMigrations {
            service: $service,
            postgres: &[$($crate::storage::MigrationFile {
                version: $version,
                description: $description,
                sql: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres/", $file)),
            }),+],
            sqlite: &[$($crate::storage::MigrationFile {
                version: $version,
                description: $description,
                sql: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite/", $file)),
            }),+],
        }
    };
}

impl ServiceMigrations {
    /// The table that records `service`'s migrations.
    pub(super) fn table(service: &str) -> String {
        format!("_chorus_{service}_migrations")
    }

    pub(super) fn migrator(&self, backend: Backend) -> Migrator {
        let files = match backend {
            Backend::Postgres => self.postgres,
            Backend::Sqlite => self.sqlite,
        };
        let migrations = files
            .iter()
            .map(|file| {
                Migration::new(
                    file.version,
                    Cow::Borrowed(file.description),
                    MigrationType::Simple,
                    sqlx::SqlSafeStr::into_sql_str(file.sql),
                    false,
                )
            })
            .collect();
        let mut migrator = Migrator::with_migrations(migrations);
        migrator.dangerous_set_table_name(Self::table(self.service));
        migrator
    }
}
