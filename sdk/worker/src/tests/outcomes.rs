//! What becomes of a task: completed, failed, requeued, canceled, abandoned.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use chorus_proto::taskstore::{FailTaskRequest, Role, TaskState};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::{NAMESPACE, PATIENCE, Running, server::LiveStore, state_of, status_changes, status_text, text_of, within};
use crate::{HandlerError, Reply, TaskContext, WorkerError};

#[tokio::test]
async fn echo_completes_with_the_text_as_message_and_artifact() {
    let store = LiveStore::start().await;
    let client = crate::connect(&store.url).await.expect("connect");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(crate::echo::run(client, crate::Placement::new("ns1"), shutdown.clone()));

    let created = store.create("ns1", crate::echo::AGENT_ID, "hello", None).await;
    let done = store.finished("ns1", &created.id).await;
    assert_eq!(state_of(&done), TaskState::Completed, "{done:?}");
    assert_eq!(done.attempt, 1);
    let message = done.status.as_ref().and_then(|status| status.message.as_ref()).expect("a final message");
    assert_eq!(message.role(), Role::Agent);
    assert_eq!(
        (message.task_id.as_str(), message.context_id.as_str()),
        (created.id.as_str(), created.context_id.as_str())
    );
    assert_eq!(text_of(Some(message)), Some("hello"));
    let roles: Vec<Role> = done.history.iter().map(|message| message.role()).collect();
    assert_eq!(roles, [Role::User, Role::Agent]);
    let [artifact] = done.artifacts.as_slice() else {
        panic!("one artifact expected, got {:?}", done.artifacts);
    };
    assert_eq!(artifact.name, "echo");
    assert_eq!(artifact.parts, [crate::text_part("hello")]);

    shutdown.cancel();
    let ended = within("echo to stop", run).await.expect("no panic");
    assert!(ended.is_ok(), "{ended:?}");
}

#[tokio::test]
async fn handler_errors_fail_the_task_or_requeue_it_while_retries_last() {
    let store = LiveStore::start().await;
    let handler = |task: TaskContext| async move {
        match (task.text().as_str(), task.task().attempt) {
            ("flaky", 1) => Err(HandlerError::retryable("busy")),
            ("flaky", _) => Ok(Reply::text("second try")),
            ("swamped", _) => Err(HandlerError::retryable_after("still busy", Duration::from_millis(300))),
            _ => Err(HandlerError::fatal("bad input")),
        }
    };
    let running = Running::start(&store, |worker| worker.max_retries(1).capacity(3), handler).await;
    let flaky = store.create(NAMESPACE, super::AGENT, "flaky", None).await;
    let swamped = store.create(NAMESPACE, super::AGENT, "swamped", None).await;
    let bad = store.create(NAMESPACE, super::AGENT, "bad", None).await;

    let events = store.events_until_done(NAMESPACE, &flaky.id).await;
    assert_eq!(status_changes(&events, TaskState::Submitted), [Some("busy; requeued after attempt 1 of 2")]);
    let flaky = store.get(NAMESPACE, &flaky.id).await;
    assert_eq!((state_of(&flaky), flaky.attempt, status_text(&flaky)), (TaskState::Completed, 2, Some("second try")));

    let events = store.events_until_done(NAMESPACE, &swamped.id).await;
    let requeued = status_changes(&events, TaskState::Submitted);
    assert_eq!(requeued, [Some("still busy; requeued after attempt 1 of 2, to be taken again in 300ms")]);
    let swamped = store.get(NAMESPACE, &swamped.id).await;
    assert_eq!(
        (state_of(&swamped), swamped.attempt, status_text(&swamped)),
        (TaskState::Failed, 2, Some("still busy"))
    );

    let events = store.events_until_done(NAMESPACE, &bad.id).await;
    assert!(status_changes(&events, TaskState::Submitted).is_empty(), "a fatal error is not retried: {events:?}");
    let bad = store.get(NAMESPACE, &bad.id).await;
    assert_eq!((state_of(&bad), bad.attempt, status_text(&bad)), (TaskState::Failed, 1, Some("bad input")));
    assert!(running.stop().await.is_ok());
}

/// A worker that cannot take a task now hands it back for later: with room
/// on its stream, it is not handed the task straight back.
#[tokio::test]
async fn a_handler_may_hand_its_task_back_for_later() {
    let store = LiveStore::start().await;
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&tries);
    let handler = move |task: TaskContext| {
        let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                return Err(HandlerError::handed_back("the GPU is busy", Duration::from_millis(400)));
            }
            Ok(Reply::text(format!("done on attempt {}", task.task().attempt)))
        }
    };
    let metrics = chorus_runtime::metrics::Metrics::default();
    let counted = metrics.clone();
    let running = Running::start(&store, move |worker| worker.capacity(2).metrics(counted), handler).await;
    let task = store.create(NAMESPACE, super::AGENT, "render", None).await;
    let events = store.events_until_done(NAMESPACE, &task.id).await;
    let requeued = status_changes(&events, TaskState::Submitted);
    let [Some(said)] = requeued.as_slice() else { panic!("one hand-back: {requeued:?}") };
    let (handed_back, again) = said.split_once(", for another worker now or ").expect("others first");
    assert_eq!(handed_back, "the GPU is busy; handed back to the queue, the attempt not counted");
    assert!(again.ends_with(" again in 400ms"), "{said}");
    let done = store.get(NAMESPACE, &task.id).await;
    assert_eq!((state_of(&done), status_text(&done)), (TaskState::Completed, Some("done on attempt 1")));
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    let outcome = |outcome| metrics.worker_tasks.with([outcome]).get();
    assert_eq!((outcome("handed_back"), outcome("completed"), outcome("failed")), (1, 1, 0));
    assert_eq!(metrics.worker_claim_streams.get().get(), 1, "its claim stream is open");
    assert!(running.stop().await.is_ok());
    assert_eq!(metrics.worker_claim_streams.get().get(), 0, "and closed");
    assert_eq!(metrics.worker_tasks_in_flight.get().get(), 0);
}

#[tokio::test]
async fn a_handler_may_reject_its_task() {
    let store = LiveStore::start().await;
    let handler = |task: TaskContext| async move {
        task.status("reading the request").await?;
        Err(HandlerError::rejected("I won't do that"))
    };
    let running = Running::start(&store, |worker| worker.max_retries(1), handler).await;
    let task = store.create(NAMESPACE, super::AGENT, "something dubious", None).await;
    let rejected = store.finished(NAMESPACE, &task.id).await;
    assert_eq!(
        (state_of(&rejected), rejected.attempt, status_text(&rejected)),
        (TaskState::Rejected, 1, Some("I won't do that")),
        "rejected at once, not retried: {rejected:?}"
    );
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_handler_that_lost_its_lease_spawns_nothing() {
    let store = LiveStore::start().await;
    let (contexts_tx, mut contexts) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let contexts_tx = contexts_tx.clone();
        async move {
            let _ = contexts_tx.send(task.clone());
            task.cancelled().await;
            Ok(Reply::text("gave up"))
        }
    };
    // Room for the task's second attempt while the first handler still runs.
    let running = Running::start(&store, |worker| worker.max_retries(1).capacity(2), handler).await;
    let task = store.create(NAMESPACE, super::AGENT, "plan a trip", None).await;
    let first = within("the handler to start", contexts.recv()).await.expect("a context");
    let mut client = crate::connect(&store.url).await.expect("connect");
    let requeue = FailTaskRequest {
        namespace: NAMESPACE.to_owned(),
        task_id: task.id.clone(),
        lease_id: first.lease_id().to_owned(),
        reason: "taken away".to_owned(),
        retry: true,
        retry_after: None,
        brief: false,
    };
    client.fail_task(requeue).await.expect("requeued");

    let refused = first.spawn("booker", "book the hotels", false).await.expect_err("the lease is gone");
    let WorkerError::Transport(status) = refused else { panic!("{refused:?}") };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let second = within("the task to come back", contexts.recv()).await.expect("a context");
    second.spawn("booker", "book the hotels", false).await.expect("spawned under the current lease");
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_panicking_handler_fails_the_task_and_the_worker_goes_on() {
    let store = LiveStore::start().await;
    let handler = |task: TaskContext| async move {
        assert_ne!(task.text(), "panic", "boom");
        task.status("half way").await?;
        Ok(Reply::text("fine"))
    };
    let running = Running::start(&store, |worker| worker, handler).await;

    let panicking = store.create(NAMESPACE, super::AGENT, "panic", None).await;
    let failed = store.finished(NAMESPACE, &panicking.id).await;
    assert_eq!(state_of(&failed), TaskState::Failed);
    let reason = status_text(&failed).expect("a failure reason");
    assert!(reason.starts_with("handler panicked: ") && reason.contains("boom"), "{reason}");
    assert_eq!(failed.attempt, 1, "a panic is not retried");

    let calm = store.create(NAMESPACE, super::AGENT, "calm", None).await;
    let events = store.events_until_done(NAMESPACE, &calm.id).await;
    assert!(status_changes(&events, TaskState::Working).contains(&Some("half way")), "{events:?}");
    let done = store.get(NAMESPACE, &calm.id).await;
    assert_eq!((state_of(&done), status_text(&done)), (TaskState::Completed, Some("fine")));
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn a_task_canceled_on_the_server_is_abandoned() {
    let store = LiveStore::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let (started_tx, seen_tx) = (started_tx.clone(), seen_tx.clone());
        async move {
            let _ = started_tx.send(());
            task.cancelled().await;
            let _ = seen_tx.send(task.is_cancelled());
            Ok(Reply::text("too late"))
        }
    };
    let lease = Duration::from_secs(1);
    let configure = |worker: crate::Worker| worker.lease(lease).shutdown_grace(PATIENCE);
    let running = Running::start(&store, configure, handler).await;
    let task = store.create(NAMESPACE, super::AGENT, "work", None).await;
    within("the handler to start", started.recv()).await;

    // Outlive the lease: only renewals keep the task with this worker.
    tokio::time::sleep(lease * 2).await;
    let working = store.get(NAMESPACE, &task.id).await;
    assert_eq!((state_of(&working), working.attempt), (TaskState::Working, 1), "{working:?}");

    store.cancel(NAMESPACE, &task.id).await;
    assert_eq!(within("the handler to see the cancellation", seen.recv()).await, Some(true));
    assert!(running.stop().await.is_ok());
    let canceled = store.get(NAMESPACE, &task.id).await;
    assert_eq!(state_of(&canceled), TaskState::Canceled, "{canceled:?}");
    // The store refuses to complete a canceled task, so the API looks the same
    // whether or not the worker tried: only the calls that reached the server
    // show that it let the task go.
    let finishing: Vec<_> =
        store.calls().into_iter().filter(|call| matches!(call.method.as_str(), "CompleteTask" | "FailTask")).collect();
    assert!(finishing.is_empty(), "{finishing:?}");
}

#[tokio::test]
async fn a_cancel_reaches_the_handler_on_the_claim_stream_and_frees_its_room() {
    let store = LiveStore::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let (started_tx, seen_tx) = (started_tx.clone(), seen_tx.clone());
        async move {
            if task.text() == "next" {
                return Ok(Reply::text("done"));
            }
            let _ = started_tx.send(());
            task.cancelled().await;
            let _ = seen_tx.send(Instant::now());
            Ok(Reply::text("too late"))
        }
    };
    // Renewed every 10 s: far later than the test runs.
    let running = Running::start(&store, |worker| worker.lease(Duration::from_secs(30)), handler).await;
    let task = store.create(NAMESPACE, super::AGENT, "work", None).await;
    within("the handler to start", started.recv()).await;
    let next = store.create(NAMESPACE, super::AGENT, "next", None).await;

    let canceled_at = Instant::now();
    store.cancel(NAMESPACE, &task.id).await;
    let seen_at = within("the handler to see the cancellation", seen.recv()).await.expect("seen");
    assert!(seen_at - canceled_at < Duration::from_secs(2), "told at once, not at the next renewal");
    let done = store.finished(NAMESPACE, &next.id).await;
    assert_eq!(state_of(&done), TaskState::Completed, "the canceled task's room went to the next one");
    let renewals = store.calls().into_iter().filter(|call| call.method == "RenewLease").count();
    assert_eq!(renewals, 0, "no renewal told of the cancel");
    assert!(running.stop().await.is_ok());
}

#[tokio::test]
async fn shutdown_abandons_in_flight_tasks_promptly() {
    let store = LiveStore::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let _ = started_tx.send(task);
        std::future::pending()
    };
    let running = Running::start(&store, |worker| worker.lease(Duration::from_millis(500)), handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "forever", None).await;

    let task = within("the handler to start", started.recv()).await.expect("a task");
    assert!(!task.is_cancelled());
    let stopping = Instant::now();
    assert!(running.stop().await.is_ok());
    assert!(stopping.elapsed() < Duration::from_secs(2), "shutdown took {:?}", stopping.elapsed());
    assert!(task.is_cancelled(), "an abandoned task's context is cancelled");

    // Neither completed nor failed by the worker: handed back to the queue
    // for another worker, its attempt not counted.
    let back = store.get(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&back), back.attempt), (TaskState::Submitted, 0), "{back:?}");
    let said = "the worker shut down before finishing it; handed back to the queue, the attempt not counted";
    assert_eq!(status_text(&back), Some(said));
}

/// A task waiting for its user's answer when the worker stops is handed
/// back too: the next worker asks again. It used to stay leased, and each
/// restart of the worker spent one of its attempts.
#[tokio::test]
async fn shutdown_hands_back_a_task_waiting_on_a_question() {
    let store = LiveStore::start().await;
    let (asked_tx, mut asked) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let asked_tx = asked_tx.clone();
        async move {
            let question = crate::reply::agent_message(task.task(), vec![crate::text_part("which region?")]);
            task.update_status(TaskState::InputRequired, question).await?;
            let _ = asked_tx.send(());
            std::future::pending().await
        }
    };
    let running = Running::start(&store, |worker| worker.max_retries(0), handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "deploy", None).await;
    within("the question", asked.recv()).await.expect("asked");
    assert!(running.stop().await.is_ok());
    let back = store.get(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&back), back.attempt), (TaskState::Submitted, 0), "{back:?}");
}

#[tokio::test]
async fn capacity_bounds_the_handlers_running_at_once() {
    let store = LiveStore::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let running_now = Arc::new(AtomicUsize::new(0));
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let (handler_gate, handler_running, handler_most) =
        (Arc::clone(&gate), Arc::clone(&running_now), Arc::clone(&most_at_once));
    let handler = move |task: TaskContext| {
        let (started_tx, gate) = (started_tx.clone(), Arc::clone(&handler_gate));
        let (running_now, most_at_once) = (Arc::clone(&handler_running), Arc::clone(&handler_most));
        async move {
            let now = running_now.fetch_add(1, Ordering::SeqCst) + 1;
            most_at_once.fetch_max(now, Ordering::SeqCst);
            let _ = started_tx.send(task.id().to_owned());
            gate.acquire().await?.forget();
            running_now.fetch_sub(1, Ordering::SeqCst);
            Ok(Reply::new())
        }
    };
    let worker = Running::start(&store, |worker| worker.capacity(2), handler).await;
    let mut ids = Vec::new();
    for text in ["one", "two", "three"] {
        ids.push(store.create(NAMESPACE, super::AGENT, text, None).await.id);
    }

    let first_two = within("two handlers", async { [started.recv().await, started.recv().await] }).await;
    let third = tokio::time::timeout(Duration::from_millis(300), started.recv()).await;
    assert!(third.is_err(), "a third handler started beyond capacity");
    let waiting: Vec<_> = ids.iter().filter(|id| !first_two.contains(&Some((*id).clone()))).collect();
    let [waiting] = waiting.as_slice() else {
        panic!("one task waits, got {waiting:?}");
    };
    assert_eq!(state_of(&store.get(NAMESPACE, waiting).await), TaskState::Submitted);

    gate.add_permits(1);
    assert_eq!(within("the third handler", started.recv()).await.as_ref(), Some(*waiting));
    gate.add_permits(2);
    for id in &ids {
        assert_eq!(state_of(&store.finished(NAMESPACE, id).await), TaskState::Completed);
    }
    assert_eq!(most_at_once.load(Ordering::SeqCst), 2);
    assert!(worker.stop().await.is_ok());
}

#[tokio::test]
async fn a_task_larger_than_grpcs_default_limit_is_worked() {
    let store = LiveStore::start().await;
    let handler = |task: TaskContext| async move { Ok(Reply::text(task.text().len().to_string())) };
    let running = Running::start(&store, |worker| worker, handler).await;
    let created = store.create(NAMESPACE, super::AGENT, &"x".repeat(5 << 20), None).await;
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), done.attempt, status_text(&done)), (TaskState::Completed, 1, Some("5242880")));
    running.stop().await.expect("the worker stops cleanly");
}
