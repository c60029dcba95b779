//! Delivery against a real webhook receiver (axum on `127.0.0.1:0`) that
//! answers from a script and records what arrives.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::push::{AddressKind, PushError, PushPolicy, PushSender, PushTarget, sender::backoff};

/// One scripted answer; the last one repeats.
#[derive(Clone)]
enum Reply {
    Status(u16),
    RetryAfter(u16, &'static str),
    Redirect(String),
    Hang,
}

/// What the receiver saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

struct ReceiverState {
    script: Vec<Reply>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    async fn start(script: Vec<Reply>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let addr = listener.local_addr().expect("receiver address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(ReceiverState { script, seen: Arc::clone(&seen) });
        let app = Router::new().fallback(answer).with_state(state);
        tokio::spawn(async move { axum::serve(listener, app).await.expect("receiver serves") });
        Self { addr, seen }
    }

    fn url(&self, host: &str) -> String {
        format!("http://{host}:{}/hook", self.addr.port())
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("receiver lock").clone()
    }
}

async fn answer(State(state): State<Arc<ReceiverState>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let index = {
        let mut seen = state.seen.lock().expect("receiver lock");
        seen.push(Seen { path: uri.path().to_owned(), headers, body });
        seen.len() - 1
    };
    let reply = state.script[index.min(state.script.len() - 1)].clone();
    let status = |code: u16| StatusCode::from_u16(code).expect("scripted status");
    match reply {
        Reply::Status(code) => status(code).into_response(),
        Reply::RetryAfter(code, seconds) => (status(code), [(header::RETRY_AFTER, seconds)]).into_response(),
        Reply::Redirect(location) => (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, location)]).into_response(),
        Reply::Hang => std::future::pending().await,
    }
}

/// Private addresses allowed (the receiver is on loopback), short backoffs.
fn policy() -> PushPolicy {
    PushPolicy {
        allow_private: true,
        timeout_ms: 2_000,
        max_attempts: 5,
        initial_backoff_ms: 5,
        max_backoff_ms: 20,
        ..PushPolicy::default()
    }
}

fn sender(policy: PushPolicy) -> PushSender {
    PushSender::new(policy).expect("push sender")
}

fn target(url: String) -> PushTarget {
    PushTarget { url, token: None, authentication: None }
}

/// Delivers `status_update()` to `target`, which stays as it is on every retry.
async fn deliver(sender: &PushSender, target: &PushTarget) -> Result<u32, PushError> {
    sender.deliver(target, &status_update(), || std::future::ready(Some(target.clone()))).await
}

fn header<'a>(seen: &'a Seen, name: &str) -> Option<&'a str> {
    seen.headers.get(name).map(|value| value.to_str().expect("ascii header"))
}

fn status_update() -> serde_json::Value {
    json!({"statusUpdate": {"taskId": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_COMPLETED"}}})
}

#[tokio::test]
async fn delivers_body_and_headers() {
    let receiver = Receiver::start(vec![Reply::Status(200)]).await;
    let target = PushTarget {
        url: receiver.url("127.0.0.1"),
        token: Some("tok-1".into()),
        authentication: Some(("Bearer".into(), Some("s3cret".into()))),
    };
    let attempts = deliver(&sender(policy()), &target).await.expect("delivered");
    assert_eq!(attempts, 1);
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/hook");
    assert_eq!(header(&seen[0], "content-type"), Some("application/a2a+json"));
    assert_eq!(header(&seen[0], "authorization"), Some("Bearer s3cret"));
    assert_eq!(header(&seen[0], "x-a2a-notification-token"), Some("tok-1"));
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("json body");
    assert_eq!(body, status_update());
}

#[tokio::test]
async fn notifications_to_one_receiver_share_a_connection() {
    let receiver = chorus_runtime::testing::StreamingReceiver::start().await;
    let (sender, target) = (sender(policy()), target(receiver.url.clone()));
    for _ in 0..3 {
        assert_eq!(deliver(&sender, &target).await.expect("delivered"), 1, "at the first attempt");
    }
    assert_eq!(receiver.connections(), 1, "each answer is read to its end, so its connection serves the next");
}

#[tokio::test]
async fn omits_absent_token_and_credentials() {
    let receiver = Receiver::start(vec![Reply::Status(204)]).await;
    let target = PushTarget { authentication: Some(("Bearer".into(), None)), ..target(receiver.url("127.0.0.1")) };
    deliver(&sender(policy()), &target).await.expect("delivered");
    let seen = receiver.seen();
    assert_eq!(header(&seen[0], "authorization"), None);
    assert_eq!(header(&seen[0], "x-a2a-notification-token"), None);
}

#[tokio::test]
async fn retries_server_errors_until_delivered() {
    let receiver = Receiver::start(vec![Reply::Status(503), Reply::Status(503), Reply::Status(200)]).await;
    let attempts = deliver(&sender(policy()), &target(receiver.url("127.0.0.1"))).await;
    assert_eq!(attempts.expect("delivered"), 3);
    let seen = receiver.seen();
    assert_eq!(seen.len(), 3);
    assert!(!seen[0].body.is_empty());
    assert_eq!(seen[0].body, seen[2].body);
}

#[tokio::test]
async fn retries_408_and_429() {
    let receiver = Receiver::start(vec![Reply::Status(429), Reply::Status(408), Reply::Status(200)]).await;
    let attempts = deliver(&sender(policy()), &target(receiver.url("127.0.0.1"))).await;
    assert_eq!(attempts.expect("delivered"), 3);
}

#[tokio::test]
async fn gives_up_after_max_attempts() {
    let receiver = Receiver::start(vec![Reply::Status(500)]).await;
    let policy = PushPolicy { max_attempts: 3, ..policy() };
    let error = deliver(&sender(policy), &target(receiver.url("127.0.0.1"))).await.expect_err("500");
    let PushError::Undelivered { attempts: 3, cause } = &error else { panic!("expected 3 attempts, got {error:?}") };
    assert!(matches!(**cause, PushError::Status(StatusCode::INTERNAL_SERVER_ERROR)), "{cause:?}");
    assert_eq!(receiver.seen().len(), 3);
    assert_eq!(
        error.to_string(),
        "push notification not delivered after 3 attempt(s): push receiver answered HTTP 500 Internal Server Error"
    );
}

#[tokio::test]
async fn stops_retrying_once_the_notification_is_no_longer_wanted() {
    let receiver = Receiver::start(vec![Reply::Status(503)]).await;
    let first = target(receiver.url("127.0.0.1"));
    let mut asked = 0;
    let current = || {
        asked += 1;
        std::future::ready((asked < 2).then(|| first.clone()))
    };
    let error = sender(policy()).deliver(&first, &status_update(), current).await;
    let error = error.expect_err("withdrawn");
    let PushError::Undelivered { attempts: 2, cause } = &error else { panic!("expected 2 attempts, got {error:?}") };
    assert!(matches!(**cause, PushError::Withdrawn), "{cause:?}");
    assert_eq!(receiver.seen().len(), 2, "no attempt after the config was withdrawn");
}

#[tokio::test]
async fn retries_go_where_the_config_points_now() {
    let old = Receiver::start(vec![Reply::Status(503)]).await;
    let new = Receiver::start(vec![Reply::Status(200)]).await;
    let updated = PushTarget { token: Some("tok-2".into()), ..target(new.url("127.0.0.1")) };
    let current = || std::future::ready(Some(updated.clone()));
    let attempts = sender(policy()).deliver(&target(old.url("127.0.0.1")), &status_update(), current).await;
    assert_eq!(attempts.expect("delivered to the new URL"), 2);
    assert_eq!(old.seen().len(), 1, "the old URL was retried");
    let seen = new.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(header(&seen[0], "x-a2a-notification-token"), Some("tok-2"));
}

#[tokio::test]
async fn a_retry_to_a_refused_url_stops() {
    let receiver = Receiver::start(vec![Reply::Status(503)]).await;
    let policy = PushPolicy { allow_private: false, allowed_hosts: vec!["localhost".into()], ..policy() };
    let moved = target(receiver.url("127.0.0.1"));
    let current = || std::future::ready(Some(moved.clone()));
    let error = sender(policy).deliver(&target(receiver.url("localhost")), &status_update(), current).await;
    let error = error.expect_err("the new URL is loopback");
    let PushError::Undelivered { attempts: 1, cause } = &error else { panic!("expected 1 attempt, got {error:?}") };
    assert!(matches!(**cause, PushError::Blocked { kind: AddressKind::Loopback, .. }), "{cause:?}");
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test]
async fn does_not_retry_client_errors() {
    let receiver = Receiver::start(vec![Reply::Status(400), Reply::Status(200)]).await;
    let error = deliver(&sender(policy()), &target(receiver.url("127.0.0.1"))).await.expect_err("400");
    let PushError::Undelivered { attempts: 1, cause } = &error else { panic!("expected 1 attempt, got {error:?}") };
    assert!(matches!(**cause, PushError::Status(StatusCode::BAD_REQUEST)), "{cause:?}");
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test]
async fn does_not_follow_redirects() {
    let receiver = Receiver::start(vec![Reply::Status(200)]).await;
    let redirecting = Receiver::start(vec![Reply::Redirect(receiver.url("127.0.0.1"))]).await;
    let error = deliver(&sender(policy()), &target(redirecting.url("127.0.0.1"))).await.expect_err("307");
    let PushError::Undelivered { attempts: 1, cause } = &error else { panic!("expected 1 attempt, got {error:?}") };
    assert!(matches!(**cause, PushError::Redirect(StatusCode::TEMPORARY_REDIRECT)), "{cause:?}");
    assert_eq!(redirecting.seen().len(), 1);
    assert!(receiver.seen().is_empty(), "the redirect was followed");
}

#[tokio::test]
async fn times_out_a_hanging_receiver_and_retries() {
    let receiver = Receiver::start(vec![Reply::Hang, Reply::Status(200)]).await;
    let policy = PushPolicy { timeout_ms: 300, ..policy() };
    let started = Instant::now();
    let attempts = deliver(&sender(policy), &target(receiver.url("127.0.0.1"))).await;
    assert_eq!(attempts.expect("delivered on the second attempt"), 2);
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    assert_eq!(receiver.seen().len(), 2);
}

#[tokio::test]
async fn reports_a_timeout_when_the_receiver_never_answers() {
    let receiver = Receiver::start(vec![Reply::Hang]).await;
    let policy = PushPolicy { timeout_ms: 100, max_attempts: 2, ..policy() };
    let error = deliver(&sender(policy), &target(receiver.url("127.0.0.1"))).await.expect_err("hang");
    let PushError::Undelivered { attempts: 2, cause } = &error else { panic!("expected 2 attempts, got {error:?}") };
    assert_eq!(cause.to_string(), "push receiver did not answer within 100 ms");
}

#[tokio::test]
async fn retries_refused_connections() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    let policy = PushPolicy { max_attempts: 2, ..policy() };
    let url = format!("http://127.0.0.1:{port}/hook?access_token=secret-in-the-query");
    let error = deliver(&sender(policy), &target(url)).await.expect_err("nothing listens");
    let PushError::Undelivered { attempts: 2, cause } = &error else { panic!("expected 2 attempts, got {error:?}") };
    assert!(matches!(**cause, PushError::Transport(_)), "{cause:?}");
    let said = error.to_string();
    assert!(said.contains("Connection refused"), "the cause is told: {said}");
    assert!(!said.contains("secret-in-the-query") && !said.contains("/hook"), "the URL is not: {said}");
}

#[tokio::test]
async fn honours_retry_after_up_to_max_backoff() {
    let receiver = Receiver::start(vec![Reply::RetryAfter(503, "60"), Reply::Status(200)]).await;
    let policy = PushPolicy { initial_backoff_ms: 1, max_backoff_ms: 300, ..policy() };
    let started = Instant::now();
    let attempts = deliver(&sender(policy), &target(receiver.url("127.0.0.1"))).await;
    assert_eq!(attempts.expect("delivered"), 2);
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(300), "Retry-After ignored: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "Retry-After not capped: {elapsed:?}");
}

#[tokio::test]
async fn refuses_loopback_before_any_request() {
    let receiver = Receiver::start(vec![Reply::Status(200)]).await;
    let policy = PushPolicy { allow_private: false, ..policy() };
    let error = deliver(&sender(policy), &target(receiver.url("127.0.0.1"))).await.expect_err("loopback");
    assert!(matches!(error, PushError::Blocked { kind: AddressKind::Loopback, .. }), "{error:?}");
    assert!(receiver.seen().is_empty());
}

/// Host names are vetted by the client's resolver when it connects, not
/// only beforehand: this is what defeats DNS rebinding.
#[tokio::test]
async fn refuses_names_resolving_to_loopback_when_connecting() {
    let receiver = Receiver::start(vec![Reply::Status(200)]).await;
    let policy = PushPolicy { allow_private: false, ..policy() };
    let error = deliver(&sender(policy), &target(receiver.url("localhost"))).await.expect_err("refused");
    let PushError::Undelivered { attempts: 1, cause } = &error else { panic!("expected 1 attempt, got {error:?}") };
    let PushError::Blocked { host, kind, .. } = &**cause else { panic!("expected a refusal, got {cause:?}") };
    assert_eq!((host.as_str(), *kind), ("localhost", AddressKind::Loopback));
    assert!(receiver.seen().is_empty());
}

#[tokio::test]
async fn allowed_hosts_admit_a_listed_name() {
    let receiver = Receiver::start(vec![Reply::Status(200)]).await;
    let policy = PushPolicy { allow_private: false, allowed_hosts: vec!["localhost".into()], ..policy() };
    let attempts = deliver(&sender(policy), &target(receiver.url("localhost"))).await;
    assert_eq!(attempts.expect("delivered"), 1);
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test]
async fn refuses_header_values_that_are_not_valid() {
    let receiver = Receiver::start(vec![Reply::Status(200)]).await;
    let target = PushTarget { token: Some("a\nb".into()), ..target(receiver.url("127.0.0.1")) };
    let error = deliver(&sender(policy()), &target).await.expect_err("bad token");
    assert!(matches!(error, PushError::InvalidHeader("token")), "{error:?}");
    assert!(receiver.seen().is_empty());
}

#[test]
fn debug_redacts_secrets() {
    let target = PushTarget {
        url: "https://hooks.example.com/".into(),
        token: Some("tok-1".into()),
        authentication: Some(("Bearer".into(), Some("s3cret".into()))),
    };
    let debug = format!("{target:?}");
    assert!(debug.contains("hooks.example.com") && debug.contains("Bearer"), "{debug}");
    assert!(!debug.contains("tok-1") && !debug.contains("s3cret"), "{debug}");
}

#[test]
fn backoff_is_jittered_exponential_and_capped() {
    let policy = PushPolicy { initial_backoff_ms: 100, max_backoff_ms: 1_000, ..PushPolicy::default() };
    let ceilings = [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1_000), (40, 1_000)];
    for (failed, ceiling) in ceilings {
        let delays: Vec<Duration> = (0..200).map(|_| backoff(&policy, failed, None)).collect();
        assert!(delays.iter().all(|delay| *delay <= Duration::from_millis(ceiling)), "{failed}: {delays:?}");
        let low = delays.iter().filter(|delay| **delay < Duration::from_millis(ceiling / 2)).count();
        assert!((20..=180).contains(&low), "{failed}: not spread over [0, {ceiling}] ms: {low} of 200 low");
    }
    assert_eq!(backoff(&policy, 1, Some(Duration::from_millis(700))), Duration::from_millis(700));
    assert_eq!(backoff(&policy, 1, Some(Duration::from_secs(120))), Duration::from_millis(1_000));
}
