//! The server's edge: middleware that counts every gRPC call and HTTP
//! request, times unary calls, and keeps the open streams' gauge, each
//! call's outcome read when its response body ends.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use axum::{
    body::{Body, Bytes},
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::Response,
};
use http::{HeaderMap, StatusCode, header};
use http_body::{Body as _, Frame, SizeHint};
use prost::Message as _;

use super::Metrics;

/// The label values of a call to a method no descriptor names.
const UNKNOWN: &str = "unknown";

/// A gRPC method a descriptor set describes.
#[derive(Debug)]
struct GrpcMethod {
    service: String,
    method: String,
    server_streaming: bool,
}

/// What the gRPC middleware needs: where to count, and the methods whose
/// names may be labels (any other path is `unknown`: a caller cannot add series).
#[derive(Debug, Clone)]
pub(crate) struct GrpcObserver {
    metrics: Metrics,
    /// By path: `/package.Service/Method`.
    methods: Arc<HashMap<String, Arc<GrpcMethod>>>,
    unknown: Arc<GrpcMethod>,
}

impl GrpcObserver {
    /// Knows the methods of every service in the encoded descriptor `sets`.
    pub(crate) fn new(metrics: Metrics, sets: &[&[u8]]) -> Self {
        let mut methods = HashMap::new();
        for set in sets {
            let files = prost_types::FileDescriptorSet::decode(*set).expect("embedded descriptor sets are valid");
            for file in files.file {
                for service in &file.service {
                    let service_name = format!("{}.{}", file.package(), service.name());
                    for method in &service.method {
                        let grpc_method = GrpcMethod {
                            service: service_name.clone(),
                            method: method.name().to_owned(),
                            server_streaming: method.server_streaming(),
                        };
                        methods.insert(format!("/{service_name}/{}", method.name()), Arc::new(grpc_method));
                    }
                }
            }
        }
        let unknown = GrpcMethod { service: UNKNOWN.to_owned(), method: UNKNOWN.to_owned(), server_streaming: false };
        Self { metrics, methods: Arc::new(methods), unknown: Arc::new(unknown) }
    }
}

/// Counts a gRPC call by its status code once its response ends (a call
/// its caller gave up on before the answer as CANCELLED), times it when
/// unary, and holds the streams' gauge while a server stream is open.
pub(crate) async fn grpc(State(observer): State<GrpcObserver>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let known = observer.methods.get(request.uri().path());
    let unanswered = Unanswered(Some((observer.metrics, Arc::clone(known.unwrap_or(&observer.unknown)))));
    let response = next.run(request).await;
    let (metrics, method) = unanswered.answered();
    let stream = method.server_streaming.then(|| metrics.streams_in_flight.with(["grpc"]).hold());
    let trailers_only = grpc_code(response.headers());
    watch_body(response, move |ending| {
        let code = match ending {
            Ending::Trailers(trailers) => grpc_code(trailers).or(trailers_only),
            Ending::End => trailers_only,
            Ending::Dropped => Some(tonic::Code::Cancelled),
        };
        let code = format!("{:?}", code.unwrap_or(tonic::Code::Unknown));
        let GrpcMethod { service, method, server_streaming } = &*method;
        metrics.grpc_requests.with([service, method, &code]).inc();
        if !server_streaming {
            metrics.grpc_latency.with([service, method]).observe(started.elapsed());
        }
        drop(stream);
    })
}

/// A call not answered yet, holding what counts it: dropped so (its caller
/// went away), it counts as CANCELLED; answered, it hands them back.
struct Unanswered(Option<(Metrics, Arc<GrpcMethod>)>);

impl Unanswered {
    fn answered(mut self) -> (Metrics, Arc<GrpcMethod>) {
        self.0.take().expect("an unanswered call holds what counts it")
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some((metrics, method)) = self.0.take() {
            let code = format!("{:?}", tonic::Code::Cancelled);
            metrics.grpc_requests.with([&method.service, &method.method, &code]).inc();
        }
    }
}

/// Counts a gRPC call to a path no service serves (answered `UNIMPLEMENTED`
/// by the server's fallback, outside every service's layers).
pub(crate) fn unknown_grpc_call(metrics: &Metrics) {
    let code = format!("{:?}", tonic::Code::Unimplemented);
    metrics.grpc_requests.with([UNKNOWN, UNKNOWN, &code]).inc();
}

/// Counts an HTTP request to a path no route serves (answered 404 by the
/// server's fallback, outside every route's layers).
pub(crate) fn unknown_http_request(metrics: &Metrics, method: &http::Method) {
    metrics.http_requests.with([UNKNOWN, &method_label(method), "404", "http"]).inc();
}

fn grpc_code(headers: &HeaderMap) -> Option<tonic::Code> {
    headers.get("grpc-status").map(|status| tonic::Code::from_bytes(status.as_bytes()))
}

/// Counts an HTTP request by its route's template (never its path: ids stay
/// out), times it unless it streams, and holds the streams' gauge while an
/// SSE response is open.
pub(crate) async fn http(State(metrics): State<Metrics>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request.extensions().get::<MatchedPath>().map_or(UNKNOWN, MatchedPath::as_str).to_owned();
    let method = method_label(request.method());
    let response = next.run(request).await;
    let kind = response_kind(&response);
    let status = response.status().as_u16().to_string();
    metrics.http_requests.with([&route, &method, &status, kind]).inc();
    if kind == "http" {
        metrics.http_latency.with([&route, &method]).observe(started.elapsed());
    }
    if kind != "sse" {
        return response;
    }
    let stream = metrics.streams_in_flight.with(["sse"]).hold();
    watch_body(response, move |_| drop(stream))
}

/// The standard methods by name; any other (a caller may send any word) is `other`.
fn method_label(method: &http::Method) -> String {
    let standard = [
        http::Method::GET,
        http::Method::POST,
        http::Method::PUT,
        http::Method::PATCH,
        http::Method::DELETE,
        http::Method::HEAD,
        http::Method::OPTIONS,
    ];
    let label = if standard.contains(method) { method.as_str() } else { "other" };
    label.to_owned()
}

fn response_kind(response: &Response) -> &'static str {
    let event_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"text/event-stream"));
    match (response.status(), event_stream) {
        (StatusCode::SWITCHING_PROTOCOLS, _) => "websocket",
        (_, true) => "sse",
        _ => "http",
    }
}

/// How a response body ended.
enum Ending<'a> {
    /// With trailers (a gRPC answer's status).
    Trailers(&'a HeaderMap),
    /// Without trailers.
    End,
    /// Dropped before its end: the caller went away, or the body failed.
    Dropped,
}

/// `response`, calling `finish` once when its body ends, however it ends.
fn watch_body(response: Response, finish: impl FnOnce(Ending<'_>) + Send + 'static) -> Response {
    response.map(|inner| Body::new(Watched { inner, finish: Some(Box::new(finish)) }))
}

type Finish = Box<dyn FnOnce(Ending<'_>) + Send>;

struct Watched {
    inner: Body,
    finish: Option<Finish>,
}

impl Watched {
    fn end(&mut self, ending: Ending<'_>) {
        if let Some(finish) = self.finish.take() {
            finish(ending);
        }
    }
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    self.end(Ending::Trailers(trailers));
                }
            }
            Poll::Ready(Some(Err(_))) => self.end(Ending::Dropped),
            Poll::Ready(None) => self.end(Ending::End),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // An empty body (a gRPC trailers-only answer) is never polled: its
        // end is known from the start.
        let ending = if self.inner.is_end_stream() { Ending::End } else { Ending::Dropped };
        self.end(ending);
    }
}
