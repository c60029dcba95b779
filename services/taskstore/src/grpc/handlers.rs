//! The gRPC handlers: validate and convert the request, call the service,
//! convert the answer. No logic of their own.

use std::time::Duration;

use futures_util::StreamExt as _;

use chorus_proto::taskstore as pb;
use chorus_runtime::{
    grpc::{ResponseStream, namespace, stream_of},
    telemetry::{current_context_headers, record_ids},
    validate::{self, FieldViolation},
};
use tonic::{Request, Response, Status};

use super::{
    TaskStoreGrpc, check_context, convert, inbox, message_for, optional_message_for, pages, push_convert, task_ref,
    written,
};
use crate::{
    domain::{
        ArtifactChunk, ClaimRequest, HandBack, NewSubtask, NewTask, Notification, PushConfigKey, StatusUpdate,
        TaskQuery,
    },
    service::{WatchFilter, WatchStart},
};

const DEFAULT_PAGE_SIZE: u32 = 50;
const MAX_PAGE_SIZE: u32 = 100;
const DEFAULT_AWAIT_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_AWAIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Most tasks of one agent a claim stream holds at once.
const MAX_CAPACITY: u32 = 10_000;
/// Most retries an agent's tasks get.
const MAX_RETRIES: u32 = 1_000;

/// What a `ListTasksResponse` holds besides its tasks, at most: the page token, the total and their framing.
const PAGE_OVERHEAD: usize = 1024;

#[tonic::async_trait]
impl pb::task_store_server::TaskStore for TaskStoreGrpc {
    async fn create_task(&self, request: Request<pb::CreateTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, agent_id) = (namespace(&request.namespace)?, validate::id("agent_id", &request.agent_id)?);
        let context_id = validate::optional_id("context_id", &request.context_id)?;
        let message = message_for("message", request.message, None)?;
        check_context(context_id.as_deref(), &message)?;
        let task = NewTask {
            namespace,
            agent_id,
            context_id,
            message,
            metadata: convert::json_object("metadata", request.metadata)?,
            spawn_context: convert::spawn_context(request.spawn_context)?,
            trace_context: current_context_headers(),
            idempotency_key: validate::optional_id("idempotency_key", &request.idempotency_key)?,
            answer: convert::answer(request.answer)?,
            follower: push_convert::turn_follower(request.follower)?,
            run_by_creator: request.run_by_creator,
        };
        let task = self.store.create_task(task).await?;
        record_ids(&task.namespace, &task.id);
        Ok(Response::new(convert::task_out(task)))
    }

    async fn get_task(&self, request: Request<pb::GetTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, id) = task_ref(&request.namespace, "id", &request.id)?;
        let task = self.store.get_task(&namespace, &id, request.history_length).await?;
        Ok(Response::new(convert::task_out(task)))
    }

    async fn await_task(
        &self,
        request: Request<pb::AwaitTaskRequest>,
    ) -> Result<Response<pb::AwaitTaskResponse>, Status> {
        let request = request.into_inner();
        let (namespace, id) = task_ref(&request.namespace, "id", &request.id)?;
        let timeout = validate::duration("timeout", request.timeout, DEFAULT_AWAIT_TIMEOUT)?;
        if timeout > MAX_AWAIT_TIMEOUT {
            return Err(FieldViolation::new("timeout", "must be at most 1h").into());
        }
        let (task, timed_out) = self.store.await_task(&namespace, &id, request.history_length, timeout).await?;
        Ok(Response::new(pb::AwaitTaskResponse { task: Some(convert::task_out(task)), timed_out }))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let request = request.into_inner();
        let page_size = validate::count("page_size", request.page_size, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)?;
        let page_token = match request.page_token.as_str() {
            "" => None,
            token => Some(
                token
                    .parse()
                    .map_err(|()| FieldViolation::new("page_token", "is not a page token this service handed out"))?,
            ),
        };
        let query = TaskQuery {
            namespace: namespace(&request.namespace)?,
            context_id: validate::optional_id("context_id", &request.context_id)?,
            state: convert::optional_task_state("state", request.state)?,
            agent_id: validate::optional_id("agent_id", &request.agent_id)?,
            parent_id: validate::optional_id("parent_task_id", &request.parent_task_id)?,
            updated_after: convert::timestamp_micros("updated_after", request.updated_after)?,
            page_size,
            page_token,
            history_length: request.history_length,
            include_artifacts: request.include_artifacts,
        };
        let page = self.store.list_tasks(query).await?;
        Ok(Response::new(pages::fit_page(page, self.max_message_bytes.saturating_sub(PAGE_OVERHEAD))))
    }

    async fn add_message(&self, request: Request<pb::AddMessageRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let message = message_for("message", request.message, Some(&task_id))?;
        let lease_id = validate::optional_id("lease_id", &request.lease_id)?;
        let task = self.store.add_message(&namespace, &task_id, message, lease_id.as_deref()).await?;
        Ok(written(task, request.brief))
    }

    async fn update_status(&self, request: Request<pb::UpdateStatusRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let update = StatusUpdate {
            state: convert::task_state("state", request.state)?,
            message: optional_message_for("message", request.message, &task_id)?,
            lease_id: validate::optional_id("lease_id", &request.lease_id)?,
        };
        let task = self.store.update_status(&namespace, &task_id, update).await?;
        Ok(written(task, request.brief))
    }

    async fn append_artifact(&self, request: Request<pb::AppendArtifactRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let chunk = ArtifactChunk {
            artifact: convert::artifact("artifact", request.artifact)?,
            append: request.append,
            last_chunk: request.last_chunk,
            lease_id: validate::optional_id("lease_id", &request.lease_id)?,
        };
        let task = self.store.append_artifact(&namespace, &task_id, chunk).await?;
        Ok(written(task, request.brief))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        let request = request.into_inner();
        let (namespace, id) = task_ref(&request.namespace, "id", &request.id)?;
        let reason = (!request.reason.is_empty()).then_some(request.reason);
        let (task, canceled_task_ids) = self.store.cancel_task(&namespace, &id, reason).await?;
        Ok(Response::new(pb::CancelTaskResponse { task: Some(convert::task_out(task)), canceled_task_ids }))
    }

    type WatchTaskStream = ResponseStream<pb::TaskEvent>;

    async fn watch_task(
        &self,
        request: Request<pb::WatchTaskRequest>,
    ) -> Result<Response<Self::WatchTaskStream>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let after = convert::cursor("after_cursor", &request.after_cursor)?;
        if !request.snapshot {
            let events = self.store.watch_task(&namespace, &task_id, after).await?;
            return Ok(Response::new(stream_of(events, convert::event_out)));
        }
        if after.is_some() {
            return Err(FieldViolation::new("snapshot", "cannot be combined with after_cursor").into());
        }
        let (task, cursor, events) = self.store.watch_task_from_snapshot(&namespace, &task_id).await?;
        let snapshot = futures_util::stream::once(std::future::ready(Ok(convert::snapshot_out(task, cursor))));
        Ok(Response::new(Box::pin(snapshot.chain(stream_of(events, convert::event_out)))))
    }

    type WatchTasksStream = ResponseStream<pb::TaskEvent>;

    async fn watch_tasks(
        &self,
        request: Request<pb::WatchTasksRequest>,
    ) -> Result<Response<Self::WatchTasksStream>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let filter = WatchFilter {
            agent_id: validate::optional_id("agent_id", &request.agent_id)?,
            context_id: validate::optional_id("context_id", &request.context_id)?,
        };
        let start = match convert::cursor("after_cursor", &request.after_cursor)? {
            Some(cursor) => WatchStart::After(cursor),
            None if request.from_beginning => WatchStart::Beginning,
            None => WatchStart::Now,
        };
        let events = self.store.watch_tasks(&namespace, filter, start).await?;
        Ok(Response::new(stream_of(events, convert::event_out)))
    }

    type ClaimTasksStream = ResponseStream<pb::ClaimedTask>;

    async fn claim_tasks(
        &self,
        request: Request<pb::ClaimTasksRequest>,
    ) -> Result<Response<Self::ClaimTasksStream>, Status> {
        let request = request.into_inner();
        let claim = ClaimRequest {
            namespace: namespace(&request.namespace)?,
            agent_id: validate::id("agent_id", &request.agent_id)?,
            worker_id: validate::id("worker_id", &request.worker_id)?,
            capacity: validate::count("capacity", request.capacity, 1, MAX_CAPACITY)?,
            lease: validate::duration("lease", request.lease, Duration::ZERO)?,
            max_retries: validate::count("max_retries", request.max_retries, 0, MAX_RETRIES)?,
        };
        if request.fresh_start {
            self.store.start_worker_run(&claim.namespace, &claim.worker_id, &claim.agent_id).await?;
        }
        if !request.notify_cancellations {
            return Ok(Response::new(stream_of(self.store.claim_stream(claim), convert::claimed_out)));
        }
        let events = self.store.claim_stream_with_cancellations(claim);
        Ok(Response::new(stream_of(events, convert::claim_event_out)))
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let lease_id = validate::id("lease_id", &request.lease_id)?;
        let lease = request.lease.map(|lease| validate::duration("lease", Some(lease), Duration::ZERO)).transpose()?;
        let renewal = self.store.renew_lease(&namespace, &task_id, &lease_id, lease).await?;
        Ok(Response::new(pb::RenewLeaseResponse {
            lease_expires_at: (!renewal.canceled).then(|| convert::timestamp(renewal.lease_expires_at)),
            canceled: renewal.canceled,
        }))
    }

    async fn complete_task(&self, request: Request<pb::CompleteTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let lease_id = validate::id("lease_id", &request.lease_id)?;
        let message = optional_message_for("message", request.message, &task_id)?;
        let artifacts = convert::artifacts("artifacts", request.artifacts)?;
        let task = self.store.complete_task(&namespace, &task_id, &lease_id, message, artifacts).await?;
        Ok(written(task, request.brief))
    }

    async fn fail_task(&self, request: Request<pb::FailTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let lease_id = validate::id("lease_id", &request.lease_id)?;
        let reason = if request.reason.is_empty() { "the worker reported a failure" } else { &request.reason };
        if !request.retry && request.retry_after.is_some() {
            let why = "needs `retry`: without it the task fails, and there is no retry to put off";
            return Err(FieldViolation::new("retry_after", why).into());
        }
        let retry = request.retry.then_some(convert::retry_after(request.retry_after)?);
        let task = self.store.fail_task(&namespace, &task_id, &lease_id, reason, retry).await?;
        Ok(written(task, request.brief))
    }

    async fn release_task(&self, request: Request<pb::ReleaseTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let lease_id = validate::id("lease_id", &request.lease_id)?;
        let reason = if request.reason.is_empty() { "the worker handed the task back" } else { &request.reason };
        if request.others_first && request.retry_after.is_none() {
            return Err(FieldViolation::new("others_first", "needs `retry_after`: how long this worker waits").into());
        }
        let back = HandBack { after: convert::retry_after(request.retry_after)?, others_first: request.others_first };
        let task = self.store.release_task(&namespace, &task_id, &lease_id, reason, back).await?;
        Ok(written(task, request.brief))
    }

    async fn spawn_subtask(
        &self,
        request: Request<pb::SpawnSubtaskRequest>,
    ) -> Result<Response<pb::SpawnSubtaskResponse>, Status> {
        let request = request.into_inner();
        let (namespace, parent_id) = task_ref(&request.namespace, "parent_task_id", &request.parent_task_id)?;
        let subtask = NewSubtask {
            namespace,
            parent_id,
            agent_id: validate::id("agent_id", &request.agent_id)?,
            message: message_for("message", request.message, None)?,
            owner: convert::owner("owner", request.owner)?,
            metadata: convert::json_object("metadata", request.metadata)?,
            trace_context: current_context_headers(),
            lease_id: validate::optional_id("lease_id", &request.lease_id)?,
        };
        let timeout =
            request.timeout.map(|timeout| validate::duration("timeout", Some(timeout), Duration::ZERO)).transpose()?;
        let (task, timed_out) = self.store.spawn_subtask(subtask, request.blocking, timeout).await?;
        Ok(Response::new(pb::SpawnSubtaskResponse { task: Some(convert::task_out(task)), timed_out }))
    }

    async fn await_subtasks(
        &self,
        request: Request<pb::AwaitSubtasksRequest>,
    ) -> Result<Response<pb::AwaitSubtasksResponse>, Status> {
        let request = request.into_inner();
        let (namespace, parent_id) = task_ref(&request.namespace, "parent_task_id", &request.parent_task_id)?;
        let task_ids = request
            .task_ids
            .iter()
            .enumerate()
            .map(|(index, id)| validate::id(&format!("task_ids[{index}]"), id))
            .collect::<Result<Vec<_>, _>>()?;
        let timeout = validate::duration("timeout", request.timeout, DEFAULT_AWAIT_TIMEOUT)?;
        let outcome = self.store.await_subtasks(&namespace, &parent_id, &task_ids, request.any, timeout).await?;
        Ok(Response::new(pb::AwaitSubtasksResponse {
            finished: outcome.finished.into_iter().map(convert::task_out).collect(),
            pending_task_ids: outcome.pending,
            timed_out: outcome.timed_out,
        }))
    }

    async fn notify_owner(
        &self,
        request: Request<pb::NotifyOwnerRequest>,
    ) -> Result<Response<pb::InboxMessage>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let message = message_for("message", request.message, Some(&task_id))?;
        let notification = Notification {
            namespace,
            task_id,
            kind: convert::inbox_kind("kind", request.kind)?,
            message,
            lease_id: validate::optional_id("lease_id", &request.lease_id)?,
        };
        let message = self.store.notify_owner(notification).await?;
        Ok(Response::new(convert::inbox_out(message)))
    }

    async fn answer_question(&self, request: Request<pb::AnswerQuestionRequest>) -> Result<Response<pb::Task>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let (answer, follower) =
            (message_for("answer", request.answer, Some(&task_id))?, push_convert::turn_follower(request.follower)?);
        let task = self.store.answer_question(&namespace, &task_id, answer, follower).await?;
        Ok(Response::new(convert::task_out(task)))
    }

    async fn read_inbox(
        &self,
        request: Request<pb::ReadInboxRequest>,
    ) -> Result<Response<pb::ReadInboxResponse>, Status> {
        let read = inbox::read_in(request.into_inner())?;
        let messages = self.store.read_inbox(&read.namespace, &read.owner, read.max, read.wait, read.mode).await?;
        Ok(Response::new(pb::ReadInboxResponse { messages: messages.into_iter().map(convert::inbox_out).collect() }))
    }

    async fn ack_inbox(&self, request: Request<pb::AckInboxRequest>) -> Result<Response<pb::AckInboxResponse>, Status> {
        let (namespace, owner, ids) = inbox::ack_in(request.into_inner())?;
        let acknowledged = self.store.ack_inbox(&namespace, &owner, &ids).await?;
        Ok(Response::new(pb::AckInboxResponse { acknowledged: u32::try_from(acknowledged).unwrap_or(u32::MAX) }))
    }

    async fn create_push_config(
        &self,
        request: Request<pb::CreatePushConfigRequest>,
    ) -> Result<Response<pb::PushConfig>, Status> {
        let request = request.into_inner();
        let task_id = request.config.as_ref().map(|config| config.task_id.clone()).unwrap_or_default();
        let (namespace, task_id) = task_ref(&request.namespace, "config.task_id", &task_id)?;
        let config = push_convert::push_config(&task_id, request.config)?;
        let after = convert::push_cursor("after_cursor", &request.after_cursor)?;
        let follower = push_convert::creating_follower(request.follower, request.lease_ms)?;
        let config = self.store.create_push_config(&namespace, config, after, follower).await?;
        Ok(Response::new(push_convert::push_config_out(config)))
    }

    async fn get_push_config(
        &self,
        request: Request<pb::GetPushConfigRequest>,
    ) -> Result<Response<pb::PushConfig>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let id = validate::id("id", &request.id)?;
        let config = self.store.get_push_config(&namespace, &task_id, &id).await?;
        Ok(Response::new(push_convert::push_config_out(config)))
    }

    async fn list_push_configs(
        &self,
        request: Request<pb::ListPushConfigsRequest>,
    ) -> Result<Response<pb::ListPushConfigsResponse>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let configs = self.store.list_push_configs(&namespace, &task_id).await?;
        Ok(Response::new(pb::ListPushConfigsResponse {
            configs: configs.into_iter().map(push_convert::push_config_out).collect(),
        }))
    }

    async fn delete_push_config(
        &self,
        request: Request<pb::DeletePushConfigRequest>,
    ) -> Result<Response<pb::DeletePushConfigResponse>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let id = validate::id("id", &request.id)?;
        self.store.delete_push_config(&namespace, &task_id, &id).await?;
        Ok(Response::new(pb::DeletePushConfigResponse {}))
    }

    async fn advance_push_config(
        &self,
        request: Request<pb::AdvancePushConfigRequest>,
    ) -> Result<Response<pb::AdvancePushConfigResponse>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let key = PushConfigKey { namespace, task_id, id: validate::id("id", &request.id)? };
        let delivered = convert::push_cursor("cursor", &request.cursor)?;
        let follower = push_convert::follower(request.follower)?;
        self.store.advance_push_config(&key, delivered, request.finished, follower.as_deref()).await?;
        Ok(Response::new(pb::AdvancePushConfigResponse {}))
    }

    async fn claim_push_configs(
        &self,
        request: Request<pb::ClaimPushConfigsRequest>,
    ) -> Result<Response<pb::ClaimPushConfigsResponse>, Status> {
        let request = request.into_inner();
        let (follower, lease) = push_convert::follower_lease(request.follower, request.lease_ms)?;
        let limit = validate::count("limit", request.limit, MAX_PAGE_SIZE, MAX_PAGE_SIZE)?;
        let configs = self.store.claim_push_configs(follower, lease, limit).await?;
        Ok(Response::new(pb::ClaimPushConfigsResponse {
            configs: configs.into_iter().map(push_convert::pending_push_out).collect(),
        }))
    }

    async fn renew_push_configs(
        &self,
        request: Request<pb::RenewPushConfigsRequest>,
    ) -> Result<Response<pb::RenewPushConfigsResponse>, Status> {
        let request = request.into_inner();
        let (follower, lease) = push_convert::follower_lease(request.follower, request.lease_ms)?;
        let following = push_convert::push_config_keys("following", request.following)?;
        let lost = self.store.renew_push_configs(follower, lease, following).await?;
        Ok(Response::new(pb::RenewPushConfigsResponse {
            lost: lost.into_iter().map(push_convert::push_key_out).collect(),
        }))
    }

    async fn release_push_configs(
        &self,
        request: Request<pb::ReleasePushConfigsRequest>,
    ) -> Result<Response<pb::ReleasePushConfigsResponse>, Status> {
        let follower = push_convert::required_follower(request.into_inner().follower)?;
        let released = self.store.release_push_configs(&follower).await?;
        Ok(Response::new(pb::ReleasePushConfigsResponse { released }))
    }

    async fn follow_task(
        &self,
        request: Request<pb::FollowTaskRequest>,
    ) -> Result<Response<pb::FollowTaskResponse>, Status> {
        let request = request.into_inner();
        let (namespace, task_id) = task_ref(&request.namespace, "task_id", &request.task_id)?;
        let follower = push_convert::follower(request.follower)?.ok_or_else(|| FieldViolation::required("follower"))?;
        let lease = (request.lease_ms > 0).then(|| Duration::from_millis(request.lease_ms));
        self.store.follow_task(&namespace, &task_id, follower, lease).await?;
        Ok(Response::new(pb::FollowTaskResponse {}))
    }

    async fn keep_following_tasks(
        &self,
        request: Request<pb::KeepFollowingTasksRequest>,
    ) -> Result<Response<pb::KeepFollowingTasksResponse>, Status> {
        let request = request.into_inner();
        let (follower, lease) = push_convert::follower_lease(request.follower, request.lease_ms)?;
        let following = push_convert::task_keys("following", request.following)?;
        let claim = validate::count("claim", request.claim, 0, MAX_PAGE_SIZE)?;
        let followed = self.store.keep_following(follower, lease, following, claim).await?;
        Ok(Response::new(pb::KeepFollowingTasksResponse {
            lost: push_convert::task_keys_out(followed.lost),
            claimed: push_convert::task_keys_out(followed.claimed),
        }))
    }

    async fn release_followed_tasks(
        &self,
        request: Request<pb::ReleaseFollowedTasksRequest>,
    ) -> Result<Response<pb::ReleaseFollowedTasksResponse>, Status> {
        let follower = push_convert::required_follower(request.into_inner().follower)?;
        let released = self.store.release_followed_tasks(&follower).await?;
        Ok(Response::new(pb::ReleaseFollowedTasksResponse { released }))
    }
}
