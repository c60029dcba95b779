//! Commit signals: a writer says "key K changed", waiting readers re-read.
//!
//! Signals are hints. A reader always re-reads the database after a signal
//! and also polls on an interval, so a lost signal delays, never loses, work.
//! Within one process signals are immediate; across processes sharing one
//! PostgreSQL they travel over LISTEN/NOTIFY ([`bridge`]).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{mpsc, watch};

pub(crate) mod bridge;

/// A set of named signals. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Wakeups {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    senders: Mutex<HashMap<String, watch::Sender<u64>>>,
    remote: Mutex<Option<mpsc::UnboundedSender<String>>>,
}

/// Waits for a signal on one key. Dropping the last waiter of a key forgets it.
#[derive(Debug)]
pub struct Waiter {
    receiver: watch::Receiver<u64>,
    /// The key's generation when this waiter was made.
    base: u64,
    key: String,
    inner: Arc<Inner>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut senders = self.inner.senders.lock().expect("wakeups lock poisoned");
        // This waiter's receiver is still alive here, so "last" means one.
        if senders.get(&self.key).is_some_and(|sender| sender.receiver_count() <= 1) {
            senders.remove(&self.key);
        }
    }
}

impl Wakeups {
    pub fn new() -> Self {
        Self::default()
    }

    /// A waiter for `key`. Create it *before* reading, so that a signal sent
    /// between the read and the wait is not missed.
    pub fn waiter(&self, key: &str) -> Waiter {
        let mut senders = self.inner.senders.lock().expect("wakeups lock poisoned");
        let sender = senders.entry(key.to_owned()).or_insert_with(|| watch::channel(0).0);
        let mut receiver = sender.subscribe();
        let base = *receiver.borrow_and_update();
        Waiter { receiver, base, key: key.to_owned(), inner: Arc::clone(&self.inner) }
    }

    /// Signals `key` in this process and, when bridged, in every other one.
    pub fn notify(&self, key: &str) {
        self.notify_local(key);
        if let Some(remote) = self.inner.remote.lock().expect("wakeups lock poisoned").as_ref() {
            // A closed bridge only costs latency: readers poll.
            let _ = remote.send(key.to_owned());
        }
    }

    /// Signals `key` in this process only (what a bridge calls on receipt).
    pub fn notify_local(&self, key: &str) {
        let senders = self.inner.senders.lock().expect("wakeups lock poisoned");
        if let Some(sender) = senders.get(key) {
            sender.send_modify(|generation| *generation += 1);
        }
    }

    /// Routes every future [`notify`](Self::notify) to the returned receiver
    /// too (for a cross-process bridge, which reads it in batches of distinct
    /// keys with [`next_batch`]).
    pub(crate) fn set_remote(&self) -> mpsc::UnboundedReceiver<String> {
        let (sender, receiver) = mpsc::unbounded_channel();
        *self.inner.remote.lock().expect("wakeups lock poisoned") = Some(sender);
        receiver
    }
}

impl Waiter {
    /// Resolves on the next signal or after `poll`, whichever comes first.
    pub async fn wait(&mut self, poll: Duration) {
        // An error means every sender is gone; the timeout still bounds the wait.
        let _ = tokio::time::timeout(poll, self.receiver.changed()).await;
    }

    /// Resolves once the key has got more than `seen` signals since this
    /// waiter was made (at once if it has), or after `poll`.
    pub async fn wait_past(&mut self, seen: u64, poll: Duration) {
        let base = self.base;
        let more = self.receiver.wait_for(|generation| generation.wrapping_sub(base) > seen);
        // An error means every sender is gone; the timeout still bounds the wait.
        let _ = tokio::time::timeout(poll, more).await;
    }
}

/// Resolves on the next signal to any of `waiters`, or after `poll`.
pub async fn wait_any(waiters: &mut [Waiter], poll: Duration) {
    if waiters.is_empty() {
        tokio::time::sleep(poll).await;
        return;
    }
    let changes = waiters.iter_mut().map(|waiter| Box::pin(waiter.receiver.changed()));
    let _ = tokio::time::timeout(poll, futures_util::future::select_all(changes)).await;
}

/// Drains up to everything queued on `receiver` into a set of distinct keys.
pub(crate) async fn next_batch(receiver: &mut mpsc::UnboundedReceiver<String>) -> Option<HashSet<String>> {
    let first = receiver.recv().await?;
    let mut keys = HashSet::from([first]);
    while let Ok(key) = receiver.try_recv() {
        keys.insert(key);
    }
    Some(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_after_the_waiter_is_created_is_not_missed() {
        let wakeups = Wakeups::new();
        let mut waiter = wakeups.waiter("ns/agent");
        wakeups.notify("ns/agent");
        let woke = tokio::time::timeout(Duration::from_secs(5), waiter.wait(Duration::from_secs(60))).await;
        assert!(woke.is_ok(), "the waiter slept through the signal");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_counts_the_signals_since_it_was_made_and_waits_past_them() {
        let wakeups = Wakeups::new();
        let _earlier = wakeups.waiter("k");
        wakeups.notify("k");
        let mut waiter = wakeups.waiter("k");
        let started = tokio::time::Instant::now();
        waiter.wait_past(0, Duration::from_millis(250)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(250), "a signal before the waiter was made does not count");
        wakeups.notify("k");
        waiter.wait_past(0, Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(250), "one signal is past none: no wait");
        waiter.wait_past(1, Duration::from_millis(250)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(500), "no second signal: the poll ends the wait");
        let notifier = wakeups.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            notifier.notify("k");
        });
        waiter.wait_past(1, Duration::from_secs(60)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(510), "the second signal ended the wait");
    }

    #[tokio::test(start_paused = true)]
    async fn other_keys_do_not_wake_and_poll_bounds_the_wait() {
        let wakeups = Wakeups::new();
        let mut waiter = wakeups.waiter("a");
        wakeups.notify("b");
        let started = tokio::time::Instant::now();
        waiter.wait(Duration::from_millis(250)).await;
        assert!(started.elapsed() >= Duration::from_millis(250));
    }

    #[test]
    fn keys_are_forgotten_with_their_last_waiter() {
        let wakeups = Wakeups::new();
        let first = wakeups.waiter("k");
        let second = wakeups.waiter("k");
        drop(first);
        assert_eq!(wakeups.inner.senders.lock().unwrap().len(), 1);
        drop(second);
        assert!(wakeups.inner.senders.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn wait_any_wakes_on_any_key() {
        let wakeups = Wakeups::new();
        let mut waiters = vec![wakeups.waiter("a"), wakeups.waiter("b")];
        wakeups.notify("b");
        let woke = tokio::time::timeout(Duration::from_secs(5), wait_any(&mut waiters, Duration::from_secs(60))).await;
        assert!(woke.is_ok(), "wait_any slept through the signal");
    }

    #[tokio::test]
    async fn remote_batches_hold_distinct_keys() {
        let wakeups = Wakeups::new();
        let mut remote = wakeups.set_remote();
        wakeups.notify("x");
        wakeups.notify("x");
        wakeups.notify("y");
        let batch = next_batch(&mut remote).await.expect("a batch");
        assert_eq!(batch, HashSet::from(["x".to_owned(), "y".to_owned()]));
    }
}
