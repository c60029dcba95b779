//! [`A2aClient`]: agent-card discovery and the four A2A 1.0 calls the gateway
//! makes, on the JSON-RPC and HTTP+JSON bindings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use a2a::{
    AgentCard, CancelTaskRequest, GetTaskRequest, JsonRpcId, JsonRpcResponse, ListTasksRequest, ListTasksResponse,
    SendMessageRequest, SendMessageResponse, StreamResponse, SubscribeToTaskRequest, Task, methods,
};
use chorus_runtime::egress::EgressGuard;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt, TryStreamExt, future, stream};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;

use super::sse;
use super::wire::{self, A2A_JSON, EVENT_STREAM, JSON};
use super::{Binding, Credentials, DEFAULT_CARD_TTL, DEFAULT_POLL_INITIAL, DEFAULT_POLL_MAX, DelegateError, Endpoint};

/// What an HTTP+JSON call accepts: the v1.0.1 media type, and plain JSON.
const REST_ACCEPT: &str = "application/a2a+json, application/json";

/// The well-known path of an agent card (spec §8.2).
const CARD_PATH: &str = ".well-known/agent-card.json";

/// Client for external A2A 1.0 agents. Cheap to clone; clones share the
/// agent-card cache.
#[derive(Debug, Clone)]
pub(crate) struct A2aClient {
    http: reqwest::Client,
    /// The SSRF guard of the URLs called, when they are vetted.
    guard: Option<Arc<Guard>>,
    cards: Arc<Mutex<HashMap<String, CachedCard>>>,
    card_ttl: Duration,
    pub(super) poll_initial: Duration,
    pub(super) poll_max: Duration,
}

/// What [`A2aClient::guarded`] vets URLs with.
#[derive(Debug)]
struct Guard {
    egress: EgressGuard,
    /// The gateway's own origins (`scheme://host:port`), called unvetted.
    own: Vec<String>,
}

#[derive(Debug)]
struct CachedCard {
    fetched: Instant,
    card: Arc<AgentCard>,
}

/// One operation on both bindings.
struct Call {
    /// The JSON-RPC method.
    method: &'static str,
    /// The HTTP+JSON verb.
    verb: Method,
    /// The HTTP+JSON path below the interface URL (and tenant).
    path: Vec<String>,
    /// The HTTP+JSON query; a `GET` carries its parameters there.
    query: Vec<(&'static str, String)>,
}

/// A JSON-RPC 2.0 request whose `params` is an A2A request message.
#[derive(Serialize)]
struct RpcRequest<'a, P> {
    jsonrpc: &'static str,
    id: &'a JsonRpcId,
    method: &'static str,
    params: &'a P,
}

/// A request ready to send, and the JSON-RPC id it carries.
struct Prepared {
    builder: RequestBuilder,
    id: Option<JsonRpcId>,
}

impl A2aClient {
    /// A client sending through `http` (whose TLS provider the caller installs).
    pub(crate) fn new(http: reqwest::Client) -> Self {
        Self {
            http,
            guard: None,
            cards: Arc::default(),
            card_ttl: DEFAULT_CARD_TTL,
            poll_initial: DEFAULT_POLL_INITIAL,
            poll_max: DEFAULT_POLL_MAX,
        }
    }

    /// Vets the IP-literal host of every URL it calls with `egress`, but the
    /// gateway's `own` base URLs. Its HTTP client must resolve names through
    /// `egress` too ([`EgressGuard::client_builder`]).
    pub(crate) fn guarded(mut self, egress: EgressGuard, own: &[&str]) -> Self {
        let own = own.iter().filter_map(|url| Some(Url::parse(url).ok()?.origin().ascii_serialization())).collect();
        self.guard = Some(Arc::new(Guard { egress, own }));
        self
    }

    /// `url`, if the guard lets it be called.
    fn vetted(&self, url: Url) -> Result<Url, DelegateError> {
        let Some(guard) = &self.guard else { return Ok(url) };
        if guard.own.contains(&url.origin().ascii_serialization()) {
            return Ok(url);
        }
        match guard.egress.vet_url(&url) {
            Ok(()) => Ok(url),
            Err(refused) => Err(DelegateError::Refused { url: url.to_string(), reason: refused.to_string() }),
        }
    }

    /// How long [`A2aClient::delegate`] reuses a fetched agent card (default 60 s).
    pub(crate) fn with_card_ttl(mut self, ttl: Duration) -> Self {
        self.card_ttl = ttl;
        self
    }

    /// The `GetTask` polling interval of [`A2aClient::delegate`]: starts at
    /// `initial`, doubles after each poll, capped at `max` (default 250 ms to 5 s).
    pub(crate) fn with_poll_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.poll_initial = initial;
        self.poll_max = max.max(initial);
        self
    }

    /// Fetches the agent card at `{base_url}/.well-known/agent-card.json`, or
    /// at `base_url` itself when it already names an `agent-card.json`.
    pub(crate) async fn fetch_card(&self, base_url: &str) -> Result<AgentCard, DelegateError> {
        let url = card_url(base_url);
        let builder = self.http.get(self.vetted(wire::parse_url(&url)?)?).header(ACCEPT, JSON);
        let response = wire::send(builder, &url).await?;
        let status = response.status().as_u16();
        let body = wire::read_body(response, &url).await?;
        if !(200..300).contains(&status) {
            return Err(wire::status_error(&url, status, &body));
        }
        parse_card(&url, &body)
    }

    /// The agent card of `base_url`, from the cache while it is fresh.
    pub(crate) async fn card(&self, base_url: &str) -> Result<Arc<AgentCard>, DelegateError> {
        let key = card_url(base_url);
        if let Some(cached) = self.lock_cards().get(&key).filter(|c| c.fetched.elapsed() < self.card_ttl) {
            return Ok(Arc::clone(&cached.card));
        }
        let card = Arc::new(self.fetch_card(base_url).await?);
        let mut cards = self.lock_cards();
        cards.retain(|_, c| c.fetched.elapsed() < self.card_ttl);
        cards.insert(key, CachedCard { fetched: Instant::now(), card: Arc::clone(&card) });
        Ok(card)
    }

    fn lock_cards(&self) -> std::sync::MutexGuard<'_, HashMap<String, CachedCard>> {
        self.cards.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `SendMessage` (JSON-RPC) or `POST /message:send` (HTTP+JSON).
    pub(crate) async fn send(
        &self,
        endpoint: &Endpoint,
        mut request: SendMessageRequest,
        credentials: Option<&Credentials>,
    ) -> Result<SendMessageResponse, DelegateError> {
        copy_tenant(endpoint, &mut request.tenant);
        let call = Call::post(methods::SEND_MESSAGE, vec!["message:send".to_owned()]);
        self.unary(endpoint, &call, &request, credentials).await
    }

    /// `GetTask` (JSON-RPC) or `GET /tasks/{id}` (HTTP+JSON).
    pub(crate) async fn get_task(
        &self,
        endpoint: &Endpoint,
        mut request: GetTaskRequest,
        credentials: Option<&Credentials>,
    ) -> Result<Task, DelegateError> {
        copy_tenant(endpoint, &mut request.tenant);
        let query = request.history_length.map(|n| ("historyLength", n.to_string())).into_iter().collect();
        let call = Call {
            method: methods::GET_TASK,
            verb: Method::GET,
            path: vec!["tasks".to_owned(), request.id.clone()],
            query,
        };
        self.unary(endpoint, &call, &request, credentials).await
    }

    /// `ListTasks` (JSON-RPC) or `GET /tasks` (HTTP+JSON): one page of the
    /// caller's tasks, newest first, optionally of one context.
    pub(crate) async fn list_tasks(
        &self,
        endpoint: &Endpoint,
        mut request: ListTasksRequest,
        credentials: Option<&Credentials>,
    ) -> Result<ListTasksResponse, DelegateError> {
        copy_tenant(endpoint, &mut request.tenant);
        let query = [
            ("contextId", request.context_id.clone()),
            ("pageSize", request.page_size.map(|n| n.to_string())),
            ("pageToken", request.page_token.clone()),
            ("historyLength", request.history_length.map(|n| n.to_string())),
            ("includeArtifacts", request.include_artifacts.map(|b| b.to_string())),
        ];
        let query = query.into_iter().filter_map(|(name, value)| value.map(|value| (name, value))).collect();
        let call = Call { method: methods::LIST_TASKS, verb: Method::GET, path: vec!["tasks".to_owned()], query };
        self.unary(endpoint, &call, &request, credentials).await
    }

    /// `CancelTask` (JSON-RPC) or `POST /tasks/{id}:cancel` (HTTP+JSON).
    pub(crate) async fn cancel_task(
        &self,
        endpoint: &Endpoint,
        mut request: CancelTaskRequest,
        credentials: Option<&Credentials>,
    ) -> Result<Task, DelegateError> {
        copy_tenant(endpoint, &mut request.tenant);
        let call = Call::post(methods::CANCEL_TASK, vec!["tasks".to_owned(), format!("{}:cancel", request.id)]);
        self.unary(endpoint, &call, &request, credentials).await
    }

    /// `SendStreamingMessage` (JSON-RPC) or `POST /message:stream` (HTTP+JSON):
    /// the agent's events in order. The stream owns what it needs (it borrows
    /// nothing) and ends when the agent closes it, or after the first error.
    pub(crate) fn stream(
        &self,
        endpoint: &Endpoint,
        mut request: SendMessageRequest,
        credentials: Option<&Credentials>,
    ) -> impl Stream<Item = Result<StreamResponse, DelegateError>> + Send + 'static + use<> {
        copy_tenant(endpoint, &mut request.tenant);
        let call = Call::post(methods::SEND_STREAMING_MESSAGE, vec!["message:stream".to_owned()]);
        self.streaming(endpoint, &call, &request, credentials)
    }

    /// `SubscribeToTask` (JSON-RPC) or `POST /tasks/{id}:subscribe`
    /// (HTTP+JSON): the task as it is, then its events, as [`Self::stream`].
    pub(crate) fn subscribe(
        &self,
        endpoint: &Endpoint,
        mut request: SubscribeToTaskRequest,
        credentials: Option<&Credentials>,
    ) -> impl Stream<Item = Result<StreamResponse, DelegateError>> + Send + 'static + use<> {
        copy_tenant(endpoint, &mut request.tenant);
        let call =
            Call::post(methods::SUBSCRIBE_TO_TASK, vec!["tasks".to_owned(), format!("{}:subscribe", request.id)]);
        self.streaming(endpoint, &call, &request, credentials)
    }

    /// A streaming `call`: its events, opened when first polled.
    fn streaming<Req: Serialize>(
        &self,
        endpoint: &Endpoint,
        call: &Call,
        request: &Req,
        credentials: Option<&Credentials>,
    ) -> impl Stream<Item = Result<StreamResponse, DelegateError>> + Send + 'static + use<Req> {
        let prepared = self.prepare(endpoint, call, request, credentials, EVENT_STREAM);
        let (url, binding) = (endpoint.url.clone(), endpoint.binding);
        stream::once(async move { open_stream(prepared?, url, binding).await }).try_flatten()
    }

    async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        endpoint: &Endpoint,
        call: &Call,
        params: &Req,
        credentials: Option<&Credentials>,
    ) -> Result<Resp, DelegateError> {
        let accept = match endpoint.binding {
            Binding::JsonRpc => JSON,
            Binding::HttpJson => REST_ACCEPT,
        };
        let Prepared { builder, id } = self.prepare(endpoint, call, params, credentials, accept)?;
        let url = &endpoint.url;
        let response = wire::send(builder, url).await?;
        let status = response.status().as_u16();
        let body = wire::read_body(response, url).await?;
        match id {
            Some(id) => wire::decode_jsonrpc(url, status, &id, &body),
            None => wire::decode_rest(url, status, &body),
        }
    }

    /// Builds the HTTP request of `call` on the endpoint's binding.
    fn prepare<Req: Serialize>(
        &self,
        endpoint: &Endpoint,
        call: &Call,
        params: &Req,
        credentials: Option<&Credentials>,
        accept: &str,
    ) -> Result<Prepared, DelegateError> {
        let (builder, id) = match endpoint.binding {
            Binding::JsonRpc => {
                let id = JsonRpcId::String(uuid::Uuid::new_v4().to_string());
                let body = RpcRequest { jsonrpc: "2.0", id: &id, method: call.method, params };
                let url = self.vetted(wire::parse_url(&endpoint.url)?)?;
                let builder = self.http.post(url).header(CONTENT_TYPE, JSON).json(&body);
                (builder, Some(id))
            }
            Binding::HttpJson => {
                let tenant = endpoint.tenant.as_deref().into_iter();
                let segments: Vec<&str> = tenant.chain(call.path.iter().map(String::as_str)).collect();
                let mut url = wire::join_segments(&endpoint.url, &segments)?;
                if !call.query.is_empty() {
                    url.query_pairs_mut().extend_pairs(&call.query);
                }
                let mut builder = self.http.request(call.verb.clone(), self.vetted(url)?);
                if call.verb != Method::GET {
                    builder = builder.header(CONTENT_TYPE, A2A_JSON).json(params);
                }
                (builder, None)
            }
        };
        let builder = wire::a2a_headers(builder.header(ACCEPT, accept), credentials)?;
        Ok(Prepared { builder, id })
    }
}

impl Call {
    fn post(method: &'static str, path: Vec<String>) -> Self {
        Self { method, verb: Method::POST, path, query: Vec::new() }
    }
}

/// Chooses how to reach the agent: the first interface of its card, which
/// lists them by preference (A2A 1.0 `supported_interfaces`), that is A2A
/// 1.0 over JSON-RPC or HTTP+JSON.
pub(crate) fn pick_interface(card: &AgentCard) -> Result<Endpoint, DelegateError> {
    let binding = |name: &str| {
        if name.eq_ignore_ascii_case(a2a::TRANSPORT_PROTOCOL_JSONRPC) {
            Some(Binding::JsonRpc)
        } else if name.eq_ignore_ascii_case(a2a::TRANSPORT_PROTOCOL_HTTP_JSON) {
            Some(Binding::HttpJson)
        } else {
            None
        }
    };
    let (interface, binding) = card
        .supported_interfaces
        .iter()
        .filter(|i| is_version_1_0(&i.protocol_version))
        .find_map(|i| binding(&i.protocol_binding).map(|binding| (i, binding)))
        .ok_or_else(|| DelegateError::NoInterface {
            offered: card
                .supported_interfaces
                .iter()
                .map(|i| format!("{} {}", i.protocol_binding, i.protocol_version))
                .collect(),
        })?;
    let tenant = interface.tenant.clone().filter(|t| !t.is_empty());
    Ok(Endpoint { url: interface.url.clone(), binding, tenant })
}

/// `1.0`, or a `1.0.x` patch written out in full.
fn is_version_1_0(version: &str) -> bool {
    version == "1.0" || version.starts_with("1.0.")
}

/// Puts the interface's tenant into a request (spec §8.3.2).
fn copy_tenant(endpoint: &Endpoint, tenant: &mut Option<String>) {
    if endpoint.tenant.is_some() {
        tenant.clone_from(&endpoint.tenant);
    }
}

fn card_url(base_url: &str) -> String {
    if base_url.ends_with("agent-card.json") {
        return base_url.to_owned();
    }
    format!("{}/{CARD_PATH}", base_url.trim_end_matches('/'))
}

fn parse_card(url: &str, body: &[u8]) -> Result<AgentCard, DelegateError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| wire::protocol(url, format!("the agent card is not JSON ({e})")))?;
    let legacy = value.get("supportedInterfaces").is_none() && value.get("url").is_some();
    serde_json::from_value(value).map_err(|e| {
        let detail = if legacy {
            "the agent card is in the A2A 0.3 format (no supportedInterfaces); only A2A 1.0 agents are supported"
                .to_owned()
        } else {
            format!("the agent card is not a valid A2A 1.0 card ({e})")
        };
        wire::protocol(url, detail)
    })
}

/// Sends a streaming request and decodes its SSE events.
async fn open_stream(
    prepared: Prepared,
    url: String,
    binding: Binding,
) -> Result<BoxStream<'static, Result<StreamResponse, DelegateError>>, DelegateError> {
    let response = wire::send(prepared.builder, &url).await?;
    let status = response.status().as_u16();
    let content_type = wire::content_type(&response);
    if !(200..300).contains(&status) || content_type != EVENT_STREAM {
        let body = wire::read_body(response, &url).await?;
        let error = match &prepared.id {
            Some(id) => wire::decode_jsonrpc::<Value>(&url, status, id, &body).err(),
            None => wire::decode_rest::<Value>(&url, status, &body).err(),
        };
        let expected = format!("expected an event stream, got HTTP {status} with {content_type:?}");
        return Err(match error {
            Some(error @ (DelegateError::Remote { .. } | DelegateError::Status { .. })) => error,
            // What was wrong with what came instead (not JSON, another call's id, ...).
            Some(DelegateError::Protocol { detail, .. }) => wire::protocol(&url, format!("{expected}, and {detail}")),
            _ => wire::protocol(&url, expected),
        });
    }
    let id = prepared.id;
    let events = sse::events(url.clone(), response.bytes_stream()).filter_map(move |event| {
        let decoded = match event {
            Ok(event) => decode_event(&url, binding, id.as_ref(), event),
            Err(error) => Some(Err(error)),
        };
        future::ready(decoded)
    });
    let until_error = events.scan(false, |failed, event| {
        let next = (!*failed).then(|| {
            *failed = event.is_err();
            event
        });
        future::ready(next)
    });
    Ok(until_error.boxed())
}

/// The data of one SSE event as a [`StreamResponse`]; `None` when it is blank.
fn decode_event(
    url: &str,
    binding: Binding,
    id: Option<&JsonRpcId>,
    data: String,
) -> Option<Result<StreamResponse, DelegateError>> {
    if data.trim().is_empty() {
        return None;
    }
    let decoded = match (binding, id) {
        (Binding::JsonRpc, Some(id)) => serde_json::from_str::<JsonRpcResponse>(&data)
            .map_err(|e| wire::protocol(url, format!("an event is not a JSON-RPC response ({e})")))
            .and_then(|response| wire::jsonrpc_result(url, id, response)),
        _ => wire::decode_rest_event(url, &data),
    };
    Some(decoded)
}
