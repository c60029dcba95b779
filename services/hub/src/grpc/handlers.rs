//! The gRPC handlers: validate and convert the request, call the service,
//! convert the answer. No logic of their own.

use std::time::Duration;

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use chorus_proto::hub::{self as pb, hub_server::HubServer};
use chorus_runtime::{
    grpc::{ResponseStream, namespace, stream_of},
    server::ServerConfig,
    time::{now_micros, timestamp},
    validate::{self, FieldViolation},
};
use tonic::{Request, Response, Status};

use super::convert;
use crate::{
    domain::{AgentQuery, Audience, InboxFilter, MessageKind, Outgoing, Sent, StateWrite},
    service::{Delegation, Hub, Inbox, Receive, TimeoutPolicy},
};

const DEFAULT_RECEIVE: u32 = 100;
const MAX_RECEIVE: u32 = 100;
const DEFAULT_IN_FLIGHT: u32 = 10;
const MAX_IN_FLIGHT: u32 = 1000;
const DEFAULT_DELEGATE_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_RETRIES: u32 = 3;
/// The most retries a delegation may ask for.
const MAX_RETRIES: u32 = 100;
const MAX_ACK: usize = 1000;

/// The `chorus.hub.v1.Hub` service over a [`Hub`].
#[derive(Debug, Clone)]
pub struct HubGrpc {
    hub: Hub,
    /// The most bytes a message may have, which the messages of one receive
    /// keep under, so that a client with the same limit reads them.
    max_message_bytes: usize,
}

impl HubGrpc {
    pub fn new(hub: Hub) -> Self {
        Self { hub, max_message_bytes: ServerConfig::default().max_message_bytes }
    }

    /// The tonic server, accepting requests up to `max_message_bytes` and
    /// keeping each receive's messages under it.
    pub fn into_server(self, max_message_bytes: usize) -> HubServer<Self> {
        HubServer::new(Self { max_message_bytes, ..self }).max_decoding_message_size(max_message_bytes)
    }
}

fn sent(value: Sent, confirmed: bool) -> pb::SendResponse {
    pb::SendResponse {
        message_id: value.message_id,
        sequence: u64::try_from(value.sequence).unwrap_or_default(),
        recipients: value.recipients,
        expires_at: Some(timestamp(value.expires_at)),
        duplicate: value.duplicate,
        confirmed,
    }
}

impl HubGrpc {
    fn stale_after(&self, value: Option<prost_types::Duration>) -> Result<Duration, FieldViolation> {
        validate::nonzero_duration("stale_after", value, self.hub.config().stale_after())
    }

    fn agent_out(&self, agent: crate::domain::Agent, stale_after: Duration) -> pb::Agent {
        let status = agent.status(now_micros(), stale_after);
        convert::agent_out(agent, status)
    }
}

#[tonic::async_trait]
impl pb::hub_server::Hub for HubGrpc {
    async fn subscribe(&self, request: Request<pb::SubscribeRequest>) -> Result<Response<pb::Subscription>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let agent_id = validate::id("agent_id", &request.agent_id)?;
        let topic = convert::name("topic", &request.topic)?;
        let subscription = self.hub.subscribe(&namespace, &agent_id, &topic).await?;
        Ok(Response::new(convert::subscription(subscription)))
    }

    async fn unsubscribe(
        &self,
        request: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let agent_id = validate::id("agent_id", &request.agent_id)?;
        self.hub.unsubscribe(&namespace, &agent_id, &convert::name("topic", &request.topic)?).await?;
        Ok(Response::new(pb::UnsubscribeResponse {}))
    }

    async fn list_subscriptions(
        &self,
        request: Request<pb::ListSubscriptionsRequest>,
    ) -> Result<Response<pb::ListSubscriptionsResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let agent_id = validate::optional_id("agent_id", &request.agent_id)?;
        let topic = convert::optional_name("topic", &request.topic)?;
        if agent_id.is_none() && topic.is_none() {
            return Err(FieldViolation::new("agent_id", "agent_id or topic is required").into());
        }
        let subscriptions = self.hub.subscriptions(&namespace, agent_id.as_deref(), topic.as_deref()).await?;
        Ok(Response::new(pb::ListSubscriptionsResponse {
            subscriptions: subscriptions.into_iter().map(convert::subscription).collect(),
        }))
    }

    async fn publish(&self, request: Request<pb::PublishRequest>) -> Result<Response<pb::SendResponse>, Status> {
        let request = request.into_inner();
        let config = self.hub.config();
        let send = Outgoing {
            namespace: namespace(&request.namespace)?,
            sender: validate::id("sender", &request.sender)?,
            audience: Audience::Topic(convert::name("topic", &request.topic)?),
            kind: MessageKind::Topic,
            content: convert::content("content", request.content, config)?,
            correlation_id: convert::optional_text("correlation_id", request.correlation_id)?,
            ttl: convert::ttl("ttl", request.ttl, config)?,
            idempotency_key: convert::optional_text("idempotency_key", request.idempotency_key)?,
        };
        Ok(Response::new(sent(self.hub.send(send).await?, false)))
    }

    type StreamInboxStream = ResponseStream<pb::Message>;

    async fn stream_inbox(
        &self,
        request: Request<pb::StreamInboxRequest>,
    ) -> Result<Response<Self::StreamInboxStream>, Status> {
        let request = request.into_inner();
        let inbox = Inbox {
            namespace: namespace(&request.namespace)?,
            agent_id: validate::id("agent_id", &request.agent_id)?,
            consumer_id: validate::id("consumer_id", &request.consumer_id)?,
            filter: InboxFilter {
                kinds: convert::kinds("kinds", &request.kinds)?,
                topics: convert::names("topics", &request.topics)?,
                ..InboxFilter::default()
            },
            ack_timeout: convert::ack_timeout(request.ack_timeout, self.hub.config())?,
            max_in_flight: validate::count("max_in_flight", request.max_in_flight, DEFAULT_IN_FLIGHT, MAX_IN_FLIGHT)?,
            after: request
                .after_sequence
                .map(|after| i64::try_from(after).map_err(|_| FieldViolation::new("after_sequence", "is out of range")))
                .transpose()?,
        };
        let messages = self.hub.stream_inbox(inbox).await?;
        Ok(Response::new(stream_of(messages, convert::message)))
    }

    async fn send_direct(&self, request: Request<pb::SendDirectRequest>) -> Result<Response<pb::SendResponse>, Status> {
        let request = request.into_inner();
        let config = self.hub.config();
        let send = Outgoing {
            namespace: namespace(&request.namespace)?,
            sender: validate::id("sender", &request.sender)?,
            audience: Audience::Agent(validate::id("recipient", &request.recipient)?),
            kind: MessageKind::Direct,
            content: convert::content("content", request.content, config)?,
            correlation_id: convert::optional_text("correlation_id", request.correlation_id)?,
            ttl: convert::ttl("ttl", request.ttl, config)?,
            idempotency_key: convert::optional_text("idempotency_key", request.idempotency_key)?,
        };
        let confirm = validate::duration("confirm_timeout", request.confirm_timeout, Duration::ZERO)?;
        if confirm.is_zero() {
            return Ok(Response::new(sent(self.hub.send(send).await?, false)));
        }
        let (outcome, confirmed) = self.hub.send_confirmed(send, confirm).await?;
        Ok(Response::new(sent(outcome, confirmed)))
    }

    async fn receive(&self, request: Request<pb::ReceiveRequest>) -> Result<Response<pb::ReceiveResponse>, Status> {
        let request = request.into_inner();
        validate::filter_len("senders", request.senders.len())?;
        let senders = convert::agent_ids("senders", &request.senders)?;
        if request.require_all && senders.is_empty() {
            return Err(FieldViolation::new("senders", "require_all needs the senders to wait for").into());
        }
        let receive = Receive {
            namespace: namespace(&request.namespace)?,
            agent_id: validate::id("agent_id", &request.agent_id)?,
            filter: InboxFilter {
                senders,
                types: convert::names("types", &request.types)?,
                kinds: convert::kinds("kinds", &request.kinds)?,
                topics: Vec::new(),
            },
            require_all: request.require_all,
            max: validate::count("max_messages", request.max_messages, DEFAULT_RECEIVE, MAX_RECEIVE)?,
            max_bytes: self.max_message_bytes,
            timeout: validate::duration("timeout", request.timeout, Duration::ZERO)?,
            ack_timeout: convert::ack_timeout(request.ack_timeout, self.hub.config())?,
        };
        let received = self.hub.receive(receive).await?;
        Ok(Response::new(pb::ReceiveResponse {
            messages: received.messages.into_iter().map(convert::message).collect(),
            timed_out: received.timed_out,
            missing_senders: received.missing_senders,
        }))
    }

    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let agent_id = validate::id("agent_id", &request.agent_id)?;
        if request.message_ids.is_empty() || request.message_ids.len() > MAX_ACK {
            return Err(FieldViolation::new("message_ids", format!("must hold 1-{MAX_ACK} ids")).into());
        }
        let ids = convert::agent_ids("message_ids", &request.message_ids)?;
        let unknown_ids = self.hub.ack(&namespace, &agent_id, &ids).await?;
        Ok(Response::new(pb::AckResponse { unknown_ids }))
    }

    async fn delegate(&self, request: Request<pb::DelegateRequest>) -> Result<Response<pb::DelegateResponse>, Status> {
        let request = request.into_inner();
        validate::count("max_retries", request.max_retries, 0, MAX_RETRIES)?;
        let on_timeout = match pb::TimeoutPolicy::try_from(request.on_timeout) {
            Ok(pb::TimeoutPolicy::Unspecified | pb::TimeoutPolicy::Raise) => TimeoutPolicy::Raise,
            Ok(pb::TimeoutPolicy::Fallback) => TimeoutPolicy::Fallback,
            Ok(pb::TimeoutPolicy::Retry) => TimeoutPolicy::Retry {
                max_retries: if request.max_retries == 0 { DEFAULT_RETRIES } else { request.max_retries },
            },
            Err(_) => return Err(FieldViolation::new("on_timeout", "unknown policy").into()),
        };
        let config = self.hub.config();
        let delegation = Delegation {
            namespace: namespace(&request.namespace)?,
            sender: validate::id("sender", &request.sender)?,
            recipient: validate::id("recipient", &request.recipient)?,
            content: convert::content("content", request.content, config)?,
            timeout: validate::nonzero_duration("timeout", request.timeout, DEFAULT_DELEGATE_TIMEOUT)?,
            on_timeout,
        };
        if delegation.timeout > config.max_ttl() {
            return Err(FieldViolation::new("timeout", "must not exceed the maximum TTL").into());
        }
        let delegated = self.hub.delegate(delegation).await?;
        Ok(Response::new(pb::DelegateResponse {
            correlation_id: delegated.correlation_id,
            timed_out: delegated.reply.is_none(),
            reply: delegated.reply.map(convert::message),
            attempts: delegated.attempts,
        }))
    }

    async fn reply(&self, request: Request<pb::ReplyRequest>) -> Result<Response<pb::ReplyResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let sender = validate::id("sender", &request.sender)?;
        let correlation_id = convert::name("correlation_id", &request.correlation_id)?;
        let content = convert::content("content", request.content, self.hub.config())?;
        let reply = self.hub.reply(&namespace, &sender, &correlation_id, content).await?;
        Ok(Response::new(pb::ReplyResponse { message_id: reply.id }))
    }

    async fn broadcast(&self, request: Request<pb::BroadcastRequest>) -> Result<Response<pb::SendResponse>, Status> {
        let request = request.into_inner();
        let config = self.hub.config();
        let send = Outgoing {
            namespace: namespace(&request.namespace)?,
            sender: validate::id("sender", &request.sender)?,
            audience: Audience::Everyone { agent_type: convert::optional_name("agent_type", &request.agent_type)? },
            kind: MessageKind::Broadcast,
            content: convert::content("content", request.content, config)?,
            correlation_id: convert::optional_text("correlation_id", request.correlation_id)?,
            ttl: convert::ttl("ttl", request.ttl, config)?,
            idempotency_key: convert::optional_text("idempotency_key", request.idempotency_key)?,
        };
        Ok(Response::new(sent(self.hub.send(send).await?, false)))
    }

    async fn get_state(&self, request: Request<pb::GetStateRequest>) -> Result<Response<pb::StateEntry>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let entry = self.hub.get_state(&namespace, &convert::name("key", &request.key)?).await?;
        Ok(Response::new(convert::state_entry(entry)))
    }

    async fn set_state(&self, request: Request<pb::SetStateRequest>) -> Result<Response<pb::StateEntry>, Status> {
        let request = request.into_inner();
        let config = self.hub.config();
        if request.value.len() > config.max_payload_bytes {
            return Err(
                FieldViolation::new("value", format!("must be at most {} bytes", config.max_payload_bytes)).into()
            );
        }
        let content_type = convert::content_type("content_type", request.content_type)?;
        if request.value.is_empty() && validate::is_json(&content_type) {
            return Err(FieldViolation::new("value", "must be JSON (or give another content_type)").into());
        }
        validate::json_payload("value", &content_type, &request.value)?;
        let write = StateWrite {
            namespace: namespace(&request.namespace)?,
            key: convert::name("key", &request.key)?,
            value: Some((request.value, content_type)),
            expected_version: request.expected_version.map(|v| convert::version("expected_version", v)).transpose()?,
            ttl: convert::state_ttl(request.ttl, config)?,
            updated_by: validate::optional_id("updated_by", &request.updated_by)?.unwrap_or_default(),
        };
        Ok(Response::new(convert::state_entry(self.hub.write_state(write).await?)))
    }

    async fn delete_state(
        &self,
        request: Request<pb::DeleteStateRequest>,
    ) -> Result<Response<pb::DeleteStateResponse>, Status> {
        let request = request.into_inner();
        let write = StateWrite {
            namespace: namespace(&request.namespace)?,
            key: convert::name("key", &request.key)?,
            value: None,
            expected_version: request.expected_version.map(|v| convert::version("expected_version", v)).transpose()?,
            ttl: None,
            updated_by: validate::optional_id("updated_by", &request.updated_by)?.unwrap_or_default(),
        };
        let entry = self.hub.write_state(write).await?;
        Ok(Response::new(pb::DeleteStateResponse { version: u64::try_from(entry.version).unwrap_or_default() }))
    }

    async fn list_state(
        &self,
        request: Request<pb::ListStateRequest>,
    ) -> Result<Response<pb::ListStateResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let size = validate::count("page_size", request.page_size, 100, 1000)?;
        let after =
            match request.page_token.as_str() {
                "" => None,
                token => Some(
                    URL_SAFE_NO_PAD.decode(token).ok().and_then(|bytes| String::from_utf8(bytes).ok()).ok_or_else(
                        || FieldViolation::new("page_token", "is not a page token this service handed out"),
                    )?,
                ),
            };
        let entries = self.hub.list_state(&namespace, &request.prefix, after.as_deref(), size).await?;
        let next_page_token = match entries.last() {
            Some(last) if entries.len() >= size as usize => URL_SAFE_NO_PAD.encode(&last.key),
            _ => String::new(),
        };
        Ok(Response::new(pb::ListStateResponse {
            entries: entries.into_iter().map(convert::state_entry).collect(),
            next_page_token,
        }))
    }

    type WatchStateStream = ResponseStream<pb::StateChange>;

    async fn watch_state(
        &self,
        request: Request<pb::WatchStateRequest>,
    ) -> Result<Response<Self::WatchStateStream>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let key = convert::name("key", &request.key)?;
        let after = convert::version("after_version", request.after_version)?;
        let changes = self.hub.watch_state(&namespace, &key, after);
        Ok(Response::new(stream_of(changes, convert::state_change)))
    }

    async fn register_agent(&self, request: Request<pb::RegisterAgentRequest>) -> Result<Response<pb::Agent>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let agent = self.hub.register_agent(convert::agent(request, namespace)?).await?;
        Ok(Response::new(self.agent_out(agent, self.hub.config().stale_after())))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let agent = self.hub.heartbeat(&namespace, &validate::id("agent_id", &request.agent_id)?).await?;
        Ok(Response::new(pb::HeartbeatResponse { last_seen_at: Some(timestamp(agent.last_seen_at)) }))
    }

    async fn deregister_agent(
        &self,
        request: Request<pb::DeregisterAgentRequest>,
    ) -> Result<Response<pb::DeregisterAgentResponse>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        self.hub.deregister_agent(&namespace, &validate::id("agent_id", &request.agent_id)?).await?;
        Ok(Response::new(pb::DeregisterAgentResponse {}))
    }

    async fn get_agent(&self, request: Request<pb::GetAgentRequest>) -> Result<Response<pb::Agent>, Status> {
        let request = request.into_inner();
        let namespace = namespace(&request.namespace)?;
        let stale_after = self.stale_after(request.stale_after)?;
        let agent = self.hub.get_agent(&namespace, &validate::id("agent_id", &request.agent_id)?).await?;
        Ok(Response::new(self.agent_out(agent, stale_after)))
    }

    async fn discover(&self, request: Request<pb::DiscoverRequest>) -> Result<Response<pb::DiscoverResponse>, Status> {
        let request = request.into_inner();
        let query = AgentQuery {
            namespace: namespace(&request.namespace)?,
            capabilities: convert::names("capabilities", &request.capabilities)?,
            agent_type: convert::optional_name("agent_type", &request.agent_type)?,
            status: convert::agent_status(request.status)?,
            stale_after: self.stale_after(request.stale_after)?,
            mode: convert::discovery_mode(request.mode)?,
        };
        let agents = self.hub.discover(&query).await?;
        Ok(Response::new(pb::DiscoverResponse {
            agents: agents.into_iter().map(|agent| self.agent_out(agent, query.stale_after)).collect(),
        }))
    }
}
