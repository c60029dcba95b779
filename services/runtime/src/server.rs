//! One server builder: gRPC services and HTTP routes on one pre-bound port,
//! with health, reflection, tracing, panic and timeout layers, and graceful
//! shutdown. Services hand it their generated server; it owns the rest.

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{Router, http::StatusCode, response::IntoResponse as _, routing::get};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{
    body::Body,
    server::NamedService,
    service::{Routes, RoutesBuilder},
    transport::Server,
};
use tonic_health::{ServingStatus, server::HealthReporter};
use tower::ServiceBuilder;
use tower_http::{
    catch_panic::CatchPanicLayer,
    trace::{DefaultOnFailure, TraceLayer},
};

mod cors;
mod guard;
mod limits;
mod readiness;

pub use self::{
    cors::origins,
    guard::{Admission, Guard, NamespaceCheck},
    limits::refused_for_size,
    readiness::{ReadinessProbe, serving_probe},
};
use self::{
    limits::{grpc_limit, http_limit},
    readiness::healthz,
};
use crate::{
    metrics::{self, Metrics, observe},
    telemetry, upgrade,
};

/// Server settings shared by every service.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Longest a call may take to answer: a unary call's whole answer, a
    /// stream's or an SSE response's start (what follows is not limited).
    pub request_timeout_ms: u64,
    /// Largest accepted request message.
    pub max_message_bytes: usize,
    /// How long shutdown waits for calls in flight.
    pub shutdown_grace_ms: u64,
    /// The most connections served at once; 0: three quarters of the
    /// process's open-file limit.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            request_timeout_ms: 120_000,
            max_message_bytes: 4 * 1024 * 1024,
            shutdown_grace_ms: 10_000,
            max_connections: 0,
        }
    }
}

/// How often an HTTP/2 connection is pinged, and how long its answer may take.
const HTTP2_PING_EVERY: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// The credential a [`Guard`] let a call in with, by name, in the call's
/// extensions: a handler records who acted by it, not only by what the
/// request claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// `claimed` (who a request says acts), attested by the credential the
    /// call came with, if any: `ana (credential ops)`.
    pub fn attest(extensions: &http::Extensions, claimed: &str) -> String {
        match (extensions.get::<Self>(), claimed.is_empty()) {
            (None, _) => claimed.to_owned(),
            (Some(Self(caller)), true) => format!("credential {caller}"),
            (Some(Self(caller)), false) => format!("{claimed} (credential {caller})"),
        }
    }
}

/// The path prefix of chorus's own gRPC services (`/chorus.taskstore.v1…`),
/// which a [`Guard`] covers; health, reflection and A2A are not theirs.
const OWN_SERVICES: &str = "/chorus.";

/// The encoded descriptor sets of the services a server may run, which
/// reflection describes (it adds its own).
const SERVICE_DESCRIPTORS: &[&[u8]] =
    &[chorus_proto::FILE_DESCRIPTOR_SET, chorus_proto::A2A_FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];

/// Reflection's own descriptor sets: with [`SERVICE_DESCRIPTORS`], every
/// method whose name may label a metric.
const REFLECTION_DESCRIPTORS: &[&[u8]] =
    &[tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET, tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET];

/// Collects services and routes, then serves them.
pub struct ServerBuilder {
    config: ServerConfig,
    grpc: RoutesBuilder,
    http: Router,
    service_names: Vec<&'static str>,
    probes: Vec<ReadinessProbe>,
    health: HealthReporter,
    /// Origins browsers may call from over grpc-web; `None`: no grpc-web.
    grpc_web_origins: Option<Vec<String>>,
    /// Request headers grpc-web callers may send beyond the standard ones.
    grpc_web_headers: Vec<http::HeaderName>,
    /// What a call to chorus's own services must pass; `None`: nothing.
    guard: Option<Guard>,
    /// What `/metrics` serves: counted at the edge here and by the services.
    metrics: Metrics,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder").field("services", &self.service_names).finish_non_exhaustive()
    }
}

impl ServerBuilder {
    pub fn new(config: ServerConfig) -> Self {
        let (health, health_service) = tonic_health::server::health_reporter();
        let mut grpc = RoutesBuilder::default();
        grpc.add_service(health_service);
        Self {
            config,
            grpc,
            http: Router::new(),
            service_names: Vec::new(),
            probes: Vec::new(),
            health,
            grpc_web_origins: None,
            grpc_web_headers: Vec::new(),
            guard: None,
            metrics: Metrics::default(),
        }
    }

    /// The metrics this server serves on `/metrics`, for the services it
    /// runs to count into.
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Mounts a gRPC service; it is reported SERVING once [`serve`](Self::serve) starts.
    pub fn add_grpc_service<S>(&mut self, service: S) -> &mut Self
    where
        S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.service_names.push(S::NAME);
        self.grpc.add_service(service);
        self
    }

    /// Mounts HTTP routes beside the gRPC services.
    pub fn merge_http(&mut self, router: Router) -> &mut Self {
        self.http = std::mem::take(&mut self.http).merge(router);
        self
    }

    /// Lets browsers call every gRPC service over grpc-web (HTTP/1.1 or 2),
    /// and every route, from `origins` (`*` for any; see [`origins`]) under
    /// CORS, sending `headers` beside the standard ones.
    pub fn enable_grpc_web(&mut self, origins: &[String], headers: Vec<http::HeaderName>) -> &mut Self {
        self.grpc_web_origins = Some(origins.to_vec());
        self.grpc_web_headers = headers;
        self
    }

    /// Every call to chorus's own gRPC services must pass `guard` (over
    /// grpc-web too), with the namespace its request names when the guard
    /// asks; health, reflection, other services and HTTP routes are left to
    /// check their callers themselves.
    pub fn guard_own_services(&mut self, guard: Guard) -> &mut Self {
        self.guard = Some(guard);
        self
    }

    /// Adds a check that must pass for `GET /healthz` to answer 200.
    pub fn add_readiness_probe(&mut self, probe: ReadinessProbe) -> &mut Self {
        self.probes.push(probe);
        self
    }

    /// Serves until `shutdown` is cancelled, then waits up to the grace period
    /// for calls in flight.
    pub async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), tonic::transport::Error> {
        let reflection = self.reflection();
        self.grpc.add_service(reflection.0);
        self.grpc.add_service(reflection.1);
        for name in &self.service_names {
            self.health.set_service_status(*name, ServingStatus::Serving).await;
        }
        let probes = Arc::new(std::mem::take(&mut self.probes));
        readiness::follow(Arc::clone(&probes), self.health.clone(), self.service_names.clone(), shutdown.clone());
        let scraped = self.metrics.clone();
        // gRPC messages are size-checked by each service while decoding
        // (RESOURCE_EXHAUSTED, see `oversize_request`); HTTP bodies by the
        // routes that read them (the gateway's, with the binding's own error,
        // which a limit here would answer first in plain text). Like
        // `/healthz`, `/metrics` asks for no credentials: it holds no tenant data.
        let limit = Duration::from_millis(self.config.request_timeout_ms);
        let http = std::mem::take(&mut self.http)
            .route("/healthz", get(move || healthz(Arc::clone(&probes))))
            .route("/metrics", get(move || metrics_page(scraped.clone())))
            .layer(axum::middleware::from_fn(move |request, next| http_limit(limit, request, next)))
            .route_layer(axum::middleware::from_fn_with_state(self.metrics.clone(), observe::http));
        let mut grpc = self.grpc.routes().into_axum_router();
        if let Some(guard) = self.guard.take() {
            let gate = guard::Gate::new(guard, SERVICE_DESCRIPTORS, self.config.max_message_bytes);
            grpc = grpc.layer(axum::middleware::from_fn_with_state(gate, guard::check));
        }
        grpc = grpc.layer(axum::middleware::from_fn(move |request, next| grpc_limit(limit, request, next)));
        let methods = [SERVICE_DESCRIPTORS, REFLECTION_DESCRIPTORS].concat();
        let observer = observe::GrpcObserver::new(self.metrics.clone(), &methods);
        grpc = grpc.layer(axum::middleware::from_fn_with_state(observer, observe::grpc));
        if self.grpc_web_origins.is_some() {
            // Only the gRPC routes speak grpc-web; HTTP routes stay as they are.
            grpc = grpc.layer(tonic_web::GrpcWebLayer::new());
        }
        let unknown_calls = self.metrics.clone();
        let mut router = grpc.merge(http).fallback(move |request| not_found(unknown_calls.clone(), request));
        if let Some(origins) = self.grpc_web_origins.as_ref().filter(|origins| !origins.is_empty()) {
            // Every answer, the fallback's too, so that a page reads an error rather than "failed to fetch".
            let headers = std::mem::take(&mut self.grpc_web_headers);
            router = router.layer(cors::layer(origins, headers));
        }
        let layers = ServiceBuilder::new()
            // Failures are logged once where they are handled (`error::into_status`);
            // a caller's NOT_FOUND is no server error.
            .layer(
                TraceLayer::new_for_grpc()
                    .make_span_with(telemetry::server_span)
                    .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
            )
            .layer(CatchPanicLayer::custom(panic_response));
        // WebSocket handshakes go to axum (tonic completes no upgrade); the
        // rest to tonic.
        let limit = upgrade::connection_limit(self.config.max_connections);
        let upgrade::Split { grpc: incoming, upgrades } = upgrade::split(listener, limit, shutdown.clone());
        let upgrade_routes = router.clone().layer(CatchPanicLayer::custom(panic_response));
        let stopped = shutdown.clone();
        tokio::spawn(async move {
            let serving = axum::serve(upgrades, upgrade_routes).with_graceful_shutdown(stopped.cancelled_owned());
            if let Err(error) = serving.await {
                tracing::error!(%error, "the upgrade server stopped");
            }
        });
        let grace = Duration::from_millis(self.config.shutdown_grace_ms);
        let health = self.health.clone();
        let names = self.service_names.clone();
        let stopping = shutdown.clone();
        let server = Server::builder()
            .accept_http1(true)
            // A peer that went away without closing its HTTP/2 connection
            // stops answering pings: its connection is closed.
            .http2_keepalive_interval(Some(HTTP2_PING_EVERY))
            .http2_keepalive_timeout(Some(HTTP2_PING_TIMEOUT))
            .layer(layers)
            .add_routes(Routes::from(router))
            .serve_with_incoming_shutdown(incoming, async move {
                stopping.cancelled().await;
                for name in names {
                    health.set_service_status(name, ServingStatus::NotServing).await;
                }
            });
        tokio::select! {
            served = server => served,
            () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
                tracing::warn!("shutdown grace period passed with calls still in flight");
                Ok(())
            }
        }
    }

    fn reflection(&self) -> (impl ReflectionService, impl ReflectionService) {
        let builder = || {
            let mut builder = tonic_reflection::server::Builder::configure().with_service_name("grpc.health.v1.Health");
            for set in SERVICE_DESCRIPTORS {
                builder = builder.register_encoded_file_descriptor_set(set);
            }
            for name in &self.service_names {
                builder = builder.with_service_name(*name);
            }
            builder
        };
        let v1 = builder().build_v1().expect("embedded descriptor sets are valid");
        let v1alpha = builder().build_v1alpha().expect("embedded descriptor sets are valid");
        (v1, v1alpha)
    }
}

/// What a reflection server is to the routes builder.
trait ReflectionService:
    tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible, Future: Send>
    + NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> ReflectionService for S where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible, Future: Send>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// `GET /metrics`: every series, as Prometheus scrapes them.
async fn metrics_page(metrics: Metrics) -> axum::response::Response {
    ([(http::header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics.encode()).into_response()
}

/// Unknown paths: `UNIMPLEMENTED` for gRPC callers, 404 for everyone else.
async fn not_found(metrics: Metrics, request: axum::extract::Request) -> axum::response::Response {
    let content_type = request.headers().get(http::header::CONTENT_TYPE).cloned();
    if let Some(content_type) = content_type.filter(|value| value.as_bytes().starts_with(b"application/grpc")) {
        observe::unknown_grpc_call(&metrics);
        let message = format!("no such method: {}", request.uri().path());
        let mut answer = tonic::Status::unimplemented(message).into_http::<axum::body::Body>();
        // Trailers-only, the status in the headers: the same answer in grpc-web's framing.
        answer.headers_mut().insert(http::header::CONTENT_TYPE, content_type);
        return answer;
    }
    observe::unknown_http_request(&metrics, request.method());
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> http::Response<Body> {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    tracing::error!(panic = %detail, "request handler panicked");
    tonic::Status::internal("internal error").into_http()
}

#[cfg(test)]
mod tests;
