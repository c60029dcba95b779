//! Push notifications: every status and artifact update of a task with push
//! configs is POSTed to each config's URL (spec §4.3.3), by one follower per
//! task that ends with the task.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use a2a::StreamResponse;
use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use chorus_runtime::transport::Transport;
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::{
    convert,
    error::{GatewayError, Result},
    push::{PushError, PushPolicy, PushSender, PushTarget},
};

/// Which changes of a task its push configs receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Follow {
    /// Every change since the task was created (a config sent with the
    /// message that created it).
    FromCreation,
    /// The changes from now on (a config added to a running task).
    FromNow,
}

#[derive(Debug, Clone)]
pub(crate) struct PushDispatcher {
    tasks: TaskStoreClient<Transport>,
    sender: Arc<PushSender>,
    /// (namespace, task id) of the tasks being followed.
    following: Arc<Mutex<HashSet<(String, String)>>>,
    shutdown: CancellationToken,
}

impl PushDispatcher {
    pub(crate) fn new(
        tasks: TaskStoreClient<Transport>,
        policy: &PushPolicy,
        shutdown: CancellationToken,
    ) -> std::result::Result<Self, String> {
        let sender = PushSender::new(policy.clone()).map_err(|error| error.to_string())?;
        Ok(Self { tasks, sender: Arc::new(sender), following: Arc::default(), shutdown })
    }

    /// Refuses a URL notifications may not go to (SSRF guard): a bad URL, or
    /// a host that resolves to an address that is not public. A host that
    /// does not resolve yet is let through; every delivery checks again.
    pub(crate) async fn check(&self, url: &str) -> Result<()> {
        let guard = self.sender.guard();
        guard.check(url).map_err(|error| GatewayError::InvalidParams(error.to_string()))?;
        match guard.resolve(url).await {
            Ok(_) | Err(PushError::Resolve { .. }) => Ok(()),
            Err(error) => Err(GatewayError::InvalidParams(error.to_string())),
        }
    }

    /// Follows a task's changes for its push configs, unless it is followed
    /// already; returns once the watch is open, so no change after this call
    /// is missed.
    pub(crate) async fn follow(&self, namespace: &str, task_id: &str, from: Follow) {
        let key = (namespace.to_owned(), task_id.to_owned());
        if !self.following.lock().expect("push followers lock").insert(key.clone()) {
            return;
        }
        let request = pb::WatchTaskRequest {
            namespace: namespace.to_owned(),
            task_id: task_id.to_owned(),
            snapshot: from == Follow::FromNow,
            ..pb::WatchTaskRequest::default()
        };
        let events = match self.tasks.clone().watch_task(request).await {
            Ok(events) => events.into_inner(),
            Err(status) => {
                tracing::warn!(%task_id, error = %status.message(), "cannot follow the task for push notifications");
                self.following.lock().expect("push followers lock").remove(&key);
                return;
            }
        };
        let dispatcher = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = dispatcher.deliver(&key.0, &key.1, events) => {}
                () = dispatcher.shutdown.cancelled() => {}
            }
            dispatcher.following.lock().expect("push followers lock").remove(&key);
        });
    }

    async fn deliver(&self, namespace: &str, task_id: &str, mut events: tonic::Streaming<pb::TaskEvent>) {
        while let Some(event) = events.next().await {
            let Ok(event) = event else { return };
            match convert::event_out(event) {
                Some(StreamResponse::Task(_)) | None => {}
                Some(update) => self.notify(namespace, task_id, &update).await,
            }
        }
    }

    async fn notify(&self, namespace: &str, task_id: &str, update: &StreamResponse) {
        let request = pb::ListPushConfigsRequest { namespace: namespace.to_owned(), task_id: task_id.to_owned() };
        let configs = match self.tasks.clone().list_push_configs(request).await {
            Ok(configs) => configs.into_inner().configs,
            Err(status) => {
                tracing::warn!(%task_id, error = %status.message(), "cannot read the task's push configs");
                return;
            }
        };
        let body = serde_json::to_value(update).expect("a stream response serializes");
        for config in configs {
            let target = target(&config);
            if let Err(error) = self.sender.deliver(&target, &body).await {
                tracing::warn!(%task_id, config_id = %config.id, %error, "push notification not delivered");
            }
        }
    }
}

fn target(config: &pb::PushConfig) -> PushTarget {
    PushTarget {
        url: config.url.clone(),
        token: (!config.token.is_empty()).then(|| config.token.clone()),
        authentication: (!config.auth_scheme.is_empty()).then(|| {
            (config.auth_scheme.clone(), (!config.auth_credentials.is_empty()).then(|| config.auth_credentials.clone()))
        }),
    }
}
