//! The limits every call meets: `server.request_timeout_ms`, the caller's
//! own deadline, and the size of a request.

use std::time::Duration;

use axum::{http::StatusCode, middleware::Next, response::IntoResponse as _};

/// How much sooner than the caller's `grpc-timeout` a call is answered
/// DEADLINE_EXCEEDED here: tonic's own cut-off, around every service and
/// its grpc-web and CORS layers, answers CANCELLED in plain gRPC, which a
/// browser cannot read. It covers the request's and the answer's way too:
/// with a margin of 5 ms, a client on a busy machine (a CI run) timed out
/// first, on its own (CANCELLED, "Timeout expired").
const BEFORE_DEADLINE: Duration = Duration::from_millis(25);

/// A gRPC call's answer; past the caller's deadline (`grpc-timeout`),
/// DEADLINE_EXCEEDED; past `limit` first, CANCELLED, the code tonic's own
/// server timeout answers, naming the setting. Set on the gRPC routes
/// alone, inside grpc-web: an HTTP caller would not read a status in
/// trailers.
pub(super) async fn grpc_limit(
    limit: Duration,
    request: axum::extract::Request,
    next: Next,
) -> axum::response::Response {
    let deadline = request.headers().get("grpc-timeout").and_then(|value| grpc_timeout(value.as_bytes()));
    let wait = deadline.map_or(limit, |deadline| deadline.saturating_sub(BEFORE_DEADLINE).min(limit));
    match tokio::time::timeout(wait, next.run(request)).await {
        Ok(response) => oversize_request(response),
        Err(_) if wait < limit => {
            let deadline = deadline.unwrap_or_default().as_millis();
            tonic::Status::deadline_exceeded(format!("the call's deadline (grpc-timeout, {deadline} ms) passed"))
                .into_http()
        }
        Err(_) => tonic::Status::cancelled(past_limit(limit)).into_http(),
    }
}

/// A `grpc-timeout` value: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (digits, unit) = value.split_last().map(|(unit, digits)| (digits, *unit))?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// What a call cut off by `server.request_timeout_ms` is told.
fn past_limit(limit: Duration) -> String {
    format!(
        "no answer within {} ms (server.request_timeout_ms); a wait a call asks for (AwaitTask, a blocking spawn, \
         ReadInbox, ...) is cut off there too: ask for less, or raise the setting",
        limit.as_millis()
    )
}

/// tonic refuses a request past `server.max_message_bytes` as OUT_OF_RANGE,
/// in its own words; gRPC's code for it is RESOURCE_EXHAUSTED, and the
/// caller should learn which setting it met.
fn oversize_request(response: axum::response::Response) -> axum::response::Response {
    const TONIC: &str = "Error, decoded message length too large: found ";
    let Some(status) = tonic::Status::from_header_map(response.headers()) else { return response };
    let sizes = status.message().strip_prefix(TONIC).and_then(|rest| rest.split_once(" bytes, the limit is: "));
    let Some((found, limit)) = sizes.filter(|_| status.code() == tonic::Code::OutOfRange) else { return response };
    let limit = limit.trim_end_matches(" bytes");
    let message = format!("the request is {found} bytes; this server takes at most {limit} {OVERSIZE}");
    tonic::Status::resource_exhausted(message).into_http()
}

/// What ends the message of a request refused for its size.
const OVERSIZE: &str = "(server.max_message_bytes)";

/// Whether a server refused a request for its size (a caller's fault, unlike
/// other RESOURCE_EXHAUSTED answers).
pub fn refused_for_size(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::ResourceExhausted && status.message().ends_with(OVERSIZE)
}

/// An HTTP call's answer, or, past `limit`, 504 with a `google.rpc.Status`
/// body, the error shape of the HTTP+JSON APIs served here.
pub(super) async fn http_limit(
    limit: Duration,
    request: axum::extract::Request,
    next: Next,
) -> axum::response::Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let message = past_limit(limit);
            let body =
                serde_json::json!({ "error": { "code": 504, "status": "DEADLINE_EXCEEDED", "message": message } });
            (StatusCode::GATEWAY_TIMEOUT, axum::Json(body)).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_are_read_as_the_spec_writes_them() {
        assert_eq!(grpc_timeout(b"1S"), Some(Duration::from_secs(1)));
        assert_eq!(grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc_timeout(b"99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in [&b""[..], b"S", b"100", b"123456789S", b"1s", b"-1S", b"1.5S"] {
            assert_eq!(grpc_timeout(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
