//! A gateway in a process of its own outlives its task store's restarts: a
//! blocking `SendMessage` and a `SendStreamingMessage` stream that were
//! waiting when the task store stopped (gracefully or killed) end as their
//! task does once it is back, rather than fail while the task goes on. So
//! does a worker waiting for its task's answer.

use std::time::Duration;

use chorus_proto::taskstore::{AnswerQuestionRequest, Role, TaskState};
use chorus_tests::{
    Sandbox, Server,
    a2a::{A2a, describe, events, message, unique, write_chorus_toml},
    tasks, test_worker,
    worker::Mode,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const CATALOG: &str = r#"[gateway]
default_agent = "reverser"

[[gateway.agents]]
id = "reverser"
name = "Reverser"
description = "Works on each task until it is canceled"
kind = "worker"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_outlive_a_task_store_that_stops() {
    calls_outlive_a_task_store_restart(Server::stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_outlive_a_task_store_that_is_killed() {
    calls_outlive_a_task_store_restart(Server::kill).await;
}

async fn calls_outlive_a_task_store_restart<Stopped>(stop: impl FnOnce(Server) -> Stopped)
where
    Stopped: Future<Output = std::process::ExitStatus>,
{
    let sandbox = Sandbox::new();
    write_chorus_toml(sandbox.path(), CATALOG);
    let database = format!("sqlite://{}?mode=rwc", sandbox.path().join("tasks.db").display());
    let taskstore = sandbox.serve_taskstore(&database).start().await;
    let address = taskstore.address();
    let gateway =
        sandbox.serve("gateway", &database).env("CHORUS_GATEWAY__TASKSTORE_URL", taskstore.url()).start().await;
    let _worker = test_worker!(sandbox, taskstore.url()).mode(Mode::Hang).capacity(2).start().await;
    let a2a = A2a::new(&gateway);

    let (blocking, streaming) = waiting_calls(&a2a);
    let working = working_tasks(&a2a, 2).await;

    assert_eq!(healthz(&a2a).await.0, StatusCode::OK);
    stop(taskstore).await;
    let (status, reason) = healthz(&a2a).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "a gateway without its task store is not ready: {reason}");
    assert!(reason.contains("chorus.taskstore.v1.TaskStore"), "{reason}");
    let _taskstore = sandbox.serve_taskstore(&database).listen(address).start().await;
    let mut ready = healthz(&a2a).await;
    for _ in 0..50 {
        if ready.0 == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        ready = healthz(&a2a).await;
    }
    assert_eq!(ready, (StatusCode::OK, "ok\n".to_owned()), "ready again with its task store");
    for id in &working {
        a2a.call("reverser", "CancelTask", json!({ "id": id })).await;
    }

    let (status, answer) = blocking.await.expect("the blocking call does not panic");
    assert!(status.is_success(), "HTTP {status}: {answer:#}");
    assert_eq!(answer["result"]["task"]["status"]["state"], "TASK_STATE_CANCELED", "{answer:#}");
    let seen: Vec<String> =
        streaming.await.expect("the stream does not panic").iter().map(|event| describe(&event["result"])).collect();
    assert_eq!(seen.first().map(String::as_str), Some("task SUBMITTED"), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("status CANCELED"), "{seen:?}");
    let working_seen = seen.iter().filter(|event| *event == "status WORKING").count();
    assert_eq!(working_seen, 1, "a change was lost or sent twice: {seen:?}");
}

/// A blocking `SendMessage` and a `SendStreamingMessage` to `reverser`,
/// under way: the first's status and answer, the second's events.
fn waiting_calls(a2a: &A2a) -> (JoinHandle<(StatusCode, Value)>, JoinHandle<Vec<Value>>) {
    let blocking = a2a.rpc("reverser", "SendMessage", json!({ "message": message(&unique("blocking"), "wait") }));
    let streaming =
        a2a.rpc("reverser", "SendStreamingMessage", json!({ "message": message(&unique("streaming"), "wait") }));
    (tokio::spawn(chorus_tests::a2a::json(blocking)), tokio::spawn(events(streaming)))
}

/// The gateway's `/healthz` answer.
async fn healthz(a2a: &A2a) -> (StatusCode, String) {
    let answer = a2a.get("/healthz").send().await.expect("answered");
    (answer.status(), answer.text().await.expect("a text answer"))
}

/// The ids of the first `count` tasks the worker took, once it has.
async fn working_tasks(a2a: &A2a, count: usize) -> Vec<Value> {
    let mut listed = Value::Null;
    for _ in 0..200 {
        listed = a2a.call("reverser", "ListTasks", json!({ "status": "TASK_STATE_WORKING" })).await;
        let tasks = listed["tasks"].as_array().cloned().unwrap_or_default();
        if tasks.len() == count {
            return tasks.iter().map(|task| task["id"].clone()).collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the worker did not take {count} tasks: {listed:#}");
}

/// A gateway that stops answers a blocking send with the task as it is, as
/// at its blocking timeout, and ends a stream with an error that says to
/// subscribe again, at once: held for the grace period, they were cut with
/// no answer, and a client that never learnt its task's id sent it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_gateway_answers_its_waiting_calls_at_once() {
    let sandbox = Sandbox::new();
    write_chorus_toml(sandbox.path(), CATALOG);
    // No worker serves `reverser`: both calls wait. The grace period is
    // longer than the test waits for their answers.
    let server = sandbox.dev().no_agents().env("CHORUS_SERVER__SHUTDOWN_GRACE_MS", "120000").start().await;
    let a2a = A2a::new(&server);
    let (blocking, streaming) = waiting_calls(&a2a);
    while a2a.task_count().await < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let stopped = tokio::spawn(server.stop());
    let answers = async { (blocking.await.expect("blocking call"), streaming.await.expect("stream")) };
    let ((status, answer), events) =
        tokio::time::timeout(Duration::from_secs(30), answers).await.expect("answered before the grace period ends");
    assert_eq!(status, StatusCode::OK, "{answer:#}");
    assert_eq!(answer["result"]["task"]["status"]["state"], "TASK_STATE_SUBMITTED", "the task as it is: {answer:#}");
    let last = events.last().expect("events");
    let error = last["error"]["message"].as_str().unwrap_or_default();
    assert!(error.starts_with("the gateway is shutting down; subscribe to the task again"), "{events:#?}");
    assert!(stopped.await.expect("stopped").success());
}

/// The reviewer asks before it publishes; a restart of the task store while
/// it waits for the answer leaves the task waiting, and the answer given
/// afterwards completes it. The worker's watch fails as UNAVAILABLE (a
/// rolling restart) or with the transport's own error (a kill), each of
/// which used to fail the task for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waiting_for_an_answer_outlives_a_task_store_that_stops() {
    a_worker_waiting_for_an_answer_outlives_a_restart(Server::stop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waiting_for_an_answer_outlives_a_task_store_that_is_killed() {
    a_worker_waiting_for_an_answer_outlives_a_restart(Server::kill).await;
}

async fn a_worker_waiting_for_an_answer_outlives_a_restart<Stopped>(stop: impl FnOnce(Server) -> Stopped)
where
    Stopped: Future<Output = std::process::ExitStatus>,
{
    let sandbox = Sandbox::new();
    let database = format!("sqlite://{}?mode=rwc", sandbox.path().join("tasks.db").display());
    let taskstore = sandbox.serve_taskstore(&database).start().await;
    let address = taskstore.address();
    let _reviewer = sandbox.builtin_agent("reviewer", taskstore.url(), "default");
    let mut client = taskstore.task_store().await;
    let task = tasks::create_task(&mut client, "default", "reviewer", "Review the notes").await;
    let waiting = until_state(&mut client, &task.id, TaskState::InputRequired).await;

    stop(taskstore).await;
    let taskstore = sandbox.serve_taskstore(&database).listen(address).start().await;
    let mut client = taskstore.task_store().await;
    let answer = AnswerQuestionRequest {
        namespace: "default".to_owned(),
        task_id: task.id.clone(),
        answer: Some(tasks::text_message(Role::User, "yes")),
        ..AnswerQuestionRequest::default()
    };
    let answered = client.answer_question(answer).await.expect("the task still waits for its answer").into_inner();
    assert_eq!(answered.attempt, waiting.attempt, "the same attempt goes on");
    until_state(&mut client, &task.id, TaskState::Completed).await;
}

/// The task once it is in `state` (polled for up to 15 s).
async fn until_state(client: &mut tasks::Client, id: &str, state: TaskState) -> chorus_proto::taskstore::Task {
    let mut task = tasks::get_task(client, "default", id).await;
    for _ in 0..300 {
        if tasks::state(&task) == state {
            return task;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        task = tasks::get_task(client, "default", id).await;
    }
    panic!("task {id} did not become {state:?}: {task:#?}");
}
