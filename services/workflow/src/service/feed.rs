//! Each write of a run this process makes, handed to the run's watches in
//! this process, so a watch that has read up to a revision follows the next
//! writes without reading them back from the database. A watch notices when
//! a write reaches it out of turn — made by another process, missed because
//! it lagged, or published late — by its revision, and reads the database.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::mpsc;

use crate::domain::{Run, RunEvent};

/// Writes a watch may be behind before it misses one and reads the database.
const BACKLOG: usize = 64;

/// One write of a run.
#[derive(Debug)]
pub(crate) struct Fed {
    /// The run's revision after the write.
    pub(crate) revision: i64,
    pub(crate) events: Vec<RunEvent>,
    /// The run as the write left it, when the write finished it.
    pub(crate) finished: Option<Run>,
}

type Watchers = HashMap<String, Vec<(u64, mpsc::Sender<Arc<Fed>>)>>;

/// The watches of this process, by run. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunFeed {
    watchers: Arc<Mutex<Watchers>>,
    next_id: Arc<AtomicU64>,
}

/// A watch's share of the feed; leaves it when dropped.
#[derive(Debug)]
pub(crate) struct Subscription {
    feed: RunFeed,
    run_id: String,
    id: u64,
    receiver: mpsc::Receiver<Arc<Fed>>,
}

impl RunFeed {
    fn watchers(&self) -> std::sync::MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows the writes of `run_id` from now on.
    pub(crate) fn subscribe(&self, run_id: &str) -> Subscription {
        let (sender, receiver) = mpsc::channel(BACKLOG);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.watchers().entry(run_id.to_owned()).or_default().push((id, sender));
        Subscription { feed: self.clone(), run_id: run_id.to_owned(), id, receiver }
    }

    /// Hands a committed write to the run's watches; one whose backlog is
    /// full misses it (and will see the gap).
    pub(crate) fn publish(&self, run_id: &str, fed: Fed) {
        let watchers = self.watchers();
        let Some(senders) = watchers.get(run_id) else { return };
        let fed = Arc::new(fed);
        for (_, sender) in senders {
            sender.try_send(Arc::clone(&fed)).ok();
        }
    }
}

impl Subscription {
    /// The next write, as long as the subscription lives.
    pub(crate) async fn next(&mut self) -> Option<Arc<Fed>> {
        self.receiver.recv().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut watchers = self.feed.watchers();
        if let Some(senders) = watchers.get_mut(&self.run_id) {
            senders.retain(|(id, _)| *id != self.id);
            if senders.is_empty() {
                watchers.remove(&self.run_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_hears_its_runs_writes_until_it_leaves() {
        let feed = RunFeed::default();
        let mut watch = feed.subscribe("r1");
        let mut other = feed.subscribe("r2");
        feed.publish("r1", Fed { revision: 3, events: Vec::new(), finished: None });
        assert_eq!(watch.next().await.expect("a write").revision, 3);
        assert!(other.receiver.try_recv().is_err(), "another run's watch hears nothing");
        drop(watch);
        drop(other);
        assert!(feed.watchers().is_empty(), "dropped watches leave the feed");
    }

    #[tokio::test]
    async fn a_lagging_watch_misses_writes_instead_of_holding_them() {
        let feed = RunFeed::default();
        let mut watch = feed.subscribe("r1");
        for revision in 0..(BACKLOG as i64 + 5) {
            feed.publish("r1", Fed { revision, events: Vec::new(), finished: None });
        }
        let mut heard = 0;
        while watch.receiver.try_recv().is_ok() {
            heard += 1;
        }
        assert_eq!(heard, BACKLOG);
    }
}
