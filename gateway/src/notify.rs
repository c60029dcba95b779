//! Push notifications: every status and artifact update of a task is POSTed
//! to each of its push configs' URLs (spec §4.3.3).
//!
//! Each config has its own follower, which reads the task's changes from
//! where the config starts and delivers them in order, each (with its
//! retries) before the next: a slow or dead webhook delays only itself. A
//! follower ends with the task or when its config is deleted; a watch that
//! breaks before then (the task store restarting) is reopened after the last
//! change delivered.
//!
//! The task store keeps, with each config, the cursor of the last change
//! delivered (or given up on) and whether the config finished: a gateway
//! that starts resumes every unfinished config after its cursor. A gateway
//! that stops between delivering a change and saving its cursor sends that
//! change again.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use a2a::StreamResponse;
use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use chorus_runtime::{metrics::Metrics, transport::Transport};
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
pub(crate) struct Changes {
    events: tonic::Streaming<pb::TaskEvent>,
    /// The cursor the changes start after; empty: the task's first.
    after: String,
}

impl Changes {
    /// Where the config starts, to store with it.
    pub(crate) fn after(&self) -> &str {
        &self.after
    }
}

/// How many unfinished configs a starting gateway reads at a time.
const RESUME_PAGE: u32 = 100;

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
    /// Where notifications delivered and given up on are counted.
    metrics: Metrics,
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
        metrics: Metrics,
    ) -> std::result::Result<Self, String> {
        let sender = PushSender::new(policy.clone()).map_err(|error| error.to_string())?;
        Ok(Self {
            tasks,
            sender: Arc::new(sender),
            policy: policy.clone(),
            following: Arc::default(),
            shutdown,
            metrics,
        })
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
        let error = |status: tonic::Status| GatewayError::from_taskstore(&status, Some(task_id));
        let mut events = self.tasks.clone().watch_task(request).await.map_err(error)?.into_inner();
        let after = match from {
            Follow::FromCreation => String::new(),
            // The snapshot holds the changes up to its cursor: the config
            // gets those after it.
            Follow::FromNow => match events.message().await.map_err(error)? {
                Some(snapshot) => snapshot.cursor,
                None => {
                    return Err(GatewayError::Unavailable(format!(
                        "the task store ended the watch of task {task_id} before its snapshot"
                    )));
                }
            },
        };
        Ok(Changes { events, after })
    }

    /// Resumes, in the background, the delivery of every config not
    /// finished (this gateway is starting), each after the last change it
    /// was delivered; waits for the task store while it cannot be reached.
    pub(crate) fn resume(&self) {
        let dispatcher = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = dispatcher.resume_pending() => {}
                () = dispatcher.shutdown.cancelled() => {}
            }
        });
    }

    async fn resume_pending(&self) {
        let mut after = None;
        let mut failures = 0;
        loop {
            let request = pb::ListPendingPushConfigsRequest { page_size: RESUME_PAGE, after: after.clone() };
            let page = match self.tasks.clone().list_pending_push_configs(request).await {
                Ok(page) => page.into_inner().configs,
                Err(status) => {
                    failures += 1;
                    tracing::warn!(failures, error = %status.message(), "cannot list the push configs to resume");
                    tokio::time::sleep(push::backoff(&self.policy, failures, None)).await;
                    continue;
                }
            };
            failures = 0;
            let last_page = page.len() < RESUME_PAGE as usize;
            for pending in page {
                let Some(key) = pending.key else {
                    tracing::warn!("the task store listed a push config without its key");
                    continue;
                };
                let config = (key.namespace.clone(), key.task_id.clone(), key.id.clone());
                self.spawn(config, pending.delivered_cursor, None);
                after = Some(key);
            }
            if last_page {
                return;
            }
        }
    }

    /// Delivers `changes` to the stored config `config_id` of the task, in
    /// the background, unless that config is followed already.
    pub(crate) fn start(&self, namespace: &str, task_id: &str, config_id: &str, changes: Changes) {
        let key = (namespace.to_owned(), task_id.to_owned(), config_id.to_owned());
        self.spawn(key, changes.after, Some(changes.events));
    }

    /// Follows the config from `cursor` on `events`, or on a watch opened
    /// after it, unless the config is followed already.
    fn spawn(&self, key: ConfigKey, cursor: String, events: Option<tonic::Streaming<pb::TaskEvent>>) {
        if !self.following.lock().expect("push followers lock").insert(key.clone()) {
            return;
        }
        let dispatcher = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = dispatcher.follow(&key, cursor, events) => {}
                () = dispatcher.shutdown.cancelled() => {}
            }
            dispatcher.following.lock().expect("push followers lock").remove(&key);
        });
    }

    /// Delivers the config's changes after `cursor` until the task ends or
    /// the config is gone, (re)opening the watch after the last change
    /// delivered when there is none or it broke.
    async fn follow(&self, key: &ConfigKey, mut cursor: String, mut events: Option<tonic::Streaming<pb::TaskEvent>>) {
        let (namespace, task_id, config_id) = key;
        let mut failures = 0;
        loop {
            if let Some(mut events) = events.take() {
                let before = cursor.clone();
                let stop = self.deliver(key, &mut events, &mut cursor).await;
                let progressed = cursor != before;
                match stop {
                    Stop::Finished => return self.save(key, &cursor, true).await,
                    Stop::Gone => return,
                    // Closed with nothing left after the cursor: the task is over.
                    Stop::Closed if !progressed && self.task_over(key).await => {
                        return self.save(key, &cursor, true).await;
                    }
                    Stop::Closed | Stop::Broken => {}
                }
                failures = if progressed { 1 } else { failures + 1 };
                tokio::time::sleep(push::backoff(&self.policy, failures, None)).await;
            }
            let request = pb::WatchTaskRequest {
                namespace: namespace.clone(),
                task_id: task_id.clone(),
                after_cursor: cursor.clone(),
                snapshot: false,
            };
            match self.tasks.clone().watch_task(request).await {
                Ok(opened) => events = Some(opened.into_inner()),
                Err(status) if status.code() == tonic::Code::NotFound => return,
                Err(status) => {
                    failures += 1;
                    tracing::warn!(%task_id, %config_id, failures, error = %status.message(), "cannot follow the task for push notifications");
                    tokio::time::sleep(push::backoff(&self.policy, failures, None)).await;
                }
            }
        }
    }

    /// Saves, for a gateway that restarts, that the config was delivered
    /// the changes through `cursor` and, when `finished`, that it gets no
    /// more. Not saved, a change is only sent again after a restart.
    async fn save(&self, (namespace, task_id, id): &ConfigKey, cursor: &str, finished: bool) {
        let request = pb::AdvancePushConfigRequest {
            namespace: namespace.clone(),
            task_id: task_id.clone(),
            id: id.clone(),
            cursor: cursor.to_owned(),
            finished,
        };
        match self.tasks.clone().advance_push_config(request).await {
            Ok(_) => {}
            // Deleted meanwhile: there is nothing left to resume.
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => {
                tracing::warn!(%task_id, config_id = %id, error = %status.message(), "cannot save how far the push config was delivered");
            }
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
            let update = convert::event_out(event).filter(|update| !matches!(update, StreamResponse::Task(_)));
            if let Some(update) = &update
                && let Some(stop) = self.notify(key, update).await
            {
                return stop;
            }
            *cursor = next;
            if last {
                return Stop::Finished;
            }
            if update.is_some() {
                self.save(key, cursor, false).await;
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
        // A config updated between attempts is retried as it is now; one
        // that cannot be read just now is retried as it was.
        let first = target(&config);
        let current = || async {
            match self.config(key).await {
                Ok(config) => Some(target(&config)),
                Err(Stop::Gone) => None,
                Err(_) => Some(first.clone()),
            }
        };
        let outcome = match self.sender.deliver(&first, &body, current).await {
            Ok(_) => "delivered",
            Err(error) => {
                tracing::warn!(%task_id, %config_id, %error, "push notification not delivered");
                "failed"
            }
        };
        self.metrics.push_notifications.with([outcome]).inc();
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
