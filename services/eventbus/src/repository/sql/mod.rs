//! The SQL event repository: one implementation for PostgreSQL and SQLite.
//!
//! Publishers of a namespace lock its row in `eventbus_heads` until they
//! commit, so sequences become visible in order. Claims of a handler lock
//! its row (PostgreSQL; SQLite has a single writer), so a handler's
//! deliveries are leased in sequence order.

mod claims;
mod deliveries;
mod handlers;
mod log;
mod replays;
mod repository;
mod retention;
mod rows;

use std::collections::BTreeMap;

use chorus_runtime::storage::{Backend, Db, ServiceMigrations, Tx};
use sqlx::AnyConnection;

use crate::{
    domain::{Handlers, Participant},
    error::Result,
};

/// The event bus's embedded migrations.
pub const MIGRATIONS: ServiceMigrations = chorus_runtime::service_migrations!(
    "eventbus",
    [
        (1, "eventbus", "0001_eventbus.sql"),
        (2, "hot claims", "0002_hot_claims.sql"),
        (3, "consumer streams", "0003_consumer_streams.sql"),
        (4, "retention", "0004_retention.sql"),
    ]
);

/// Event bus storage on a [`Db`].
#[derive(Debug, Clone)]
pub struct SqlEventRepository {
    db: Db,
}

impl SqlEventRepository {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    fn postgres(&self) -> bool {
        self.db.backend() == Backend::Postgres
    }

    async fn begin(&self) -> Result<Tx> {
        Ok(self.db.begin().await?)
    }

    /// `... FOR UPDATE` on PostgreSQL; nothing on SQLite (one writer).
    fn for_update(&self) -> &'static str {
        self.db.on_postgres(" FOR UPDATE")
    }

    /// How a type column matches a handler's stored `matcher`.
    fn type_match(&self, column: &str, matcher: &str) -> String {
        if self.postgres() {
            format!("{column} LIKE {matcher} ESCAPE '\\'")
        } else {
            format!("{column} GLOB {matcher}")
        }
    }

    /// A pattern as this backend's `matcher`.
    fn matcher(&self, pattern: &crate::domain::Pattern) -> String {
        if self.postgres() { pattern.to_like() } else { pattern.to_glob() }
    }

    /// Locks the namespace's head row (creating it) and returns the head.
    async fn lock_head(&self, conn: &mut AnyConnection, namespace: &str) -> Result<i64> {
        let select = format!("SELECT head FROM eventbus_heads WHERE namespace = $1{}", self.for_update());
        if let Some(head) =
            sqlx::query_scalar(sqlx::AssertSqlSafe(select.clone())).bind(namespace).fetch_optional(&mut *conn).await?
        {
            return Ok(head);
        }
        sqlx::query("INSERT INTO eventbus_heads (namespace, head) VALUES ($1, 0) ON CONFLICT (namespace) DO NOTHING")
            .bind(namespace)
            .execute(&mut *conn)
            .await?;
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(select)).bind(namespace).fetch_one(&mut *conn).await?)
    }
}

/// The namespace's latest sequence, without locking.
async fn head(conn: &mut AnyConnection, namespace: &str) -> Result<i64> {
    let head: Option<i64> = sqlx::query_scalar("SELECT head FROM eventbus_heads WHERE namespace = $1")
        .bind(namespace)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(head.unwrap_or(0))
}

/// Every handler of a namespace.
async fn load_handlers(conn: &mut AnyConnection, namespace: &str) -> Result<Handlers> {
    let rows =
        sqlx::query(concat!("SELECT ", rows::handler_columns!(), " FROM eventbus_handlers WHERE namespace = $1"))
            .bind(namespace)
            .fetch_all(&mut *conn)
            .await?;
    rows.iter().map(|row| rows::decode_handler(row).map(|h| (h.name.clone(), h))).collect()
}

/// Every delivery of the events `first..=last`, as readiness sees them (a
/// key range scan: no statement with one parameter per event).
async fn participants(
    conn: &mut AnyConnection,
    namespace: &str,
    first: i64,
    last: i64,
) -> Result<BTreeMap<i64, BTreeMap<String, Participant>>> {
    let mut events: BTreeMap<i64, BTreeMap<String, Participant>> = BTreeMap::new();
    let rows = sqlx::query(
        "SELECT sequence, handler, state, last_error, skip_handler, skip_message FROM eventbus_deliveries \
         WHERE namespace = $1 AND sequence >= $2 AND sequence <= $3",
    )
    .bind(namespace)
    .bind(first)
    .bind(last)
    .fetch_all(&mut *conn)
    .await?;
    for row in rows {
        let (sequence, handler, participant) = rows::decode_participant(&row)?;
        events.entry(sequence).or_default().insert(handler, participant);
    }
    Ok(events)
}

#[cfg(test)]
chorus_runtime::every_migration_is_registered!(MIGRATIONS);
