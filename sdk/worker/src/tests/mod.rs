//! The worker against an in-memory task store over a real socket.

mod fake;

use std::{future::Future, sync::Arc, time::Duration};

use chorus_proto::taskstore::{ClaimedTask, Message, Role, Task, TaskState, part::Content};
use tokio::{
    sync::{Semaphore, mpsc},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

use self::fake::{Call, Fake};
use crate::{HandlerError, Reply, TaskContext, Worker, WorkerError, text_part};

const PATIENCE: Duration = Duration::from_secs(5);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn claimed(id: &str, text: &str) -> ClaimedTask {
    let message = Message {
        message_id: format!("m-{id}"),
        role: Role::User.into(),
        parts: vec![text_part(text)],
        ..Message::default()
    };
    let task = Task { id: id.to_owned(), context_id: format!("ctx-{id}"), history: vec![message], ..Task::default() };
    ClaimedTask { task: Some(task), lease_id: format!("lease-{id}"), ..ClaimedTask::default() }
}

fn text_of(message: Option<&Message>) -> Option<&str> {
    match message?.parts.first()?.content.as_ref()? {
        Content::Text(text) => Some(text),
        Content::Raw(_) | Content::Url(_) | Content::Data(_) => None,
    }
}

struct Running {
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), WorkerError>>,
}

impl Running {
    async fn start<H, F>(fake: &Fake, configure: impl FnOnce(Worker) -> Worker, handler: H) -> Self
    where
        H: Fn(TaskContext) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
    {
        let client = crate::connect(&fake.url).await.expect("connect");
        let worker =
            Worker::new(client, "tester").reconnect_backoff(Duration::from_millis(1), Duration::from_millis(20));
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(configure(worker).run(handler, shutdown.clone()));
        Self { shutdown, run }
    }

    async fn stop(self) -> Result<(), WorkerError> {
        self.shutdown.cancel();
        within("run to return", self.run).await.expect("run does not panic")
    }
}

fn no_finishing_calls(fake: &mut Fake) {
    while let Ok(call) = fake.calls.try_recv() {
        assert!(!matches!(call, Call::Complete(_) | Call::Fail(_)), "unexpected {call:?}");
    }
}

#[tokio::test]
async fn echo_completes_with_the_text_as_message_and_artifact() {
    let mut fake = Fake::start().await;
    let client = crate::connect(&fake.url).await.expect("connect");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(crate::echo::run(client, "ns1", shutdown.clone()));

    let Call::Claim(claim) = within("claim", fake.next_call()).await else {
        panic!("the worker claims first");
    };
    assert_eq!((claim.namespace.as_str(), claim.agent_id.as_str()), ("ns1", "echo"));
    assert_eq!(claim.capacity, 8);
    assert!(claim.worker_id.starts_with("echo-"), "{}", claim.worker_id);
    let stream = within("stream", fake.next_stream()).await;
    stream.send(Ok(claimed("t1", "hello"))).expect("stream open");

    let Call::Complete(done) = within("completion", fake.next_call()).await else {
        panic!("the task completes");
    };
    assert_eq!((done.namespace.as_str(), done.task_id.as_str()), ("ns1", "t1"));
    assert_eq!(done.lease_id, "lease-t1");
    let message = done.message.as_ref().expect("a final message");
    assert_eq!(message.role, i32::from(Role::Agent));
    assert_eq!(message.context_id, "ctx-t1");
    assert_eq!(text_of(Some(message)), Some("hello"));
    assert_eq!(done.artifacts.len(), 1);
    assert_eq!(done.artifacts[0].name, "echo");

    shutdown.cancel();
    let ended = within("echo to stop", run).await.expect("no panic");
    assert!(ended.is_ok(), "{ended:?}");
}

#[tokio::test]
async fn handler_errors_fail_the_task_with_their_retry_flag() {
    let mut fake = Fake::start().await;
    let handler = |task: TaskContext| async move {
        match task.text().as_str() {
            "retry" => Err(HandlerError::retryable("busy")),
            _ => Err(HandlerError::fatal("bad input")),
        }
    };
    let running = Running::start(&fake, |worker| worker, handler).await;
    let stream = within("stream", fake.next_stream()).await;
    stream.send(Ok(claimed("t1", "retry"))).expect("stream open");
    stream.send(Ok(claimed("t2", "other"))).expect("stream open");

    let mut failures = Vec::new();
    while failures.len() < 2 {
        if let Call::Fail(failed) = within("failure", fake.next_call()).await {
            failures.push((failed.task_id, failed.reason, failed.retry));
        }
    }
    failures.sort();
    assert_eq!(failures, [("t1".into(), "busy".into(), true), ("t2".into(), "bad input".into(), false)]);
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_panicking_handler_fails_the_task_and_the_worker_goes_on() {
    let mut fake = Fake::start().await;
    let handler = |task: TaskContext| async move {
        assert_ne!(task.text(), "panic", "boom");
        task.status("half way").await?;
        Ok(Reply::text("fine"))
    };
    let running = Running::start(&fake, |worker| worker, handler).await;
    let stream = within("stream", fake.next_stream()).await;
    stream.send(Ok(claimed("t1", "panic"))).expect("stream open");
    stream.send(Ok(claimed("t2", "calm"))).expect("stream open");

    let _claim = within("claim", fake.next_call()).await;
    let Call::Fail(failed) = within("failure", fake.next_call()).await else {
        panic!("the panicking task fails");
    };
    assert_eq!(failed.task_id, "t1");
    assert!(failed.reason.starts_with("handler panicked: "), "{}", failed.reason);
    assert!(failed.reason.contains("boom"), "{}", failed.reason);
    assert!(!failed.retry);

    let Call::Status(status) = within("status", fake.next_call()).await else {
        panic!("the next task reports progress");
    };
    assert_eq!((status.task_id.as_str(), status.lease_id.as_str()), ("t2", "lease-t2"));
    assert_eq!(status.state, i32::from(TaskState::Working));
    assert_eq!(text_of(status.message.as_ref()), Some("half way"));
    let Call::Complete(done) = within("completion", fake.next_call()).await else {
        panic!("the next task completes");
    };
    assert_eq!(done.task_id, "t2");
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_task_canceled_on_the_server_is_abandoned() {
    let mut fake = Fake::start().await;
    fake.state.cancel_on_renew.store(true, std::sync::atomic::Ordering::SeqCst);
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let seen_tx = seen_tx.clone();
        async move {
            task.cancelled().await;
            let _ = seen_tx.send(task.is_cancelled());
            Ok(Reply::text("too late"))
        }
    };
    let lease = Duration::from_millis(60);
    let configure = |worker: Worker| worker.lease(lease).shutdown_grace(PATIENCE);
    let running = Running::start(&fake, configure, handler).await;
    let stream = within("stream", fake.next_stream()).await;
    stream.send(Ok(claimed("t1", "work"))).expect("stream open");

    let renewal = within("renewal", fake.next_renewal()).await;
    assert_eq!((renewal.task_id.as_str(), renewal.lease_id.as_str()), ("t1", "lease-t1"));
    assert_eq!(renewal.lease.map(|lease| lease.nanos), Some(60_000_000));
    assert_eq!(within("cancellation", seen.recv()).await, Some(true));
    assert!(running.stop().await.is_ok());
    no_finishing_calls(&mut fake);
}

#[tokio::test]
async fn shutdown_abandons_in_flight_tasks_promptly() {
    let mut fake = Fake::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let _ = started_tx.send(task);
        std::future::pending()
    };
    let running = Running::start(&fake, |worker| worker, handler).await;
    let stream = within("stream", fake.next_stream()).await;
    stream.send(Ok(claimed("t1", "forever"))).expect("stream open");

    let task = within("handler start", started.recv()).await.expect("a task");
    assert!(!task.is_cancelled());
    assert!(running.stop().await.is_ok());
    assert!(task.is_cancelled(), "an abandoned task's context is cancelled");
    no_finishing_calls(&mut fake);
}

#[tokio::test]
async fn the_worker_reconnects_when_the_stream_ends() {
    let mut fake = Fake::start().await;
    let running = Running::start(&fake, |worker| worker, crate::echo::handle).await;
    let Call::Claim(first) = within("claim", fake.next_call()).await else {
        panic!("the worker claims first");
    };
    drop(within("stream", fake.next_stream()).await);

    let Call::Claim(second) = within("second claim", fake.next_call()).await else {
        panic!("the worker claims again");
    };
    assert_eq!(first.worker_id, second.worker_id);
    let stream = within("second stream", fake.next_stream()).await;
    stream.send(Ok(claimed("t1", "again"))).expect("stream open");
    let Call::Complete(done) = within("completion", fake.next_call()).await else {
        panic!("the task completes");
    };
    assert_eq!(text_of(done.message.as_ref()), Some("again"));
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn capacity_bounds_the_handlers_running_at_once() {
    let mut fake = Fake::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let handler_gate = Arc::clone(&gate);
    let handler = move |task: TaskContext| {
        let (started_tx, gate) = (started_tx.clone(), Arc::clone(&handler_gate));
        async move {
            let _ = started_tx.send(task.id().to_owned());
            gate.acquire().await?.forget();
            Ok(Reply::new())
        }
    };
    let running = Running::start(&fake, |worker| worker.capacity(2), handler).await;
    let stream = within("stream", fake.next_stream()).await;
    for id in ["t1", "t2", "t3"] {
        stream.send(Ok(claimed(id, "wait"))).expect("stream open");
    }

    within("two handlers", async {
        started.recv().await;
        started.recv().await;
    })
    .await;
    let third = tokio::time::timeout(Duration::from_millis(200), started.recv()).await;
    assert!(third.is_err(), "a third handler started beyond capacity");
    gate.add_permits(1);
    assert_eq!(within("third handler", started.recv()).await.as_deref(), Some("t3"));
    gate.add_permits(2);
    let mut completed = 0;
    while completed < 3 {
        if let Call::Complete(_) = within("completion", fake.next_call()).await {
            completed += 1;
        }
    }
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_refused_claim_stream_stops_the_worker() {
    let fake = Fake::start().await;
    *fake.state.refuse_claims.lock().await = Some(tonic::Status::unauthenticated("no key"));
    let running = Running::start(&fake, |worker| worker, crate::echo::handle).await;
    let ended = within("run to return", running.run).await.expect("no panic");
    match ended {
        Err(WorkerError::Stream(status)) => assert_eq!(status.code(), tonic::Code::Unauthenticated),
        other => panic!("expected a refused stream, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_reports_bad_urls_and_absent_servers() {
    let bad = crate::connect("not a url").await;
    assert!(matches!(bad, Err(WorkerError::Connect { .. })), "{bad:?}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let addr = listener.local_addr().expect("bound address");
    drop(listener);
    let absent = crate::connect(&format!("http://{addr}")).await;
    assert!(matches!(absent, Err(WorkerError::Connect { .. })), "{absent:?}");
}

#[tokio::test]
async fn calls_about_a_task_continue_its_trace() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    // This test's runtime runs every task on this thread.
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));

    let mut fake = Fake::start().await;
    let handler = |task: TaskContext| async move {
        task.status("traced").await?;
        Ok(Reply::text("done"))
    };
    let running = Running::start(&fake, |worker| worker, handler).await;
    let stream = within("stream", fake.next_stream()).await;
    let mut task = claimed("t1", "trace me");
    let traceparent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    task.trace_context.insert("traceparent".into(), traceparent);
    stream.send(Ok(task)).expect("stream open");
    while !matches!(within("completion", fake.next_call()).await, Call::Complete(_)) {}
    assert!(running.stop().await.is_ok());

    let traceparents = fake.state.traceparents.lock().await.clone();
    assert!(traceparents.len() >= 2, "{traceparents:?}");
    for traceparent in traceparents {
        assert!(traceparent.starts_with(&format!("00-{TRACE_ID}-")), "{traceparent:?}");
    }
}
