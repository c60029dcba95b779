//! Push notifications: every status and artifact update of a task is POSTed
//! to each of its push configs' URLs (spec §4.3.3).
//!
//! Each config has its own follower, which reads the task's changes from
//! where the config starts and delivers them in order, each (with its
//! retries) before the next: a slow or dead webhook delays only itself. A
//! follower ends with the task or when its config is deleted; a watch that
//! breaks before then (the task store restarting) is reopened after the last
//! change delivered.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use a2a::StreamResponse;
use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use chorus_runtime::transport::Transport;
use tokio_util::sync::CancellationToken;

use crate::{
    convert,
    error::{GatewayError, Result},
    push::{self, PushError, PushPolicy, PushSender, PushTarget},
};

/// Which changes of a task a push config receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Follow {
    /// Every change since the task was created (a config sent with the
    /// message that created it).
    FromCreation,
    /// The changes from now on (a config added to an existing task).
    FromNow,
}

/// A task's changes, opened for a config before the config is stored so
/// that none made meanwhile is missed.
#[derive(Debug)]
pub(crate) struct Changes(tonic::Streaming<pb::TaskEvent>);

/// (namespace, task id, config id).
type ConfigKey = (String, String, String);

#[derive(Debug, Clone)]
pub(crate) struct PushDispatcher {
    tasks: TaskStoreClient<Transport>,
    sender: Arc<PushSender>,
    policy: PushPolicy,
    /// The configs being followed.
    following: Arc<Mutex<HashSet<ConfigKey>>>,
    shutdown: CancellationToken,
}

/// How reading a config's changes stopped.
enum Stop {
    /// The task ended and its last change was delivered.
    Finished,
    /// The config or its task is gone.
    Gone,
    /// The watch ended before the task's last change: the task ended
    /// before the config was followed, or the task store went away.
    Closed,
    /// The watch broke, or the config could not be read: reopen after the
    /// last change delivered.
    Broken,
}

impl PushDispatcher {
    pub(crate) fn new(
        tasks: TaskStoreClient<Transport>,
        policy: &PushPolicy,
        shutdown: CancellationToken,
    ) -> std::result::Result<Self, String> {
        let sender = PushSender::new(policy.clone()).map_err(|error| error.to_string())?;
        Ok(Self { tasks, sender: Arc::new(sender), policy: policy.clone(), following: Arc::default(), shutdown })
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

    /// Opens the changes of a task that a config to be stored will receive.
    pub(crate) async fn open(&self, namespace: &str, task_id: &str, from: Follow) -> Result<Changes> {
        let request = pb::WatchTaskRequest {
            namespace: namespace.to_owned(),
            task_id: task_id.to_owned(),
            snapshot: from == Follow::FromNow,
            ..pb::WatchTaskRequest::default()
        };
        let events = self.tasks.clone().watch_task(request).await;
        let events = events.map_err(|status| GatewayError::from_taskstore(&status, Some(task_id)))?;
        Ok(Changes(events.into_inner()))
    }

    /// Delivers `changes` to the stored config `config_id` of the task, in
    /// the background, unless that config is followed already.
    pub(crate) fn start(&self, namespace: &str, task_id: &str, config_id: &str, changes: Changes) {
        let key = (namespace.to_owned(), task_id.to_owned(), config_id.to_owned());
        if !self.following.lock().expect("push followers lock").insert(key.clone()) {
            return;
        }
        let dispatcher = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = dispatcher.follow(&key, changes.0) => {}
                () = dispatcher.shutdown.cancelled() => {}
            }
            dispatcher.following.lock().expect("push followers lock").remove(&key);
        });
    }

    /// Delivers the config's changes until the task ends or the config is
    /// gone, reopening a watch that broke after the last change delivered.
    async fn follow(&self, key: &ConfigKey, mut events: tonic::Streaming<pb::TaskEvent>) {
        let (namespace, task_id, config_id) = key;
        let mut cursor = String::new();
        let mut failures = 0;
        loop {
            let before = cursor.clone();
            let stop = self.deliver(key, &mut events, &mut cursor).await;
            let progressed = cursor != before;
            match stop {
                Stop::Finished | Stop::Gone => return,
                // Closed with nothing left after the cursor: the task is over.
                Stop::Closed if !progressed && self.task_over(key).await => return,
                Stop::Closed | Stop::Broken => {}
            }
            failures = if progressed { 1 } else { failures + 1 };
            tokio::time::sleep(push::backoff(&self.policy, failures, None)).await;
            let request = pb::WatchTaskRequest {
                namespace: namespace.clone(),
                task_id: task_id.clone(),
                after_cursor: cursor.clone(),
                snapshot: false,
            };
            events = match self.tasks.clone().watch_task(request).await {
                Ok(events) => events.into_inner(),
                Err(status) if status.code() == tonic::Code::NotFound => return,
                Err(status) => {
                    tracing::warn!(%task_id, %config_id, failures, error = %status.message(), "cannot resume following the task for push notifications");
                    continue;
                }
            };
        }
    }

    /// Delivers each change of `events`, moving `cursor` past it once
    /// delivered (or given up on).
    async fn deliver(
        &self,
        key: &ConfigKey,
        events: &mut tonic::Streaming<pb::TaskEvent>,
        cursor: &mut String,
    ) -> Stop {
        let (_, task_id, config_id) = key;
        loop {
            let event = match events.message().await {
                Ok(Some(event)) => event,
                Ok(None) => return Stop::Closed,
                Err(status) if status.code() == tonic::Code::NotFound => return Stop::Gone,
                Err(status) => {
                    tracing::warn!(%task_id, %config_id, error = %status.message(), "push notification watch broke");
                    return Stop::Broken;
                }
            };
            let next = event.cursor.clone();
            let last = ends_task(&event);
            if let Some(update) = convert::event_out(event).filter(|update| !matches!(update, StreamResponse::Task(_)))
                && let Some(stop) = self.notify(key, &update).await
            {
                return stop;
            }
            *cursor = next;
            if last {
                return Stop::Finished;
            }
        }
    }

    /// Delivers one change to the config as it is now; `Some` when the config
    /// is gone or could not be read.
    async fn notify(&self, key: &ConfigKey, update: &StreamResponse) -> Option<Stop> {
        let (_, task_id, config_id) = key;
        let config = match self.config(key).await {
            Ok(config) => config,
            Err(stop) => return Some(stop),
        };
        let body = serde_json::to_value(update).expect("a stream response serializes");
        let still_wanted = || async { !matches!(self.config(key).await, Err(Stop::Gone)) };
        if let Err(error) = self.sender.deliver(&target(&config), &body, still_wanted).await {
            tracing::warn!(%task_id, %config_id, %error, "push notification not delivered");
        }
        None
    }

    /// Whether the task is terminal or gone.
    async fn task_over(&self, (namespace, task_id, _): &ConfigKey) -> bool {
        let request = pb::GetTaskRequest { namespace: namespace.clone(), id: task_id.clone(), history_length: Some(0) };
        match self.tasks.clone().get_task(request).await {
            Ok(task) => {
                let state = task.into_inner().status.map_or(0, |status| status.state);
                convert::state_out(state).is_terminal()
            }
            Err(status) => status.code() == tonic::Code::NotFound,
        }
    }

    async fn config(&self, (namespace, task_id, id): &ConfigKey) -> std::result::Result<pb::PushConfig, Stop> {
        let request =
            pb::GetPushConfigRequest { namespace: namespace.clone(), task_id: task_id.clone(), id: id.clone() };
        match self.tasks.clone().get_push_config(request).await {
            Ok(config) => Ok(config.into_inner()),
            Err(status) if status.code() == tonic::Code::NotFound => Err(Stop::Gone),
            Err(status) => {
                tracing::warn!(%task_id, config_id = %id, error = %status.message(), "cannot read the push config");
                Err(Stop::Broken)
            }
        }
    }
}

/// The task's final change: the task store ends the watch after it.
fn ends_task(event: &pb::TaskEvent) -> bool {
    event.kind() == pb::task_event::Kind::StatusChanged
        && convert::state_out(event.status.as_ref().map_or(0, |status| status.state)).is_terminal()
}

pub(crate) fn target(config: &pb::PushConfig) -> PushTarget {
    PushTarget {
        url: config.url.clone(),
        token: (!config.token.is_empty()).then(|| config.token.clone()),
        authentication: (!config.auth_scheme.is_empty()).then(|| {
            (config.auth_scheme.clone(), (!config.auth_credentials.is_empty()).then(|| config.auth_credentials.clone()))
        }),
    }
}
