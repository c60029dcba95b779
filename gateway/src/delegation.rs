//! `chorus.gateway.v1.Gateway/Delegate`: chorus agents (and the workflow
//! engine) delegate a task to an external A2A agent through the gateway.

use std::time::Duration;

use chorus_proto::gateway::{self as pb, delegate_response::Result as Outcome, gateway_server::GatewayServer};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{
    convert,
    delegate::{A2aClient, Credentials, DelegateOutcome, DelegateTarget},
    error::GatewayError,
};

/// The `Gateway` gRPC service.
#[derive(Debug, Clone)]
pub struct DelegateGrpc {
    client: A2aClient,
    default_timeout: Duration,
    own: OwnAgents,
}

/// This gateway's own agents. A delegation to one of them (a workflow's
/// delegate step naming a catalog agent) acts in the caller's namespace, and,
/// where the gateway checks credentials and it brings none, carries the
/// gateway's internal credential: whoever may call Delegate may act in every
/// namespace already.
#[derive(Clone)]
pub(crate) struct OwnAgents {
    /// `{base}/a2a/` of each URL the gateway answers at.
    prefixes: Vec<String>,
    /// `None`: the gateway checks no credentials.
    secret: Option<String>,
}

impl OwnAgents {
    pub(crate) fn new(base_urls: &[&str], secret: Option<String>) -> Self {
        let prefixes = base_urls.iter().map(|base| format!("{}/a2a/", base.trim_end_matches('/'))).collect();
        Self { prefixes, secret }
    }

    fn holds(&self, agent_url: &str) -> bool {
        self.prefixes.iter().any(|prefix| agent_url.starts_with(prefix.as_str()))
    }
}

impl std::fmt::Debug for OwnAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnAgents").field("prefixes", &self.prefixes).finish_non_exhaustive()
    }
}

impl DelegateGrpc {
    pub(crate) fn new(client: A2aClient, default_timeout: Duration, own: OwnAgents) -> Self {
        Self { client, default_timeout, own }
    }

    pub fn into_server(self, max_message_bytes: usize) -> GatewayServer<Self> {
        GatewayServer::new(self).max_decoding_message_size(max_message_bytes)
    }
}

fn invalid(message: &str) -> Status {
    GatewayError::InvalidParams(message.to_owned()).into()
}

#[tonic::async_trait]
impl pb::gateway_server::Gateway for DelegateGrpc {
    async fn delegate(&self, request: Request<pb::DelegateRequest>) -> Result<Response<pb::DelegateResponse>, Status> {
        let request = request.into_inner();
        if request.agent_url.is_empty() {
            return Err(invalid("agent_url is required"));
        }
        let mut message = convert::message_out(request.message.ok_or_else(|| invalid("message is required"))?);
        if message.parts.is_empty() {
            return Err(invalid("message.parts must not be empty"));
        }
        if message.message_id.is_empty() {
            message.message_id = a2a::new_message_id();
        }
        if message.role == a2a::Role::Unspecified {
            message.role = a2a::Role::User;
        }
        let timeout = match request.timeout {
            Some(timeout) => Duration::try_from(timeout).map_err(|_| invalid("timeout must not be negative"))?,
            None => self.default_timeout,
        };
        let own = self.own.holds(&request.agent_url);
        let credentials = match (request.bearer_token.is_empty(), request.api_key.is_empty()) {
            (false, _) => Some(Credentials::Bearer(request.bearer_token)),
            (true, false) => Some(Credentials::ApiKey {
                header: if request.api_key_header.is_empty() { "X-API-Key".to_owned() } else { request.api_key_header },
                value: request.api_key,
            }),
            (true, true) if own => self.own.secret.clone().map(Credentials::Bearer),
            (true, true) => None,
        };
        let mut target = DelegateTarget::new(request.agent_url);
        if own && !request.namespace.is_empty() {
            let namespace = chorus_runtime::validate::namespace(&request.namespace)
                .map_err(|violation| invalid(&format!("namespace {}", violation.reason)))?;
            target.tenant = Some(namespace);
        }
        // A caller that goes away (its deadline, a workflow step's timeout,
        // its run canceled) drops this call; the remote task is then asked
        // to cancel rather than left running for nobody.
        let abandoned = CancellationToken::new();
        let _on_drop = abandoned.clone().drop_guard();
        let client = self.client.clone();
        let delegation = tokio::spawn(async move {
            client.delegate_until(&target, message, timeout, credentials.as_ref(), &abandoned, None).await
        });
        let outcome = delegation
            .await
            .map_err(|error| GatewayError::Internal(format!("the delegation stopped: {error}")))?
            .map_err(GatewayError::from)?;
        let result = match outcome {
            DelegateOutcome::Task(task) => Outcome::Task(convert::task_in(&task)),
            DelegateOutcome::Message(message) => Outcome::Message(convert::message_in(&message)),
        };
        Ok(Response::new(pb::DelegateResponse { result: Some(result) }))
    }
}
