//! The worker's link to the task store: connecting, reconnecting,
//! restarting, refusal, and the trace that travels with each task.

use std::{sync::Arc, time::Duration};

use chorus_proto::taskstore::TaskState;
use tokio::sync::{Notify, mpsc};

use super::{AGENT, NAMESPACE, Running, server::LiveStore, state_of, status_changes, status_text, within};
use crate::{CancellationToken, Reply, TaskContext, Worker, WorkerError};

#[tokio::test]
async fn the_worker_reconnects_when_the_server_comes_back() {
    let mut store = LiveStore::start().await;
    let running = Running::start(&store, |worker| worker, crate::echo::handle).await;
    let before = store.create(NAMESPACE, AGENT, "before", None).await;
    assert_eq!(state_of(&store.finished(NAMESPACE, &before.id).await), TaskState::Completed);

    store.stop().await;
    assert!(!running.run.is_finished(), "the worker keeps going while the server is away");
    store.restart().await;

    let after = store.create(NAMESPACE, AGENT, "again", None).await;
    let done = store.finished(NAMESPACE, &after.id).await;
    assert_eq!((state_of(&done), status_text(&done)), (TaskState::Completed, Some("again")));
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_refused_claim_stream_stops_the_worker() {
    let store = LiveStore::start().await;
    // The task store refuses an agent id with a control character.
    let running = Running::start_for(&store, "tab\there", |worker| worker, crate::echo::handle).await;
    let ended = within("run to return", running.run).await.expect("no panic");
    match ended {
        Err(WorkerError::Stream(status)) => assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}"),
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

/// A worker whose client connects lazily starts before its task store and
/// works once the store is up.
#[tokio::test]
async fn a_lazily_connected_worker_waits_for_its_task_store() {
    let mut store = LiveStore::start().await;
    store.stop().await;
    assert!(matches!(crate::connect_lazy("not a url"), Err(WorkerError::Connect { .. })));
    let client = crate::connect_lazy(&store.url).expect("a lazy client needs no server");
    let shutdown = CancellationToken::new();
    let worker = Worker::new(client, AGENT).reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50));
    let handler = |task: TaskContext| async move { Ok(Reply::text(task.text())) };
    let run = tokio::spawn(worker.run(handler, shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!run.is_finished(), "the worker waits for its task store");
    store.restart().await;
    let created = store.create(NAMESPACE, AGENT, "hello", None).await;
    assert_eq!(state_of(&store.finished(NAMESPACE, &created.id).await), TaskState::Completed);
    shutdown.cancel();
    within("the worker to stop", run).await.expect("no panic").expect("a clean stop");
}

/// Records OpenTelemetry spans on every thread of this test process, from now on.
///
/// Global rather than `set_default` for this test's thread: tracing caches
/// each callsite's interest process-wide, and a callsite first reached on
/// another test's thread (the task store's request span) would be cached as
/// disabled for this thread too.
fn trace_every_thread() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    static INSTALLED: std::sync::Once = std::sync::Once::new();

    INSTALLED.call_once(|| {
        opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("no other global subscriber in the test process");
        tracing::callsite::rebuild_interest_cache();
    });
}

#[tokio::test]
async fn a_task_continues_the_trace_of_its_creator() {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

    trace_every_thread();
    let store = LiveStore::start().await;
    // The handler answers with the trace its `handle_task` span belongs to.
    let handler = |task: TaskContext| async move {
        task.status("traced").await?;
        let trace_id = tracing::Span::current().context().span().span_context().trace_id();
        Ok(Reply::text(trace_id.to_string()))
    };
    let running = Running::start(&store, |worker| worker, handler).await;
    let traceparent = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
    let task = store.create(NAMESPACE, AGENT, "trace me", Some(&traceparent)).await;
    let done = store.finished(NAMESPACE, &task.id).await;
    assert_eq!((state_of(&done), status_text(&done)), (TaskState::Completed, Some(TRACE_ID)));
    assert!(running.stop().await.is_ok());

    // What the worker's calls carried is seen where it arrives: the headers
    // of the calls that reached the server (the API does not return them).
    let worker_calls: Vec<_> = store
        .calls()
        .into_iter()
        .filter(|call| matches!(call.method.as_str(), "UpdateStatus" | "RenewLease" | "CompleteTask" | "FailTask"))
        .collect();
    let methods: Vec<&str> = worker_calls.iter().map(|call| call.method.as_str()).collect();
    assert_eq!(methods, ["UpdateStatus", "CompleteTask"]);
    for call in &worker_calls {
        let traceparent = call.traceparent.as_deref().unwrap_or_default();
        assert!(traceparent.starts_with(&format!("00-{TRACE_ID}-")), "{call:?}");
    }
}

/// A worker that keeps its id across restarts takes its previous process's
/// task up at once: the task is requeued when the new process first claims,
/// not when the old lease (a minute here) runs out. (A process that shuts
/// down hands its tasks back itself; this one stands for one killed.)
#[tokio::test]
async fn a_restarted_worker_takes_up_its_previous_runs_task_at_once() {
    let store = LiveStore::start().await;
    let configure = |worker: Worker| worker.worker_id("pod-0").lease(Duration::from_secs(60)).max_retries(1);
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let hang = move |task: TaskContext| {
        let _ = started_tx.send(task.task().id.clone());
        std::future::pending()
    };
    let first = Running::start(&store, configure, hang).await;
    let task = store.create(NAMESPACE, AGENT, "survive me", None).await;
    assert_eq!(within("the first run to take the task", started.recv()).await, Some(task.id.clone()));
    first.kill().await;

    let second = Running::start(&store, configure, crate::echo::handle).await;
    let done = store.finished(NAMESPACE, &task.id).await;
    assert_eq!((state_of(&done), done.attempt, status_text(&done)), (TaskState::Completed, 2, Some("survive me")));
    let events = store.events_until_done(NAMESPACE, &task.id).await;
    let requeued = status_changes(&events, TaskState::Submitted);
    assert_eq!(requeued, [Some("worker restarted; requeued after attempt 1 of 2")]);
    assert!(second.stop().await.is_ok());
}

/// A reconnect is no restart: the tasks the process works on stay its own.
#[tokio::test]
async fn a_reconnected_worker_keeps_the_tasks_it_works_on() {
    let mut store = LiveStore::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let gate = Arc::clone(&release);
    let handler = move |task: TaskContext| {
        let _ = started_tx.send(());
        let gate = Arc::clone(&gate);
        async move {
            gate.notified().await;
            Ok(Reply::text(format!("finished {}", task.text())))
        }
    };
    let configure = |worker: Worker| worker.worker_id("pod-1").lease(Duration::from_secs(60));
    let running = Running::start(&store, configure, handler).await;
    let task = store.create(NAMESPACE, AGENT, "long job", None).await;
    within("the handler to start", started.recv()).await.expect("a task");

    store.restart().await;
    within("the worker to claim again", async {
        while store.calls().iter().filter(|call| call.method == "ClaimTasks").count() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    release.notify_one();
    let done = store.finished(NAMESPACE, &task.id).await;
    assert_eq!(
        (state_of(&done), done.attempt, status_text(&done)),
        (TaskState::Completed, 1, Some("finished long job"))
    );
    assert!(running.stop().await.is_ok());
}
