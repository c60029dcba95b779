//! How the worker ends a task it handled: completes it (a large reply in
//! pieces), fails, rejects or hands it back, retrying a call cut off on its
//! way while the lease may still hold.

use std::{future::Future, time::Duration};

use chorus_proto::taskstore::{
    AppendArtifactRequest, Artifact, CompleteTaskRequest, FailTaskRequest, ReleaseTaskRequest, TaskState,
    UpdateStatusRequest,
};
use chorus_runtime::transport;
use prost::Message as _;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::{
    Client, Reply, TaskContext,
    backoff::Backoff,
    reply::{agent_message, pieces, text_part},
    task::{Runner, lease_lost, prost_duration},
};

/// A completion up to this size carries its artifacts; a larger one sends
/// them ahead, in pieces of [`PIECE_BYTES`], well under the 4 MiB a task
/// store takes by default.
const INLINE_BYTES: usize = 1 << 20;
const PIECE_BYTES: usize = 1 << 20;

impl<H> Runner<H> {
    /// Completes the task with `reply`. A reply too large for one request
    /// (a server takes 4 MiB by default) sends its artifacts ahead, in
    /// pieces; one the task store refuses all the same fails the task,
    /// saying why, rather than leaving it to be redone when its lease ends.
    pub(crate) async fn complete(&self, ctx: &TaskContext, reply: Reply) {
        let (message, artifacts) = reply.into_completion(ctx.task());
        let mut request = CompleteTaskRequest {
            namespace: self.namespace.clone(),
            task_id: ctx.id().to_owned(),
            lease_id: ctx.lease_id().to_owned(),
            message,
            artifacts,
            brief: true,
        };
        if request.encoded_len() > INLINE_BYTES {
            for artifact in std::mem::take(&mut request.artifacts) {
                if let Err(status) = self.send_artifact(ctx, artifact).await {
                    return self.undeliverable(ctx, &status).await;
                }
            }
        }
        match self.call(request, |mut client, request| async move { client.complete_task(request).await }).await {
            Ok(()) => self.ended("completed"),
            Err(status) => self.undeliverable(ctx, &status).await,
        }
    }

    /// Appends `artifact` in pieces of at most [`PIECE_BYTES`], the first
    /// replacing any earlier try of it.
    async fn send_artifact(&self, ctx: &TaskContext, artifact: Artifact) -> Result<(), tonic::Status> {
        let pieces = pieces(artifact, PIECE_BYTES);
        let last = pieces.len().saturating_sub(1);
        for (index, piece) in pieces.into_iter().enumerate() {
            let request = AppendArtifactRequest {
                namespace: self.namespace.clone(),
                task_id: ctx.id().to_owned(),
                artifact: Some(piece),
                append: index > 0,
                last_chunk: index == last,
                lease_id: ctx.lease_id().to_owned(),
                brief: true,
            };
            self.call(request, |mut client, request| async move { client.append_artifact(request).await }).await?;
        }
        Ok(())
    }

    /// The reply could not be delivered: a call cut off, or a lease gone,
    /// leaves the task to be redone once its lease runs out; any other
    /// refusal fails it, saying why.
    async fn undeliverable(&self, ctx: &TaskContext, status: &tonic::Status) {
        warn!(task_id = %ctx.id(), error = %status, "delivering the handler's reply failed");
        if transport::cut_off(status) || lease_lost(status) {
            // Redone once its lease runs out.
            return self.count("lease_lost");
        }
        let reason = format!("the handler's reply could not be delivered: {}", status.message());
        self.fail(ctx, reason, None).await;
    }

    /// Fails the task; with a `retry`, requeued after that pause (zero: at once).
    pub(crate) async fn fail(&self, ctx: &TaskContext, reason: String, retry: Option<Duration>) {
        let request = FailTaskRequest {
            namespace: self.namespace.clone(),
            task_id: ctx.id().to_owned(),
            lease_id: ctx.lease_id().to_owned(),
            reason,
            retry: retry.is_some(),
            retry_after: retry.filter(|pause| !pause.is_zero()).and_then(prost_duration),
            brief: true,
        };
        let ending = if request.retry { "retried" } else { "failed" };
        self.finish(ctx, ending, request, |mut client, request| async move { client.fail_task(request).await }).await;
    }

    /// Hands the task back to the queue, to be claimed once `after` has passed.
    pub(crate) async fn release(&self, ctx: &TaskContext, reason: String, after: Duration) {
        let request = ReleaseTaskRequest {
            namespace: self.namespace.clone(),
            task_id: ctx.id().to_owned(),
            lease_id: ctx.lease_id().to_owned(),
            reason,
            retry_after: Some(after).filter(|pause| !pause.is_zero()).and_then(prost_duration),
            brief: true,
            others_first: !after.is_zero(),
        };
        self.finish(
            ctx,
            "handed_back",
            request,
            |mut client, request| async move { client.release_task(request).await },
        )
        .await;
    }

    /// Ends the task `REJECTED` with `reason` as its status message.
    pub(crate) async fn reject(&self, ctx: &TaskContext, reason: String) {
        let request = UpdateStatusRequest {
            namespace: self.namespace.clone(),
            task_id: ctx.id().to_owned(),
            state: TaskState::Rejected.into(),
            message: Some(agent_message(ctx.task(), vec![text_part(reason)])),
            lease_id: ctx.lease_id().to_owned(),
            brief: true,
        };
        self.finish(ctx, "rejected", request, |mut client, request| async move { client.update_status(request).await })
            .await;
    }

    /// Makes the call that ends the task `ending` (logged, and counted as
    /// its outcome once it is made; a task whose end could not be reported
    /// is redone once its lease ends, and counts as `lease_lost`).
    async fn finish<R, C, Fut, T>(&self, ctx: &TaskContext, ending: &str, request: R, call: C)
    where
        R: Clone,
        C: Fn(Client, R) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match self.call(request, call).await {
            Ok(()) => self.ended(ending),
            Err(status) => {
                self.count("lease_lost");
                warn!(task_id = %ctx.id(), ending, error = %status, "reporting the task's end failed");
            }
        }
    }

    /// The task ended `ending`, as reported.
    fn ended(&self, ending: &str) {
        self.count(ending);
        debug!(ending, "task ended");
    }

    /// Makes a call about the task, retrying while it is cut off and the
    /// lease may still hold.
    async fn call<R, C, Fut, T>(&self, request: R, call: C) -> Result<(), tonic::Status>
    where
        R: Clone,
        C: Fn(Client, R) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let status = match call(self.client.clone(), request.clone()).await {
                Ok(_) => return Ok(()),
                Err(status) => status,
            };
            let delay = backoff.next_delay();
            if !transport::cut_off(&status) || started.elapsed() + delay >= self.lease {
                return Err(status);
            }
            tokio::time::sleep(delay).await;
        }
    }
}
