//! The HTTP side of the gateway: agent cards, the catalog, and the
//! JSON-RPC and HTTP+JSON bindings, with what they share (body limits,
//! version negotiation, authentication, SSE).

use std::{collections::HashMap, convert::Infallible, time::Duration};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response, Sse, sse::Event, sse::KeepAlive},
    routing::{any, get, post},
};
use futures_util::{Stream, StreamExt as _};
use serde_json::Value;

use crate::{
    auth::Principal,
    catalog::CardEntry,
    error::{GatewayError, Result},
    jsonrpc, rest,
    service::{EventStream, Gateway},
};

/// The protocol version a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    /// No `A2A-Version`, or `0.3`: the 0.3 methods and shapes.
    V03,
}

/// The gateway's routes, to merge into the server's router.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/.well-known/agent-card.json", get(default_card))
        .route("/.well-known/agent.json", get(default_card))
        .route("/a2a", get(catalog))
        .route("/a2a/{agent}/.well-known/agent-card.json", get(agent_card))
        .route("/a2a/{agent}", post(jsonrpc::handle))
        .route("/a2a/{agent}/", post(jsonrpc::handle))
        .route("/a2a/{agent}/rest/{*path}", any(rest::handle))
        .route("/acp", get(crate::acp::websocket))
        .with_state(gateway)
}

async fn default_card(State(gateway): State<Gateway>, headers: HeaderMap) -> Response {
    let id = gateway.catalog().default_agent().id.clone();
    card_response(&gateway, &id, &headers)
}

async fn agent_card(State(gateway): State<Gateway>, Path(agent): Path<String>, headers: HeaderMap) -> Response {
    card_response(&gateway, &agent, &headers)
}

/// Every agent's card.
async fn catalog(State(gateway): State<Gateway>) -> Response {
    let cards: Vec<&a2a::AgentCard> = gateway.catalog().cards().map(|entry| &entry.card).collect();
    (StatusCode::OK, axum::Json(serde_json::json!({ "agents": cards }))).into_response()
}

fn card_response(gateway: &Gateway, agent: &str, headers: &HeaderMap) -> Response {
    let Some(CardEntry { json, etag, .. }) = gateway.catalog().card(agent) else {
        return rest::error_response(&GatewayError::AgentNotFound(agent.to_owned()));
    };
    let last_modified = gateway.catalog().last_modified.as_str();
    let fresh = not_modified(headers, etag, last_modified);
    let status = if fresh { StatusCode::NOT_MODIFIED } else { StatusCode::OK };
    let body = if fresh { Body::empty() } else { Body::from(json.clone()) };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    headers.insert(header::ETAG, HeaderValue::from_str(etag).expect("an ETag is a valid header"));
    headers
        .insert(header::LAST_MODIFIED, HeaderValue::from_str(last_modified).expect("an HTTP date is a valid header"));
    response
}

/// Whether the caller's copy is current (RFC 9110 §13.1): `If-None-Match`
/// names the ETag, weakly compared (`W/"x"` matches `"x"`), or, without it,
/// `If-Modified-Since` is no earlier than the card's last change.
fn not_modified(headers: &HeaderMap, etag: &str, last_modified: &str) -> bool {
    let header = |name| headers.get(name).and_then(|value: &HeaderValue| value.to_str().ok());
    let opaque = |tag: &str| tag.trim().trim_start_matches("W/").to_owned();
    if let Some(tags) = header(header::IF_NONE_MATCH) {
        return tags.split(',').any(|tag| tag.trim() == "*" || opaque(tag) == opaque(etag));
    }
    let date = |text: &str| chrono::DateTime::parse_from_rfc2822(text.trim()).ok();
    match (header(header::IF_MODIFIED_SINCE).and_then(date), date(last_modified)) {
        (Some(since), Some(changed)) => since >= changed,
        _ => false,
    }
}

/// What the JSON-RPC binding speaks; HTTP+JSON and gRPC speak 1.0 only.
pub(crate) const SPEAKS_1_0_AND_0_3: &str = "1.0 and 0.3";
pub(crate) const SPEAKS_1_0: &str = "1.0";

/// The version a request asked for (`A2A-Version` header, else query
/// parameter); the patch number does not count. A version other than 1.0
/// and 0.3 is refused as one the binding (which `speaks`) does not speak.
pub(crate) fn version(headers: &HeaderMap, query: Option<&str>, speaks: &'static str) -> Result<Version> {
    let requested = requested_version(headers, &self::query(query), speaks)?.unwrap_or_default();
    parse_version(requested.trim(), speaks)
}

/// The version a request names: its `A2A-Version` header, else its
/// `A2A-Version` query parameter (spec §3.6.1) among the decoded `query`.
pub(crate) fn requested_version(
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    speaks: &'static str,
) -> Result<Option<String>> {
    if let Some(value) = headers.get("a2a-version") {
        let value = value.to_str().map_err(|_| GatewayError::VersionNotSupported("<not ASCII>".to_owned(), speaks))?;
        return Ok(Some(value.to_owned()));
    }
    Ok(query.iter().find_map(|(name, value)| name.eq_ignore_ascii_case("a2a-version").then(|| value.clone())))
}

/// The query's parameters, percent-decoded (`+` is a space).
pub(crate) fn query(query: Option<&str>) -> HashMap<String, String> {
    let decode = |text: &str| chorus_runtime::uri::percent_decode(&text.replace('+', " "));
    query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

pub(crate) fn parse_version(requested: &str, speaks: &'static str) -> Result<Version> {
    let major_minor: Vec<&str> = requested.split('.').take(2).collect();
    match major_minor.as_slice() {
        [""] => Ok(Version::V03),
        ["1", "0"] | ["1"] => Ok(Version::V1),
        ["0", "3"] => Ok(Version::V03),
        _ => Err(GatewayError::VersionNotSupported(requested.to_owned(), speaks)),
    }
}

/// The caller the request's headers identify.
pub(crate) fn authenticate(gateway: &Gateway, headers: &HeaderMap) -> Result<Principal> {
    gateway.auth().authenticate(|name| headers.get(name).and_then(|value| value.to_str().ok()))
}

/// An error answer with what HTTP asks of a 401: a `WWW-Authenticate`
/// challenge naming the scheme to use (RFC 9110 §11.6.1).
pub(crate) fn challenged(mut response: Response, error: &GatewayError) -> Response {
    if matches!(error, GatewayError::Unauthenticated) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"chorus\""));
    }
    response
}

/// The body, refused past the configured limit. What comes past it is read
/// and dropped for a while before the refusal goes out: a client whose
/// body is still on its way would otherwise meet a closed connection
/// (`EPIPE`) instead of the 413.
pub(crate) async fn read_body(gateway: &Gateway, body: Body) -> Result<Bytes> {
    let limit = gateway.config().max_body_bytes;
    let mut chunks = body.into_data_stream();
    let mut read = bytes::BytesMut::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|_| GatewayError::PayloadTooLarge(limit))?;
        if read.len() + chunk.len() > limit {
            chorus_runtime::egress::drain_stream(chunks, DRAINED_PAST_THE_LIMIT, Duration::from_secs(5)).await;
            return Err(GatewayError::PayloadTooLarge(limit));
        }
        read.extend_from_slice(&chunk);
    }
    Ok(read.freeze())
}

/// The most bytes past `max_body_bytes` read (and dropped) before a 413.
const DRAINED_PAST_THE_LIMIT: usize = 64 << 20;

/// Whether the request says its body is JSON (`application/json` or
/// `application/a2a+json`, any parameters). No Content-Type is accepted.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_none_or(|value| {
        let media_type = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        media_type == "application/json" || media_type == "application/a2a+json"
    })
}

/// An SSE response: each event rendered by `render`, keep-alive comments
/// between them; an error mid-stream becomes the last event.
pub(crate) fn sse(
    gateway: &Gateway,
    events: EventStream,
    render: impl Fn(std::result::Result<&a2a::StreamResponse, &GatewayError>) -> Value + Send + 'static,
) -> Response {
    let stream = events.map(move |event| {
        let data = render(event.as_ref());
        Ok::<_, Infallible>(Event::default().data(data.to_string()))
    });
    sse_of(stream, Duration::from_millis(gateway.config().keep_alive_ms))
}

fn sse_of(
    stream: impl Stream<Item = std::result::Result<Event, Infallible>> + Send + 'static,
    keep_alive: Duration,
) -> Response {
    let mut response = Sse::new(stream).keep_alive(KeepAlive::new().interval(keep_alive)).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
