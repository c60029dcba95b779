//! Shared state: reads, conditional writes, watches.

use chorus_runtime::{feed, time::now_micros};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Hub, keys};
use crate::{
    domain::{StateEntry, StateWrite},
    error::{HubError, Result},
};

impl Hub {
    /// A key's value; absent, deleted and expired keys are `KeyNotFound`.
    pub async fn get_state(&self, namespace: &str, key: &str) -> Result<StateEntry> {
        match self.repository.state_row(namespace, key).await? {
            Some(entry) if entry.is_live(now_micros()) => Ok(entry),
            _ => Err(HubError::KeyNotFound(key.to_owned())),
        }
    }

    /// Sets or deletes a key under its version rule.
    pub async fn write_state(&self, write: StateWrite) -> Result<StateEntry> {
        let namespace = write.namespace.clone();
        let entry = self.repository.write_state(write, now_micros()).await?;
        if entry.version > 0 {
            self.wakeups.notify(&keys::state(&namespace, &entry.key));
        }
        Ok(entry)
    }

    pub async fn list_state(
        &self,
        namespace: &str,
        prefix: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<StateEntry>> {
        self.repository.list_state(namespace, prefix, after, limit, now_micros()).await
    }

    /// A key's changes after `after_version`: its current row first when
    /// newer, then each later version (intermediate ones may be coalesced).
    pub fn watch_state(&self, namespace: &str, key: &str, after_version: i64) -> ReceiverStream<Result<StateEntry>> {
        let (sender, receiver) = mpsc::channel(16);
        let hub = self.clone();
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        tokio::spawn(async move {
            let mut seen = after_version;
            loop {
                let mut waiter = hub.wakeups.waiter(&keys::state(&namespace, &key));
                match hub.repository.state_row(&namespace, &key).await {
                    Ok(Some(entry)) if entry.version > seen => {
                        seen = entry.version;
                        if sender.send(Ok(entry)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        let _ = sender.send(Err(error)).await;
                        return;
                    }
                }
                tokio::select! {
                    () = hub.shutdown.cancelled() => return feed::stopping(&sender, HubError::ShuttingDown).await,
                    () = sender.closed() => return,
                    () = waiter.wait(hub.config.poll_interval()) => {}
                }
            }
        });
        ReceiverStream::new(receiver)
    }
}
