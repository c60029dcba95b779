//! [`Effects`] over the other services' gRPC clients and an egress-guarded
//! HTTP client for webhooks.

use std::time::Duration;

use async_trait::async_trait;
use chorus_proto::{
    eventbus::{self as bus, event_bus_client::EventBusClient},
    gateway::{self as gw, gateway_client::GatewayClient},
    hub::{self, hub_client::HubClient},
    json::struct_from_json,
    taskstore::{self as ts, task_event::Kind as EventKind, task_store_client::TaskStoreClient},
};
use chorus_runtime::{
    egress::{self, EgressGuard},
    transport::{self, Transport},
};
use serde_json::{Value, json};
use tonic::{Code, Status};

use super::{
    Delegated, Destination, EffectError, Effects, Note, Origin, TaskOutcome,
    task::{is_terminal, message_parts, outcome},
};

/// Where the services the engine calls are.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub taskstore: Transport,
    pub hub: Transport,
    pub eventbus: Transport,
    pub gateway: Transport,
    /// The gateway's base URL: an agent id `x` is `{gateway_url}/a2a/x`.
    pub gateway_url: String,
    /// Webhook steps may call loopback and private addresses.
    pub allow_private_webhooks: bool,
    pub webhook_timeout: Duration,
}

/// What a webhook refused for its address names.
pub(crate) const WEBHOOK_REMEDY: &str = "set workflow.allow_private_webhooks to allow it";

/// The engine's side effects over gRPC and HTTP.
#[derive(Debug, Clone)]
pub struct ClientEffects {
    tasks: TaskStoreClient<Transport>,
    hub: HubClient<Transport>,
    bus: EventBusClient<Transport>,
    gateway: GatewayClient<Transport>,
    gateway_url: String,
    guard: EgressGuard,
    http: reqwest::Client,
}

impl ClientEffects {
    /// Effects over `endpoints`. Installs ring as the process's rustls
    /// provider (what reqwest's HTTPS needs), unless one is installed already.
    pub fn new(endpoints: Endpoints) -> Result<Self, EffectError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let guard = EgressGuard::new(endpoints.allow_private_webhooks, &[], WEBHOOK_REMEDY);
        Ok(Self {
            // Tasks can outgrow the default 4 MiB answer (see the gateway's client).
            tasks: TaskStoreClient::new(endpoints.taskstore).max_decoding_message_size(usize::MAX),
            hub: HubClient::new(endpoints.hub),
            bus: EventBusClient::new(endpoints.eventbus),
            // A delegation answers with the remote task, as large as it grew.
            gateway: GatewayClient::new(endpoints.gateway).max_decoding_message_size(usize::MAX),
            gateway_url: endpoints.gateway_url.trim_end_matches('/').to_owned(),
            http: webhook_client(&guard, endpoints.webhook_timeout)?,
            guard,
        })
    }
}

/// The settings that point the engine at the services its steps call.
const TASKSTORE_URL: &str = "workflow.taskstore_url";
const HUB_URL: &str = "workflow.hub_url";
const EVENTBUS_URL: &str = "workflow.eventbus_url";
const GATEWAY_URL: &str = "workflow.gateway_url";

/// A failed call: transient when retrying later may help. A service that
/// has no such method is not the one the call is for: `setting` points the
/// engine elsewhere (unset, the engine calls its own process).
fn status_error(what: &str, setting: &str, status: &Status) -> EffectError {
    let message = format!("{what}: {}", status.message());
    match status.code() {
        code if transport::cut_off(status)
            || matches!(code, Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted | Code::Unknown) =>
        {
            EffectError::Transient(message)
        }
        Code::Unimplemented => EffectError::Failed(format!(
            "{message}: the engine does not reach that service where it calls it; point {setting} at it"
        )),
        _ => EffectError::Failed(message),
    }
}

fn metadata(origin: &Origin) -> prost_types::Struct {
    let fields = json!({
        "workflow": origin.workflow,
        "run_id": origin.run_id,
        "step_id": origin.step_id,
        "iteration": origin.iteration,
        "attempt": origin.attempt,
    });
    struct_from_json(fields.as_object().cloned().unwrap_or_default())
}

fn message(origin: &Origin, input: &Value) -> ts::Message {
    ts::Message {
        message_id: origin.key.clone(),
        context_id: origin.run_id.clone(),
        role: ts::Role::User.into(),
        parts: message_parts(input),
        metadata: Some(metadata(origin)),
        ..ts::Message::default()
    }
}

#[async_trait]
impl Effects for ClientEffects {
    async fn spawn(&self, origin: &Origin, agent: &str, input: &Value) -> Result<String, EffectError> {
        let request = ts::CreateTaskRequest {
            namespace: origin.namespace.clone(),
            agent_id: agent.to_owned(),
            message: Some(message(origin, input)),
            context_id: origin.run_id.clone(),
            metadata: Some(metadata(origin)),
            idempotency_key: origin.key.clone(),
            ..ts::CreateTaskRequest::default()
        };
        let task = self
            .tasks
            .clone()
            .create_task(request)
            .await
            .map_err(|s| status_error("create task", TASKSTORE_URL, &s))?;
        Ok(task.into_inner().id)
    }

    async fn await_task(&self, namespace: &str, task_id: &str) -> Result<Option<TaskOutcome>, EffectError> {
        let request = ts::WatchTaskRequest {
            namespace: namespace.to_owned(),
            task_id: task_id.to_owned(),
            snapshot: true,
            ..ts::WatchTaskRequest::default()
        };
        let mut tasks = self.tasks.clone();
        let mut stream = match tasks.watch_task(request).await {
            Ok(stream) => stream.into_inner(),
            Err(status) if status.code() == Code::NotFound => return Ok(None),
            Err(status) => return Err(status_error("watch task", TASKSTORE_URL, &status)),
        };
        loop {
            let event = stream.message().await.map_err(|s| status_error("watch task", TASKSTORE_URL, &s))?;
            let Some(event) = event else {
                return Err(EffectError::Transient(format!("the watch of task {task_id} ended early")));
            };
            let state = match event.kind() {
                EventKind::Snapshot => event.task.as_ref().and_then(|t| t.status.as_ref()).map(|s| s.state()),
                EventKind::StatusChanged => event.status.as_ref().map(|s| s.state()),
                _ => None,
            };
            if state.is_some_and(is_terminal) {
                break;
            }
        }
        let request =
            ts::GetTaskRequest { namespace: namespace.to_owned(), id: task_id.to_owned(), history_length: Some(0) };
        let task = tasks.get_task(request).await.map_err(|s| status_error("get task", TASKSTORE_URL, &s))?.into_inner();
        Ok(Some(outcome(&task)))
    }

    async fn cancel_task(&self, namespace: &str, task_id: &str, reason: &str) -> Result<Option<String>, EffectError> {
        let request = ts::CancelTaskRequest {
            namespace: namespace.to_owned(),
            id: task_id.to_owned(),
            reason: reason.to_owned(),
        };
        match self.tasks.clone().cancel_task(request).await {
            // A task's attempts count its claims.
            Ok(canceled) => Ok(canceled.into_inner().task.filter(|task| task.attempt == 0).map(|task| task.agent_id)),
            // Already finished, or gone: nothing to cancel.
            Err(status) if matches!(status.code(), Code::FailedPrecondition | Code::NotFound) => Ok(None),
            Err(status) => Err(status_error("cancel task", TASKSTORE_URL, &status)),
        }
    }

    async fn delegate(
        &self,
        origin: &Origin,
        agent: &str,
        input: &Value,
        timeout: Option<std::time::Duration>,
    ) -> Result<Delegated, EffectError> {
        let agent_url = match agent.starts_with("http://") || agent.starts_with("https://") {
            true => agent.to_owned(),
            false => format!("{}/a2a/{agent}", self.gateway_url),
        };
        let mut sent = message(origin, input);
        sent.context_id.clear();
        let timeout = timeout.and_then(|timeout| prost_types::Duration::try_from(timeout).ok());
        let request = gw::DelegateRequest {
            agent_url,
            message: Some(sent),
            timeout,
            // A catalog agent's task is the run's namespace's.
            namespace: origin.namespace.clone(),
            ..gw::DelegateRequest::default()
        };
        let response =
            self.gateway.clone().delegate(request).await.map_err(|s| status_error("delegate", GATEWAY_URL, &s))?;
        let (task_id, outcome) = match response.into_inner().result {
            Some(gw::delegate_response::Result::Task(task)) => {
                (Some(task.id.clone()).filter(|id| !id.is_empty()), outcome(&task))
            }
            Some(gw::delegate_response::Result::Message(answer)) => {
                let task = ts::Task {
                    status: Some(ts::TaskStatus {
                        state: ts::TaskState::Completed.into(),
                        message: Some(answer),
                        timestamp: None,
                    }),
                    ..ts::Task::default()
                };
                (None, outcome(&task))
            }
            None => (None, TaskOutcome::Failed("the agent answered nothing".into())),
        };
        Ok(Delegated { task_id, outcome })
    }

    async fn message(&self, origin: &Origin, to: &Destination, note: &Note) -> Result<Value, EffectError> {
        let sender = format!("workflow:{}", origin.workflow);
        let mut body = json!({ "run_id": origin.run_id, "workflow": origin.workflow, "step_id": origin.step_id });
        if let Some(text) = &note.text {
            body["text"] = json!(text);
        }
        if !note.data.is_null() {
            body["data"] = note.data.clone();
        }
        let content = hub::Content {
            r#type: note.kind.clone(),
            payload: body.to_string().into_bytes(),
            content_type: "application/json".into(),
        };
        let sent = match to {
            Destination::Topic(topic) => {
                let request = hub::PublishRequest {
                    namespace: origin.namespace.clone(),
                    topic: topic.clone(),
                    sender,
                    content: Some(content),
                    idempotency_key: origin.key.clone(),
                    ..hub::PublishRequest::default()
                };
                self.hub.clone().publish(request).await.map_err(|s| status_error("hub publish", HUB_URL, &s))?
            }
            Destination::Agent(agent) => {
                let request = hub::SendDirectRequest {
                    namespace: origin.namespace.clone(),
                    sender,
                    recipient: agent.clone(),
                    content: Some(content),
                    idempotency_key: origin.key.clone(),
                    ..hub::SendDirectRequest::default()
                };
                self.hub.clone().send_direct(request).await.map_err(|s| status_error("hub send", HUB_URL, &s))?
            }
            Destination::Webhook(url) => return self.webhook(origin, url, &body, &note.kind).await,
            Destination::Event(event_type) => {
                return Ok(json!({ "sequence": self.publish(origin, event_type, &body).await? }));
            }
        };
        let sent = sent.into_inner();
        Ok(json!({ "message_id": sent.message_id, "recipients": sent.recipients }))
    }

    async fn publish(&self, origin: &Origin, event_type: &str, payload: &Value) -> Result<u64, EffectError> {
        let request = bus::PublishRequest {
            namespace: origin.namespace.clone(),
            event: Some(bus::NewEvent {
                r#type: event_type.to_owned(),
                source: "workflow".into(),
                subject: origin.run_id.clone(),
                payload: payload.to_string().into_bytes(),
                content_type: "application/json".into(),
                idempotency_key: origin.key.clone(),
                ..bus::NewEvent::default()
            }),
        };
        let published =
            self.bus.clone().publish(request).await.map_err(|s| status_error("publish event", EVENTBUS_URL, &s))?;
        Ok(published.into_inner().sequence)
    }
}

impl ClientEffects {
    /// POSTs the message as JSON with an `Idempotency-Key` header. The client
    /// follows no redirect and connects only to addresses its resolver vetted.
    async fn webhook(
        &self,
        origin: &Origin,
        url: &str,
        body: &Value,
        message_type: &str,
    ) -> Result<Value, EffectError> {
        let refused = |why: String| EffectError::Refused(format!("webhook {url}: {why}"));
        let parsed = reqwest::Url::parse(url).map_err(|e| refused(e.to_string()))?;
        parsed.host_str().ok_or_else(|| refused("no host".into()))?;
        self.guard.vet_url(&parsed).map_err(|why| refused(why.to_string()))?;
        let mut body = body.clone();
        body["type"] = json!(message_type);
        let response =
            self.http.post(parsed.clone()).header("Idempotency-Key", &origin.key).json(&body).send().await.map_err(
                |error| match egress::refusal(&error) {
                    Some(why) => refused(why.to_string()),
                    None => {
                        EffectError::Transient(format!("webhook {url}: {}", chorus_runtime::error::with_causes(&error)))
                    }
                },
            )?;
        let status = response.status();
        egress::drain(response).await;
        if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
            return Err(EffectError::Transient(format!("webhook {url} answered {status}")));
        }
        if !status.is_success() {
            return Err(refused(format!("answered {status}")));
        }
        Ok(json!({ "status": status.as_u16() }))
    }
}

/// The webhook client: no redirects, no proxy, and the egress guard.
fn webhook_client(guard: &EgressGuard, timeout: Duration) -> Result<reqwest::Client, EffectError> {
    let builder = guard.client_builder().timeout(timeout).redirect(reqwest::redirect::Policy::none()).no_proxy();
    builder.build().map_err(|error| EffectError::Failed(format!("cannot build the webhook client: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_without_the_method_names_the_setting_that_points_at_the_right_one() {
        let status = Status::unimplemented("no such method: /chorus.taskstore.v1.TaskStore/CreateTask");
        let EffectError::Failed(message) = status_error("create task", TASKSTORE_URL, &status) else {
            panic!("a lasting failure");
        };
        assert!(message.starts_with("create task: no such method"), "{message}");
        assert!(message.ends_with("point workflow.taskstore_url at it"), "{message}");
        let down = status_error("hub publish", HUB_URL, &Status::unavailable("tcp connect error"));
        assert!(matches!(down, EffectError::Transient(_)), "an outage is waited out: {down:?}");
        let mut cut = Status::internal("h2 protocol error: frame with invalid size");
        cut.set_source(std::sync::Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        let cut = status_error("create task", TASKSTORE_URL, &cut);
        assert!(matches!(cut, EffectError::Transient(_)), "so is a connection cut under the call: {cut:?}");
        let refused = status_error("create task", TASKSTORE_URL, &Status::internal("a storage error"));
        assert!(matches!(refused, EffectError::Failed(_)), "the service's own error is not: {refused:?}");
    }
}
