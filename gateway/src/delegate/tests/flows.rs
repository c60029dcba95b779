//! [`A2aClient::delegate`] end to end against the test agent.

use std::sync::atomic::Ordering;
use std::time::Duration;

use a2a::{PartContent, TaskState};

use super::agent::{self, Setup};
use super::{JSONRPC, REST, client, user};
use crate::delegate::{A2aClient, Credentials, DelegateError, DelegateOutcome, DelegateTarget};

const NO_STREAMING: Setup = Setup { streaming: false, jsonrpc: true, tenant: None };
const WAIT: Duration = Duration::from_secs(10);

fn quick_polls() -> A2aClient {
    client().with_poll_backoff(Duration::from_millis(5), Duration::from_millis(20))
}

fn task(outcome: DelegateOutcome) -> a2a::Task {
    match outcome {
        DelegateOutcome::Task(task) => task,
        DelegateOutcome::Message(message) => panic!("expected a task, got message {message:?}"),
    }
}

#[tokio::test]
async fn a_streaming_agent_is_followed_to_completion_on_both_bindings() {
    for setup in [JSONRPC, REST] {
        let agent = agent::start(setup).await;
        let target = DelegateTarget::new(&agent.base_url);
        let done = task(client().delegate(&target, user("hello"), WAIT, None).await.expect("delegated"));
        assert_eq!(done.status.state, TaskState::Completed);
        let artifact = &done.artifacts.as_deref().expect("artifacts")[0];
        assert_eq!(artifact.parts[0].content, PartContent::Text("hello".into()));
        let methods: Vec<_> = agent.state.calls().into_iter().map(|c| c.method).collect();
        let expected = if setup.jsonrpc { "SendStreamingMessage" } else { "POST /rest/message:stream" };
        assert_eq!(methods, [expected]);
    }
}

#[tokio::test]
async fn an_agent_without_streaming_is_polled_until_the_task_completes() {
    let agent = agent::start(NO_STREAMING).await;
    let target = DelegateTarget::new(&agent.base_url);
    let credentials = Credentials::Bearer("t".into());
    let done = task(quick_polls().delegate(&target, user("poll"), WAIT, Some(&credentials)).await.expect("delegated"));
    assert_eq!(done.status.state, TaskState::Completed);
    let calls = agent.state.calls();
    let methods: Vec<_> = calls.iter().map(|c| c.method.as_str()).collect();
    assert_eq!(methods, ["SendMessage", "GetTask", "GetTask"]);
    assert_eq!(calls[0].params["configuration"]["returnImmediately"], true);
    assert_eq!(calls[2].params["id"], done.id.as_str());
}

#[tokio::test]
async fn interrupted_tasks_and_direct_messages_end_the_delegation() {
    for setup in [JSONRPC, NO_STREAMING] {
        let agent = agent::start(setup).await;
        let target = DelegateTarget::new(&agent.base_url);
        let asked = task(client().delegate(&target, user("question"), WAIT, None).await.expect("delegated"));
        assert_eq!(asked.status.state, TaskState::InputRequired);
        match client().delegate(&target, user("chat"), WAIT, None).await.expect("delegated") {
            DelegateOutcome::Message(message) => assert_eq!(message.text(), Some("hi there")),
            DelegateOutcome::Task(task) => panic!("expected a message, got task {task:?}"),
        }
    }
}

#[tokio::test]
async fn a_continuation_is_followed_past_the_question_it_answers() {
    for setup in [JSONRPC, REST, NO_STREAMING] {
        let agent = agent::start(setup).await;
        let target = DelegateTarget::new(&agent.base_url);
        let asked = task(quick_polls().delegate(&target, user("question"), WAIT, None).await.expect("asked"));
        assert_eq!(asked.status.state, TaskState::InputRequired);
        let mut answer = user("Bob");
        answer.task_id = Some(asked.id.clone());
        answer.context_id = Some(asked.context_id.clone());
        let done = task(quick_polls().delegate(&target, answer, WAIT, None).await.expect("answered"));
        assert_eq!(done.status.state, TaskState::Completed, "not the question the answer answers ({setup:?})");
    }
}

#[tokio::test]
async fn a_remote_error_ends_the_delegation() {
    for setup in [JSONRPC, NO_STREAMING] {
        let agent = agent::start(setup).await;
        let target = DelegateTarget::new(&agent.base_url);
        let error = client().delegate(&target, user("refuse"), WAIT, None).await.expect_err("refused");
        assert!(matches!(&error, DelegateError::Remote { code: -32004, message } if message.contains("refuses")));
    }
}

#[tokio::test]
async fn a_slow_agent_times_out_and_its_task_is_canceled() {
    let rest_polled = Setup { streaming: false, jsonrpc: false, tenant: None };
    for setup in [JSONRPC, rest_polled] {
        let agent = agent::start(setup).await;
        let target = DelegateTarget::new(&agent.base_url);
        let timeout = Duration::from_millis(300);
        let error = quick_polls().delegate(&target, user("slow"), timeout, None).await.expect_err("too slow");
        let DelegateError::Timeout { task_id: Some(id) } = &error else { panic!("expected Timeout, got {error:?}") };
        assert_eq!(
            error.to_string(),
            format!("the remote A2A task {id} did not finish in time; it was asked to cancel")
        );
        assert_eq!(agent.state.task(id).expect("the agent's task").status.state, TaskState::Canceled);
        let last = agent.state.calls().pop().expect("calls");
        if setup.jsonrpc {
            assert_eq!((last.method.as_str(), &last.params["id"]), ("CancelTask", &serde_json::json!(id)));
        } else {
            assert_eq!(last.method, format!("POST /rest/tasks/{id}:cancel"));
        }
    }
}

#[tokio::test]
async fn the_card_is_reused_within_its_ttl() {
    let agent = agent::start(JSONRPC).await;
    let target = DelegateTarget::new(&agent.base_url);
    let cached = client().with_card_ttl(Duration::from_secs(3600));
    for _ in 0..2 {
        cached.delegate(&target, user("hello"), WAIT, None).await.expect("delegated");
    }
    assert_eq!(agent.state.card_hits.load(Ordering::SeqCst), 1);

    let uncached = client().with_card_ttl(Duration::ZERO);
    for _ in 0..2 {
        uncached.delegate(&target, user("hello"), WAIT, None).await.expect("delegated");
    }
    assert_eq!(agent.state.card_hits.load(Ordering::SeqCst), 3);
}
