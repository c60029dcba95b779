//! Carries wake-up signals between processes sharing one PostgreSQL.
//!
//! Local signals are queued and sent as one `pg_notify` per burst, listing
//! every key that changed, from a transaction with `synchronous_commit` off:
//! a hint needs no durability, so it costs no WAL flush. Each process tags
//! what it sends and ignores its own echoes.

use std::{collections::HashSet, time::Duration};

use sqlx::{AnyPool, postgres::PgListener};
use tokio_util::sync::CancellationToken;

use super::{Wakeups, next_batch};

/// PostgreSQL refuses payloads of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7_900;

pub(crate) fn spawn(pool: AnyPool, url: String, channel: &'static str, wakeups: &Wakeups, shutdown: CancellationToken) {
    let instance = uuid::Uuid::new_v4().simple().to_string();
    let mut outgoing = wakeups.set_remote();
    let sender_shutdown = shutdown.clone();
    let sender_instance = instance.clone();
    tokio::spawn(async move {
        loop {
            let batch = tokio::select! {
                () = sender_shutdown.cancelled() => return,
                batch = next_batch(&mut outgoing) => batch,
            };
            let Some(keys) = batch else { return };
            if let Err(error) = send(&pool, channel, &sender_instance, &keys).await {
                tracing::debug!(%error, channel, "wake-up notify failed; readers will poll");
            }
        }
    });
    let wakeups = wakeups.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = listen(url, channel, instance, wakeups) => {}
        }
    });
}

async fn send(pool: &AnyPool, channel: &str, instance: &str, keys: &HashSet<String>) -> Result<(), sqlx::Error> {
    for payload in payloads(instance, keys) {
        // One statement, one implicit transaction, committed without waiting
        // for the WAL flush (`set_config(..., true)` lasts that transaction).
        sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
            .bind(channel)
            .bind(payload)
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// `instance` on the first line, then one key per line, split to fit.
fn payloads(instance: &str, keys: &HashSet<String>) -> Vec<String> {
    let mut payloads = Vec::new();
    let mut current = instance.to_owned();
    for key in keys {
        if current.len() + 1 + key.len() > MAX_PAYLOAD && current.len() > instance.len() {
            payloads.push(std::mem::replace(&mut current, instance.to_owned()));
        }
        current.push('\n');
        current.push_str(key);
    }
    if current.len() > instance.len() {
        payloads.push(current);
    }
    payloads
}

async fn listen(url: String, channel: &'static str, instance: String, wakeups: Wakeups) {
    loop {
        let received: Result<std::convert::Infallible, sqlx::Error> = async {
            let mut listener = PgListener::connect(&url).await?;
            listener.listen(channel).await?;
            loop {
                let notification = listener.recv().await?;
                let mut lines = notification.payload().lines();
                if lines.next() == Some(instance.as_str()) {
                    continue;
                }
                lines.for_each(|key| wakeups.notify_local(key));
            }
        }
        .await;
        let Err(error) = received;
        tracing::warn!(%error, channel, "wake-up listener lost its connection; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_carry_the_instance_and_split_before_the_limit() {
        let keys: HashSet<String> = (0..400).map(|index| format!("task/ns/{index:040}")).collect();
        let sent = payloads("me", &keys);
        assert!(sent.len() > 1);
        let mut seen = HashSet::new();
        for payload in &sent {
            assert!(payload.len() < MAX_PAYLOAD + 1);
            let mut lines = payload.lines();
            assert_eq!(lines.next(), Some("me"));
            seen.extend(lines.map(str::to_owned));
        }
        assert_eq!(seen, keys);
        assert!(payloads("me", &HashSet::new()).is_empty());
    }
}
