//! Completions: what a worker's final answer keeps, adds and replaces, and
//! the writes it refuses.

use std::time::Duration;

use chorus_runtime::error::{ErrorCode, ServiceError as _};
use chorus_taskstore::{
    domain::{Artifact, ArtifactChunk, EventKind, Part, StatusUpdate, TaskEvent, TaskState},
    error::TaskStoreError,
};
use tokio_stream::StreamExt as _;

use crate::{
    harness::{Harness, agent_message, conformance, text_artifact, user_message},
    workers::{claim_request, complete_with_pong, next_claim},
};

conformance!(
    a_completion_keeps_what_the_task_had_and_adds_its_message,
    a_completion_replaces_and_adds_artifacts_logged_before_its_final_state,
    a_completion_naming_one_artifact_twice_is_refused,
    a_completion_with_a_user_message_is_refused,
    an_artifact_takes_no_chunk_after_its_last,
    a_completion_after_a_reported_status_logs_its_artifacts_under_that_status,
    a_completion_without_the_lease_changes_nothing,
);

async fn a_completion_keeps_what_the_task_had_and_adds_its_message(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let artifact = text_artifact("draft", "half");
    let chunk = ArtifactChunk {
        artifact: artifact.clone(),
        append: false,
        last_chunk: true,
        lease_id: Some(claimed.lease_id.clone()),
    };
    h.store.append_artifact("ns", &task.id, chunk).await.unwrap();
    h.store.add_message("ns", &task.id, agent_message("thinking"), Some(&claimed.lease_id)).await.unwrap();
    let mut events = h.store.watch_task("ns", &task.id, None).await.unwrap();

    let done = h.store.complete_task("ns", &task.id, &claimed.lease_id, Some(agent_message("pong")), Vec::new()).await;
    let done = done.unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    let texts: Vec<String> = done.history.iter().map(|message| message.joined_text()).collect();
    assert_eq!(texts, ["ping", "thinking", "pong"]);
    let status_message = done.status.message.clone().unwrap();
    assert_eq!(status_message.joined_text(), "pong");
    assert_eq!(status_message.task_id.as_deref(), Some(task.id.as_str()), "bound to its task");
    assert_eq!(status_message.context_id.as_deref(), Some(task.context_id.as_str()));
    assert_eq!(done.history.last(), Some(&status_message));
    assert_eq!(done.artifacts, vec![artifact]);
    assert_eq!(h.store.get_task("ns", &task.id, None).await.unwrap(), done, "stored as returned");
    let last = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.unwrap().unwrap().unwrap();
        if event.status.state.is_terminal() {
            break event;
        }
    };
    assert_eq!(last.kind, EventKind::StatusChanged);
    assert_eq!(last.status, done.status);
}

/// The status a claim left is what a completion's artifacts are logged
/// under, unless the worker reported another since: then that one.
async fn a_completion_after_a_reported_status_logs_its_artifacts_under_that_status(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let update = StatusUpdate {
        state: TaskState::Working,
        message: Some(agent_message("halfway")),
        lease_id: Some(claimed.lease_id.clone()),
    };
    let reported = h.store.update_status("ns", &task.id, update).await.unwrap();
    assert_ne!(reported.status, claimed.task.status);
    let mut events = h.store.watch_task("ns", &task.id, None).await.unwrap();
    let artifact = text_artifact("out", "pong");
    let done = complete_with_pong(&h, &claimed, &artifact).await;
    let texts: Vec<String> = done.history.iter().map(|message| message.joined_text()).collect();
    assert_eq!(texts, ["ping", "halfway", "pong"]);
    assert_eq!(done.artifacts, std::slice::from_ref(&artifact));
    assert_eq!(h.store.get_task("ns", &task.id, None).await.unwrap(), done, "stored as returned");
    let logged = loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.unwrap().unwrap().unwrap();
        if event.kind == EventKind::ArtifactUpdated && event.artifact.as_ref() == Some(&artifact) {
            break event;
        }
    };
    assert_eq!(logged.status, reported.status, "logged under the status the worker reported last");
}

async fn a_completion_replaces_and_adds_artifacts_logged_before_its_final_state(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let chunk = ArtifactChunk {
        artifact: text_artifact("draft", "half"),
        append: false,
        last_chunk: true,
        lease_id: Some(claimed.lease_id.clone()),
    };
    let working = h.store.append_artifact("ns", &task.id, chunk).await.unwrap();
    let mut events = h.store.watch_task("ns", &task.id, None).await.unwrap();

    let finished = vec![text_artifact("draft", "whole"), text_artifact("notes", "n"), text_artifact("extra", "e")];
    let done = h
        .store
        .complete_task("ns", &task.id, &claimed.lease_id, Some(agent_message("pong")), finished.clone())
        .await
        .unwrap();
    assert_eq!(done.status.state, TaskState::Completed);
    assert_eq!(done.artifacts, finished, "the draft replaced in its place, the new ones after it");
    assert_eq!(h.store.get_task("ns", &task.id, None).await.unwrap(), done, "stored as returned");
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.unwrap().unwrap().unwrap();
        let last = event.status.state.is_terminal();
        seen.push(event);
        if last {
            break;
        }
    }
    let artifact_events: Vec<&TaskEvent> =
        seen.iter().filter(|event| event.kind == EventKind::ArtifactUpdated).skip(1).collect();
    let logged: Vec<Option<Artifact>> = artifact_events.iter().map(|event| event.artifact.clone()).collect();
    assert_eq!(logged, finished.into_iter().map(Some).collect::<Vec<_>>(), "in order, before the final state");
    for event in artifact_events {
        assert_eq!(event.status, working.status, "an artifact's event carries the status it was added under");
    }
    assert_eq!(seen.last().unwrap().status, done.status);
}

/// A completion's artifacts are whole: one id given twice would keep only
/// the last, so the completion is refused and changes nothing.
async fn a_completion_naming_one_artifact_twice_is_refused(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let twice = vec![text_artifact("out", "first"), text_artifact("out", "second")];
    let error = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, twice).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::InvalidArgument, "{error}");
    assert!(error.to_string().contains("out"), "names the artifact: {error}");
    let untouched = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((untouched.status.state, untouched.artifacts.len()), (TaskState::Working, 0));
    let once = vec![text_artifact("out", "first"), text_artifact("notes", "second")];
    let done = h.store.complete_task("ns", &task.id, &claimed.lease_id, None, once.clone()).await.unwrap();
    assert_eq!(done.artifacts, once);
}

async fn a_completion_with_a_user_message_is_refused(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let users = Some(user_message("pong"));
    let error = h.store.complete_task("ns", &task.id, &claimed.lease_id, users, Vec::new()).await.unwrap_err();
    assert_eq!(error.error_code(), ErrorCode::InvalidArgument, "{error}");
    assert_eq!(h.store.get_task("ns", &task.id, None).await.unwrap().status.state, TaskState::Working);
    let done = h.store.complete_task("ns", &task.id, &claimed.lease_id, Some(agent_message("pong")), Vec::new());
    assert_eq!(done.await.unwrap().status.state, TaskState::Completed);
}

/// A streamed artifact ends with its last chunk; another append is refused
/// (a new artifact under its id replaces it, as before).
async fn an_artifact_takes_no_chunk_after_its_last(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let chunk = |text: &str, append: bool, last_chunk: bool| ArtifactChunk {
        artifact: text_artifact("log", text),
        append,
        last_chunk,
        lease_id: Some(claimed.lease_id.clone()),
    };
    h.store.append_artifact("ns", &task.id, chunk("a", false, false)).await.unwrap();
    h.store.append_artifact("ns", &task.id, chunk("b", true, true)).await.unwrap();
    let error = h.store.append_artifact("ns", &task.id, chunk("c", true, false)).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::ArtifactClosed { .. }), "{error}");
    assert_eq!(error.error_code(), ErrorCode::FailedPrecondition);
    assert!(error.to_string().contains("artifact log"), "names the artifact: {error}");
    let stored = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!(stored.artifacts[0].parts, [Part::text("a"), Part::text("b")], "nothing after the last chunk");
    let replaced = h.store.append_artifact("ns", &task.id, chunk("new", false, false)).await.unwrap();
    assert_eq!(replaced.artifacts, vec![text_artifact("log", "new")]);
    h.store.append_artifact("ns", &task.id, chunk("more", true, true)).await.unwrap();
}

async fn a_completion_without_the_lease_changes_nothing(h: Harness) {
    let task = h.task("ns", "echo", "ping").await;
    let unknown = h.store.complete_task("ns", "no-such-task", "lease", Some(agent_message("x")), Vec::new()).await;
    assert!(matches!(unknown, Err(TaskStoreError::TaskNotFound(_))), "{unknown:?}");
    let unleased = h.store.complete_task("ns", &task.id, "lease", None, Vec::new()).await;
    assert!(matches!(unleased, Err(TaskStoreError::LeaseLost { .. })), "{unleased:?}");
    let mut claims = h.store.claim_stream(claim_request("echo", "w1", 1, Duration::from_secs(30), 0));
    let claimed = next_claim(&mut claims).await;
    let stolen = h.store.complete_task("ns", &task.id, "stolen", Some(agent_message("x")), Vec::new()).await;
    assert!(matches!(stolen, Err(TaskStoreError::LeaseLost { .. })), "{stolen:?}");
    let other_namespace = h.store.complete_task("other", &task.id, &claimed.lease_id, None, Vec::new()).await;
    assert!(matches!(other_namespace, Err(TaskStoreError::TaskNotFound(_))), "{other_namespace:?}");
    let untouched = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((untouched.status.state, untouched.history.len()), (TaskState::Working, 1));
    h.store.complete_task("ns", &task.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
    let twice = h.store.complete_task("ns", &task.id, &claimed.lease_id, Some(agent_message("x")), Vec::new()).await;
    assert!(matches!(twice, Err(TaskStoreError::TaskFinished { .. })), "{twice:?}");
    let finished = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((finished.status.state, finished.history.len()), (TaskState::Completed, 1));
}
