//! The A2A operations, over the task store. Bindings parse and authenticate,
//! then call these with A2A model types; nothing here knows JSON-RPC, REST
//! or gRPC.

mod follow;
mod inputs;
mod push_configs;
mod rewatch;

use std::{pin::Pin, sync::Arc, time::Duration};

use a2a::{
    ListTasksRequest, ListTasksResponse, Message, SendMessageRequest, SendMessageResponse, StreamResponse, Task,
    TaskPushNotificationConfig,
};
use chorus_proto::taskstore::{self as pb, task_store_client::TaskStoreClient};
use chorus_runtime::transport::Transport;
use futures_util::{Stream, StreamExt as _, stream};
use tokio_util::sync::CancellationToken;

use self::{
    follow::{Waiting, until_settled},
    inputs::{check_input_modes, keep_latest, validate_message, without_empty_strings},
};
pub(crate) use self::{inputs::history_length, rewatch::worth_reopening};
use crate::{
    auth::{Authenticator, Scope},
    builtin::{self, Runner},
    catalog::Catalog,
    config::{AgentConfig, AgentKind, GatewayConfig},
    convert,
    delegation::DelegateGrpc,
    error::{GatewayError, Result},
    notify::{Follow, PushDispatcher},
};

/// The events of a streaming call, in order; the stream ends after a
/// terminal or interrupted state.
pub(crate) type EventStream = Pin<Box<dyn Stream<Item = Result<StreamResponse>> + Send>>;

const DEFAULT_PAGE_SIZE: i32 = 50;
/// The longest the task store waits for a task in one call.
const LONGEST_BLOCKING_WAIT: Duration = Duration::from_secs(3600);
const MAX_PAGE_SIZE: i32 = 100;

/// The gateway: cheap to clone, shared by every binding.
#[derive(Debug, Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    tasks: TaskStoreClient<Transport>,
    catalog: Catalog,
    auth: Authenticator,
    runner: Runner,
    push: PushDispatcher,
    delegation: DelegateGrpc,
    config: GatewayConfig,
    /// Cancelled when the process stops: blocking sends answer and streams
    /// end at once, rather than hold their callers for the grace period.
    stopping: CancellationToken,
}

/// What starting a turn produced.
enum Started {
    /// The agent answered with a message; there is no task.
    Reply(Box<Message>),
    /// The task the message created or continued, as it was then.
    Task(Box<pb::Task>),
}

impl Gateway {
    pub(crate) fn new(
        tasks: TaskStoreClient<Transport>,
        catalog: Catalog,
        runner: Runner,
        push: PushDispatcher,
        delegation: DelegateGrpc,
        config: GatewayConfig,
        stopping: CancellationToken,
    ) -> Self {
        let auth = Authenticator::new(&config.auth, &config.default_namespace, &config.namespaces);
        Self { inner: Arc::new(Inner { tasks, catalog, auth, runner, push, delegation, config, stopping }) }
    }

    /// The `chorus.gateway.v1.Gateway` service (outbound delegation).
    pub fn delegation(&self) -> DelegateGrpc {
        self.inner.delegation.clone()
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    pub(crate) fn auth(&self) -> &Authenticator {
        &self.inner.auth
    }

    pub(crate) fn config(&self) -> &GatewayConfig {
        &self.inner.config
    }

    fn tasks(&self) -> TaskStoreClient<Transport> {
        self.inner.tasks.clone()
    }

    /// The agent a request is for: the one its URL names, else the one its
    /// tenant names, else the default agent.
    pub(crate) fn agent(&self, path_agent: Option<&str>, scope: &Scope) -> Result<&AgentConfig> {
        if let (Some(path), Some(tenant)) = (path_agent, scope.agent.as_deref())
            && path != tenant
        {
            return Err(GatewayError::InvalidParams(format!(
                "the request is sent to agent {path:?} but its tenant names agent {tenant:?}"
            )));
        }
        match path_agent.or(scope.agent.as_deref()) {
            Some(id) => self.inner.catalog.agent(id).ok_or_else(|| GatewayError::AgentNotFound(id.to_owned())),
            None => Ok(self.inner.catalog.default_agent()),
        }
    }

    /// What a call to chorus's own gRPC services (task store, event bus,
    /// hub, workflow engine, delegation) on the gateway's port must pass
    /// where credentials are configured: a credential, scoped to the
    /// namespace the request names; a method that acts across namespaces
    /// takes one for every namespace. `None`: no credentials are configured.
    pub fn operator_guard(&self) -> Option<chorus_runtime::server::Guard> {
        if !self.inner.auth.enabled() {
            return None;
        }
        let gateway = self.clone();
        Some(Arc::new(move |headers: &http::HeaderMap| gateway.auth().admit(headers)))
    }

    /// The header API keys travel in.
    pub fn api_key_header(&self) -> http::HeaderName {
        http::HeaderName::from_bytes(self.inner.config.auth.api_key_header.as_bytes())
            .expect("checked when the gateway was built")
    }

    /// `GetExtendedAgentCard`: the card an authenticated caller sees. There is
    /// one only where credentials are configured.
    pub(crate) fn extended_card(&self, scope: &Scope, agent: &str) -> Result<a2a::AgentCard> {
        if !self.inner.auth.enabled() {
            return Err(GatewayError::UnsupportedOperation(
                "this gateway authenticates no one, so it has no extended agent card".to_owned(),
            ));
        }
        self.inner.catalog.card_in(&scope.namespace, agent).ok_or_else(|| GatewayError::AgentNotFound(agent.to_owned()))
    }

    /// `SendMessage`: blocking unless `returnImmediately`; a blocking call
    /// answers when the task is terminal or interrupted, or after the
    /// blocking timeout with the task as it is.
    pub(crate) async fn send(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        request: SendMessageRequest,
    ) -> Result<SendMessageResponse> {
        let request = without_empty_strings(request);
        let configuration = request.configuration.clone().unwrap_or_else(default_configuration);
        let history_length = history_length(configuration.history_length)?;
        let task = match self.start(scope, agent, request).await? {
            Started::Reply(message) => return Ok(SendMessageResponse::Message(*message)),
            Started::Task(task) => task,
        };
        let task = if configuration.return_immediately.unwrap_or(false) {
            self.get_task(scope, agent, &task.id, history_length).await?
        } else {
            self.settle(scope, &task.id, history_length).await?
        };
        Ok(SendMessageResponse::Task(task))
    }

    /// `SendStreamingMessage`: the task as created, then its changes.
    pub(crate) async fn send_streaming(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        request: SendMessageRequest,
    ) -> Result<EventStream> {
        if !agent.streaming {
            return Err(GatewayError::UnsupportedOperation(format!("agent {} does not stream", agent.id)));
        }
        let request = without_empty_strings(request);
        let configuration = request.configuration.as_ref();
        let length = history_length(configuration.and_then(|configuration| configuration.history_length))?;
        let continuing = request.message.task_id.is_some();
        let events = match self.start(scope, agent, request).await? {
            Started::Reply(message) => {
                return Ok(Box::pin(stream::once(async move { Ok(StreamResponse::Message(*message)) })));
            }
            Started::Task(task) if continuing => self.follow(scope, &task.id, Waiting::Ends).await?,
            Started::Task(task) => {
                // The task as it was created, then every change from its first:
                // a retried message (same messageId, same task) replays it all.
                let first = StreamResponse::Task(convert::task_as_created((*task).clone()));
                let request = pb::WatchTaskRequest {
                    namespace: scope.namespace.clone(),
                    task_id: task.id.clone(),
                    ..pb::WatchTaskRequest::default()
                };
                let events = self.watch(request, &task.id).await?;
                Box::pin(stream::once(async { Ok(first) }).chain(until_settled(events, Waiting::Ends)))
            }
        };
        Ok(Box::pin(events.map(move |event| match event {
            Ok(StreamResponse::Task(task)) => Ok(StreamResponse::Task(keep_latest(task, length))),
            other => other,
        })))
    }

    /// `SubscribeToTask`: the task as it is, then its changes.
    pub(crate) async fn subscribe(&self, scope: &Scope, agent: &AgentConfig, task_id: &str) -> Result<EventStream> {
        let task = self.get_task(scope, agent, task_id, Some(0)).await?;
        if task.status.state.is_terminal() {
            return Err(GatewayError::UnsupportedOperation(format!(
                "task {task_id} is {} and will not change; read it with GetTask",
                convert::state_name(&task.status.state)
            )));
        }
        self.follow(scope, task_id, Waiting::Continues).await
    }

    /// A task of `agent`: each agent's endpoint serves its own tasks only,
    /// and another's is not found there, as one that does not exist.
    pub(crate) async fn get_task(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        id: &str,
        history_length: Option<u32>,
    ) -> Result<Task> {
        let request = pb::GetTaskRequest { namespace: scope.namespace.clone(), id: id.to_owned(), history_length };
        let task = self.tasks().get_task(request).await.map_err(|status| task_error(&status, id))?.into_inner();
        if task.agent_id != agent.id {
            return Err(GatewayError::TaskNotFound(id.to_owned()));
        }
        Ok(convert::task_out(task, true))
    }

    /// `ListTasks`: `agent`'s tasks.
    pub(crate) async fn list_tasks(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        request: ListTasksRequest,
    ) -> Result<ListTasksResponse> {
        let page_size = request.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(1..=MAX_PAGE_SIZE).contains(&page_size) {
            return Err(GatewayError::InvalidParams(format!("pageSize must be between 1 and {MAX_PAGE_SIZE}")));
        }
        let include_artifacts = request.include_artifacts.unwrap_or(false);
        let query = pb::ListTasksRequest {
            namespace: scope.namespace.clone(),
            context_id: request.context_id.unwrap_or_default(),
            state: request.status.as_ref().map(convert::state_in).unwrap_or_default().into(),
            agent_id: agent.id.clone(),
            updated_after: request.status_timestamp_after.as_ref().and_then(a2a_pb::pbconv::to_proto_timestamp),
            page_size: page_size.unsigned_abs(),
            page_token: request.page_token.unwrap_or_default(),
            history_length: history_length(request.history_length)?,
            include_artifacts,
            parent_task_id: String::new(),
        };
        let page = self.tasks().list_tasks(query).await.map_err(|status| task_error(&status, ""))?.into_inner();
        Ok(ListTasksResponse {
            tasks: page.tasks.into_iter().map(|task| convert::task_out(task, include_artifacts)).collect(),
            next_page_token: page.next_page_token,
            page_size,
            total_size: i32::try_from(page.total_size).unwrap_or(i32::MAX),
        })
    }

    pub(crate) async fn cancel_task(&self, scope: &Scope, agent: &AgentConfig, id: &str) -> Result<Task> {
        let before = self.get_task(scope, agent, id, Some(0)).await?;
        let request = pb::CancelTaskRequest {
            namespace: scope.namespace.clone(),
            id: id.to_owned(),
            reason: "canceled by the A2A caller".to_owned(),
        };
        match self.tasks().cancel_task(request).await {
            Ok(response) => {
                let task = response.into_inner().task.ok_or_else(|| GatewayError::Internal("no task".to_owned()))?;
                match self.inner.catalog.agent(&task.agent_id).map(|agent| (agent, agent.kind)) {
                    Some((agent, AgentKind::Remote)) => {
                        self.inner.runner.cancel_remote(agent, &task, &before.status.state).await;
                    }
                    Some((_, AgentKind::Workflow)) => self.inner.runner.cancel_run(&scope.namespace, &task).await,
                    Some((_, AgentKind::Worker | AgentKind::Builtin)) | None => {}
                }
                Ok(convert::task_out(task, true))
            }
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                let task = self.get_task(scope, agent, id, Some(0)).await?;
                Err(GatewayError::TaskNotCancelable {
                    id: id.to_owned(),
                    state: convert::state_name(&task.status.state),
                })
            }
            Err(status) => Err(task_error(&status, id)),
        }
    }

    /// Creates or continues the task, or lets a built-in agent answer.
    async fn start(&self, scope: &Scope, agent: &AgentConfig, request: SendMessageRequest) -> Result<Started> {
        let mut message = request.message;
        validate_message(&message)?;
        if let Some(caller) = &scope.caller {
            message.metadata.get_or_insert_default().insert(builtin::CALLER.to_owned(), caller.clone().into());
        }
        check_input_modes(agent, &message)?;
        let push = request.configuration.and_then(|configuration| configuration.task_push_notification_config);
        if let Some(push) = &push {
            self.check_push_config(push, push_configs::SENT_CONFIG).await?;
        }
        if let Some(task_id) = message.task_id.clone() {
            return self.continue_task(scope, agent, &task_id, message, push).await;
        }
        if let Some(reply) = Runner::direct_reply(agent, &message) {
            return Ok(Started::Reply(Box::new(reply)));
        }
        let answer = Runner::answer(agent, &message);
        let answered = answer.is_some();
        let create = pb::CreateTaskRequest {
            namespace: scope.namespace.clone(),
            agent_id: agent.id.clone(),
            message: Some(convert::message_in(&message)),
            context_id: message.context_id.clone().unwrap_or_default(),
            metadata: request.metadata.as_ref().map(a2a_pb::pbconv::to_proto_struct),
            spawn_context: pb::SpawnContext::Agent.into(),
            // Every SendMessage makes its own task, as A2A servers do; a
            // messageId is the sender's, not a request key. Time-ordered, so
            // each key lands at the end of the task store's index of them
            // rather than in a random page of it.
            idempotency_key: format!("a2a-{}", uuid::Uuid::now_v7()),
            follower: if answer.is_some() { None } else { self.inner.runner.follower(agent) },
            answer,
            run_by_creator: agent.kind.runs_in_gateway(),
        };
        let task = self.tasks().create_task(create).await.map_err(|status| task_error(&status, ""))?.into_inner();
        if let Some(push) = push {
            let changes = self.inner.push.open(&scope.namespace, &task.id, Follow::FromCreation).await?;
            self.store_push_config(scope, push_configs::sent_for(push, &task.id), changes).await?;
        }
        if !answered && agent.kind.runs_in_gateway() {
            self.inner.runner.start(agent, &scope.namespace, &task, message);
        }
        Ok(Started::Task(Box::new(task)))
    }

    /// Adds the message to the task; a push config sent with it receives
    /// the changes from before the message on.
    async fn continue_task(
        &self,
        scope: &Scope,
        agent: &AgentConfig,
        task_id: &str,
        message: Message,
        push: Option<TaskPushNotificationConfig>,
    ) -> Result<Started> {
        let request =
            pb::GetTaskRequest { namespace: scope.namespace.clone(), id: task_id.to_owned(), history_length: Some(0) };
        let task = self.tasks().get_task(request).await.map_err(|status| task_error(&status, task_id))?.into_inner();
        if task.agent_id != agent.id {
            return Err(GatewayError::TaskNotFound(task_id.to_owned()));
        }
        if let Some(context_id) = &message.context_id
            && *context_id != task.context_id
        {
            return Err(GatewayError::InvalidParams(format!(
                "message.contextId {context_id:?} is not the context of task {task_id}"
            )));
        }
        let state = convert::state_out(task.status.as_ref().map_or(0, |status| status.state));
        if state.is_terminal() {
            return Err(GatewayError::UnsupportedOperation(format!(
                "task {task_id} is {} and accepts no more messages",
                convert::state_name(&state)
            )));
        }
        let changes = match &push {
            Some(_) => Some(self.inner.push.open(&scope.namespace, task_id, Follow::FromNow).await?),
            None => None,
        };
        let namespace = scope.namespace.clone();
        let stored = Some(convert::message_in(&message));
        let mut tasks = self.tasks();
        let task = if agent.kind.runs_in_gateway() {
            // The gateway runs this agent's turns: only the message that
            // answers the task's interruption starts one. A second message
            // sent meanwhile, or one to a task still working, is refused by
            // the task store, under the task's lock, and changes nothing.
            let follower = self.inner.runner.follower(agent);
            let request =
                pb::AnswerQuestionRequest { namespace, task_id: task_id.to_owned(), answer: stored, follower };
            let task = tasks.answer_question(request).await.map_err(|status| task_error(&status, task_id))?;
            let task = task.into_inner();
            self.inner.runner.start(agent, &scope.namespace, &task, message);
            task
        } else {
            let request = pb::AddMessageRequest {
                namespace,
                task_id: task_id.to_owned(),
                message: stored,
                lease_id: String::new(),
                brief: false,
            };
            tasks.add_message(request).await.map_err(|status| task_error(&status, task_id))?.into_inner()
        };
        if let (Some(push), Some(changes)) = (push, changes) {
            self.store_push_config(scope, push_configs::sent_for(push, &task.id), changes).await?;
        }
        Ok(Started::Task(Box::new(task)))
    }

    /// The task once it is terminal or interrupted, or as it is when the
    /// blocking timeout passes. A continued task is working again (or still)
    /// when this starts: continuing it moved it past its interruption.
    async fn settle(&self, scope: &Scope, task_id: &str, history_length: Option<u32>) -> Result<Task> {
        let timeout = Duration::from_millis(self.inner.config.blocking_timeout_ms).min(LONGEST_BLOCKING_WAIT);
        let (namespace, id) = (scope.namespace.clone(), task_id.to_owned());
        let request =
            pb::AwaitTaskRequest { namespace: namespace.clone(), id: id.clone(), history_length, timeout: None };
        let settled = tokio::select! {
            settled = rewatch::await_task(self.tasks(), request, timeout) => settled.map(|settled| settled.task),
            // As at the blocking timeout: the task as it is, which goes on.
            () = self.inner.stopping.cancelled() => {
                let get = pb::GetTaskRequest { namespace, id, history_length };
                self.tasks().get_task(get).await.map(|task| Some(task.into_inner()))
            }
        };
        let settled = settled.map_err(|status| match task_error(&status, task_id) {
            GatewayError::Unavailable(message) => GatewayError::Unavailable(format!(
                "{message}; task {task_id} was created and goes on: read it with GetTask"
            )),
            error => error,
        })?;
        let task =
            settled.ok_or_else(|| GatewayError::Internal("the task store answered without a task".to_owned()))?;
        Ok(convert::task_out(task, true))
    }

    /// The task as it is now, then its changes until it settles: the task
    /// store's snapshot holds exactly the changes before those that follow.
    async fn follow(&self, scope: &Scope, task_id: &str, waiting: Waiting) -> Result<EventStream> {
        let request = pb::WatchTaskRequest {
            namespace: scope.namespace.clone(),
            task_id: task_id.to_owned(),
            snapshot: true,
            ..pb::WatchTaskRequest::default()
        };
        let events = self.watch(request, task_id).await?;
        Ok(Box::pin(until_settled(events, waiting)))
    }

    async fn watch(
        &self,
        request: pb::WatchTaskRequest,
        task_id: &str,
    ) -> Result<impl Stream<Item = Result<StreamResponse>> + Send + 'static> {
        let stopping = self.inner.stopping.clone();
        let events =
            rewatch::watch(self.tasks(), request, stopping).await.map_err(|status| task_error(&status, task_id))?;
        Ok(events.filter_map(|event| std::future::ready(event.map(convert::event_out).transpose())))
    }
}

fn default_configuration() -> a2a::SendMessageConfiguration {
    a2a::SendMessageConfiguration {
        accepted_output_modes: None,
        task_push_notification_config: None,
        history_length: None,
        return_immediately: None,
    }
}

fn task_error(status: &tonic::Status, task_id: &str) -> GatewayError {
    GatewayError::from_taskstore(status, Some(task_id))
}
