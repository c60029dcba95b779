//! [`TaskRepository`] for [`SqlTaskRepository`]: each method is one of the
//! transactions in the sibling modules.

use std::time::Duration;

use async_trait::async_trait;

use super::{SqlTaskRepository, endings::Ending};
use crate::{
    domain::{
        Artifact, ArtifactChunk, ClaimRequest, Claimed, Completed, Created, Cursor, EventBatch, EventQuery, Expiry,
        HandBack, Handoff, InboxMessage, InboxRead, Limits, Message, NewSubtask, NewTask, Notification, Owner,
        PendingPush, PurgeCursor, Purged, PushConfig, PushConfigKey, PushLease, Renewal, StatusUpdate, Task,
        TaskCursor, TaskEvent, TaskKey, TaskPage, TaskQuery, WorkerLeases,
    },
    error::Result,
    repository::TaskRepository,
};

#[async_trait]
impl TaskRepository for SqlTaskRepository {
    async fn create_task(
        &self,
        id: &str,
        task: NewTask,
        handoff: Option<Handoff>,
        follow: Option<PushLease>,
    ) -> Result<Created> {
        self.create(id, task, handoff, follow).await
    }

    async fn get_task(&self, namespace: &str, id: &str, history_length: Option<u32>) -> Result<Task> {
        self.get(namespace, id, history_length).await
    }

    async fn list_tasks(&self, query: TaskQuery) -> Result<TaskPage> {
        self.list(query).await
    }

    async fn add_message(
        &self,
        namespace: &str,
        task_id: &str,
        message: Message,
        lease_id: Option<&str>,
    ) -> Result<Task> {
        self.add_message_to(namespace, task_id, message, lease_id).await
    }

    async fn update_status(&self, namespace: &str, task_id: &str, update: StatusUpdate) -> Result<Vec<Task>> {
        self.update(namespace, task_id, update).await
    }

    async fn append_artifact(&self, namespace: &str, task_id: &str, chunk: ArtifactChunk) -> Result<Task> {
        self.write_artifact(namespace, task_id, chunk).await
    }

    async fn cancel_task(&self, namespace: &str, id: &str, reason: Option<String>) -> Result<Vec<Task>> {
        self.cancel(namespace, id, reason).await
    }

    async fn worker_leases(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<WorkerLeases> {
        self.leases(namespace, worker_id, agent_id).await
    }

    async fn claim_tasks(&self, request: &ClaimRequest, slots: u32) -> Result<Vec<Claimed>> {
        self.claim(request, slots).await
    }

    async fn renew_lease(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        lease: Option<Duration>,
        fallback: Duration,
    ) -> Result<Renewal> {
        self.renew(namespace, task_id, lease_id, lease, fallback).await
    }

    async fn release_claim(&self, namespace: &str, task_id: &str, lease_id: &str) -> Result<bool> {
        self.release(namespace, task_id, lease_id).await
    }

    async fn complete_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        message: Option<Message>,
        artifacts: Vec<Artifact>,
    ) -> Result<Completed> {
        self.complete(namespace, task_id, lease_id, message, artifacts).await
    }

    async fn release_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        back: HandBack,
    ) -> Result<Task> {
        self.end_held(namespace, task_id, lease_id, Ending::HandedBack { reason, back }).await
    }

    async fn fail_task(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        retry: Option<Duration>,
    ) -> Result<Task> {
        self.end_held(namespace, task_id, lease_id, Ending::Failed { reason, retry }).await
    }

    async fn expire_leases(&self, now: i64, started: i64, limit: u32) -> Result<Vec<Expiry>> {
        self.expire(now, started, limit).await
    }

    async fn end_previous_run(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<Vec<Expiry>> {
        self.end_run(namespace, worker_id, agent_id).await
    }

    async fn purge_finished(&self, finished_before: i64, after: Option<&PurgeCursor>, limit: u32) -> Result<Purged> {
        self.purge(finished_before, after, limit).await
    }

    async fn queue_depth(&self) -> Result<(u64, Option<i64>)> {
        self.queued().await
    }

    async fn first_statistics(&self, min_tasks: i64) -> Result<bool> {
        const TABLES: [&str; 4] = ["taskstore_tasks", "taskstore_history", "taskstore_artifacts", "taskstore_events"];
        Ok(self.db.analyze_once_filled("taskstore_tasks", &TABLES, min_tasks).await?)
    }

    async fn spawn_subtask(
        &self,
        id: &str,
        subtask: NewSubtask,
        limits: &Limits,
        awaited_until: Option<i64>,
    ) -> Result<Task> {
        self.spawn(id, subtask, limits, awaited_until).await
    }

    async fn end_blocking_wait(&self, namespace: &str, child_id: &str, taken: bool) -> Result<()> {
        self.end_wait(namespace, child_id, taken).await
    }

    async fn children(&self, namespace: &str, parent_id: &str, task_ids: &[String]) -> Result<Vec<Task>> {
        self.children_of(namespace, parent_id, task_ids).await
    }

    async fn take_completions(&self, namespace: &str, task_ids: &[String]) -> Result<Vec<String>> {
        self.take(namespace, task_ids).await
    }

    async fn notify_owner(&self, notification: Notification) -> Result<(InboxMessage, Task)> {
        self.notify(notification).await
    }

    async fn task_bytes(&self, namespace: &str, task_id: &str) -> Result<u64> {
        self.bytes_of(namespace, task_id).await
    }

    async fn answer_question(
        &self,
        namespace: &str,
        task_id: &str,
        answer: Message,
        follow: Option<PushLease>,
    ) -> Result<Task> {
        self.answer(namespace, task_id, answer, follow).await
    }

    async fn read_inbox(&self, namespace: &str, owner: &Owner, max: u32, read: InboxRead) -> Result<Vec<InboxMessage>> {
        self.read_inbox_of(namespace, owner, max, read).await
    }

    async fn ack_inbox(&self, namespace: &str, owner: &Owner, ids: &[i64]) -> Result<u64> {
        self.ack(namespace, owner, ids).await
    }

    async fn read_events(&self, query: &EventQuery) -> Result<EventBatch> {
        self.events(query).await
    }

    async fn snapshot_task(&self, namespace: &str, task_id: &str) -> Result<Option<(Task, Option<TaskCursor>)>> {
        self.snapshot(namespace, task_id).await
    }

    async fn latest_event(&self, namespace: &str, task_id: Option<&str>) -> Result<Option<TaskEvent>> {
        self.latest(namespace, task_id).await
    }

    async fn align_log_clock(&self) -> Result<Option<i64>> {
        self.align_clock().await
    }

    async fn read_outbox(&self, after: Cursor, limit: u32) -> Result<EventBatch> {
        self.outbox(after, limit).await
    }

    async fn acquire_outbox_lease(
        &self,
        relay: &str,
        owner: &str,
        now: i64,
        lease: Duration,
    ) -> Result<Option<Cursor>> {
        self.acquire_outbox(relay, owner, now, lease).await
    }

    async fn save_outbox_cursor(
        &self,
        relay: &str,
        owner: &str,
        cursor: Cursor,
        now: i64,
        lease: Duration,
    ) -> Result<()> {
        self.save_outbox(relay, owner, cursor, now, lease).await
    }

    async fn create_push_config(
        &self,
        namespace: &str,
        config: PushConfig,
        after: Option<Cursor>,
        lease: Option<&PushLease>,
        limit: u32,
    ) -> Result<PushConfig> {
        self.create_push(namespace, config, after, lease, limit).await
    }

    async fn get_push_config(&self, namespace: &str, task_id: &str, id: &str) -> Result<PushConfig> {
        self.get_push(namespace, task_id, id).await
    }

    async fn list_push_configs(&self, namespace: &str, task_id: &str) -> Result<Vec<PushConfig>> {
        self.list_push(namespace, task_id).await
    }

    async fn delete_push_config(&self, namespace: &str, task_id: &str, id: &str) -> Result<()> {
        self.delete_push(namespace, task_id, id).await
    }

    async fn advance_push_config(
        &self,
        key: &PushConfigKey,
        delivered: Option<Cursor>,
        finished: bool,
        follower: Option<&str>,
    ) -> Result<()> {
        self.advance_push(key, delivered, finished, follower).await
    }

    async fn claim_push_configs(&self, lease: &PushLease, now: i64, limit: u32) -> Result<Vec<PendingPush>> {
        self.claim_push(lease, now, limit).await
    }

    async fn renew_push_configs(&self, lease: &PushLease, following: &[PushConfigKey]) -> Result<Vec<PushConfigKey>> {
        self.renew_push(lease, following).await
    }

    async fn release_push_configs(&self, follower: &str, now: i64) -> Result<u64> {
        self.release_push(follower, now).await
    }

    async fn follow_task(&self, namespace: &str, task_id: &str, lease: Option<&PushLease>) -> Result<()> {
        self.follow(namespace, task_id, lease).await
    }

    async fn renew_turns(&self, lease: &PushLease, following: &[TaskKey]) -> Result<Vec<TaskKey>> {
        self.renew_followed(lease, following).await
    }

    async fn claim_turns(&self, lease: &PushLease, now: i64, limit: u32) -> Result<Vec<TaskKey>> {
        self.claim_followed(lease, now, limit).await
    }

    async fn release_turns(&self, follower: &str, now: i64) -> Result<u64> {
        self.release_followed(follower, now).await
    }
}
