//! The readiness probe: whether the database answers, and why not, soon.

use std::time::Duration;

use sqlx::{Connection as _, Executor as _};

use super::{Db, ServiceMigrations, classify, errors};

/// How long a probe waits for a pooled connection before it also opens one
/// of its own: a database that refuses or ignores new sessions is told at
/// once, not after the pool's acquire timeout, with what it answered.
const DIRECT_AFTER: Duration = Duration::from_millis(500);

/// Why no pooled connection came while the database takes new sessions.
const POOL_BUSY: &str = "no pooled connection came free within storage.acquire_timeout_ms: every one of the \
                         storage.max_connections is in use (a slow database, or too small a pool)";

impl Db {
    /// Succeeds when the database answers and still holds the tables of the
    /// services migrated: a database dropped and made again empty under a
    /// running process answers, but every call would fail.
    pub async fn ping(&self) -> Result<(), String> {
        // Classified, as a service's errors are: a probe of an idle service
        // that found its connection broken has the next probe test it.
        let failed = |error: sqlx::Error| {
            classify(&error);
            match error {
                sqlx::Error::PoolTimedOut => POOL_BUSY.to_owned(),
                other => errors::reason(&other),
            }
        };
        let acquire = self.acquire();
        tokio::pin!(acquire);
        let mut connection = tokio::select! {
            acquired = &mut acquire => acquired.map_err(failed)?,
            () = tokio::time::sleep(DIRECT_AFTER) => {
                let timeout = self.pool.options().get_acquire_timeout();
                connect_directly(&self.options, timeout).await.map_err(|error| errors::reason(&error))?;
                acquire.await.map_err(failed)?
            }
        };
        connection.execute("SELECT 1").await.map_err(failed)?;
        let services = self.migrated.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for service in services {
            let probe = format!("SELECT 1 FROM {} LIMIT 1", ServiceMigrations::table(service));
            if connection.execute(sqlx::AssertSqlSafe(probe)).await.is_err() {
                return Err(format!(
                    "the {service} tables are gone (was the database made again?); restart the process to create them"
                ));
            }
        }
        Ok(())
    }
}

/// Opens a connection apart from any pool and closes it, within `timeout`:
/// why the database takes no new session, if it does not (`PoolTimedOut`
/// when it does not answer in time).
pub(super) async fn connect_directly(
    options: &sqlx::any::AnyConnectOptions,
    timeout: Duration,
) -> Result<(), sqlx::Error> {
    match tokio::time::timeout(timeout, sqlx::AnyConnection::connect_with(options)).await {
        Ok(Ok(connection)) => {
            // Closing politely is a courtesy; the session ends either way.
            let _ = connection.close().await;
            Ok(())
        }
        Ok(Err(error)) => Err(error),
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::{net::TcpListener, task::JoinSet};

    use super::*;
    use crate::storage::StorageConfig;

    /// A TCP proxy to `to`; dropping it closes its port and every connection through it.
    async fn proxy(to: SocketAddr) -> (SocketAddr, JoinSet<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        (address, tasks)
    }

    /// A database gone while the process runs is told within a second or
    /// so, with what refused it, not after the pool's 10 s acquire timeout.
    #[tokio::test]
    async fn a_database_that_went_away_is_told_soon_and_why() {
        let Ok(url) = std::env::var(crate::testing::POSTGRES_URL_VAR) else { return };
        let mut url = reqwest::Url::parse(&url).unwrap();
        let server = SocketAddr::new(url.host_str().unwrap().parse().unwrap(), url.port().unwrap_or(5432));
        let (address, proxied) = proxy(server).await;
        url.set_port(Some(address.port())).unwrap();
        let config = StorageConfig { acquire_timeout_ms: 10_000, ..StorageConfig::default() };
        let db = Db::connect(url.as_str(), &config).await.unwrap();
        db.ping().await.unwrap();
        drop(proxied);
        // The first probe may meet its broken connection; the next opens new ones.
        let _ = db.ping().await;
        let started = std::time::Instant::now();
        let why = db.ping().await.expect_err("nothing answers on the port now");
        assert!(started.elapsed() < Duration::from_secs(3), "told in {:?}", started.elapsed());
        assert!(why.to_lowercase().contains("refused"), "{why}");
    }
}
