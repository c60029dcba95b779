//! A worker's claim stream, which gives back, when the worker goes away,
//! the claims it never received.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tokio::sync::mpsc;
use tokio_stream::Stream;

use super::TaskStore;
use crate::{
    domain::{ClaimRequest, Claimed},
    error::Result,
};

/// The tasks claimed for one worker, as they are claimed.
///
/// A claim counts once it is on the stream's channel; one still there when
/// the stream is dropped (its worker closed it, or went away) never left
/// this process: its task goes back to the queue at once, rather than sit
/// leased to a worker that does not know it until the lease runs out.
pub struct ClaimStream {
    receiver: mpsc::Receiver<Result<Claimed>>,
    store: TaskStore,
    namespace: String,
    agent_id: String,
}

impl std::fmt::Debug for ClaimStream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ClaimStream")
            .field("namespace", &self.namespace)
            .field("agent_id", &self.agent_id)
            .finish()
    }
}

impl ClaimStream {
    pub(super) fn new(receiver: mpsc::Receiver<Result<Claimed>>, store: TaskStore, request: &ClaimRequest) -> Self {
        Self { receiver, store, namespace: request.namespace.clone(), agent_id: request.agent_id.clone() }
    }
}

impl Stream for ClaimStream {
    type Item = Result<Claimed>;

    fn poll_next(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.receiver.poll_recv(context)
    }
}

impl Drop for ClaimStream {
    fn drop(&mut self) {
        self.receiver.close();
        let mut unreceived = Vec::new();
        while let Ok(item) = self.receiver.try_recv() {
            unreceived.extend(item.ok());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if unreceived.is_empty() {
            return;
        }
        let (store, namespace, agent_id) = (self.store.clone(), self.namespace.clone(), self.agent_id.clone());
        runtime.spawn(async move {
            for claimed in unreceived {
                store.release(&namespace, &agent_id, &claimed).await;
            }
        });
    }
}
