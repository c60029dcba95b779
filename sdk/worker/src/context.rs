//! What a handler gets: the claimed task and the actions its lease allows.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use chorus_proto::taskstore::{
    AppendArtifactRequest, Artifact, AwaitSubtasksRequest, AwaitSubtasksResponse, InboxMessage, Message,
    NotifyOwnerRequest, SpawnSubtaskRequest, SpawnSubtaskResponse, Task, TaskState, UpdateStatusRequest, inbox_message,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{
    Client, WorkerError,
    reply::{agent_message, text_part, user_message, user_text},
};

/// One claimed task, handed to the handler.
///
/// Cheap to clone. Every call it makes uses the task's lease and runs inside
/// the task's `handle_task` span, so the trace continues into the task store.
#[derive(Debug, Clone)]
pub struct TaskContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    task: Task,
    lease_id: String,
    namespace: String,
    client: Client,
    cancel: CancellationToken,
    /// The worker's shutdown.
    shutdown: CancellationToken,
    span: tracing::Span,
    /// How many subtasks of each (agent, text) this run of the handler
    /// spawned: what a spawn's message id counts.
    spawned: Mutex<HashMap<u64, u32>>,
}

impl TaskContext {
    pub(crate) fn new(
        task: Task,
        lease_id: String,
        namespace: String,
        client: Client,
        [cancel, shutdown]: [CancellationToken; 2],
        span: tracing::Span,
    ) -> Self {
        let inner = Inner { task, lease_id, namespace, client, cancel, shutdown, span, spawned: Mutex::default() };
        Self { inner: Arc::new(inner) }
    }

    /// The task's id.
    pub fn id(&self) -> &str {
        &self.inner.task.id
    }

    /// The task's context (conversation) id.
    pub fn context_id(&self) -> &str {
        &self.inner.task.context_id
    }

    /// The namespace the task lives in.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The lease under which this worker holds the task.
    pub fn lease_id(&self) -> &str {
        &self.inner.lease_id
    }

    /// The task as it was when claimed.
    pub fn task(&self) -> &Task {
        &self.inner.task
    }

    /// The text parts of the most recent user message, joined by newlines.
    pub fn text(&self) -> String {
        user_text(&self.inner.task)
    }

    /// The task-store client, for calls the context has no shortcut for.
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Reports progress: the task is `WORKING` with `text` as its status
    /// message. Like every write of the context, it answers with the task
    /// brief (its status and metadata, without history and artifacts), at a
    /// cost that does not grow with the task.
    pub async fn status(&self, text: impl Into<String>) -> Result<Task, WorkerError> {
        self.update_status(TaskState::Working, agent_message(&self.inner.task, vec![text_part(text)])).await
    }

    /// Moves the task to `state` (`WORKING`, or `INPUT_REQUIRED` to ask its
    /// user a question) with `message`, the agent's, as its status message.
    pub async fn update_status(&self, state: TaskState, message: Message) -> Result<Task, WorkerError> {
        let request = UpdateStatusRequest {
            namespace: self.inner.namespace.clone(),
            task_id: self.id().to_owned(),
            state: state.into(),
            message: Some(message),
            lease_id: self.inner.lease_id.clone(),
            brief: true,
        };
        let mut client = self.client();
        let task = client.update_status(request).instrument(self.inner.span.clone()).await?;
        Ok(task.into_inner())
    }

    /// Adds a whole artifact to the task.
    pub async fn artifact(&self, artifact: Artifact) -> Result<Task, WorkerError> {
        self.artifact_chunk(artifact, false, true).await
    }

    /// Streams an artifact in chunks: the first chunk with `append = false`,
    /// the next ones (same `artifact_id`) with `append = true`, the final one
    /// with `last_chunk = true`.
    pub async fn artifact_chunk(
        &self,
        artifact: Artifact,
        append: bool,
        last_chunk: bool,
    ) -> Result<Task, WorkerError> {
        let request = AppendArtifactRequest {
            namespace: self.inner.namespace.clone(),
            task_id: self.id().to_owned(),
            artifact: Some(artifact),
            append,
            last_chunk,
            lease_id: self.inner.lease_id.clone(),
            brief: true,
        };
        let mut client = self.client();
        let task = client.append_artifact(request).instrument(self.inner.span.clone()).await?;
        Ok(task.into_inner())
    }

    /// Delegates `text` to `agent_id` as a subtask of this task (owned by it),
    /// under the task's lease: once the lease is lost, the spawn is refused.
    /// Blocking: returns when the child has finished or the server's spawn
    /// timeout passed (`timed_out`); otherwise returns the child at once.
    ///
    /// A handler run again (a retry, a task handed back, a worker restarted)
    /// gets the children its earlier runs spawned rather than new ones: the
    /// n-th spawn of one (agent, text) in a run of the handler carries the
    /// same message id each time, on which the task store makes spawns
    /// idempotent. A blocking one answers with the child as it is (finished
    /// already, or awaited again). Another text is another child.
    pub async fn spawn(
        &self,
        agent_id: &str,
        text: impl Into<String>,
        blocking: bool,
    ) -> Result<SpawnSubtaskResponse, WorkerError> {
        let text = text.into();
        let mut message = user_message(vec![text_part(text.as_str())]);
        message.message_id = self.spawn_id(agent_id, &text);
        let request = SpawnSubtaskRequest {
            namespace: self.inner.namespace.clone(),
            parent_task_id: self.id().to_owned(),
            agent_id: agent_id.to_owned(),
            message: Some(message),
            blocking,
            lease_id: self.inner.lease_id.clone(),
            ..SpawnSubtaskRequest::default()
        };
        let mut client = self.client();
        let response = client.spawn_subtask(request).instrument(self.inner.span.clone()).await?;
        Ok(response.into_inner())
    }

    /// Waits for this task's children to finish: those named (any, when
    /// `task_ids` is empty: each unread completion once), all of them, or
    /// with `any` the first, for at most `timeout` (`timed_out` then says
    /// so). Finished children come back whole, their output in their
    /// artifacts and final status message.
    pub async fn await_subtasks(
        &self,
        task_ids: &[String],
        any: bool,
        timeout: std::time::Duration,
    ) -> Result<AwaitSubtasksResponse, WorkerError> {
        let request = AwaitSubtasksRequest {
            namespace: self.inner.namespace.clone(),
            parent_task_id: self.id().to_owned(),
            task_ids: task_ids.to_vec(),
            any,
            timeout: crate::task::prost_duration(timeout),
        };
        let mut client = self.client();
        let answer = client.await_subtasks(request).instrument(self.inner.span.clone()).await?;
        Ok(answer.into_inner())
    }

    /// The message id of this run's next spawn of `text` to `agent_id`:
    /// the task's id, the pair's hash, and how many of the pair this run
    /// spawned before.
    fn spawn_id(&self, agent_id: &str, text: &str) -> String {
        let pair = fnv1a([agent_id.as_bytes(), &[0], text.as_bytes()]);
        let mut spawned = self.inner.spawned.lock().unwrap_or_else(PoisonError::into_inner);
        let count = spawned.entry(pair).or_default();
        let id = format!("{}/spawn/{pair:016x}/{count}", self.id());
        *count += 1;
        id
    }

    /// Tells this task's owner something: a status, a question (the task then
    /// waits in `INPUT_REQUIRED`) or an error.
    pub async fn notify_owner(
        &self,
        kind: inbox_message::Kind,
        text: impl Into<String>,
    ) -> Result<InboxMessage, WorkerError> {
        let request = NotifyOwnerRequest {
            namespace: self.inner.namespace.clone(),
            task_id: self.id().to_owned(),
            kind: kind.into(),
            message: Some(agent_message(&self.inner.task, vec![text_part(text)])),
            lease_id: self.inner.lease_id.clone(),
        };
        let mut client = self.client();
        let message = client.notify_owner(request).instrument(self.inner.span.clone()).await?;
        Ok(message.into_inner())
    }

    /// Completes when the worker stops working on this task without
    /// completing it: the task was canceled on the server, its lease was
    /// lost, or the worker shut down and the task is handed back to the queue
    /// (once [`Worker::shutdown_grace`](crate::Worker::shutdown_grace) is
    /// over). Whatever the handler returns afterwards is ignored; it is
    /// aborted soon after (in a second at shutdown).
    pub async fn cancelled(&self) {
        self.inner.cancel.cancelled().await;
    }

    /// Whether [`cancelled`](Self::cancelled) has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Completes when the worker begins to shut down. The task is still
    /// this worker's: a reply within the shutdown grace completes it as
    /// usual, so a handler may hurry (save its progress as an artifact,
    /// skip optional work); after the grace it is handed back.
    pub async fn shutting_down(&self) {
        self.inner.shutdown.cancelled().await;
    }

    /// Whether [`shutting_down`](Self::shutting_down) has fired.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }
}

/// The 64-bit FNV-1a hash of `chunks` in a row: a hash that stays the same
/// across processes and Rust releases, as a spawn's message id must.
fn fnv1a<const N: usize>(chunks: [&[u8]; N]) -> u64 {
    chunks
        .iter()
        .flat_map(|chunk| chunk.iter())
        .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::fnv1a;

    #[test]
    fn the_spawn_hash_is_fnv1a() {
        assert_eq!(fnv1a([b"".as_slice()]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a([b"a".as_slice()]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a([b"fo".as_slice(), b"obar"]), fnv1a([b"foobar".as_slice()]));
    }
}
