//! The gateways that follow the tasks whose turns they run: one follower at
//! a time per unfinished task, under a lease that a live follower renews
//! and a dead one's successor claims.

use std::time::Duration;

use chorus_taskstore::{
    domain::{NewTask, StatusUpdate, TaskKey, TaskState, TurnFollower},
    error::TaskStoreError,
};

use crate::harness::{Harness, conformance, own_task, user_message};

conformance!(
    a_followed_task_is_claimed_only_once_its_lease_ran_out,
    finished_tasks_are_let_go_and_never_claimed,
    a_task_no_one_follows_is_not_claimed,
    released_leases_are_claimed_at_once,
    a_new_follower_takes_a_task_over,
    a_task_created_with_its_follower_is_followed_from_the_start,
    an_answer_with_its_follower_follows_the_task_from_the_same_write,
);

const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(50);

fn key(task_id: &str) -> TaskKey {
    TaskKey { namespace: "ns".to_owned(), task_id: task_id.to_owned() }
}

/// What `follower` claims, following nothing.
async fn claims(h: &Harness, follower: &str) -> Vec<TaskKey> {
    h.store.keep_following(follower.to_owned(), LONG, Vec::new(), 10).await.unwrap().claimed
}

async fn a_followed_task_is_claimed_only_once_its_lease_ran_out(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), Some(SHORT)).await.unwrap();
    let kept = h.store.keep_following("gw-1".to_owned(), SHORT, vec![key(&task.id)], 10).await.unwrap();
    assert!(kept.lost.is_empty() && kept.claimed.is_empty(), "{kept:?}");
    assert_eq!(claims(&h, "gw-2").await, [], "held: not claimed");

    tokio::time::sleep(SHORT * 3).await;
    assert_eq!(claims(&h, "gw-2").await, [key(&task.id)], "its follower died: claimed");
    assert_eq!(claims(&h, "gw-3").await, [], "held again");
    let late = h.store.keep_following("gw-1".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert_eq!(late.lost, [key(&task.id)], "the first follower learns it lost the task");
    let kept = h.store.keep_following("gw-2".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert!(kept.lost.is_empty(), "{kept:?}");
}

async fn finished_tasks_are_let_go_and_never_claimed(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), Some(SHORT)).await.unwrap();
    let done = StatusUpdate { state: TaskState::Completed, message: None, lease_id: None };
    h.store.update_status("ns", &task.id, done).await.unwrap();
    tokio::time::sleep(SHORT * 3).await;
    assert_eq!(claims(&h, "gw-2").await, [], "a finished task is nobody's to follow");
    let kept = h.store.keep_following("gw-1".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert_eq!(kept.lost, [key(&task.id)], "its follower lets go of it");
}

async fn a_task_no_one_follows_is_not_claimed(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    assert_eq!(claims(&h, "gw-1").await, [], "a task never followed");
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), Some(SHORT)).await.unwrap();
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), None).await.unwrap();
    tokio::time::sleep(SHORT * 3).await;
    assert_eq!(claims(&h, "gw-2").await, [], "a turn that waits on its user");
    let missing = h.store.follow_task("ns", "nope", "gw-1".to_owned(), Some(LONG)).await.unwrap_err();
    assert!(matches!(missing, TaskStoreError::TaskNotFound(_)), "{missing}");
    let elsewhere = h.store.follow_task("other", &task.id, "gw-1".to_owned(), Some(LONG)).await.unwrap_err();
    assert!(matches!(elsewhere, TaskStoreError::TaskNotFound(_)), "{elsewhere}");
}

async fn released_leases_are_claimed_at_once(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), Some(LONG)).await.unwrap();
    assert_eq!(h.store.release_followed_tasks("gw-1").await.unwrap(), 1);
    assert_eq!(claims(&h, "gw-1").await, [key(&task.id)], "a restarted follower takes its tasks back at once");
}

async fn a_new_follower_takes_a_task_over(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), Some(LONG)).await.unwrap();
    h.store.follow_task("ns", &task.id, "gw-2".to_owned(), Some(LONG)).await.unwrap();
    let kept = h.store.keep_following("gw-1".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert_eq!(kept.lost, [key(&task.id)]);
}

async fn a_task_created_with_its_follower_is_followed_from_the_start(h: Harness) {
    let follower = |name: &str, lease| Some(TurnFollower { name: name.to_owned(), lease });
    let mut new = own_task("ns", "ops", "deploy");
    new.idempotency_key = Some("create-1".to_owned());
    let task = h.store.create_task(NewTask { follower: follower("gw-1", SHORT), ..new.clone() }).await.unwrap();
    assert_eq!(claims(&h, "gw-2").await, [], "followed as it was made");
    tokio::time::sleep(SHORT * 3).await;
    assert_eq!(claims(&h, "gw-2").await, [key(&task.id)], "its follower died before it renewed: claimed");

    let again = h.store.create_task(NewTask { follower: follower("gw-3", LONG), ..new.clone() }).await.unwrap();
    assert_eq!(again.id, task.id, "a retried create returns the task");
    let kept = h.store.keep_following("gw-2".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert_eq!(kept.lost, [key(&task.id)], "the retry's follower took the task over");
    tokio::time::sleep(SHORT * 3).await;
    assert_eq!(claims(&h, "gw-4").await, [], "held by the retry's follower");

    let plain = h.own_task("ns", "ops", "unfollowed").await;
    tokio::time::sleep(SHORT * 3).await;
    assert!(!claims(&h, "gw-4").await.contains(&key(&plain.id)), "a task made without a follower is no one's");
}

async fn an_answer_with_its_follower_follows_the_task_from_the_same_write(h: Harness) {
    let task = h.own_task("ns", "ops", "deploy").await;
    h.store.follow_task("ns", &task.id, "gw-1".to_owned(), Some(LONG)).await.unwrap();
    let question = StatusUpdate { state: TaskState::InputRequired, message: None, lease_id: None };
    h.store.update_status("ns", &task.id, question.clone()).await.unwrap();
    let follower = Some(TurnFollower { name: "gw-2".to_owned(), lease: SHORT });
    let answered = h.store.answer_question("ns", &task.id, user_message("go on"), follower.clone()).await.unwrap();
    assert_eq!(answered.status.state, TaskState::Working);
    let kept = h.store.keep_following("gw-1".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert_eq!(kept.lost, [key(&task.id)], "the answering gateway took the turn over");
    tokio::time::sleep(SHORT * 3).await;
    assert_eq!(claims(&h, "gw-3").await, [key(&task.id)], "its follower died before it renewed: claimed");

    let refused = h.store.answer_question("ns", &task.id, user_message("again"), follower).await.unwrap_err();
    assert!(matches!(refused, TaskStoreError::NoQuestion { .. }), "{refused}");
    let kept = h.store.keep_following("gw-3".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert!(kept.lost.is_empty(), "a refused answer follows nothing: {kept:?}");

    h.store.update_status("ns", &task.id, question).await.unwrap();
    h.store.answer_question("ns", &task.id, user_message("plain"), None).await.unwrap();
    let kept = h.store.keep_following("gw-3".to_owned(), LONG, vec![key(&task.id)], 0).await.unwrap();
    assert!(kept.lost.is_empty(), "an answer without a follower keeps the task's: {kept:?}");
}
