use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

async fn http_get(address: std::net::SocketAddr, path: &str) -> String {
    http_request(address, &format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")).await
}

/// A server of `builder` on a free port: its address, the token that
/// stops it, and its task.
pub(super) async fn started(
    builder: ServerBuilder,
) -> (std::net::SocketAddr, CancellationToken, tokio::task::JoinHandle<Result<(), tonic::transport::Error>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    (address, shutdown.clone(), tokio::spawn(builder.serve(listener, shutdown)))
}

/// A readiness probe that passes while `up` holds, and fails with `reason` while not.
pub(super) fn flag_probe(up: &Arc<AtomicBool>, reason: &'static str) -> ReadinessProbe {
    let up = Arc::clone(up);
    Arc::new(move || {
        let up = up.load(Ordering::SeqCst);
        Box::pin(async move { if up { Ok(()) } else { Err(reason.to_owned()) } })
    })
}

async fn http_request(address: std::net::SocketAddr, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn healthz_follows_readiness_and_unknown_paths_are_404() {
    let ready = Arc::new(AtomicBool::new(false));
    let mut builder = ServerBuilder::new(ServerConfig::default());
    builder.add_readiness_probe(flag_probe(&ready, "warming up"));
    let (address, shutdown, server) = started(builder).await;

    let warming = http_get(address, "/healthz").await;
    assert!(warming.starts_with("HTTP/1.1 503"), "{warming}");
    assert!(warming.contains("not ready: warming up"), "{warming}");
    ready.store(true, Ordering::SeqCst);
    assert!(http_get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(http_get(address, "/no/such/page").await.starts_with("HTTP/1.1 404"));

    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn metrics_count_grpc_calls_http_requests_and_open_streams() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let (address, shutdown, server) = started(ServerBuilder::new(ServerConfig::default())).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}")).unwrap().connect_lazy();
    let mut health = HealthClient::new(channel.clone());

    health.check(HealthCheckRequest::default()).await.unwrap();
    let watch = health.watch(HealthCheckRequest::default()).await.unwrap().into_inner();
    let mut unknown = tonic::client::Grpc::new(channel);
    unknown.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/chorus.nothing.v1.Nothing/Call");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let answer = unknown.unary(tonic::Request::new(()), path, codec).await;
    assert_eq!(answer.unwrap_err().code(), tonic::Code::Unimplemented);
    assert!(http_get(address, "/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(http_get(address, "/no/such/page").await.starts_with("HTTP/1.1 404"));
    // Refused by its route, a request is counted under it.
    let refused = "PUT /healthz HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    assert!(http_request(address, refused).await.starts_with("HTTP/1.1 405"));

    let page = http_get(address, "/metrics").await;
    assert!(page.contains("content-type: text/plain; version=0.0.4"), "{page}");
    for series in [
        "chorus_grpc_requests_total{service=\"grpc.health.v1.Health\",method=\"Check\",code=\"Ok\"} 1\n",
        "chorus_grpc_request_duration_seconds_count{service=\"grpc.health.v1.Health\",method=\"Check\"} 1\n",
        "chorus_grpc_requests_total{service=\"unknown\",method=\"unknown\",code=\"Unimplemented\"} 1\n",
        "chorus_http_requests_total{route=\"/healthz\",method=\"GET\",status=\"200\",kind=\"http\"} 1\n",
        "chorus_http_requests_total{route=\"/healthz\",method=\"PUT\",status=\"405\",kind=\"http\"} 1\n",
        "chorus_http_requests_total{route=\"unknown\",method=\"GET\",status=\"404\",kind=\"http\"} 1\n",
        "chorus_streams_in_flight{protocol=\"grpc\"} 1\n",
    ] {
        assert!(page.contains(series), "no {series} in:\n{page}");
    }
    drop(watch);
    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn grpc_web_preflights_allow_the_extra_headers() {
    let mut builder = ServerBuilder::new(ServerConfig::default());
    builder.enable_grpc_web(&["*".to_owned()], vec![http::HeaderName::from_static("x-team-key")]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(builder.serve(listener, shutdown.clone()));

    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let preflight = "OPTIONS /grpc.health.v1.Health/Check HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\
                     origin: https://app.example\r\naccess-control-request-method: POST\r\n\
                     access-control-request-headers: x-team-key\r\n\r\n";
    stream.write_all(preflight.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let allowed = response.lines().find(|line| line.to_ascii_lowercase().starts_with("access-control-allow-headers"));
    assert!(allowed.is_some_and(|line| line.contains("x-team-key") && line.contains("x-api-key")), "{response}");

    shutdown.cancel();
    server.await.unwrap().unwrap();
}

#[test]
fn a_caller_attests_who_a_request_says_acts() {
    let mut extensions = http::Extensions::new();
    assert_eq!(Caller::attest(&extensions, "ana"), "ana", "no guard: what the request says");
    extensions.insert(Caller("ops".to_owned()));
    assert_eq!(Caller::attest(&extensions, "ana"), "ana (credential ops)");
    assert_eq!(Caller::attest(&extensions, ""), "credential ops");
}
