//! Tasks: create, read, list, converse, the state machine, artifacts, cancel.

use std::time::Duration;

use std::sync::Arc;

use chorus_runtime::{storage::Backend, wakeup::Wakeups};
use chorus_taskstore::{
    TaskStore,
    domain::{
        Artifact, ArtifactChunk, EventKind, PageToken, Part, Role, StatusUpdate, TaskAnswer, TaskQuery, TaskState,
    },
    error::TaskStoreError,
    repository::sql::SqlTaskRepository,
};
use tokio_util::sync::CancellationToken;

use crate::harness::{Harness, agent_message, conformance, own_task, test_config, text_artifact, user_message};

conformance!(
    create_is_idempotent_on_the_first_message_id,
    concurrent_creates_of_one_message_make_one_task,
    concurrent_creates_each_make_their_own_task,
    an_idempotency_key_replaces_the_message_id_as_the_create_key,
    a_snapshot_watch_starts_with_the_task_then_follows_it,
    a_snapshot_holds_no_change_that_follows_it,
    history_length_limits_what_is_returned,
    list_filters_and_pages_newest_first,
    illegal_transitions_fail_and_change_nothing,
    artifacts_are_added_replaced_and_appended_in_chunks,
    a_user_message_resumes_an_interrupted_task,
    only_the_first_answer_to_an_interruption_lands,
    unknown_ids_are_not_found,
    a_new_database_gets_its_first_statistics_once_it_holds_tasks,
    an_answered_task_is_created_settled_with_each_change_logged,
    a_task_answered_with_a_question_takes_the_reply,
    a_task_holds_at_most_its_limit_of_messages_and_artifacts,
);

fn status(state: TaskState) -> StatusUpdate {
    StatusUpdate { state, message: None, lease_id: None }
}

async fn create_is_idempotent_on_the_first_message_id(h: Harness) {
    let mut new = own_task("ns", "echo", "hello");
    new.context_id = Some("ctx-1".into());
    let first = h.store.create_task(new.clone()).await.unwrap();
    assert_eq!(first.status.state, TaskState::Submitted);
    assert_eq!(first.context_id, "ctx-1");
    assert_eq!(first.history.len(), 1);
    assert_eq!(first.history[0].task_id.as_deref(), Some(first.id.as_str()));
    assert_eq!(first.history[0].context_id.as_deref(), Some("ctx-1"));
    let again = h.store.create_task(new).await.unwrap();
    assert_eq!(again.id, first.id);
    let fetched = h.store.get_task("ns", &first.id, None).await.unwrap();
    assert_eq!(fetched.history, first.history);
    let other = h.own_task("ns", "echo", "hello").await;
    assert_ne!(other.id, first.id, "a new message id makes a new task");
    assert_ne!(other.context_id, first.context_id, "a context is generated when none is given");
}

async fn an_idempotency_key_replaces_the_message_id_as_the_create_key(h: Harness) {
    let mut new = own_task("ns", "echo", "same message");
    new.idempotency_key = Some("request-1".into());
    let first = h.store.create_task(new.clone()).await.unwrap();
    assert_eq!(h.store.create_task(new.clone()).await.unwrap().id, first.id, "a retry with the key");
    let mut retried = new.clone();
    retried.message.message_id = uuid::Uuid::new_v4().to_string();
    assert_eq!(h.store.create_task(retried).await.unwrap().id, first.id, "the key names the request");
    let mut other = new.clone();
    other.message.parts = vec![Part::text("another message")];
    let error = h.store.create_task(other).await.unwrap_err();
    assert!(matches!(&error, TaskStoreError::RequestKeyInUse { task_id, .. } if task_id == &first.id), "{error}");
    new.idempotency_key = Some("request-2".into());
    let second = h.store.create_task(new).await.unwrap();
    assert_ne!(second.id, first.id, "the same message id under another key is another task");
    assert_eq!(second.history[0].message_id, first.history[0].message_id);
}

async fn a_snapshot_watch_starts_with_the_task_then_follows_it(h: Harness) {
    use futures_util::StreamExt as _;
    let task = h.own_task("ns", "echo", "watch me").await;
    h.store.update_status("ns", &task.id, status(TaskState::Working)).await.unwrap();
    let (snapshot, cursor, mut events) = h.store.watch_task_from_snapshot("ns", &task.id).await.unwrap();
    assert_eq!(snapshot.status.state, TaskState::Working, "the snapshot is the task as it is");
    h.store.update_status("ns", &task.id, status(TaskState::Completed)).await.unwrap();
    // After the snapshot: every later change, and none it holds.
    let mut states = Vec::new();
    while let Some(event) = events.next().await {
        let event = event.unwrap();
        assert!(cursor.as_ref().is_none_or(|cursor| event.cursor > cursor.after), "nothing at or before the cursor");
        states.push(event.status.state);
    }
    assert_eq!(states, [TaskState::Completed], "only the change after the snapshot");
    let unknown = h.store.watch_task_from_snapshot("ns", "no-such-task").await;
    assert!(matches!(unknown, Err(TaskStoreError::TaskNotFound(_))), "{unknown:?}");
}

/// Snapshots taken while chunks are appended: each snapshot's artifact,
/// with the chunks that follow it appended, is the whole artifact. A chunk
/// both in a snapshot and after it would be there twice.
async fn a_snapshot_holds_no_change_that_follows_it(h: Harness) {
    use futures_util::StreamExt as _;
    const CHUNKS: usize = 40;
    let task = h.own_task("ns", "echo", "stream to me").await;
    h.store.update_status("ns", &task.id, status(TaskState::Working)).await.unwrap();
    let text_of = |parts: &[Part]| -> String { parts.iter().map(|part| format!("{:?}", part.content)).collect() };
    let writer = {
        let (store, id) = (h.store.clone(), task.id.clone());
        tokio::spawn(async move {
            for n in 0..CHUNKS {
                let artifact = text_artifact("a", &n.to_string());
                let chunk = ArtifactChunk { artifact, append: n > 0, last_chunk: n + 1 == CHUNKS, lease_id: None };
                store.append_artifact("ns", &id, chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            store.update_status("ns", &id, status(TaskState::Completed)).await.unwrap();
        })
    };
    let mut readers = Vec::new();
    while !writer.is_finished() {
        let (snapshot, _, events) = h.store.watch_task_from_snapshot("ns", &task.id).await.unwrap();
        readers.push(tokio::spawn(async move {
            let mut text = snapshot.artifacts.first().map(|artifact| text_of(&artifact.parts)).unwrap_or_default();
            let events: Vec<_> = events.collect().await;
            for event in events.into_iter().map(Result::unwrap) {
                match event.artifact {
                    Some(artifact) if event.append => text.push_str(&text_of(&artifact.parts)),
                    Some(artifact) => text = text_of(&artifact.parts),
                    None => {}
                }
            }
            text
        }));
    }
    writer.await.unwrap();
    let whole = h.store.get_task("ns", &task.id, Some(0)).await.unwrap();
    let whole = text_of(&whole.artifacts[0].parts);
    assert!(readers.len() > 1, "snapshots were taken as the chunks came");
    for reader in readers {
        assert_eq!(reader.await.unwrap(), whole);
    }
}

async fn concurrent_creates_of_one_message_make_one_task(h: Harness) {
    let new = own_task("ns", "echo", "only once");
    let creates = (0..8).map(|_| h.store.create_task(new.clone()));
    let tasks = futures_util::future::join_all(creates).await;
    let ids: std::collections::HashSet<String> = tasks.into_iter().map(|task| task.unwrap().id).collect();
    assert_eq!(ids.len(), 1, "every retry gets the one task");
    let query = TaskQuery {
        namespace: "ns".into(),
        context_id: None,
        state: None,
        agent_id: None,
        parent_id: None,
        updated_after: None,
        page_size: 10,
        page_token: None,
        history_length: Some(0),
        include_artifacts: false,
    };
    assert_eq!(h.store.list_tasks(query).await.unwrap().total_size, 1);
}

async fn concurrent_creates_each_make_their_own_task(h: Harness) {
    let news: Vec<_> = (0..40).map(|index| own_task("ns", "echo", &format!("job {index}"))).collect();
    // Each create twice, all at once.
    let creates = news.iter().chain(&news).map(|new| h.store.create_task(new.clone()));
    let tasks: Vec<_> = futures_util::future::join_all(creates).await.into_iter().map(Result::unwrap).collect();
    let (firsts, retries) = tasks.split_at(news.len());
    for ((task, retry), new) in firsts.iter().zip(retries).zip(&news) {
        assert_eq!(retry.id, task.id, "a retry gets the task of its own request");
        assert_eq!(task.history[0].message_id, new.message.message_id);
        let stored = h.store.get_task("ns", &task.id, None).await.unwrap();
        assert_eq!(stored.history, task.history);
        let events = h.store.watch_task("ns", &task.id, None).await.unwrap();
        let first = tokio_stream::StreamExt::next(&mut { events }).await.unwrap().unwrap();
        assert_eq!(
            (first.kind, first.message.map(|message| message.joined_text())),
            (chorus_taskstore::domain::EventKind::Created, Some(new.message.joined_text()))
        );
    }
    let ids: std::collections::HashSet<&str> = firsts.iter().map(|task| task.id.as_str()).collect();
    assert_eq!(ids.len(), news.len());
}

async fn history_length_limits_what_is_returned(h: Harness) {
    let task = h.own_task("ns", "echo", "one").await;
    h.store.add_message("ns", &task.id, agent_message("two"), None).await.unwrap();
    h.store.add_message("ns", &task.id, user_message("three"), None).await.unwrap();
    let texts = |history: &[chorus_taskstore::domain::Message]| {
        history.iter().map(|message| message.joined_text()).collect::<Vec<_>>()
    };
    let all = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!(texts(&all.history), ["one", "two", "three"]);
    assert_eq!(all.history[1].role, Role::Agent);
    let last = h.store.get_task("ns", &task.id, Some(1)).await.unwrap();
    assert_eq!(texts(&last.history), ["three"]);
    let none = h.store.get_task("ns", &task.id, Some(0)).await.unwrap();
    assert!(none.history.is_empty());
    let more = h.store.get_task("ns", &task.id, Some(10)).await.unwrap();
    assert_eq!(more.history.len(), 3);
}

async fn list_filters_and_pages_newest_first(h: Harness) {
    let mut ids = Vec::new();
    for index in 0..5 {
        let mut new = own_task("ns", if index % 2 == 0 { "even" } else { "odd" }, &format!("task {index}"));
        new.context_id = Some(format!("ctx-{}", index % 2));
        ids.push(h.store.create_task(new).await.unwrap().id);
    }
    h.store.update_status("ns", &ids[0], status(TaskState::Working)).await.unwrap();
    let query = |page_size, page_token| TaskQuery {
        namespace: "ns".into(),
        context_id: None,
        state: None,
        agent_id: None,
        parent_id: None,
        updated_after: None,
        page_size,
        page_token,
        history_length: Some(0),
        include_artifacts: false,
    };

    let first_page = h.store.list_tasks(query(2, None)).await.unwrap();
    assert_eq!(first_page.total_size, 5);
    assert_eq!(first_page.tasks.len(), 2);
    assert_eq!(first_page.tasks[0].id, ids[0], "the most recently updated comes first");
    let mut seen: Vec<String> = first_page.tasks.iter().map(|task| task.id.clone()).collect();
    let mut token = first_page.next_page_token;
    while let Some(next) = token {
        let page = h.store.list_tasks(query(2, Some(next))).await.unwrap();
        seen.extend(page.tasks.iter().map(|task| task.id.clone()));
        token = page.next_page_token;
    }
    let mut expected = ids.clone();
    expected.sort();
    seen.sort();
    assert_eq!(seen, expected, "paging visits every task once");

    let by_agent = h.store.list_tasks(TaskQuery { agent_id: Some("odd".into()), ..query(50, None) }).await.unwrap();
    assert_eq!(by_agent.tasks.len(), 2);
    assert!(by_agent.tasks.iter().all(|task| task.agent_id == "odd"));
    let by_context =
        h.store.list_tasks(TaskQuery { context_id: Some("ctx-0".into()), ..query(50, None) }).await.unwrap();
    assert_eq!(by_context.total_size, 3);
    let by_state = h.store.list_tasks(TaskQuery { state: Some(TaskState::Working), ..query(50, None) }).await.unwrap();
    assert_eq!(by_state.tasks.iter().map(|task| &task.id).collect::<Vec<_>>(), [&ids[0]]);
    let working = h.store.get_task("ns", &ids[0], None).await.unwrap();
    let recent = TaskQuery { updated_after: Some(working.status.timestamp), ..query(50, None) };
    assert_eq!(h.store.list_tasks(recent).await.unwrap().tasks[0].id, ids[0]);
    let bogus = PageToken { timestamp: i64::MIN + 1, id: String::new(), counted: None };
    assert!(h.store.list_tasks(query(2, Some(bogus))).await.unwrap().tasks.is_empty());

    // Every filter at once, paged one by one.
    let all = |page_token| TaskQuery {
        context_id: Some("ctx-0".into()),
        agent_id: Some("even".into()),
        state: Some(TaskState::Submitted),
        updated_after: Some(0),
        ..query(1, page_token)
    };
    let mut pages = vec![h.store.list_tasks(all(None)).await.unwrap()];
    while let Some(token) = pages.last().unwrap().next_page_token.clone() {
        pages.push(h.store.list_tasks(all(Some(token))).await.unwrap());
    }
    let listed: Vec<&String> = pages.iter().flat_map(|page| &page.tasks).map(|task| &task.id).collect();
    assert_eq!(listed, [&ids[4], &ids[2]], "even tasks of ctx-0 still submitted, newest first");
    assert!(pages.iter().all(|page| page.total_size == 2), "each page counts the whole listing");

    // Later pages carry the first page's count instead of counting again.
    let paged = |page_token| TaskQuery { namespace: "paged".into(), ..query(1, page_token) };
    for text in ["one", "two", "three"] {
        h.own_task("paged", "echo", text).await;
    }
    let first = h.store.list_tasks(paged(None)).await.unwrap();
    assert_eq!(first.total_size, 3);
    h.own_task("paged", "echo", "four").await;
    let second = h.store.list_tasks(paged(first.next_page_token)).await.unwrap();
    assert_eq!(second.total_size, 3, "counted once, by the first page");
    let fresh = h.store.list_tasks(paged(None)).await.unwrap();
    assert_eq!(fresh.total_size, 4, "a new listing counts again");
    // A token carries its total for its own filters only.
    let elsewhere = TaskQuery { agent_id: Some("nobody".into()), ..paged(fresh.next_page_token) };
    assert_eq!(h.store.list_tasks(elsewhere).await.unwrap().total_size, 0, "other filters are counted");
}

async fn illegal_transitions_fail_and_change_nothing(h: Harness) {
    let task = h.own_task("ns", "echo", "go").await;
    let working = h.store.update_status("ns", &task.id, status(TaskState::Working)).await.unwrap();
    let error = h.store.update_status("ns", &task.id, status(TaskState::Submitted)).await.unwrap_err();
    assert!(matches!(
        error,
        TaskStoreError::IllegalTransition { from: TaskState::Working, to: TaskState::Submitted, .. }
    ));
    let unchanged = h.store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!(unchanged, working, "a refused transition changes nothing");

    let done = StatusUpdate { state: TaskState::Completed, message: Some(agent_message("done")), lease_id: None };
    let completed = h.store.update_status("ns", &task.id, done).await.unwrap();
    assert_eq!(completed.status.message.as_ref().unwrap().joined_text(), "done");
    let error = h.store.update_status("ns", &task.id, status(TaskState::Working)).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::TaskFinished { state: TaskState::Completed, .. }));
    let error = h.store.add_message("ns", &task.id, user_message("late"), None).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::TaskFinished { .. }));
    assert_eq!(h.store.get_task("ns", &task.id, None).await.unwrap(), completed);
}

async fn artifacts_are_added_replaced_and_appended_in_chunks(h: Harness) {
    let task = h.own_task("ns", "echo", "write").await;
    let artifact = |id: &str, text: &str| Artifact {
        artifact_id: id.into(),
        name: Some("report".into()),
        description: None,
        parts: vec![Part::text(text)],
        metadata: None,
        extensions: Vec::new(),
    };
    let chunk = |artifact, append| ArtifactChunk { artifact, append, last_chunk: false, lease_id: None };
    h.store.append_artifact("ns", &task.id, chunk(artifact("a", "one"), false)).await.unwrap();
    h.store.append_artifact("ns", &task.id, chunk(artifact("b", "other"), false)).await.unwrap();
    let appended = h.store.append_artifact("ns", &task.id, chunk(artifact("a", "two"), true)).await.unwrap();
    assert_eq!(appended.artifacts.len(), 2);
    assert_eq!(appended.artifacts[0].artifact_id, "a", "artifacts keep their order");
    assert_eq!(appended.artifacts[0].parts, vec![Part::text("one"), Part::text("two")]);
    let replaced = h.store.append_artifact("ns", &task.id, chunk(artifact("a", "new"), false)).await.unwrap();
    assert_eq!(replaced.artifacts[0].parts, vec![Part::text("new")]);
    let error = h.store.append_artifact("ns", &task.id, chunk(artifact("missing", "x"), true)).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::ArtifactNotFound { .. }), "{error}");
    assert_eq!(h.store.get_task("ns", &task.id, None).await.unwrap().artifacts, replaced.artifacts);
}

async fn a_user_message_resumes_an_interrupted_task(h: Harness) {
    let task = h.own_task("ns", "echo", "start").await;
    let question =
        StatusUpdate { state: TaskState::InputRequired, message: Some(agent_message("which file?")), lease_id: None };
    h.store.update_status("ns", &task.id, question).await.unwrap();
    let resumed = h.store.add_message("ns", &task.id, user_message("main.rs"), None).await.unwrap();
    assert_eq!(resumed.status.state, TaskState::Working);
    assert_eq!(resumed.history.last().unwrap().joined_text(), "main.rs");
    let from_agent = h.store.add_message("ns", &task.id, agent_message("thinking"), None).await.unwrap();
    assert_eq!(from_agent.status.state, TaskState::Working);
}

async fn only_the_first_answer_to_an_interruption_lands(h: Harness) {
    for interruption in [TaskState::InputRequired, TaskState::AuthRequired] {
        let task = h.own_task("ns", "echo", "start").await;
        let working = h.store.answer_question("ns", &task.id, user_message("too early"), None).await.unwrap_err();
        assert!(matches!(working, TaskStoreError::NoQuestion { state: TaskState::Submitted, .. }), "{working}");
        h.store.update_status("ns", &task.id, status(interruption)).await.unwrap();
        let answered = h.store.answer_question("ns", &task.id, user_message("first"), None).await.unwrap();
        assert_eq!(answered.status.state, TaskState::Working);
        let late = h.store.answer_question("ns", &task.id, user_message("second"), None).await.unwrap_err();
        assert!(matches!(late, TaskStoreError::NoQuestion { state: TaskState::Working, .. }), "{late}");
        let history = h.store.get_task("ns", &task.id, None).await.unwrap().history;
        let texts: Vec<String> = history.iter().map(|message| message.joined_text()).collect();
        assert_eq!(texts, ["start", "first"], "after {interruption}");
    }
}

async fn unknown_ids_are_not_found(h: Harness) {
    let missing = "no-such-task";
    assert!(matches!(h.store.get_task("ns", missing, None).await, Err(TaskStoreError::TaskNotFound(_))));
    let update = h.store.update_status("ns", missing, status(TaskState::Working)).await;
    assert!(matches!(update, Err(TaskStoreError::TaskNotFound(_))));
    let message = h.store.add_message("ns", missing, user_message("x"), None).await;
    assert!(matches!(message, Err(TaskStoreError::TaskNotFound(_))));
    assert!(matches!(h.store.cancel_task("ns", missing, None).await, Err(TaskStoreError::TaskNotFound(_))));
    assert!(matches!(h.store.watch_task("ns", missing, None).await, Err(TaskStoreError::TaskNotFound(_))));
}

/// A new PostgreSQL database gets its first statistics once it holds enough
/// tasks, every task table at once, without waiting for autovacuum (SQLite
/// keeps no plans that need them).
async fn a_new_database_gets_its_first_statistics_once_it_holds_tasks(h: Harness) {
    let postgres = h.db.backend() == Backend::Postgres;
    assert_eq!(h.repository.first_statistics(3).await.unwrap(), !postgres, "no tasks yet");
    for n in 0..3 {
        h.own_task("ns", "echo", &format!("task {n}")).await;
    }
    // Row counts reach the activity statistics within a second or so.
    let started = tokio::time::Instant::now();
    while !h.repository.first_statistics(3).await.unwrap() {
        assert!(started.elapsed() < Duration::from_secs(10), "never analysed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if postgres {
        let history: f32 =
            sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = to_regclass('taskstore_history')")
                .fetch_one(&mut *h.db.acquire().await.unwrap())
                .await
                .unwrap();
        assert_eq!(history, 3.0, "the other task tables were analysed with it");
    }
}

async fn an_answered_task_is_created_settled_with_each_change_logged(h: Harness) {
    use futures_util::StreamExt as _;
    let mut new = own_task("ns", "echo", "answer me");
    new.answer = Some(TaskAnswer {
        state: TaskState::Completed,
        message: Some(agent_message("answered")),
        artifacts: vec![text_artifact("a", "one"), text_artifact("b", "two")],
    });
    let task = h.store.create_task(new.clone()).await.unwrap();
    assert_eq!(task.status.state, TaskState::Completed);
    assert_eq!(task.status.message.as_ref().map(|message| message.joined_text()).as_deref(), Some("answered"));
    let texts: Vec<String> = task.history.iter().map(|message| message.joined_text()).collect();
    assert_eq!(texts, ["answer me", "answered"], "the answer follows the first message");
    assert_eq!(task.history[1].task_id.as_deref(), Some(task.id.as_str()));
    let ids: Vec<&str> = task.artifacts.iter().map(|artifact| artifact.artifact_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    let stored = h.repository.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!((&stored.status, &stored.history, &stored.artifacts), (&task.status, &task.history, &task.artifacts));
    let last_one = h.repository.get_task("ns", &task.id, Some(1)).await.unwrap();
    assert_eq!(last_one.history, task.history[1..]);

    let events: Vec<_> = h.store.watch_task("ns", &task.id, None).await.unwrap().map(Result::unwrap).collect().await;
    let kinds: Vec<EventKind> = events.iter().map(|event| event.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Created, EventKind::ArtifactUpdated, EventKind::ArtifactUpdated, EventKind::StatusChanged],
        "each change as a turn would have logged it, in order"
    );
    assert_eq!(events[0].message.as_ref().unwrap().joined_text(), "answer me");
    assert_eq!(events[2].artifact.as_ref().unwrap().parts, vec![Part::text("two")]);
    assert!(events[1].last_chunk && events[1].status.state == TaskState::Submitted);
    assert_eq!(events[3].status, task.status);

    let again = h.store.create_task(new).await.unwrap();
    assert_eq!(again.id, task.id, "a retried create returns the first task");
    let replayed = h.store.watch_task("ns", &task.id, None).await.unwrap().count().await;
    assert_eq!(replayed, 4, "and logs nothing more");
    let finished = h.store.update_status("ns", &task.id, status(TaskState::Working)).await;
    assert!(matches!(finished, Err(TaskStoreError::TaskFinished { .. })), "{finished:?}");
}

async fn a_task_answered_with_a_question_takes_the_reply(h: Harness) {
    let mut new = own_task("ns", "echo", "book a flight");
    new.answer = Some(TaskAnswer {
        state: TaskState::InputRequired,
        message: Some(agent_message("where to?")),
        artifacts: vec![],
    });
    let task = h.store.create_task(new).await.unwrap();
    assert_eq!((task.status.state, task.artifacts.len()), (TaskState::InputRequired, 0));
    let resumed = h.store.add_message("ns", &task.id, user_message("Lisbon"), None).await.unwrap();
    assert_eq!(resumed.status.state, TaskState::Working);
    let texts: Vec<String> = resumed.history.iter().map(|message| message.joined_text()).collect();
    assert_eq!(texts, ["book a flight", "where to?", "Lisbon"]);
}

async fn a_task_holds_at_most_its_limit_of_messages_and_artifacts(h: Harness) {
    let shutdown = CancellationToken::new();
    let config = chorus_taskstore::config::TaskStoreConfig { max_task_bytes: 4_000, ..test_config() };
    let store =
        TaskStore::new(Arc::new(SqlTaskRepository::new(h.db.clone())), Wakeups::new(), config, shutdown.clone());
    let task = store.create_task(own_task("ns", "echo", "a long talk")).await.unwrap();
    let words = "w".repeat(1_000);
    let mut added = 0;
    let refused = loop {
        match store.add_message("ns", &task.id, user_message(&words), None).await {
            Ok(_) => added += 1,
            Err(error) => break error,
        }
        assert!(added < 10, "the limit holds");
    };
    assert_eq!(added, 3, "three messages of 1,000 letters (and their JSON) fit beside the first in 4,000 bytes");
    assert!(matches!(refused, TaskStoreError::TaskTooLarge { limit: 4_000, .. }), "{refused}");
    let held = store.get_task("ns", &task.id, None).await.unwrap();
    assert_eq!(held.history.len(), 4, "the refused message changed nothing");
    let chunk =
        ArtifactChunk { artifact: text_artifact("out", &words), append: false, last_chunk: true, lease_id: None };
    let refused = store.append_artifact("ns", &task.id, chunk).await.unwrap_err();
    assert!(matches!(refused, TaskStoreError::TaskTooLarge { .. }), "artifacts count too: {refused}");
    store.add_message("ns", &task.id, user_message("ok"), None).await.expect("a short one still fits");
    let other = store.create_task(own_task("ns", "echo", "another talk")).await.unwrap();
    store.add_message("ns", &other.id, user_message(&words), None).await.expect("the limit is per task");
    shutdown.cancel();
}
