//! ACP over WebSocket at `GET /acp?agent=<id>`, for IDEs that are not on
//! the gateway's machine: one JSON-RPC message per text frame, the same
//! bridge as `chorus acp`, calling this gateway's A2A API with the
//! connection's own credentials (`Authorization: Bearer`, the API-key
//! header, or `?token=` for clients that cannot set headers).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt as _, StreamExt as _, future};

use super::bridge::Bridge;
use super::upstream::{TokenSource, Upstream};
use crate::delegate::Credentials;
use crate::error::GatewayError;
use crate::service::Gateway;

/// The HTTP client the bridges of this process share.
fn http() -> reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build().unwrap_or_default())
        .clone()
}

/// `GET /acp`: authenticates, then upgrades to a WebSocket that speaks ACP.
pub(crate) async fn handle(
    State(gateway): State<Gateway>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN).map(|origin| origin.to_str().unwrap_or_default())
        && !origin_allowed(origin, &gateway.config().cors_origins)
    {
        // A browser does not hold a WebSocket to the origin policy: without
        // this, any page the IDE's user opens could drive their sessions.
        let refused = format!("origin {origin:?} is not among gateway.cors_origins");
        return crate::rest::error_response(&GatewayError::Forbidden(refused));
    }
    let query_token = query.get("token").map(|token| format!("Bearer {token}"));
    let lookup = |name: &str| match (name, &query_token) {
        ("authorization", Some(token)) => Some(token.as_str()),
        _ => headers.get(name).and_then(|value| value.to_str().ok()),
    };
    if let Err(error) = gateway.auth().authenticate(lookup) {
        return crate::rest::error_response(&error);
    }
    let credentials = credentials(&gateway, &headers, query.get("token"));
    let agent = match query.get("agent") {
        Some(agent) => agent.clone(),
        None => gateway.catalog().default_agent().id.clone(),
    };
    let Some(entry) = gateway.catalog().card(&agent) else {
        return crate::rest::error_response(&GatewayError::AgentNotFound(agent));
    };
    let card_url = entry.card.supported_interfaces.first().map(|interface| interface.url.clone()).unwrap_or_default();
    let base_url = card_url.strip_suffix(&format!("/a2a/{agent}")).unwrap_or(&card_url).to_owned();
    let upstream = Upstream::new(http(), &base_url, &agent, TokenSource::Fixed(credentials));
    let limit = message_limit(gateway.config().max_body_bytes);
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| serve(socket, Arc::new(Bridge::new(upstream))))
        .into_response()
}

/// The largest ACP message (and frame) a WebSocket takes: twice the body
/// limit of the A2A calls it turns into, for the JSON-RPC around them; a
/// larger one closes the connection (1009, message too big).
fn message_limit(max_body_bytes: usize) -> usize {
    max_body_bytes.saturating_mul(2)
}

/// Whether a page of `origin` may open the WebSocket: one `allowed` names
/// (`*`: any). A client that is no web page (an IDE's) sends no origin.
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(origin))
}

/// The connection's credentials, to call the gateway with.
fn credentials(gateway: &Gateway, headers: &HeaderMap, query_token: Option<&String>) -> Option<Credentials> {
    if let Some(token) = query_token {
        return Some(Credentials::Bearer(token.clone()));
    }
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).map(str::trim);
    let bearer =
        header("authorization").and_then(|value| value.strip_prefix("Bearer ").or(value.strip_prefix("bearer ")));
    if let Some(token) = bearer {
        return Some(Credentials::Bearer(token.trim().to_owned()));
    }
    let api_key_header = gateway.config().auth.api_key_header.clone();
    header(&api_key_header).map(|value| Credentials::ApiKey { header: api_key_header.clone(), value: value.to_owned() })
}

async fn serve(socket: WebSocket, bridge: Arc<Bridge>) {
    let (sink, stream) = socket.split();
    let outgoing = sink
        .sink_map_err(std::io::Error::other)
        .with(|line: String| future::ready(Ok::<_, std::io::Error>(Message::Text(line.into()))));
    let incoming =
        stream.take_while(|frame| future::ready(!matches!(frame, Ok(Message::Close(_))))).filter_map(|frame| {
            future::ready(match frame {
                Ok(Message::Text(text)) => Some(Ok(text.to_string())),
                Ok(Message::Binary(bytes)) => Some(Ok(String::from_utf8_lossy(&bytes).into_owned())),
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Close(_)) => None,
                Err(error) => Some(Err(std::io::Error::other(error))),
            })
        });
    if let Err(error) = super::adapter::serve_frames(bridge, Box::pin(outgoing), Box::pin(incoming)).await {
        tracing::debug!(%error, "acp websocket connection ended");
    }
}
