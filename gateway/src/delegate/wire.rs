//! HTTP framing shared by both bindings: headers, URLs, bounded body reads
//! and the decoding of JSON-RPC and HTTP+JSON answers and errors.

use a2a::{JsonRpcId, JsonRpcResponse, StreamResponse};
use reqwest::header::{self, HeaderName, HeaderValue};
use reqwest::{RequestBuilder, Response, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Credentials, DelegateError};

/// Media type of JSON-RPC requests and answers.
pub(super) const JSON: &str = "application/json";
/// Media type of HTTP+JSON requests and answers (spec §11.1, v1.0.1).
pub(super) const A2A_JSON: &str = "application/a2a+json";
/// Media type of streaming answers.
pub(super) const EVENT_STREAM: &str = "text/event-stream";

/// Largest response body (or SSE event) read from a remote agent.
pub(super) const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// How much of an unexpected body an error message quotes.
const EXCERPT_CHARS: usize = 512;

/// Adds `A2A-Version: 1.0` and the caller's credentials to `builder`.
pub(super) fn a2a_headers(
    builder: RequestBuilder,
    credentials: Option<&Credentials>,
) -> Result<RequestBuilder, DelegateError> {
    let builder = builder.header(a2a::SVC_PARAM_VERSION, a2a::VERSION);
    let Some(credentials) = credentials else {
        return Ok(builder);
    };
    let (name, value) = match credentials {
        Credentials::Bearer(token) => (header::AUTHORIZATION, secret(&format!("Bearer {token}"))?),
        Credentials::ApiKey { header, value } => {
            let name = HeaderName::try_from(header.as_str()).map_err(|_| DelegateError::InvalidCredentials {
                detail: format!("{header:?} is not a valid header name"),
            })?;
            (name, secret(value)?)
        }
    };
    Ok(builder.header(name, value))
}

fn secret(value: &str) -> Result<HeaderValue, DelegateError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| DelegateError::InvalidCredentials {
        detail: "the secret contains characters not allowed in a header value".to_owned(),
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// `base` with `segments` appended as percent-encoded path segments.
pub(super) fn join_segments(base: &str, segments: &[&str]) -> Result<Url, DelegateError> {
    let invalid = |detail: String| DelegateError::Protocol { url: base.to_owned(), detail };
    let mut url = Url::parse(base).map_err(|e| invalid(format!("the interface URL is not a valid URL ({e})")))?;
    url.path_segments_mut()
        .map_err(|()| invalid("the interface URL cannot take a path".to_owned()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// Parses `base` as the URL of a request.
pub(super) fn parse_url(base: &str) -> Result<Url, DelegateError> {
    Url::parse(base).map_err(|e| DelegateError::Protocol {
        url: base.to_owned(),
        detail: format!("the interface URL is not a valid URL ({e})"),
    })
}

/// Sends `builder`, mapping a transport failure to [`DelegateError::Http`].
pub(super) async fn send(builder: RequestBuilder, url: &str) -> Result<Response, DelegateError> {
    builder.send().await.map_err(|source| match chorus_runtime::egress::refusal(&source) {
        Some(refused) => DelegateError::Refused { url: url.to_owned(), reason: refused.to_string() },
        None => DelegateError::Http { url: url.to_owned(), source },
    })
}

/// Reads the whole body, refusing more than [`MAX_BODY_BYTES`].
pub(super) async fn read_body(mut response: Response, url: &str) -> Result<Vec<u8>, DelegateError> {
    let mut body = Vec::new();
    while let Some(chunk) =
        response.chunk().await.map_err(|source| DelegateError::Http { url: url.to_owned(), source })?
    {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(protocol(url, format!("the response is larger than {MAX_BODY_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The content type of `response` without parameters, lower-cased.
pub(super) fn content_type(response: &Response) -> String {
    let raw = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    raw.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

pub(super) fn protocol(url: &str, detail: impl Into<String>) -> DelegateError {
    DelegateError::Protocol { url: url.to_owned(), detail: detail.into() }
}

/// [`DelegateError::Status`] quoting the start of `body`.
pub(super) fn status_error(url: &str, status: u16, body: &[u8]) -> DelegateError {
    DelegateError::Status { url: url.to_owned(), status, body: excerpt(body) }
}

fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.chars().count() <= EXCERPT_CHARS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(EXCERPT_CHARS).collect();
    cut.push('…');
    cut
}

/// Decodes a JSON-RPC answer to the call `id`: its `result` as `T`, or its
/// `error` as [`DelegateError::Remote`].
pub(super) fn decode_jsonrpc<T: DeserializeOwned>(
    url: &str,
    status: u16,
    id: &JsonRpcId,
    body: &[u8],
) -> Result<T, DelegateError> {
    // A refusal of the caller's credentials, or of a body too large, is the
    // HTTP status's to say: its JSON-RPC code (-32600) is any invalid
    // request's.
    if matches!(status, 401 | 403 | 413) {
        return Err(status_error(url, status, body));
    }
    let response: JsonRpcResponse = match serde_json::from_slice(body) {
        Ok(response) => response,
        Err(_) if !(200..300).contains(&status) => return Err(status_error(url, status, body)),
        Err(e) => return Err(protocol(url, format!("the body is not a JSON-RPC 2.0 response ({e})"))),
    };
    jsonrpc_result(url, id, response)
}

/// The `result` of a parsed JSON-RPC `response` as `T`.
pub(super) fn jsonrpc_result<T: DeserializeOwned>(
    url: &str,
    id: &JsonRpcId,
    response: JsonRpcResponse,
) -> Result<T, DelegateError> {
    if let Some(error) = response.error {
        return Err(DelegateError::Remote { code: error.code, message: error.message });
    }
    if &response.id != id {
        return Err(protocol(url, format!("the response id {:?} does not match the request id {id:?}", response.id)));
    }
    let result = response.result.ok_or_else(|| protocol(url, "the JSON-RPC response has neither result nor error"))?;
    serde_json::from_value(result).map_err(|e| protocol(url, format!("unexpected result shape ({e})")))
}

/// Decodes an HTTP+JSON answer: the body as `T` on success, else the
/// `google.rpc.Status` error (AIP-193) as [`DelegateError::Remote`].
pub(super) fn decode_rest<T: DeserializeOwned>(url: &str, status: u16, body: &[u8]) -> Result<T, DelegateError> {
    if !(200..300).contains(&status) {
        return Err(rest_error(url, status, body));
    }
    serde_json::from_slice(body).map_err(|e| protocol(url, format!("unexpected response shape ({e})")))
}

/// One HTTP+JSON stream event: a bare `StreamResponse`, or a
/// `google.rpc.Status` error as [`DelegateError::Remote`].
pub(super) fn decode_rest_event(url: &str, data: &str) -> Result<StreamResponse, DelegateError> {
    serde_json::from_str(data).map_err(|e| match serde_json::from_str::<RestErrorBody>(data) {
        Ok(RestErrorBody { error }) => error.into_remote(None),
        Err(_) => protocol(url, format!("an event is not a StreamResponse ({e})")),
    })
}

/// The HTTP+JSON error body (AIP-193 `google.rpc.Status`).
#[derive(Deserialize)]
struct RestErrorBody {
    error: RestStatus,
}

#[derive(Deserialize)]
struct RestStatus {
    #[serde(default)]
    code: Option<i32>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: Vec<Value>,
}

impl RestStatus {
    /// The A2A code from the `ErrorInfo` reason, else the HTTP status.
    fn into_remote(self, http_status: Option<u16>) -> DelegateError {
        let reason_code = self
            .details
            .iter()
            .filter(|d| d.get("@type").and_then(Value::as_str) == Some(a2a::ERROR_INFO_TYPE))
            .filter_map(|d| d.get("reason").and_then(Value::as_str))
            .find_map(a2a::reason_to_error_code);
        let code = reason_code.or(http_status.map(i32::from)).or(self.code).unwrap_or(a2a::error_code::INTERNAL_ERROR);
        let message = if self.message.is_empty() { format!("error {code} without a message") } else { self.message };
        DelegateError::Remote { code, message }
    }
}

/// An HTTP+JSON error answer as [`DelegateError::Remote`], or as
/// [`DelegateError::Status`] when the body is not a `google.rpc.Status`.
fn rest_error(url: &str, status: u16, body: &[u8]) -> DelegateError {
    match serde_json::from_slice::<RestErrorBody>(body) {
        Ok(RestErrorBody { error }) => error.into_remote(Some(status)),
        Err(_) => status_error(url, status, body),
    }
}
