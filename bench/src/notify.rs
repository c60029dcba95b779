//! Counts the wake-up notifications chorus sends through PostgreSQL.
//!
//! chorus carries wake-up keys to other replicas with `pg_notify` on one
//! channel per service. Each call is made in a transaction of the sender's and read, by
//! every listening backend, in a transaction of the listener's: both show in
//! `xact_commit`. Listening on the same channel shows how many calls a round
//! trip causes and which keys they carried. A payload is one key, or (from
//! senders that batch) a sender tag line followed by one key per line; a tag
//! alone is a bridge's hello, which carries no key (a bridge sends keys only
//! while another process listens).

use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde::Serialize;
use sqlx::postgres::PgListener;
use tokio::task::JoinHandle;

/// The channels `chorus serve taskstore` and `chorus serve eventbus` notify
/// on (`src/stack.rs`).
pub(crate) const TASKSTORE_CHANNEL: &str = "chorus_taskstore";
pub(crate) const EVENTBUS_CHANNEL: &str = "chorus_eventbus";

/// Notifications received, and the wake-up keys they carried by kind
/// (`task/…`, `events/…`, `claim/…`, anything else).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Notifications {
    pub(crate) total: u64,
    pub(crate) task_keys: u64,
    pub(crate) events_keys: u64,
    pub(crate) claim_keys: u64,
    pub(crate) other_keys: u64,
}

impl Notifications {
    fn count(&mut self, payload: &str) {
        self.total += 1;
        // Keys have a '/'; a sender's tag line has none.
        for key in payload.lines().filter(|line| line.contains('/')) {
            let kind = match key.split_once('/').map(|(kind, _)| kind) {
                Some("task") => &mut self.task_keys,
                Some("events") => &mut self.events_keys,
                Some("claim") => &mut self.claim_keys,
                _ => &mut self.other_keys,
            };
            *kind += 1;
        }
    }

    /// What arrived between `self` and `later`.
    pub(crate) fn until(self, later: Self) -> Self {
        Self {
            total: later.total - self.total,
            task_keys: later.task_keys - self.task_keys,
            events_keys: later.events_keys - self.events_keys,
            claim_keys: later.claim_keys - self.claim_keys,
            other_keys: later.other_keys - self.other_keys,
        }
    }
}

/// A listener counting notifications until dropped.
#[derive(Debug)]
pub(crate) struct NotifyCounter {
    counts: Arc<Mutex<Notifications>>,
    backend_pid: i32,
    /// Ends only on failure, with the reason.
    listener: JoinHandle<anyhow::Error>,
}

impl NotifyCounter {
    /// Starts listening on `channel` of `database_url` (a database chorus serves from).
    pub(crate) async fn start(database_url: &str, channel: &str) -> anyhow::Result<Self> {
        let mut listener = PgListener::connect(database_url).await.context("cannot connect the notify counter")?;
        listener.listen(channel).await.context("cannot LISTEN for chorus wake-ups")?;
        // A listening backend runs a transaction for each batch of
        // notifications it reads and reports it only when it next finishes
        // a query or exits. Flushing now leaves nothing pending, so no idle
        // timer reports this listener's transactions later: they stay out
        // of the chorus database's counts until it disconnects at the end.
        let backend_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid() FROM pg_stat_force_next_flush()")
            .fetch_one(&mut listener)
            .await
            .context("cannot prepare the notify counter")?;
        let counts = Arc::new(Mutex::new(Notifications::default()));
        let shared = Arc::clone(&counts);
        let listener = tokio::spawn(async move {
            loop {
                match listener.try_recv().await {
                    Ok(Some(notification)) => {
                        shared.lock().expect("notify counts lock poisoned").count(notification.payload());
                    }
                    // A lost connection loses notifications: stop, so `read` fails.
                    Ok(None) => return anyhow::anyhow!("the notify counter lost its connection"),
                    Err(error) => return anyhow::Error::new(error).context("the notify counter failed"),
                }
            }
        });
        Ok(Self { counts, backend_pid, listener })
    }

    /// The PostgreSQL backend that listens.
    pub(crate) fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// The counts so far; fails if the listener stopped.
    pub(crate) async fn read(&mut self) -> anyhow::Result<Notifications> {
        if self.listener.is_finished() {
            return Err(match (&mut self.listener).await {
                Ok(error) => error,
                Err(join_error) => anyhow::Error::new(join_error).context("the notify counter panicked"),
            });
        }
        Ok(*self.counts.lock().expect("notify counts lock poisoned"))
    }
}

impl Drop for NotifyCounter {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_keys_and_tagged_batches_are_counted_by_key_kind() {
        let mut counts = Notifications::default();
        let payloads = ["task/bench/1", "0f3a9c\ntask/bench/2\nevents/bench\nclaim/bench/bench-0", "inbox/x/y/z"];
        for payload in payloads {
            counts.count(payload);
        }
        let expected = Notifications { total: 3, task_keys: 2, events_keys: 1, claim_keys: 1, other_keys: 1 };
        assert_eq!(counts, expected);
        assert_eq!(Notifications::default().until(expected), expected);
    }
}
