//! Storage for the services of a process: its database, connected and
//! probed for readiness, and the SQLite file held for it alone.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use chorus_runtime::{
    server::ServerBuilder,
    storage::{Backend, Db, redact_url, sqlite_file, with_application_name},
};

use super::Service;
use crate::config::ChorusConfig;

/// The database of a process whose services need one, with the lock of its
/// SQLite file (none on PostgreSQL); `(None, None)` when none needs one.
pub(super) async fn open(
    config: &ChorusConfig,
    services: &[Service],
    server: &mut ServerBuilder,
) -> anyhow::Result<(Option<Db>, Option<std::fs::File>)> {
    if !services.iter().any(|service| service.needs_storage()) {
        return Ok((None, None));
    }
    let lock = sqlite_lock_path(&config.storage.effective_url()?).map(|path| lock_sqlite_file(&path)).transpose()?;
    // Its connections are named after the service it holds, or `chorus` for several.
    let stored: Vec<&Service> = services.iter().filter(|service| service.needs_storage()).collect();
    let name = match stored.as_slice() {
        [service] => format!("chorus-{}", service.name()),
        _ => "chorus".to_owned(),
    };
    let db = open_storage(config, &name, server).await?;
    if let [service] = services
        && db.backend() == Backend::Sqlite
    {
        tracing::warn!(
            service = ?service,
            "serving one service on a SQLite file of its own: services run apart share their state only \
             through PostgreSQL; give --database-url (CHORUS_STORAGE__DATABASE_URL) unless this is meant"
        );
    }
    Ok((Some(db), lock))
}

/// The lock file of the SQLite file `url` names (`<file>.lock`); none for
/// PostgreSQL or an in-memory database.
fn sqlite_lock_path(url: &str) -> Option<PathBuf> {
    sqlite_file(url).map(|file| PathBuf::from(format!("{}.lock", file.display())))
}

/// Holds the SQLite file for this process: two processes writing one file
/// would fail each other's writes as "database is locked". Released when
/// the process ends, however it ends.
fn lock_sqlite_file(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "the database beside {} is in use by another chorus process; stop it, or give this one another \
             data directory (--data-dir, storage.data_dir) or storage.database_url",
            path.display()
        ),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// Connects the database and makes `/healthz` depend on it.
async fn open_storage(config: &ChorusConfig, name: &str, server: &mut ServerBuilder) -> anyhow::Result<Db> {
    let url = config.storage.effective_url()?;
    let db = Db::connect(&with_application_name(&url, name), &config.storage).await?;
    tracing::info!(database = %redact_url(&url), backend = ?db.backend(), "storage connected");
    server.metrics().watch_pool(&db);
    let probe_db = db.clone();
    server.add_readiness_probe(Arc::new(move || {
        let db = probe_db.clone();
        Box::pin(async move { db.ping().await.map_err(|error| format!("database: {error}")) })
    }));
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_files_are_locked_beside_themselves() {
        assert_eq!(
            sqlite_lock_path("sqlite://.chorus/chorus.db?mode=rwc"),
            Some(PathBuf::from(".chorus/chorus.db.lock"))
        );
        assert_eq!(sqlite_lock_path("sqlite:///var/lib/c.db"), Some(PathBuf::from("/var/lib/c.db.lock")));
        assert_eq!(sqlite_lock_path("sqlite::memory:"), None);
        assert_eq!(sqlite_lock_path("sqlite://x.db?mode=memory"), None);
        assert_eq!(sqlite_lock_path("postgres://u@h/db"), None);
    }
}
