//! The task store service: the repository plus what storage alone cannot do
//! — waiting for changes, waking waiters after commits, expiring leases,
//! relaying the outbox to the event bus.
//!
//! Every write goes through the repository (one transaction) and is then
//! announced on [`Wakeups`] so streams and blocking calls re-read at once.

mod claims;
mod handoff;
mod outbox;
mod push;
mod reaper;
mod recent;
mod settled;
mod streams;
mod turns;
mod waits;

use std::{sync::Arc, time::Duration};

use chorus_runtime::{
    metrics::Metrics,
    validate::FieldViolation,
    wakeup::{Waiter, Wakeups},
};
use tokio_util::sync::CancellationToken;

pub use self::{
    claims::ClaimStream,
    streams::{WatchFilter, WatchStart},
    waits::AwaitOutcome,
};
use crate::{
    config::TaskStoreConfig,
    domain::{
        Artifact, ArtifactChunk, Claimed, HandBack, InboxMessage, InboxRead, Message, NewTask, Notification, Owner,
        Renewal, StatusUpdate, Task, TaskPage, TaskQuery, TaskState, TurnFollower, new_task_id, now_micros,
    },
    error::{Result, TaskStoreError},
    repository::TaskRepository,
};

/// The most a notification's message may hold, as JSON.
const MAX_NOTIFICATION_BYTES: usize = 1024 * 1024;

/// The shortest lease a worker may ask for: a task handed out under a
/// shorter one could reach its worker expired.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(100);

/// The task store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TaskStore {
    repository: Arc<dyn TaskRepository>,
    wakeups: Wakeups,
    config: Arc<TaskStoreConfig>,
    shutdown: CancellationToken,
    /// The claim streams open here, which creates hand tasks to.
    streams: handoff::Streams,
    /// Tasks lately finished here, for the awaits that follow.
    settled: Arc<settled::Settled>,
    /// Tasks lately created here, each with a waiter on it made before its
    /// insert: while that waiter has had only the creation's own signal,
    /// nothing has changed the task, and an await need not read it.
    fresh: Arc<recent::Recent<Waiter>>,
    /// Where tasks created, finished, claimed and expired are counted.
    metrics: Metrics,
}

/// Wake-up keys: who waits for what.
pub(crate) mod keys {
    use crate::domain::Owner;

    pub(crate) fn task(namespace: &str, id: &str) -> String {
        format!("task/{namespace}/{id}")
    }

    pub(crate) fn claimable(namespace: &str, agent_id: &str) -> String {
        format!("claim/{namespace}/{agent_id}")
    }

    pub(crate) fn events(namespace: &str) -> String {
        format!("events/{namespace}")
    }

    pub(crate) fn inbox(namespace: &str, owner: &Owner) -> String {
        format!("inbox/{namespace}/{}/{}", owner.kind.as_str(), owner.id)
    }

    /// Every change in any namespace: what the outbox relay waits for.
    pub(crate) const OUTBOX: &str = "outbox";
}

impl TaskStore {
    /// `shutdown` ends every stream and wait the service has open.
    pub fn new(
        repository: Arc<dyn TaskRepository>,
        wakeups: Wakeups,
        config: TaskStoreConfig,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            repository,
            wakeups,
            config: Arc::new(config),
            shutdown,
            streams: handoff::Streams::default(),
            settled: Arc::default(),
            fresh: Arc::default(),
            metrics: Metrics::default(),
        }
    }

    /// Counts into `metrics` (the server's) instead of a set of its own.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Counts `task` as finished when this change made it so (no change
    /// leaves a final state, so none counts a task twice).
    fn count_if_finished(&self, task: &Task) {
        let state = task.status.state;
        if state.is_terminal() {
            self.metrics.tasks_finished.with([state.as_str()]).inc();
        }
    }

    /// Announces a committed change whose write returned the task whole.
    fn changed_whole(&self, task: &Task) {
        self.settled.keep(task);
        self.changed(task);
    }

    /// Announces a committed change to `task`.
    fn changed(&self, task: &Task) {
        let namespace = &task.namespace;
        self.wakeups.notify(&keys::task(namespace, &task.id));
        self.wakeups.notify(&keys::events(namespace));
        self.wakeups.notify(keys::OUTBOX);
        // Finished or back in the queue, a task's lease has ended: its
        // worker has room. Back in the queue, it waits for any worker.
        let state = task.status.state;
        if state == TaskState::Submitted || state.is_terminal() {
            let canceled = state == TaskState::Canceled;
            let room_to_fill = self.streams.released(namespace, &task.agent_id, &task.id, canceled);
            let queued = state == TaskState::Submitted;
            if queued {
                self.streams.missed(namespace, &task.agent_id);
            }
            if queued || room_to_fill {
                self.wakeups.notify(&keys::claimable(namespace, &task.agent_id));
            }
        }
        if let Some(owner) = &task.owner
            && (task.status.state.is_terminal() || task.status.state.is_interrupted())
        {
            self.wakeups.notify(&keys::inbox(namespace, owner));
        }
    }

    /// Creates a task; a worker of its agent waiting here with room gets it
    /// at once ([`handoff`]).
    ///
    /// The create runs to its end even when its caller goes away (a client
    /// that hangs up has its request dropped): a task committed under a
    /// hand-off's lease but never put on the worker's stream would sit
    /// claimed by a worker that never got it until the lease ran out.
    pub async fn create_task(&self, task: NewTask) -> Result<Task> {
        let store = self.clone();
        chorus_runtime::detach::to_completion(async move { store.create_now(task).await }).await
    }

    async fn create_now(&self, mut task: NewTask) -> Result<Task> {
        task.run_by_creator |= task.answer.is_some() || task.follower.is_some();
        let follow = task.follower.take().map(|follower| self.push_lease(follower.name, follower.lease));
        if task.answer.is_some() {
            // Settled from the start: no worker is offered it, and the
            // awaits that follow find it finished here.
            let task = self.repository.create_task(&new_task_id(), task, None, follow).await?.task;
            self.changed_whole(&task);
            self.metrics.tasks_created.get().inc();
            self.count_if_finished(&task);
            return Ok(task);
        }
        let offer =
            (!task.run_by_creator).then(|| self.streams.offer(&task.namespace, &task.agent_id, now_micros())).flatten();
        let trace_context = offer.as_ref().map(|_| task.trace_context.clone()).unwrap_or_default();
        let creating = self.creating(&task.namespace);
        let handoff = offer.as_ref().map(|offer| offer.handoff.clone());
        let created = self.repository.create_task(&creating.id, task, handoff, follow).await?;
        let task = created.task;
        self.changed(&task);
        self.metrics.tasks_created.get().inc();
        if let Some(waiter) = creating.waiter_for(&task) {
            self.fresh.keep(&task.namespace, &task.id, waiter);
        }
        if let Some(offer) = offer.filter(|_| created.handed_off) {
            let lease_id = offer.handoff.lease_id.clone();
            let claimed = Claimed {
                task: task.clone(),
                lease_id: lease_id.clone(),
                lease_expires_at: offer.handoff.lease_expires_at,
                trace_context,
            };
            tracing::debug!(task_id = %task.id, worker_id = %offer.handoff.worker_id, "task handed to a waiting worker");
            match offer.deliver(claimed) {
                None => self.metrics.task_claims.get().inc(),
                Some(undelivered) => self.release(&task.namespace, &task.agent_id, &undelivered).await,
            }
        }
        Ok(task)
    }

    pub async fn get_task(&self, namespace: &str, id: &str, history_length: Option<u32>) -> Result<Task> {
        self.repository.get_task(namespace, id, history_length).await
    }

    pub async fn list_tasks(&self, query: TaskQuery) -> Result<TaskPage> {
        self.repository.list_tasks(query).await
    }

    /// Appends a message; with a `lease_id`, only under the task's current lease.
    pub async fn add_message(
        &self,
        namespace: &str,
        task_id: &str,
        message: Message,
        lease_id: Option<&str>,
    ) -> Result<Task> {
        self.check_room(namespace, task_id, &message).await?;
        let task = self.repository.add_message(namespace, task_id, message, lease_id).await?;
        self.changed(&task);
        Ok(task)
    }

    /// Moves a task through the state machine; moved to CANCELED, it takes
    /// its unfinished subtree with it, as [`cancel_task`](Self::cancel_task) does.
    pub async fn update_status(&self, namespace: &str, task_id: &str, update: StatusUpdate) -> Result<Task> {
        let (store, namespace, task_id) = (self.clone(), namespace.to_owned(), task_id.to_owned());
        chorus_runtime::detach::to_completion(async move {
            let mut changed = store.repository.update_status(&namespace, &task_id, update).await?.into_iter();
            let task = changed.next().ok_or(TaskStoreError::TaskNotFound(task_id))?;
            store.changed_whole(&task);
            store.count_if_finished(&task);
            for below in changed {
                store.changed(&below);
                store.count_if_finished(&below);
            }
            Ok(task)
        })
        .await
    }

    pub async fn append_artifact(&self, namespace: &str, task_id: &str, chunk: ArtifactChunk) -> Result<Task> {
        self.check_room(namespace, task_id, &chunk.artifact).await?;
        let task = self.repository.append_artifact(namespace, task_id, chunk).await?;
        self.changed(&task);
        Ok(task)
    }

    /// Cancels a task and its unfinished subtree; returns the root as it now
    /// is and the ids of every task canceled.
    pub async fn cancel_task(&self, namespace: &str, id: &str, reason: Option<String>) -> Result<(Task, Vec<String>)> {
        let canceled = self.repository.cancel_task(namespace, id, reason).await?;
        if let Some(root) = canceled.first() {
            self.settled.keep(root);
        }
        for task in &canceled {
            self.changed(task);
            self.count_if_finished(task);
        }
        let ids = canceled.iter().map(|task| task.id.clone()).collect();
        let root = canceled.into_iter().next().ok_or_else(|| TaskStoreError::TaskNotFound(id.to_owned()))?;
        Ok((root, ids))
    }

    pub async fn renew_lease(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        lease: Option<Duration>,
    ) -> Result<Renewal> {
        // No length asked: as long as the lease was granted for.
        let lease = lease.filter(|lease| !lease.is_zero()).map(|lease| self.lease_length(Some(lease))).transpose()?;
        self.repository.renew_lease(namespace, task_id, lease_id, lease, self.config.default_lease()).await
    }

    /// Completes a task under its lease; a retry of a completion that landed
    /// answers the task as it ended, telling and counting nothing again.
    pub async fn complete_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        message: Option<Message>,
        artifacts: Vec<Artifact>,
    ) -> Result<Task> {
        let (store, names) = (self.clone(), [namespace, task_id, lease_id].map(str::to_owned));
        chorus_runtime::detach::to_completion(async move {
            let [namespace, task_id, lease_id] = &names;
            let completed = store.repository.complete_task(namespace, task_id, lease_id, message, artifacts).await?;
            if completed.now {
                store.changed_whole(&completed.task);
                store.count_if_finished(&completed.task);
            }
            Ok(completed.task)
        })
        .await
    }

    pub async fn fail_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        retry: Option<std::time::Duration>,
    ) -> Result<Task> {
        let (store, names) = (self.clone(), [namespace, task_id, lease_id, reason].map(str::to_owned));
        chorus_runtime::detach::to_completion(async move {
            let [namespace, task_id, lease_id, reason] = &names;
            let task = store.repository.fail_task(namespace, task_id, lease_id, reason, retry).await?;
            store.changed_whole(&task);
            store.count_if_finished(&task);
            Ok(task)
        })
        .await
    }

    /// Hands a working task back to the queue, its attempt not counted, to
    /// be claimed as `back` says.
    pub async fn release_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        back: HandBack,
    ) -> Result<Task> {
        let task = self.repository.release_task(namespace, task_id, lease_id, reason, back).await?;
        self.changed_whole(&task);
        Ok(task)
    }

    pub async fn notify_owner(&self, notification: Notification) -> Result<InboxMessage> {
        let bytes = serde_json::to_vec(&notification.message).map_or(0, |json| json.len());
        if bytes > MAX_NOTIFICATION_BYTES {
            let why = format!(
                "holds {bytes} bytes; a notification holds at most {MAX_NOTIFICATION_BYTES} (1 MiB), so that an \
                 owner's read fits a client's default 4 MiB: put larger content in an artifact of the task"
            );
            return Err(FieldViolation::new("message", why).into());
        }
        let (message, task) = self.repository.notify_owner(notification).await?;
        self.changed(&task);
        self.wakeups.notify(&keys::inbox(&task.namespace, &message.owner));
        Ok(message)
    }

    /// Answers a task waiting for input; `follower` follows its turn from
    /// the same write.
    pub async fn answer_question(
        &self,
        namespace: &str,
        task_id: &str,
        answer: Message,
        follower: Option<TurnFollower>,
    ) -> Result<Task> {
        self.check_room(namespace, task_id, &answer).await?;
        let follow = follower.map(|follower| self.push_lease(follower.name, follower.lease));
        let task = self.repository.answer_question(namespace, task_id, answer, follow).await?;
        self.changed(&task);
        Ok(task)
    }

    /// Refuses to add `content` (a message or an artifact) to a task that
    /// would then hold more than `taskstore.max_task_bytes` of them: every
    /// read of the task carries them. Appends at once may each pass the
    /// check, and the task go past the limit by what they add.
    async fn check_room(&self, namespace: &str, task_id: &str, content: &impl serde::Serialize) -> Result<()> {
        let limit = self.config.max_task_bytes;
        if limit == 0 {
            return Ok(());
        }
        let adding = serde_json::to_vec(content).map_or(0, |json| u64::try_from(json.len()).unwrap_or(u64::MAX));
        let held = self.repository.task_bytes(namespace, task_id).await?;
        if held + adding > limit {
            return Err(TaskStoreError::TaskTooLarge { task_id: task_id.to_owned(), held, adding, limit });
        }
        Ok(())
    }

    /// A worker's lease length: what it asked for, or the default when it
    /// asked for none (zero). A lease shorter than [`MIN_LEASE`] would run out
    /// before its task reached the worker, one longer than the configured
    /// maximum is not granted: both are refused, naming the bounds.
    fn lease_length(&self, asked: Option<Duration>) -> Result<Duration> {
        let Some(lease) = asked.filter(|lease| !lease.is_zero()) else {
            return Ok(self.config.default_lease());
        };
        let max = self.config.max_lease();
        if lease < MIN_LEASE || lease > max {
            let bounds = format!(
                "must be from {} ms to {} ms (taskstore.max_lease_ms), or unset for the default",
                MIN_LEASE.as_millis(),
                max.as_millis()
            );
            return Err(FieldViolation::new("lease", bounds).into());
        }
        Ok(lease)
    }

    /// Reads `owner`'s inbox, waiting up to `wait` for a first message.
    pub async fn read_inbox(
        &self,
        namespace: &str,
        owner: &Owner,
        max: u32,
        wait: Duration,
        read: InboxRead,
    ) -> Result<Vec<InboxMessage>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut waiter = self.wakeups.waiter(&keys::inbox(namespace, owner));
            let messages = self.repository.read_inbox(namespace, owner, max, read).await?;
            let now = tokio::time::Instant::now();
            if !messages.is_empty() || now >= deadline {
                return Ok(messages);
            }
            if self.shutdown.is_cancelled() {
                return Err(TaskStoreError::ShuttingDown);
            }
            waiter.wait(self.config.poll_interval().min(deadline - now)).await;
        }
    }

    /// Marks the owner's messages `ids` read (those a read holds until they
    /// are acknowledged); how many were unread.
    pub async fn ack_inbox(&self, namespace: &str, owner: &Owner, ids: &[i64]) -> Result<u64> {
        self.repository.ack_inbox(namespace, owner, ids).await
    }
}
