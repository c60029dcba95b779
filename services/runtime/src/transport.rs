//! How a gRPC client reaches its server: over the network ([`Transport::remote`])
//! or, when both run in one process, by calling the server's tonic service
//! directly ([`Transport::in_process`]). In process, a call skips the socket,
//! HTTP/2 framing and the kernel; it still goes through the generated codec,
//! so client and handler see exactly what they would over the network.
//!
//! Generated clients take a `Transport` as they take a `Channel`:
//! `TaskStoreClient::new(transport)`.

use std::{
    convert::Infallible,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
};

use tonic::{body::Body, transport::Channel};
use tower::{BoxError, Service, ServiceExt as _, util::BoxCloneSyncService};

/// A gRPC client's way to its server; cheap to clone. A type of its own,
/// not an alias of the boxed service: through an alias, rustc cannot prove
/// the futures of generic code over the client (the worker SDK's) `Send`.
#[derive(Clone)]
pub struct Transport(BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError>);

impl Transport {
    /// Calls over `channel`, each carrying the caller's trace context (in
    /// process, a call is made in the caller's span already).
    pub fn remote(channel: Channel) -> Self {
        let traced = channel.map_request(|mut request: http::Request<Body>| {
            crate::telemetry::inject_current_context(request.headers_mut());
            request
        });
        Self(BoxCloneSyncService::new(traced.map_err(BoxError::from)))
    }

    /// Calls `server` (a generated `…Server`) in this process.
    pub fn in_process<S>(server: S) -> Self
    where
        S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        Self(BoxCloneSyncService::new(server.map_err(|never| match never {})))
    }

    /// A transport to a server of this process that is built after its
    /// client: two services that call each other. [`Later::set`] names the
    /// server; a call before then fails.
    pub fn later() -> (Self, Later) {
        let slot = Arc::new(OnceLock::<Transport>::new());
        let server = Arc::clone(&slot);
        let service = tower::service_fn(move |request: http::Request<Body>| {
            let server = server.get().cloned();
            async move {
                match server {
                    Some(server) => server.oneshot(request).await,
                    None => Err(BoxError::from("the service this process serves is not built yet")),
                }
            }
        });
        (Self(BoxCloneSyncService::new(service)), Later(slot))
    }

    /// The same transport, each call run on a task of its own, as a call
    /// over the network runs on its connection's: for a caller that holds
    /// what the handler needs (SQLite's one writer) while it polls the call,
    /// such as the workflow engine driving a run's parallel steps. A caller
    /// that gives up on a call (drops it) ends its handler, as a call over
    /// the network does when its stream is reset.
    pub fn detached(self) -> Self {
        let inner = self.0;
        let service = tower::service_fn(move |request: http::Request<Body>| {
            let call = inner.clone().oneshot(request);
            async move { tokio_util::task::AbortOnDropHandle::new(tokio::spawn(call)).await.map_err(BoxError::from)? }
        });
        Self(BoxCloneSyncService::new(service))
    }

    /// The same transport, each call carrying `authorization: Bearer {token}`.
    pub fn with_bearer(self, token: &str) -> Result<Self, http::header::InvalidHeaderValue> {
        let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))?;
        value.set_sensitive(true);
        let authorized = self.0.map_request(move |mut request: http::Request<Body>| {
            request.headers_mut().insert(http::header::AUTHORIZATION, value.clone());
            request
        });
        Ok(Self(BoxCloneSyncService::new(authorized)))
    }
}

/// Whether a call failed on its way rather than with its server's answer:
/// the server is unavailable (starting, stopping, out of reach), or the
/// client's transport made the status because the connection could not be
/// made or broke under the call. A status the server answered carries no
/// cause; one the transport made carries its own, whatever code it maps to:
/// a connection cut mid-frame comes as INTERNAL ("h2 protocol error").
pub fn cut_off(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable || std::error::Error::source(status).is_some()
}

/// Where a [`Transport::later`] learns its server.
#[derive(Debug)]
pub struct Later(Arc<OnceLock<Transport>>);

impl Later {
    /// Calls go to `server` from now on.
    pub fn set(self, server: Transport) {
        // A `Later` is consumed here, so its slot is set at most once.
        let _ = self.0.set(server);
    }
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Transport")
    }
}

impl Service<http::Request<Body>> for Transport {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = <BoxCloneSyncService<http::Request<Body>, http::Response<Body>, BoxError> as Service<
        http::Request<Body>,
    >>::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.0.call(request)
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt as _;
    use tonic_health::{
        ServingStatus,
        pb::{HealthCheckRequest, health_check_response::ServingStatus as Wire, health_client::HealthClient},
    };

    use super::*;

    #[tokio::test]
    async fn an_in_process_client_calls_and_streams_through_the_server() {
        let (reporter, server) = tonic_health::server::health_reporter();
        reporter.set_service_status("chorus.test", ServingStatus::NotServing).await;
        let mut client = HealthClient::new(Transport::in_process(server));
        let request = || HealthCheckRequest { service: "chorus.test".to_owned() };
        let status = client.check(request()).await.unwrap().into_inner().status;
        assert_eq!(status, Wire::NotServing as i32);

        let mut watch = client.watch(request()).await.unwrap().into_inner();
        assert_eq!(watch.next().await.unwrap().unwrap().status, Wire::NotServing as i32);
        reporter.set_service_status("chorus.test", ServingStatus::Serving).await;
        assert_eq!(watch.next().await.unwrap().unwrap().status, Wire::Serving as i32);

        let unknown = client.check(HealthCheckRequest { service: "nothing".to_owned() }).await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound, "the server's own errors come through");
    }

    #[tokio::test]
    async fn a_call_is_cut_off_by_its_transport_not_by_its_server_answering() {
        let (_reporter, server) = tonic_health::server::health_reporter();
        let mut answering = HealthClient::new(Transport::in_process(server));
        let answered = answering.check(HealthCheckRequest { service: "nothing".to_owned() }).await.unwrap_err();
        assert!(!cut_off(&answered), "the server's own answer: {answered:?}");
        assert!(!cut_off(&tonic::Status::internal("a storage error")));
        assert!(cut_off(&tonic::Status::unavailable("shutting down; call again")));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let channel = Channel::from_shared(format!("http://{address}")).unwrap().connect_lazy();
        let mut away = HealthClient::new(Transport::remote(channel));
        let refused = away.check(HealthCheckRequest::default()).await.unwrap_err();
        assert!(cut_off(&refused), "nothing listens: {refused:?}");
        let mut broken = tonic::Status::internal("h2 protocol error: frame with invalid size");
        broken.set_source(Arc::new(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
        assert!(cut_off(&broken), "a status the transport made, whatever its code");
    }

    #[tokio::test]
    async fn a_detached_call_given_up_ends_its_handler() {
        let (ended, handler_ended) = tokio::sync::oneshot::channel::<()>();
        let ended = Arc::new(std::sync::Mutex::new(Some(ended)));
        let server = tower::service_fn(move |_request: http::Request<Body>| {
            let ended = ended.lock().unwrap().take();
            async move {
                // Held until the handler ends, which closes the channel.
                let _ended = ended;
                std::future::pending::<Result<http::Response<Body>, Infallible>>().await
            }
        });
        let call = Transport::in_process(server).detached().oneshot(http::Request::new(Body::empty()));
        let given_up = tokio::time::timeout(std::time::Duration::from_millis(50), call).await;
        assert!(given_up.is_err(), "the handler never answers");
        let handler = tokio::time::timeout(std::time::Duration::from_secs(5), handler_ended).await;
        assert!(handler.expect("the handler ended with the call").is_err(), "its end closed the channel");
    }

    #[tokio::test]
    async fn a_later_transport_calls_its_server_once_it_is_set() {
        let (transport, later) = Transport::later();
        let mut client = HealthClient::new(transport);
        let request = || HealthCheckRequest { service: String::new() };
        assert!(client.check(request()).await.is_err(), "no server yet");
        let (_reporter, server) = tonic_health::server::health_reporter();
        later.set(Transport::in_process(server));
        let status = client.check(request()).await.unwrap().into_inner().status;
        assert_eq!(status, Wire::Serving as i32);
    }

    #[tokio::test]
    async fn a_bearer_transport_sends_its_token_on_every_call() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        let (_reporter, server) = tonic_health::server::health_reporter();
        let server = tower::ServiceBuilder::new()
            .map_request(move |request: http::Request<Body>| {
                let header = request.headers().get(http::header::AUTHORIZATION).cloned();
                recorded.lock().unwrap().push(header);
                request
            })
            .service(server);
        let transport = Transport::in_process(server).with_bearer("s3cret").unwrap();
        let mut client = HealthClient::new(transport);
        for _ in 0..2 {
            client.check(HealthCheckRequest { service: String::new() }).await.unwrap();
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert!(seen.iter().all(|header| header.as_ref().is_some_and(|value| value == "Bearer s3cret")), "{seen:?}");
        assert!(Transport::remote(Channel::from_static("http://x").connect_lazy()).with_bearer("bad\nline").is_err());
    }
}
