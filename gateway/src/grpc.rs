//! The gRPC binding (spec §10): `lf.a2a.v1.A2AService` from the official
//! `a2a-pb` crate, converted to and from the A2A model at the edge.

use a2a_pb::{
    pbconv as pbc,
    proto::{self as pb, a2a_service_server::A2aServiceServer},
};
use futures_util::StreamExt as _;
use tonic::{Request, Response, Status, metadata::MetadataMap};

use crate::{
    auth::Scope,
    config::AgentConfig,
    error::{GatewayError, Result},
    http::{SPEAKS_1_0, Version, parse_version},
    service::{self, EventStream, Gateway},
};

/// `lf.a2a.v1.A2AService` over a [`Gateway`].
#[derive(Debug, Clone)]
pub struct A2aGrpc {
    gateway: Gateway,
}

type GrpcStream = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<pb::StreamResponse, Status>> + Send>>;

impl A2aGrpc {
    pub fn new(gateway: Gateway) -> Self {
        Self { gateway }
    }

    pub fn into_server(self, max_message_bytes: usize) -> A2aServiceServer<Self> {
        A2aServiceServer::new(self).max_decoding_message_size(max_message_bytes)
    }

    /// Authenticates the call and resolves its tenant, and the agent it is
    /// for: the one the tenant names, else the default one.
    fn scope(&self, metadata: &MetadataMap, tenant: &str) -> Result<(Scope, &AgentConfig)> {
        let version = metadata.get("a2a-version").map(|value| value.to_str().unwrap_or("<not ASCII>"));
        if let Some(requested) = version
            && parse_version(requested.trim(), SPEAKS_1_0)? == Version::V03
            && !requested.trim().is_empty()
        {
            return Err(GatewayError::VersionNotSupported(requested.to_owned(), SPEAKS_1_0));
        }
        let principal =
            self.gateway.auth().authenticate(|name| metadata.get(name).and_then(|value| value.to_str().ok()))?;
        let scope = self.gateway.auth().scope(&principal, tenant)?;
        let agent = self.gateway.agent(None, &scope)?;
        Ok((scope, agent))
    }
}

/// What ProtoJSON refuses and the proto types let through: a part without
/// content (the A2A model would take it as an empty text).
fn check_parts(message: Option<&pb::Message>) -> Result<()> {
    let Some(message) = message else {
        return Err(GatewayError::InvalidParams("message is required".to_owned()));
    };
    match message.parts.iter().position(|part| part.content.is_none()) {
        Some(index) => Err(GatewayError::InvalidParams(format!(
            "message.parts[{index}]: a part holds exactly one of text, raw, url and data"
        ))),
        None => Ok(()),
    }
}

fn stream(events: EventStream) -> Response<GrpcStream> {
    let events = events.map(|event| event.map(|event| pbc::to_proto_stream_response(&event)).map_err(Status::from));
    Response::new(Box::pin(events))
}

#[tonic::async_trait]
impl pb::a2a_service_server::A2aService for A2aGrpc {
    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        check_parts(request.get_ref().message.as_ref())?;
        let request = pbc::from_proto_send_message_request(request.get_ref());
        let response = self.gateway.send(&scope, agent, request).await?;
        Ok(Response::new(pbc::to_proto_send_message_response(&response)))
    }

    type SendStreamingMessageStream = GrpcStream;

    async fn send_streaming_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<Self::SendStreamingMessageStream>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        check_parts(request.get_ref().message.as_ref())?;
        let request = pbc::from_proto_send_message_request(request.get_ref());
        Ok(stream(self.gateway.send_streaming(&scope, agent, request).await?))
    }

    async fn get_task(&self, request: Request<pb::GetTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let request = request.into_inner();
        let task =
            self.gateway.get_task(&scope, agent, &request.id, service::history_length(request.history_length)?).await?;
        Ok(Response::new(pbc::to_proto_task(&task)))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let status = request.get_ref().status;
        if pb::TaskState::try_from(status).is_err() {
            return Err(GatewayError::InvalidParams(format!("status {status} is not a task state")).into());
        }
        // An explicit page size is checked as the other bindings check it;
        // the conversion would read a non-positive one as unset.
        let page_size = request.get_ref().page_size;
        let request = a2a::ListTasksRequest { page_size, ..pbc::from_proto_list_tasks_request(request.get_ref()) };
        let response = self.gateway.list_tasks(&scope, agent, request).await?;
        Ok(Response::new(pbc::to_proto_list_tasks_response(&response)))
    }

    async fn cancel_task(&self, request: Request<pb::CancelTaskRequest>) -> Result<Response<pb::Task>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let task = self.gateway.cancel_task(&scope, agent, &request.get_ref().id).await?;
        Ok(Response::new(pbc::to_proto_task(&task)))
    }

    type SubscribeToTaskStream = GrpcStream;

    async fn subscribe_to_task(
        &self,
        request: Request<pb::SubscribeToTaskRequest>,
    ) -> Result<Response<Self::SubscribeToTaskStream>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        Ok(stream(self.gateway.subscribe(&scope, agent, &request.get_ref().id).await?))
    }

    async fn create_task_push_notification_config(
        &self,
        request: Request<pb::TaskPushNotificationConfig>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let config = pbc::from_proto_create_task_push_notification_config_request(request.get_ref());
        let created = self.gateway.create_push_config(&scope, agent, config).await?;
        Ok(Response::new(pbc::to_proto_task_push_notification_config(&created)))
    }

    async fn get_task_push_notification_config(
        &self,
        request: Request<pb::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<pb::TaskPushNotificationConfig>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let request = request.into_inner();
        let config = self.gateway.get_push_config(&scope, agent, &request.task_id, &request.id).await?;
        Ok(Response::new(pbc::to_proto_task_push_notification_config(&config)))
    }

    async fn list_task_push_notification_configs(
        &self,
        request: Request<pb::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<pb::ListTaskPushNotificationConfigsResponse>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let request = request.into_inner();
        let page_token = Some(request.page_token.as_str()).filter(|token| !token.is_empty());
        let page_size = Some(request.page_size);
        let (configs, next_page_token) =
            self.gateway.list_push_configs(&scope, agent, &request.task_id, page_size, page_token).await?;
        Ok(Response::new(pb::ListTaskPushNotificationConfigsResponse {
            configs: configs.iter().map(pbc::to_proto_task_push_notification_config).collect(),
            next_page_token,
        }))
    }

    async fn get_extended_agent_card(
        &self,
        request: Request<pb::GetExtendedAgentCardRequest>,
    ) -> Result<Response<pb::AgentCard>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        let card = self.gateway.extended_card(&scope, &agent.id)?;
        Ok(Response::new(pbc::to_proto_agent_card(&card)))
    }

    async fn delete_task_push_notification_config(
        &self,
        request: Request<pb::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let (scope, agent) = self.scope(request.metadata(), &request.get_ref().tenant)?;
        self.gateway.delete_push_config(&scope, agent, &request.get_ref().task_id, &request.get_ref().id).await?;
        Ok(Response::new(()))
    }
}
