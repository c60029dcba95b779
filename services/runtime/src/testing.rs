//! Test support (cargo feature `testing`): a PostgreSQL database of its own
//! for each test.
//!
//! Tests that need PostgreSQL read [`postgres_admin_url`]: unset means skip
//! (say so with an `eprintln!`); set but unreachable is a failure, which
//! [`PostgresDatabase::create`] reports by panicking.

use std::fmt;

use crate::storage::{Db, StorageConfig, redact_url};

/// The variable naming the PostgreSQL server tests may use; CI sets it.
pub const POSTGRES_URL_VAR: &str = "CHORUS_TEST_POSTGRES_URL";

/// The admin URL tests create their databases from, when one is configured.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var(POSTGRES_URL_VAR).ok().filter(|url| !url.is_empty())
}

/// A fresh database `chorus_test_<uuid>`, dropped (`WITH (FORCE)`, so open
/// connections do not keep it alive) when this value is dropped.
pub struct PostgresDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl fmt::Debug for PostgresDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresDatabase").field("name", &self.name).field("url", &redact_url(&self.url)).finish()
    }
}

impl PostgresDatabase {
    /// Creates the database through `admin_url` (a URL of the server's
    /// maintenance database, such as `postgres://…/postgres`).
    ///
    /// # Panics
    /// When the server is unreachable or refuses: a configured PostgreSQL
    /// that does not work fails the test rather than skipping it.
    pub async fn create(admin_url: &str) -> Self {
        let name = format!("chorus_test_{}", uuid::Uuid::new_v4().simple());
        let admin = connect_admin(admin_url)
            .await
            .unwrap_or_else(|error| panic!("{POSTGRES_URL_VAR} is set but PostgreSQL is unreachable: {error}"));
        let created = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(admin.pool()).await;
        admin.pool().close().await;
        if let Err(error) = created {
            panic!("cannot create test database {name}: {error}");
        }
        let url = database_url(admin_url, &name);
        Self { admin_url: admin_url.to_owned(), name, url }
    }

    /// The URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PostgresDatabase {
    /// Drops the database from a thread of its own, so that dropping works
    /// inside or outside an async runtime.
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let admin = connect_admin(&admin_url).await.map_err(std::io::Error::other)?;
                let outcome = sqlx::query(sqlx::AssertSqlSafe(statement)).execute(admin.pool()).await;
                admin.pool().close().await;
                outcome.map(drop).map_err(std::io::Error::other)
            })
        });
        match dropped.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("could not drop test database {}: {error}", self.name),
            Err(_) => eprintln!("could not drop test database {}: the dropping thread panicked", self.name),
        }
    }
}

async fn connect_admin(admin_url: &str) -> Result<Db, crate::storage::StorageError> {
    Db::connect(admin_url, &StorageConfig { max_connections: 1, ..StorageConfig::default() }).await
}

/// `admin_url` with its database name replaced by `name` (query kept).
fn database_url(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let (server, _database) = match base.split_once("://") {
        Some((_, rest)) if rest.contains('/') => base.rsplit_once('/').unwrap_or((base, "")),
        _ => (base, ""),
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn the_database_name_is_replaced_and_the_query_kept() {
        let url = database_url("postgres://u:p@h:5432/postgres", "t1");
        assert_eq!(url, "postgres://u:p@h:5432/t1");
        let url = database_url("postgres://u@h/postgres?sslmode=disable", "t1");
        assert_eq!(url, "postgres://u@h/t1?sslmode=disable");
        assert_eq!(database_url("postgres://h", "t1"), "postgres://h/t1");
    }
}
