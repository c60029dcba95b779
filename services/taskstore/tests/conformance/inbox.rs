//! The owner's inbox: a blocking spawn's child reported by its answer alone,
//! reads held until acknowledged, replies that fit a client, and retried
//! notifications sent once.

use std::time::Duration;

use chorus_taskstore::{
    domain::{Claimed, InboxKind, InboxMessage, InboxRead, Message, Notification, Owner, TaskState},
    error::TaskStoreError,
};

use crate::{
    harness::{Harness, agent_message, conformance, user_message},
    subtasks::{owner_of, root_on, spawn, subtask},
};

conformance!(
    a_blocking_spawn_s_child_is_reported_by_its_answer_alone,
    a_blocking_spawn_whose_caller_went_away_leaves_the_completion_to_the_inbox,
    a_held_read_is_read_again_unless_acknowledged,
    a_read_returns_as_many_messages_as_fit_in_a_reply,
    a_retried_notification_is_sent_once,
    a_question_answered_by_a_user_s_message_leaves_the_inbox,
    a_notification_larger_than_a_read_may_carry_is_refused,
    a_retried_answer_is_the_first,
);

const LONG: Duration = Duration::from_secs(30);

fn ids(messages: &[InboxMessage]) -> Vec<i64> {
    messages.iter().map(|message| message.id.parse().expect("a numeric id")).collect()
}

async fn a_blocking_spawn_s_child_is_reported_by_its_answer_alone(h: Harness) {
    for round in 0..5 {
        let parent = root_on(&h.store).await;
        let owner = owner_of(&parent);
        let store = h.store.clone();
        let asked = subtask(&parent.id, "coder", &format!("round {round}"));
        let blocking = tokio::spawn(async move { store.spawn_subtask(asked, true, Some(LONG)).await });
        let claimed = h.claim("ns", "coder").await;
        h.store
            .complete_task("ns", &claimed.task.id, &claimed.lease_id, Some(agent_message("done")), Vec::new())
            .await
            .unwrap();
        // At once, before the spawn is likely to have woken: it still holds the completion.
        let (read, awaited) = tokio::join!(
            h.store.read_inbox("ns", &owner, 10, Duration::ZERO, InboxRead::Consume),
            h.store.await_subtasks("ns", &parent.id, &[], false, Duration::ZERO),
        );
        let (child, timed_out) = blocking.await.unwrap().unwrap();
        assert_eq!((child.status.state, timed_out), (TaskState::Completed, false));
        assert!(read.unwrap().is_empty(), "round {round}: the spawn's answer reports the child");
        assert!(awaited.unwrap().finished.is_empty(), "round {round}: the spawn's answer reports the child");
        let after = h.store.read_inbox("ns", &owner, 10, Duration::from_millis(100), InboxRead::Consume).await;
        assert!(after.unwrap().is_empty(), "round {round}: the spawn consumed the completion");
    }
}

async fn a_blocking_spawn_whose_caller_went_away_leaves_the_completion_to_the_inbox(h: Harness) {
    let parent = root_on(&h.store).await;
    let store = h.store.clone();
    let asked = subtask(&parent.id, "coder", "write it");
    let blocking = tokio::spawn(async move { store.spawn_subtask(asked, true, Some(LONG)).await });
    let claimed = h.claim("ns", "coder").await;
    blocking.abort();
    assert!(blocking.await.unwrap_err().is_cancelled());
    h.store
        .complete_task("ns", &claimed.task.id, &claimed.lease_id, Some(agent_message("done")), Vec::new())
        .await
        .unwrap();
    // Long before the spawn's 30 s would have passed.
    let read = h.store.read_inbox("ns", &owner_of(&parent), 10, Duration::from_secs(5), InboxRead::Consume).await;
    let read = read.unwrap();
    assert_eq!(read.len(), 1, "the completion is the inbox's: {read:?}");
    assert_eq!((read[0].kind, read[0].task_id.as_str()), (InboxKind::Completion, claimed.task.id.as_str()));
}

/// What the worker holding `claimed` tells its owner.
fn notification(claimed: &Claimed, kind: InboxKind, message: Message) -> Notification {
    Notification {
        namespace: "ns".into(),
        task_id: claimed.task.id.clone(),
        kind,
        message,
        lease_id: Some(claimed.lease_id.clone()),
    }
}

/// A child of a new root, claimed, that tells its owner `count` statuses.
async fn statuses(h: &Harness, count: usize, text: &str) -> Owner {
    let parent = root_on(&h.store).await;
    let child = spawn(h, &parent.id, "coder", "report").await;
    let claimed = h.claim("ns", "coder").await;
    assert_eq!(claimed.task.id, child.id);
    for index in 0..count {
        let notification = notification(&claimed, InboxKind::Status, agent_message(&format!("{index}: {text}")));
        h.store.notify_owner(notification).await.unwrap();
    }
    owner_of(&parent)
}

async fn a_held_read_is_read_again_unless_acknowledged(h: Harness) {
    let owner = statuses(&h, 3, "step").await;
    let read = |mode| h.store.read_inbox("ns", &owner, 10, Duration::ZERO, mode);
    let held = read(InboxRead::Hold { deadline: Duration::from_millis(300) }).await.unwrap();
    assert_eq!(held.len(), 3);
    assert!(read(InboxRead::Consume).await.unwrap().is_empty(), "held messages are hidden from other reads");
    assert!(read(InboxRead::Peek).await.unwrap().is_empty(), "and from peeks");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = read(InboxRead::Hold { deadline: LONG }).await.unwrap();
    assert_eq!(again, held, "unacknowledged, they are read again once the deadline passed");
    let held_ids = ids(&held);
    let other = Owner { id: "someone-else".into(), ..owner.clone() };
    assert_eq!(h.store.ack_inbox("ns", &other, &held_ids).await.unwrap(), 0, "only the owner acknowledges");
    assert_eq!(h.store.ack_inbox("ns", &owner, &held_ids[..2]).await.unwrap(), 2);
    assert_eq!(h.store.ack_inbox("ns", &owner, &held_ids).await.unwrap(), 1, "a message read already counts once");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(read(InboxRead::Peek).await.unwrap().is_empty(), "acknowledged messages are read");
}

async fn a_read_returns_as_many_messages_as_fit_in_a_reply(h: Harness) {
    let owner = statuses(&h, 6, &"x".repeat(700_000)).await;
    let mut sizes = Vec::new();
    loop {
        let read = h.store.read_inbox("ns", &owner, 100, Duration::ZERO, InboxRead::Consume).await.unwrap();
        if read.is_empty() {
            break;
        }
        sizes.push(read.len());
    }
    assert_eq!(sizes, [4, 2], "3 MiB of messages per reply");
}

async fn a_retried_notification_is_sent_once(h: Harness) {
    let parent = root_on(&h.store).await;
    spawn(&h, &parent.id, "coder", "build").await;
    let claimed = h.claim("ns", "coder").await;
    let notify = |kind, message: Message| notification(&claimed, kind, message);
    let status = agent_message("halfway");
    let first = h.store.notify_owner(notify(InboxKind::Status, status.clone())).await.unwrap();
    let again = h.store.notify_owner(notify(InboxKind::Status, status.clone())).await.unwrap();
    assert_eq!(again, first, "a retried status is the first");
    let question = agent_message("which branch?");
    let asked = h.store.notify_owner(notify(InboxKind::Question, question.clone())).await.unwrap();
    let asked_again = h.store.notify_owner(notify(InboxKind::Question, question)).await.unwrap();
    assert_eq!(asked_again, asked, "a retried question is the first");
    let child = h.store.get_task("ns", &claimed.task.id, Some(0)).await.unwrap();
    assert_eq!(child.status.state, TaskState::InputRequired);
    let other = Message { parts: agent_message("done already").parts, ..status };
    let refused = h.store.notify_owner(notify(InboxKind::Status, other)).await.unwrap_err();
    assert!(matches!(&refused, TaskStoreError::NotificationKeyInUse { .. }), "{refused}");
    let inbox = h.store.read_inbox("ns", &owner_of(&parent), 10, Duration::ZERO, InboxRead::Peek).await.unwrap();
    assert_eq!(inbox.len(), 2, "one status, one question: {inbox:?}");
}

/// A user's message answers a question as `AnswerQuestion` does: the
/// question is read, and the owner does not find it waiting afterwards.
async fn a_question_answered_by_a_user_s_message_leaves_the_inbox(h: Harness) {
    let parent = root_on(&h.store).await;
    spawn(&h, &parent.id, "coder", "build").await;
    let claimed = h.claim("ns", "coder").await;
    let question = notification(&claimed, InboxKind::Question, agent_message("which branch?"));
    h.store.notify_owner(question).await.unwrap();
    let owner = owner_of(&parent);
    let peek = || h.store.read_inbox("ns", &owner, 10, Duration::ZERO, InboxRead::Peek);
    assert_eq!(peek().await.unwrap().len(), 1);
    let answered = h.store.add_message("ns", &claimed.task.id, user_message("main"), None).await.unwrap();
    assert_eq!(answered.status.state, TaskState::Working);
    assert!(peek().await.unwrap().is_empty(), "the question was answered");
}

/// A notification of more than 1 MiB is refused, and nothing is sent: the
/// owner's reads stay readable by a client with the default 4 MiB limit.
async fn a_notification_larger_than_a_read_may_carry_is_refused(h: Harness) {
    let parent = root_on(&h.store).await;
    spawn(&h, &parent.id, "coder", "build").await;
    let claimed = h.claim("ns", "coder").await;
    let huge = notification(&claimed, InboxKind::Status, agent_message(&"x".repeat(1_100_000)));
    let refused = h.store.notify_owner(huge).await.unwrap_err();
    assert!(
        matches!(&refused, TaskStoreError::InvalidArgument(violation) if violation.field == "message"),
        "{refused}"
    );
    let inbox = h.store.read_inbox("ns", &owner_of(&parent), 10, Duration::ZERO, InboxRead::Peek).await.unwrap();
    assert!(inbox.is_empty(), "nothing was sent: {inbox:?}");
}

/// An answer retried (its reply lost) is the answer given: it does not
/// answer the question asked next, nor join the history twice.
async fn a_retried_answer_is_the_first(h: Harness) {
    let parent = root_on(&h.store).await;
    spawn(&h, &parent.id, "coder", "build").await;
    let claimed = h.claim("ns", "coder").await;
    let ask = |text: &str| notification(&claimed, InboxKind::Question, agent_message(text));
    h.store.notify_owner(ask("which branch?")).await.unwrap();
    let answer = user_message("main");
    let id = claimed.task.id.as_str();
    let answered = h.store.answer_question("ns", id, answer.clone(), None).await.unwrap();
    assert_eq!(answered.status.state, TaskState::Working);
    let again = h.store.answer_question("ns", id, answer.clone(), None).await.unwrap();
    assert_eq!(again.history, answered.history, "the retry is the answer given");
    h.store.notify_owner(ask("which tag?")).await.unwrap();
    let late = h.store.answer_question("ns", id, answer.clone(), None).await.unwrap();
    assert_eq!(late.status.state, TaskState::InputRequired, "the next question is not answered by a retry");
    let mains = late.history.iter().filter(|message| message.message_id == answer.message_id).count();
    assert_eq!(mains, 1);
    // A client that reuses the id with other words sends a new answer.
    let other = Message { parts: user_message("v2").parts, ..answer.clone() };
    let reused = h.store.answer_question("ns", id, other, None).await.unwrap();
    assert_eq!(reused.status.state, TaskState::Working, "{reused:?}");
    assert_eq!(reused.history.last().map(Message::joined_text).as_deref(), Some("v2"));
}
