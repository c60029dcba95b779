//! What a handler's reply, a handler run again and a shutdown leave behind:
//! a reply larger than a request may be still lands (or fails the task,
//! saying why), a rerun's spawns find the children of the run before, and a
//! shutting-down worker tells its handlers.

use std::time::{Duration, Instant};

use chorus_proto::taskstore::{ListTasksRequest, TaskState, part::Content};
use tokio::sync::mpsc;

use super::{NAMESPACE, Running, server::LiveStore, server::SERVER_LIMIT, state_of, status_text, within};
use crate::{HandlerError, Reply, TaskContext, text_artifact, text_part};

#[tokio::test]
async fn a_reply_larger_than_a_request_may_be_sends_its_artifacts_ahead() {
    let store = LiveStore::start().await;
    let text: String = "chorus ✓ ".chars().cycle().take(SERVER_LIMIT + (1 << 20)).collect();
    let sent = text.clone();
    let handler = move |_: TaskContext| {
        let text = sent.clone();
        async move { Ok(Reply::text("here it is").with_artifact(text_artifact("result", text))) }
    };
    let running = Running::start(&store, |worker| worker, handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "big", None).await;
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), done.attempt, status_text(&done)), (TaskState::Completed, 1, Some("here it is")));
    let [artifact] = done.artifacts.as_slice() else { panic!("one artifact: {:?}", done.artifacts.len()) };
    assert!(artifact.parts.len() > 1, "sent in pieces");
    let joined: String = artifact
        .parts
        .iter()
        .map(|part| match &part.content {
            Some(Content::Text(text)) => text.as_str(),
            _ => panic!("a text part"),
        })
        .collect();
    assert!(joined == text, "the pieces rejoin to the text ({} of {} bytes)", joined.len(), text.len());
    running.stop().await.expect("the worker stops cleanly");
}

#[tokio::test]
async fn a_reply_the_task_store_refuses_fails_the_task_at_once_saying_why() {
    let store = LiveStore::start().await;
    let handler = |_: TaskContext| async { Ok(Reply::new().with_part(text_part("x".repeat(SERVER_LIMIT + 1)))) };
    let running = Running::start(&store, |worker| worker.max_retries(2), handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "too much", None).await;
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), done.attempt), (TaskState::Failed, 1), "not redone: {:?}", status_text(&done));
    let said = status_text(&done).unwrap_or_default();
    assert!(said.starts_with("the handler's reply could not be delivered: the request is "), "{said}");
    running.stop().await.expect("the worker stops cleanly");
}

#[tokio::test]
async fn a_handler_run_again_finds_the_children_its_earlier_run_spawned() {
    let store = LiveStore::start().await;
    let handler = |task: TaskContext| async move {
        for text in ["summarize a", "summarize a", "summarize b"] {
            task.spawn("child", text, false).await?;
        }
        if task.task().attempt == 1 {
            return Err(HandlerError::retryable("the first run gives up after its spawns"));
        }
        Ok(Reply::text("planned"))
    };
    let running = Running::start(&store, |worker| worker.max_retries(1), handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "plan", None).await;
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), done.attempt), (TaskState::Completed, 2));
    let client = crate::connect(&store.url).await.expect("connect");
    let request = ListTasksRequest {
        namespace: NAMESPACE.into(),
        parent_task_id: created.id.clone(),
        history_length: Some(1),
        ..ListTasksRequest::default()
    };
    let children = client.clone().list_tasks(request).await.expect("children").into_inner().tasks;
    assert_eq!(children.len(), 3);
    let mut texts: Vec<String> = children.iter().map(crate::reply::user_text).collect();
    texts.sort();
    assert_eq!(texts, ["summarize a", "summarize a", "summarize b"], "two runs, one set of children");
    running.stop().await.expect("the worker stops cleanly");
}

#[tokio::test]
async fn a_handler_sees_its_worker_shut_down_then_its_task_handed_back() {
    let store = LiveStore::start().await;
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let seen_tx = seen_tx.clone();
        async move {
            let _ = seen_tx.send("started");
            task.shutting_down().await;
            let _ = seen_tx.send("shutting down");
            task.cancelled().await;
            let _ = seen_tx.send("cancelled");
            std::future::pending().await
        }
    };
    let grace = Duration::from_millis(300);
    let running = Running::start(&store, |worker| worker.shutdown_grace(grace), handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "long", None).await;
    assert_eq!(within("the handler", seen.recv()).await, Some("started"));
    let stopping = Instant::now();
    running.stop().await.expect("the worker stops cleanly");
    assert!(stopping.elapsed() >= grace && stopping.elapsed() < grace * 10, "{:?}", stopping.elapsed());
    assert_eq!((seen.recv().await, seen.recv().await), (Some("shutting down"), Some("cancelled")));
    let back = store.get(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&back), back.attempt), (TaskState::Submitted, 0), "handed back: {back:?}");
}

#[tokio::test]
async fn a_handler_past_the_task_timeout_is_told_and_its_task_failed_saying_why() {
    let store = LiveStore::start().await;
    let (told_tx, mut told) = mpsc::unbounded_channel();
    let handler = move |task: TaskContext| {
        let told_tx = told_tx.clone();
        async move {
            task.cancelled().await;
            let _ = told_tx.send(());
            std::future::pending().await
        }
    };
    let limit = Duration::from_millis(300);
    let running = Running::start(&store, |worker| worker.task_timeout(limit), handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "hang", None).await;
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), done.attempt), (TaskState::Failed, 1));
    assert_eq!(status_text(&done), Some("the handler did not finish within 300ms (task_timeout)"));
    assert_eq!(within("the handler to be told", told.recv()).await, Some(()));
    running.stop().await.expect("the worker stops cleanly");
}

#[tokio::test]
async fn a_handler_asks_its_user_and_goes_on_with_the_answer() {
    let store = LiveStore::start().await;
    let handler = |task: TaskContext| async move {
        let answer = task.ask("which region?").await?;
        Ok(Reply::text(format!("deploying to {}", crate::reply::text_of(&answer.parts))))
    };
    let running = Running::start(&store, |worker| worker, handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "deploy", None).await;
    let client = crate::connect(&store.url).await.expect("connect");
    let asked = within("the question", async {
        loop {
            let task = store.get(NAMESPACE, &created.id).await;
            if state_of(&task) == TaskState::InputRequired {
                return task;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(status_text(&asked), Some("which region?"));
    let answer = chorus_proto::taskstore::Message {
        message_id: "answer-1".into(),
        role: chorus_proto::taskstore::Role::User.into(),
        parts: vec![text_part("eu-west")],
        ..Default::default()
    };
    let request = chorus_proto::taskstore::AnswerQuestionRequest {
        namespace: NAMESPACE.into(),
        task_id: created.id.clone(),
        answer: Some(answer),
        follower: None,
    };
    client.clone().answer_question(request).await.expect("answer");
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), status_text(&done)), (TaskState::Completed, Some("deploying to eu-west")));
    running.stop().await.expect("the worker stops cleanly");
}

#[tokio::test]
async fn a_handler_awaits_the_children_it_spawned() {
    let store = LiveStore::start().await;
    let children = Running::start_for(&store, "echoer", |worker| worker.capacity(2), crate::echo::handle).await;
    let handler = |task: TaskContext| async move {
        let mut ids = Vec::new();
        for text in ["one", "two"] {
            ids.push(task.spawn("echoer", text, false).await?.task.map(|child| child.id).unwrap_or_default());
        }
        let awaited = task.await_subtasks(&ids, false, Duration::from_secs(10)).await?;
        let mut said: Vec<String> =
            awaited.finished.iter().filter_map(|child| status_text(child).map(str::to_owned)).collect();
        said.sort();
        Ok(Reply::text(format!("{} of {}: {}", said.len(), ids.len(), said.join(", "))))
    };
    let running = Running::start(&store, |worker| worker, handler).await;
    let created = store.create(NAMESPACE, super::AGENT, "plan", None).await;
    let done = store.finished(NAMESPACE, &created.id).await;
    assert_eq!((state_of(&done), status_text(&done)), (TaskState::Completed, Some("2 of 2: one, two")));
    running.stop().await.expect("the worker stops cleanly");
    children.stop().await.expect("the children's worker stops cleanly");
}
