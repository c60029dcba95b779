//! The task store's storage contract. One SQL implementation serves both
//! PostgreSQL and SQLite ([`sql::SqlTaskRepository`]); the conformance suite
//! in `tests/conformance` runs against both.
//!
//! Every method is one transaction: it either commits everything it says or
//! changes nothing.

pub mod sql;

use std::time::Duration;

use async_trait::async_trait;

use crate::{
    domain::{
        ArtifactChunk, ClaimRequest, Claimed, Completed, Created, Cursor, EventBatch, EventQuery, Expiry, HandBack,
        Handoff, InboxMessage, InboxRead, Limits, Message, NewSubtask, NewTask, Notification, Owner, PendingPush,
        PurgeCursor, Purged, PushConfig, PushConfigKey, PushLease, Renewal, StatusUpdate, Task, TaskCursor, TaskEvent,
        TaskKey, TaskPage, TaskQuery, WorkerLeases,
    },
    error::Result,
};

#[async_trait]
pub trait TaskRepository: Send + Sync + std::fmt::Debug + 'static {
    /// Creates task `id` in `submitted`, or, with a `handoff`, already
    /// claimed under its lease (`working`, both events recorded). A retry
    /// (the same request under the same key: the first message id, or the
    /// idempotency key) returns the task of the first; another request under
    /// the key is `RequestKeyInUse` and changes nothing. With `follow`, the
    /// task is followed under that lease from the insert (see
    /// [`follow_task`](Self::follow_task)); a retry has it follow the task it
    /// returns, unless that one finished.
    async fn create_task(
        &self,
        id: &str,
        task: NewTask,
        handoff: Option<Handoff>,
        follow: Option<PushLease>,
    ) -> Result<Created>;

    /// `history_length`: `None` the whole history, `Some(n)` the last n messages.
    async fn get_task(&self, namespace: &str, id: &str, history_length: Option<u32>) -> Result<Task>;

    async fn list_tasks(&self, query: TaskQuery) -> Result<TaskPage>;

    /// Appends to the history; a user message resumes an interrupted task.
    /// With a `lease_id` (a worker writing), only under the task's current
    /// lease.
    async fn add_message(
        &self,
        namespace: &str,
        task_id: &str,
        message: Message,
        lease_id: Option<&str>,
    ) -> Result<Task>;

    /// Returns the task whole (full history, artifacts), as do
    /// `complete_task` and `fail_task`: the service keeps finished ones for
    /// the awaits that follow. A task moved to CANCELED takes its unfinished
    /// subtree with it, as `cancel_task` does: those follow it, without history.
    async fn update_status(&self, namespace: &str, task_id: &str, update: StatusUpdate) -> Result<Vec<Task>>;

    async fn append_artifact(&self, namespace: &str, task_id: &str, chunk: ArtifactChunk) -> Result<Task>;

    /// The bytes a task's messages and artifacts take as stored (0 for a
    /// task that does not exist).
    async fn task_bytes(&self, namespace: &str, task_id: &str) -> Result<u64>;

    /// Cancels the task and every unfinished task below it; returns the
    /// canceled tasks, root first and whole (the others without history).
    async fn cancel_task(&self, namespace: &str, id: &str, reason: Option<String>) -> Result<Vec<Task>>;

    /// The worker's leased tasks of `agent_id`, and whether that agent has
    /// one to claim.
    async fn worker_leases(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<WorkerLeases>;

    /// Leases up to `slots` of the agent's claimable tasks to the worker,
    /// oldest first.
    async fn claim_tasks(&self, request: &ClaimRequest, slots: u32) -> Result<Vec<Claimed>>;

    /// Extends the lease by `lease`, or, when `None`, by the length it was
    /// granted for (the last length a claim or renewal gave it; `fallback`
    /// when it has none).
    async fn renew_lease(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        lease: Option<Duration>,
        fallback: Duration,
    ) -> Result<Renewal>;

    /// Undoes the claim of a task that never reached its worker (its stream
    /// closed as it was claimed): task `task_id`, still working under lease
    /// `lease_id`, becomes claimable again, as if never claimed (the other
    /// tasks of the claim, which the worker may have, stay its). Whether it
    /// was released.
    async fn release_claim(&self, namespace: &str, task_id: &str, lease_id: &str) -> Result<bool>;

    /// Completes the task under its lease. A user's final message, or an
    /// artifact id given twice, is an invalid argument and changes nothing.
    /// A task this lease completed already with the same final message (none,
    /// or one of the same id) is returned as it is, so a worker retrying a
    /// completion whose answer it lost learns it landed.
    async fn complete_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        message: Option<Message>,
        artifacts: Vec<crate::domain::Artifact>,
    ) -> Result<Completed>;

    /// Fails the task, or, with a `retry` and while its agent's retries
    /// last, requeues it to be claimed no sooner than that pause from now
    /// (zero: at once).
    async fn fail_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        retry: Option<Duration>,
    ) -> Result<Task>;

    /// Puts a working task back in the queue without counting its attempt,
    /// with `reason` in its history, to be claimed as `back` says; the lease
    /// ends.
    async fn release_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        back: HandBack,
    ) -> Result<Task>;

    /// Ends or requeues up to `limit` tasks whose lease ran out before `now`,
    /// but none within a lease length of `started`: a lease that ran out
    /// while no reaper of this task store ran, or soon after (it was live
    /// while no task store its worker could renew with ran), gets that long
    /// from `started` to be renewed.
    async fn expire_leases(&self, now: i64, started: i64, limit: u32) -> Result<Vec<Expiry>>;

    /// Ends or requeues, as if their leases had run out, the tasks of
    /// `agent_id` leased to `worker_id`: its previous run's, gone.
    async fn end_previous_run(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<Vec<Expiry>>;

    /// Deletes the task trees whose every task finished at or before
    /// `finished_before` (µs) and whose events every outbox relay has
    /// published, with all that belongs to them: history, artifacts, events,
    /// inbox rows about them, push configs. Examines up to `limit` finished
    /// roots after `after`, in the order they finished; a tree goes whole or
    /// not at all, so no task ever points at a parent that is gone.
    async fn purge_finished(&self, finished_before: i64, after: Option<&PurgeCursor>, limit: u32) -> Result<Purged>;

    /// The tasks waiting for a worker (`submitted`), every namespace: how
    /// many, and when the oldest of them was created.
    async fn queue_depth(&self) -> Result<(u64, Option<i64>)>;

    /// Gives the task tables their first statistics once they hold
    /// `min_tasks` tasks, if the database has none yet; whether it has now.
    async fn first_statistics(&self, min_tasks: i64) -> Result<bool>;

    /// Creates child task `id` after the safety limits, under the parent's
    /// current lease when the spawn names one. A retry (the same
    /// request under the same first message id) returns the child of the
    /// first; another request under the id is `RequestKeyInUse` and changes
    /// nothing.
    /// A blocking spawn keeps the child's completion out of the inbox and of
    /// unnamed awaits until `awaited_until` (µs), or until
    /// [`end_blocking_wait`](Self::end_blocking_wait).
    async fn spawn_subtask(
        &self,
        id: &str,
        subtask: NewSubtask,
        limits: &Limits,
        awaited_until: Option<i64>,
    ) -> Result<Task>;

    /// Ends a blocking spawn's wait on a child: its completion is consumed
    /// when `taken` (the spawn answers with it), else left to the inbox.
    async fn end_blocking_wait(&self, namespace: &str, child_id: &str, taken: bool) -> Result<()>;

    /// The parent's children that are still of interest: `task_ids` when
    /// given, else every child whose completion has not been delivered.
    async fn children(&self, namespace: &str, parent_id: &str, task_ids: &[String]) -> Result<Vec<Task>>;

    /// Marks the completion messages of these finished children as read,
    /// but those a blocking spawn keeps or a reader holds; returns the ids
    /// whose completion this call consumed.
    async fn take_completions(&self, namespace: &str, task_ids: &[String]) -> Result<Vec<String>>;

    async fn notify_owner(&self, notification: Notification) -> Result<(InboxMessage, Task)>;

    /// Answers a task waiting for input; with `follow`, the task is
    /// followed under that lease from the same write.
    async fn answer_question(
        &self,
        namespace: &str,
        task_id: &str,
        answer: Message,
        follow: Option<PushLease>,
    ) -> Result<Task>;

    /// Up to `max` unread messages no other read holds, oldest first, as
    /// many as fit in [`INBOX_READ_BYTES`](crate::domain::INBOX_READ_BYTES)
    /// (at least one), peeked, consumed or held as `read` says.
    async fn read_inbox(&self, namespace: &str, owner: &Owner, max: u32, read: InboxRead) -> Result<Vec<InboxMessage>>;

    /// Marks the owner's messages `ids` read; how many were unread.
    async fn ack_inbox(&self, namespace: &str, owner: &Owner, ids: &[i64]) -> Result<u64>;

    /// Events after a cursor, in commit order.
    async fn read_events(&self, query: &EventQuery) -> Result<EventBatch>;

    /// A task whole with a cursor after exactly the changes it includes,
    /// both read at one instant: a watch from that cursor gets exactly the
    /// changes that follow the task as read. `None` while no such cursor can
    /// be told yet (too many changes it includes may still be preceded by
    /// one an older transaction commits); try again shortly.
    async fn snapshot_task(&self, namespace: &str, task_id: &str) -> Result<Option<(Task, Option<TaskCursor>)>>;

    /// The newest event a reader can see now, of one task or of the namespace.
    async fn latest_event(&self, namespace: &str, task_id: Option<&str>) -> Result<Option<TaskEvent>>;

    /// Makes the log's order hold on the database server it is on now, once
    /// at start-up: on a log restored from a server whose transaction ids ran
    /// ahead of this one's, new events are numbered after the restored ones
    /// from then on. The offset it took, when it had to.
    async fn align_log_clock(&self) -> Result<Option<i64>>;

    /// Up to `limit` events of every namespace after a cursor, in commit
    /// order: what the outbox relay publishes.
    async fn read_outbox(&self, after: Cursor, limit: u32) -> Result<EventBatch>;

    /// Leases outbox relay `relay` to `owner` until `now` + `lease` (times in
    /// µs) when it is free, its lease ran out, or `owner` already holds it;
    /// creates the relay, at the start of the log, on first use. Returns the
    /// relay's saved cursor, or `None` while another owner's lease runs.
    async fn acquire_outbox_lease(&self, relay: &str, owner: &str, now: i64, lease: Duration)
    -> Result<Option<Cursor>>;

    /// Saves the relay's cursor and renews its lease until `now` + `lease`;
    /// [`OutboxLeaseLost`] unless `owner` holds the lease at `now`.
    ///
    /// [`OutboxLeaseLost`]: crate::error::TaskStoreError::OutboxLeaseLost
    async fn save_outbox_cursor(
        &self,
        relay: &str,
        owner: &str,
        cursor: Cursor,
        now: i64,
        lease: Duration,
    ) -> Result<()>;

    /// Stores the config, which gets the task's changes after `after`
    /// (`None`: from the task's first), followed under `lease` (`None`: by
    /// no one, claimable at once). Replacing a config (same id) keeps how far
    /// the one replaced was delivered, and takes its lease; a finished one
    /// stays finished and keeps no token or credentials. A new config of a
    /// task that has `limit` already is [`TaskStoreError::TooManyPushConfigs`].
    /// Returns the config as stored.
    async fn create_push_config(
        &self,
        namespace: &str,
        config: PushConfig,
        after: Option<Cursor>,
        lease: Option<&PushLease>,
        limit: u32,
    ) -> Result<PushConfig>;
    async fn get_push_config(&self, namespace: &str, task_id: &str, id: &str) -> Result<PushConfig>;
    async fn list_push_configs(&self, namespace: &str, task_id: &str) -> Result<Vec<PushConfig>>;
    async fn delete_push_config(&self, namespace: &str, task_id: &str, id: &str) -> Result<()>;

    /// Records that the config was delivered the changes through `delivered`
    /// (a cursor at or before the saved one changes nothing) and, when
    /// `finished`, that it gets no more: its token and credentials are
    /// cleared then. With a `follower`,
    /// [`PushConfigNotHeld`] unless that follower holds the config.
    ///
    /// [`PushConfigNotHeld`]: crate::error::TaskStoreError::PushConfigNotHeld
    async fn advance_push_config(
        &self,
        key: &PushConfigKey,
        delivered: Option<Cursor>,
        finished: bool,
        follower: Option<&str>,
    ) -> Result<()>;

    /// Takes up to `limit` unfinished configs, of every namespace, that no
    /// follower holds at `now` (none named, or its lease ended), under
    /// `lease`; skips those another claim is taking.
    async fn claim_push_configs(&self, lease: &PushLease, now: i64, limit: u32) -> Result<Vec<PendingPush>>;

    /// Extends to `lease.until` the leases `lease.follower` holds on the
    /// unfinished configs of `following`, in one statement; those it holds.
    /// A config it holds but no longer follows (its previous run's, handed
    /// back as it started) keeps its lease, which runs out.
    async fn renew_push_configs(&self, lease: &PushLease, following: &[PushConfigKey]) -> Result<Vec<PushConfigKey>>;

    /// Ends at `now` the leases `follower` holds on unfinished configs, so
    /// that any follower claims them at once; how many.
    async fn release_push_configs(&self, follower: &str, now: i64) -> Result<u64>;

    /// Has `lease.follower` follow the task's turns until `lease.until`, or
    /// no one (`None`). NotFound when there is no such task.
    async fn follow_task(&self, namespace: &str, task_id: &str, lease: Option<&PushLease>) -> Result<()>;

    /// Extends to `lease.until` the follower's leases on the unfinished
    /// tasks of `following`, and lets go of those finished; returns those it
    /// still holds.
    async fn renew_turns(&self, lease: &PushLease, following: &[TaskKey]) -> Result<Vec<TaskKey>>;

    /// Hands the follower, until `lease.until`, up to `limit` unfinished
    /// tasks whose follower's lease ended by `now`.
    async fn claim_turns(&self, lease: &PushLease, now: i64, limit: u32) -> Result<Vec<TaskKey>>;

    /// Ends at `now` the leases `follower` holds on tasks.
    async fn release_turns(&self, follower: &str, now: i64) -> Result<u64>;
}
