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
//! delivered (or given up on), whether the config finished, and which
//! gateway follows it, under a lease: the one that created it, until the
//! lease runs out unrenewed. Every third of a lease a gateway renews the
//! leases it holds, stops following the configs it learns it lost, and
//! claims the configs no gateway holds (their gateway died, or handed them
//! back), following each after its cursor. A gateway hands its leases back
//! when it stops, and when it starts (those of its previous run, which it
//! then claims like any other). A follower whose config was taken is refused
//! its next save and stops; a gateway that stops between delivering a change
//! and saving its cursor has that change sent again by the next follower.

mod leases;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
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

/// (namespace, task id, config id).
type ConfigKey = (String, String, String);

/// Tells the followers of one config apart, as one may start after another
/// was told to stop and before it did.
static FOLLOWERS: AtomicU64 = AtomicU64::new(0);

/// A config's follower, as the dispatcher knows it.
#[derive(Debug)]
struct Follower {
    id: u64,
    /// Stops it: its config was taken by another gateway.
    stop: CancellationToken,
}

#[derive(Debug, Clone)]
pub(crate) struct PushDispatcher {
    tasks: TaskStoreClient<Transport>,
    sender: Arc<PushSender>,
    policy: PushPolicy,
    /// This gateway's name in the leases of the configs it follows.
    follower: String,
    /// The configs being followed.
    following: Arc<Mutex<HashMap<ConfigKey, Follower>>>,
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
    /// Another gateway follows the config now.
    Lost,
}

impl PushDispatcher {
    pub(crate) fn new(
        tasks: TaskStoreClient<Transport>,
        policy: &PushPolicy,
        shutdown: CancellationToken,
        metrics: Metrics,
    ) -> std::result::Result<Self, String> {
        if policy.lease_ms == 0 {
            return Err("gateway.push.lease_ms must be at least 1".to_owned());
        }
        let sender = PushSender::new(policy.clone()).map_err(|error| error.to_string())?;
        let follower = policy.follower_id.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "chorus".into());
            format!("{host}-{}-{}", std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8])
        });
        Ok(Self {
            tasks,
            sender: Arc::new(sender),
            policy: policy.clone(),
            follower,
            following: Arc::default(),
            shutdown,
            metrics,
        })
    }

    /// The server's metrics, which deliveries are counted into.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// This gateway's name in the leases of the configs it follows.
    pub(crate) fn follower(&self) -> &str {
        &self.follower
    }

    /// How long a lease lasts unrenewed.
    pub(crate) fn lease_ms(&self) -> u64 {
        self.policy.lease_ms
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

    /// Delivers `changes` to the stored config `config_id` of the task, in
    /// the background, unless that config is followed already.
    pub(crate) fn start(&self, namespace: &str, task_id: &str, config_id: &str, changes: Changes) {
        let key = (namespace.to_owned(), task_id.to_owned(), config_id.to_owned());
        self.spawn(key, changes.after, Some(changes.events));
    }

    /// Follows the config from `cursor` on `events`, or on a watch opened
    /// after it, unless the config is followed already.
    fn spawn(&self, key: ConfigKey, cursor: String, events: Option<tonic::Streaming<pb::TaskEvent>>) {
        let id = FOLLOWERS.fetch_add(1, Ordering::Relaxed);
        // A child of shutdown: it stops with the gateway too.
        let stop = self.shutdown.child_token();
        {
            let mut following = self.following.lock().expect("push followers lock");
            if following.contains_key(&key) {
                return;
            }
            following.insert(key.clone(), Follower { id, stop: stop.clone() });
        }
        let dispatcher = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = dispatcher.follow(&key, cursor, events) => {}
                () = stop.cancelled() => {}
            }
            let mut following = dispatcher.following.lock().expect("push followers lock");
            if following.get(&key).is_some_and(|follower| follower.id == id) {
                following.remove(&key);
            }
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
                    Stop::Finished => {
                        self.save(key, &cursor, true).await;
                        return;
                    }
                    Stop::Gone | Stop::Lost => return,
                    // Closed with nothing left after the cursor: the task is over.
                    Stop::Closed if !progressed && self.task_over(key).await => {
                        self.save(key, &cursor, true).await;
                        return;
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

    /// Saves, for the next follower, that the config was delivered the
    /// changes through `cursor` and, when `finished`, that it gets no more.
    /// Not saved, a change is only sent again by the next follower.
    /// [`Stop::Lost`] when this gateway no longer holds the config.
    async fn save(&self, (namespace, task_id, id): &ConfigKey, cursor: &str, finished: bool) -> Option<Stop> {
        let request = pb::AdvancePushConfigRequest {
            namespace: namespace.clone(),
            task_id: task_id.clone(),
            id: id.clone(),
            cursor: cursor.to_owned(),
            finished,
            follower: self.follower.clone(),
        };
        match self.tasks.clone().advance_push_config(request).await {
            Ok(_) => None,
            // Deleted meanwhile: there is nothing left to resume.
            Err(status) if status.code() == tonic::Code::NotFound => None,
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                tracing::info!(%task_id, config_id = %id, "push config followed by another gateway now");
                Some(Stop::Lost)
            }
            Err(status) => {
                tracing::warn!(%task_id, config_id = %id, error = %status.message(), "cannot save how far the push config was delivered");
                None
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
            let last = convert::ends_task(&event);
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
            if update.is_some()
                && let Some(stop) = self.save(key, cursor, false).await
            {
                return stop;
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

pub(crate) fn target(config: &pb::PushConfig) -> PushTarget {
    PushTarget {
        url: config.url.clone(),
        token: (!config.token.is_empty()).then(|| config.token.clone()),
        authentication: (!config.auth_scheme.is_empty()).then(|| {
            (config.auth_scheme.clone(), (!config.auth_credentials.is_empty()).then(|| config.auth_credentials.clone()))
        }),
    }
}
