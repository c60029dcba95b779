//! Carries wake-up signals between processes sharing one PostgreSQL.
//!
//! Local signals are queued and sent as one `pg_notify` per burst, listing
//! every key that changed, from a transaction with `synchronous_commit` off:
//! a hint needs no durability, so it costs no WAL flush. Each process tags
//! what it sends and ignores its own echoes.
//!
//! Signals are sent only while another process listens on the channel. Each
//! bridge says hello (its tag alone) when it starts listening and every
//! [`HELLO_EVERY`], and answers a process it had not heard from at once, so
//! two processes know of each other as soon as the second listens. A process
//! alone on its channel (a single replica) sends nothing but its hellos; one
//! that stops is forgotten [`PEER_TTL`] after its last word.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use sqlx::{AnyPool, postgres::PgListener};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{Wakeups, next_batch};

/// PostgreSQL refuses payloads of 8000 bytes or more.
const MAX_PAYLOAD: usize = 7_900;
/// How often a bridge tells the others it listens.
const HELLO_EVERY: Duration = Duration::from_secs(2);
/// How long another process counts as listening after its last word.
const PEER_TTL: Duration = Duration::from_secs(5);

pub(crate) fn spawn(pool: AnyPool, url: String, channel: &'static str, wakeups: &Wakeups, shutdown: CancellationToken) {
    let instance = uuid::Uuid::new_v4().simple().to_string();
    let peers = Arc::new(Peers::default());
    let hello = Arc::new(Notify::new());
    let mut outgoing = wakeups.set_remote();
    let sender = Sender { pool, channel, instance: instance.clone() };
    let sender_shutdown = shutdown.clone();
    let (sender_peers, sender_hello) = (Arc::clone(&peers), Arc::clone(&hello));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(Instant::now() + HELLO_EVERY, HELLO_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let sent = tokio::select! {
                () = sender_shutdown.cancelled() => return,
                _ = ticks.tick() => sender.hello().await,
                () = sender_hello.notified() => sender.hello().await,
                batch = next_batch(&mut outgoing) => match batch {
                    None => return,
                    Some(keys) if sender_peers.any(Instant::now()) => sender.keys(&keys).await,
                    Some(_) => Ok(()),
                },
            };
            if let Err(error) = sent {
                tracing::debug!(%error, channel, "wake-up notify failed; readers will poll");
            }
        }
    });
    let wakeups = wakeups.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = listen(url, channel, instance, wakeups, peers, hello) => {}
        }
    });
}

/// The other processes heard on the channel, and when each was last heard.
#[derive(Debug, Default)]
struct Peers {
    heard: Mutex<HashMap<String, Instant>>,
}

impl Peers {
    /// Records word from `instance` at `now`; true when it was not known
    /// (never heard, or quiet for longer than [`PEER_TTL`]).
    fn heard(&self, instance: &str, now: Instant) -> bool {
        let mut heard = self.heard.lock().expect("peers lock poisoned");
        let last = heard.insert(instance.to_owned(), now);
        last.is_none_or(|last| now.duration_since(last) >= PEER_TTL)
    }

    /// Whether any other process was heard within [`PEER_TTL`] of `now`.
    fn any(&self, now: Instant) -> bool {
        let mut heard = self.heard.lock().expect("peers lock poisoned");
        heard.retain(|_, last| now.duration_since(*last) < PEER_TTL);
        !heard.is_empty()
    }
}

struct Sender {
    pool: AnyPool,
    channel: &'static str,
    instance: String,
}

impl Sender {
    async fn hello(&self) -> Result<(), sqlx::Error> {
        self.send(&self.instance).await
    }

    async fn keys(&self, keys: &HashSet<String>) -> Result<(), sqlx::Error> {
        for payload in payloads(&self.instance, keys) {
            self.send(&payload).await?;
        }
        Ok(())
    }

    async fn send(&self, payload: &str) -> Result<(), sqlx::Error> {
        // One statement, one implicit transaction, committed without waiting
        // for the WAL flush (`set_config(..., true)` lasts that transaction).
        sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
            .bind(self.channel)
            .bind(payload)
            .execute(&self.pool)
            .await
            .map(drop)
    }
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

async fn listen(
    url: String,
    channel: &'static str,
    instance: String,
    wakeups: Wakeups,
    peers: Arc<Peers>,
    hello: Arc<Notify>,
) {
    loop {
        let received: Result<std::convert::Infallible, sqlx::Error> = async {
            let mut listener = PgListener::connect(&url).await?;
            listener.listen(channel).await?;
            hello.notify_one();
            loop {
                let notification = listener.recv().await?;
                let mut lines = notification.payload().lines();
                let Some(from) = lines.next().filter(|from| *from != instance) else { continue };
                if peers.heard(from, Instant::now()) {
                    hello.notify_one();
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

    #[tokio::test(start_paused = true)]
    async fn peers_are_known_from_their_first_word_until_they_go_quiet() {
        let peers = Peers::default();
        let start = Instant::now();
        assert!(!peers.any(start));
        assert!(peers.heard("b", start), "a first word is news");
        assert!(!peers.heard("b", start + PEER_TTL / 2), "a second one is not");
        assert!(peers.any(start + PEER_TTL));
        assert!(!peers.any(start + PEER_TTL / 2 + PEER_TTL), "quiet for the whole TTL: gone");
        assert!(peers.heard("b", start + PEER_TTL * 2), "back after going quiet is news again");
    }

    /// Against the PostgreSQL of `CHORUS_TEST_POSTGRES_URL`, on a channel of
    /// the test's own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_bridge_sends_only_hellos_and_two_bridges_wake_each_other() {
        let Some(url) = std::env::var("CHORUS_TEST_POSTGRES_URL").ok().filter(|url| !url.is_empty()) else {
            eprintln!("skipped: CHORUS_TEST_POSTGRES_URL is not set");
            return;
        };
        let channel: &'static str = format!("chorus_test_{}", uuid::Uuid::new_v4().simple()).leak();
        let mut observer = PgListener::connect(&url).await.expect("observer connects");
        observer.listen(channel).await.expect("observer listens");
        let next = async |observer: &mut PgListener| {
            let received = tokio::time::timeout(Duration::from_secs(10), observer.recv()).await;
            received.expect("a notification within 10 s").expect("the observer's connection holds").payload().to_owned()
        };
        let shutdown = CancellationToken::new();
        let db = crate::storage::Db::connect(&url, &crate::storage::StorageConfig::default()).await.expect("connects");
        let alone = Wakeups::new();
        db.bridge_wakeups(channel, &alone, shutdown.clone());
        let first_hello = next(&mut observer).await;
        assert!(!first_hello.contains('\n'), "a hello carries no keys: {first_hello:?}");
        alone.notify("alone/1");
        // The periodic hello comes HELLO_EVERY later; the key was queued long before.
        assert_eq!(next(&mut observer).await, first_hello, "nobody else listens, so the key is not sent");

        let other = Wakeups::new();
        let mut waiter = other.waiter("shared/1");
        db.bridge_wakeups(channel, &other, shutdown.clone());
        let woke = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                alone.notify("shared/1");
                if tokio::time::timeout(Duration::from_millis(50), waiter.wait(Duration::from_secs(60))).await.is_ok() {
                    return;
                }
            }
        })
        .await;
        assert!(woke.is_ok(), "the second process never heard the first one's signal");
        let mut back = alone.waiter("shared/2");
        other.notify("shared/2");
        let woke = tokio::time::timeout(Duration::from_secs(10), back.wait(Duration::from_secs(60))).await;
        assert!(woke.is_ok(), "the first process did not hear the second at once");
        shutdown.cancel();
    }
}
