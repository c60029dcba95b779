//! Subtasks: spawn, await, the owner's inbox, questions, exactly-once
//! completion and the safety limits.

use std::time::Duration;

use chorus_runtime::error::{ErrorCode, ServiceError as _};
use chorus_taskstore::{
    TaskStore, TaskStoreConfig,
    domain::{
        ClaimEvent, Claimed, InboxKind, InboxRead, Limits, Message, NewSubtask, Notification, Owner, OwnerKind, Part,
        SpawnContext, StatusUpdate, Task, TaskQuery, TaskState, new_task_id,
    },
    error::TaskStoreError,
};

use crate::{
    harness::{Harness, agent_message, conformance, new_task, own_task, test_config, user_message},
    workers::{claim_request, next_claim, next_claim_event},
};

conformance!(
    start = crate::subtasks::start;
    a_blocking_spawn_returns_the_result,
    a_blocking_spawn_times_out_without_losing_the_child,
    non_blocking_spawns_are_awaited_together,
    await_any_returns_on_the_first_to_finish,
    completions_wait_in_the_inbox_until_read,
    a_completion_without_a_message_reaches_the_owner,
    questions_interrupt_the_child_until_answered,
    each_completion_reaches_the_parent_exactly_once,
    concurrent_awaits_and_inbox_reads_report_each_completion_once,
    a_message_id_is_reused_only_to_retry_the_same_request,
    depth_is_limited_by_where_the_tree_started,
    concurrent_and_total_subtasks_are_limited,
    spawn_rate_is_limited,
    a_spawn_that_repeats_an_ancestor_is_a_cycle,
    a_worker_canceling_its_task_cancels_the_subtree_and_tells_the_workers_below,
    a_listing_names_the_parent_whose_children_it_lists,
);

pub(crate) fn limits_config() -> TaskStoreConfig {
    TaskStoreConfig {
        limits: Limits {
            max_concurrent_subtasks: 3,
            max_total_subtasks: 5,
            max_spawns_per_minute: 100,
            ..Limits::default()
        },
        ..test_config()
    }
}

pub(crate) fn subtask(parent_id: &str, agent: &str, text: &str) -> NewSubtask {
    NewSubtask {
        namespace: "ns".into(),
        parent_id: parent_id.into(),
        agent_id: agent.into(),
        message: user_message(text),
        owner: None,
        metadata: None,
        trace_context: Default::default(),
        lease_id: None,
    }
}

/// A spawn below a task a worker claimed, under its lease.
fn subtask_of(claimed: &Claimed, agent: &str, text: &str) -> NewSubtask {
    NewSubtask { lease_id: Some(claimed.lease_id.clone()), ..subtask(&claimed.task.id, agent, text) }
}

/// Spawns a non-blocking child.
pub(crate) async fn spawn(h: &Harness, parent_id: &str, agent: &str, text: &str) -> Task {
    h.store.spawn_subtask(subtask(parent_id, agent, text), false, None).await.expect("spawn").0
}

async fn orchestrator_root(h: &Harness) -> Task {
    root_on(&h.store).await
}

/// A root task on `store` that may spawn subtasks.
pub(crate) async fn root_on(store: &TaskStore) -> Task {
    let mut root = own_task("ns", "planner", "plan the release");
    root.spawn_context = SpawnContext::Orchestrator;
    store.create_task(root).await.unwrap()
}

/// Runs a worker for `agent` that completes `count` tasks with their text reversed.
pub(crate) fn complete_in_background(h: &Harness, agent: &'static str, count: usize) -> tokio::task::JoinHandle<()> {
    let store = h.store.clone();
    tokio::spawn(async move {
        let mut claims =
            store.claim_stream(claim_request(agent, &format!("{agent}-worker"), 4, Duration::from_secs(30), 0));
        for _ in 0..count {
            let claimed = next_claim(&mut claims).await;
            let reversed: String = claimed.task.history[0].joined_text().chars().rev().collect();
            store
                .complete_task("ns", &claimed.task.id, &claimed.lease_id, Some(agent_message(&reversed)), Vec::new())
                .await
                .unwrap();
        }
    })
}

pub(crate) fn owner_of(parent: &Task) -> Owner {
    Owner { kind: OwnerKind::Worker, id: parent.id.clone() }
}

async fn a_blocking_spawn_returns_the_result(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let worker = complete_in_background(&h, "coder", 1);
    let (child, timed_out) = h.store.spawn_subtask(subtask(&parent.id, "coder", "abc"), true, None).await.unwrap();
    worker.await.unwrap();
    assert!(!timed_out);
    assert_eq!(child.status.state, TaskState::Completed);
    assert_eq!(child.status.message.unwrap().joined_text(), "cba");
    assert_eq!(child.parent_id.as_deref(), Some(parent.id.as_str()));
    assert_eq!(child.depth, 1);
    assert_eq!(child.context_id, parent.context_id);
    let inbox = h.store.read_inbox("ns", &owner_of(&parent), 10, Duration::ZERO, InboxRead::Consume).await.unwrap();
    assert!(inbox.is_empty(), "the blocking caller already received the completion");
}

async fn a_blocking_spawn_times_out_without_losing_the_child(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let timeout = Some(Duration::from_millis(300));
    let (child, timed_out) = h.store.spawn_subtask(subtask(&parent.id, "slow", "wait"), true, timeout).await.unwrap();
    assert!(timed_out);
    assert_eq!(child.status.state, TaskState::Submitted);
    let worker = complete_in_background(&h, "slow", 1);
    worker.await.unwrap();
    let outcome = h.store.await_subtasks("ns", &parent.id, &[], false, Duration::from_secs(5)).await.unwrap();
    assert_eq!(outcome.finished.len(), 1);
    assert_eq!(outcome.finished[0].id, child.id);
}

async fn non_blocking_spawns_are_awaited_together(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let first = spawn(&h, &parent.id, "coder", "one").await;
    let second = spawn(&h, &parent.id, "coder", "two").await;
    assert_eq!(first.status.state, TaskState::Submitted);
    let nothing_yet = h.store.await_subtasks("ns", &parent.id, &[], false, Duration::from_millis(200)).await.unwrap();
    assert!(nothing_yet.timed_out);
    assert!(nothing_yet.finished.is_empty());
    assert_eq!(nothing_yet.pending.len(), 2);
    let worker = complete_in_background(&h, "coder", 2);
    let outcome = h.store.await_subtasks("ns", &parent.id, &[], false, Duration::from_secs(10)).await.unwrap();
    worker.await.unwrap();
    assert!(!outcome.timed_out);
    let mut finished: Vec<String> = outcome.finished.iter().map(|task| task.id.clone()).collect();
    finished.sort();
    let mut expected = vec![first.id.clone(), second.id.clone()];
    expected.sort();
    assert_eq!(finished, expected);
    let again = h.store.await_subtasks("ns", &parent.id, &[], false, Duration::from_millis(100)).await.unwrap();
    assert!(again.finished.is_empty() && again.pending.is_empty(), "delivered completions are not delivered again");
    let named = h.store.await_subtasks("ns", &parent.id, std::slice::from_ref(&first.id), false, Duration::ZERO).await;
    assert_eq!(named.unwrap().finished[0].status.state, TaskState::Completed, "a named child can still be read");
}

async fn await_any_returns_on_the_first_to_finish(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let fast = spawn(&h, &parent.id, "fast", "quick").await;
    let slow = spawn(&h, &parent.id, "slow", "never").await;
    let worker = complete_in_background(&h, "fast", 1);
    let ids = [fast.id.clone(), slow.id.clone()];
    let outcome = h.store.await_subtasks("ns", &parent.id, &ids, true, Duration::from_secs(10)).await.unwrap();
    worker.await.unwrap();
    assert_eq!(outcome.finished.iter().map(|task| &task.id).collect::<Vec<_>>(), [&fast.id]);
    assert_eq!(outcome.pending, std::slice::from_ref(&slow.id));
    let unknown = h.store.await_subtasks("ns", &parent.id, &["nope".into()], true, Duration::ZERO).await;
    assert!(matches!(unknown, Err(TaskStoreError::TaskNotFound(_))));
}

async fn completions_wait_in_the_inbox_until_read(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let child = spawn(&h, &parent.id, "coder", "hello").await;
    complete_in_background(&h, "coder", 1).await.unwrap();
    let owner = owner_of(&parent);
    let peeked = h.store.read_inbox("ns", &owner, 10, Duration::from_secs(5), InboxRead::Peek).await.unwrap();
    assert_eq!(peeked.len(), 1);
    assert_eq!(peeked[0].kind, InboxKind::Completion);
    assert_eq!(peeked[0].task_id, child.id);
    assert_eq!(peeked[0].task_state, Some(TaskState::Completed));
    assert_eq!(peeked[0].message.as_ref().unwrap().joined_text(), "olleh");
    let read = h.store.read_inbox("ns", &owner, 10, Duration::ZERO, InboxRead::Consume).await.unwrap();
    assert_eq!(read, peeked, "peeking consumed nothing");
    let after = h.store.read_inbox("ns", &owner, 10, Duration::from_millis(100), InboxRead::Consume).await.unwrap();
    assert!(after.is_empty(), "a read message is gone");
}

async fn a_completion_without_a_message_reaches_the_owner(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let child = spawn(&h, &parent.id, "quiet", "say nothing").await;
    let lone = h.task("ns", "quiet", "no owner").await;
    let mut claims = h.store.claim_stream(claim_request("quiet", "quiet-worker", 2, Duration::from_secs(30), 0));
    for _ in 0..2 {
        let claimed = next_claim(&mut claims).await;
        let done = h.store.complete_task("ns", &claimed.task.id, &claimed.lease_id, None, Vec::new()).await.unwrap();
        assert_eq!(done.status.state, TaskState::Completed);
        assert_eq!(done.status.message, None);
        assert_eq!(done.history, claimed.task.history, "nothing is added to the history");
    }
    let inbox = h.store.read_inbox("ns", &owner_of(&parent), 10, Duration::ZERO, InboxRead::Consume).await.unwrap();
    assert_eq!(inbox.len(), 1, "only the owned task reports: {inbox:?}");
    assert_eq!((inbox[0].kind, inbox[0].task_id.as_str()), (InboxKind::Completion, child.id.as_str()));
    assert_eq!(inbox[0].task_state, Some(TaskState::Completed));
    assert_eq!(inbox[0].message, None);
    let stored = h.store.get_task("ns", &lone.id, None).await.unwrap();
    assert_eq!(stored.status.state, TaskState::Completed);
}

async fn questions_interrupt_the_child_until_answered(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let mut custom = subtask(&parent.id, "coder", "refactor");
    let owner = Owner { kind: OwnerKind::Orchestrator, id: "orchestrator".into() };
    custom.owner = Some(owner.clone());
    let (child, _) = h.store.spawn_subtask(custom, false, None).await.unwrap();
    let coding = h.claim("ns", "coder").await;
    let notify = |kind, text: &str| Notification {
        namespace: "ns".into(),
        task_id: child.id.clone(),
        kind,
        message: agent_message(text),
        lease_id: Some(coding.lease_id.clone()),
    };
    h.store.notify_owner(notify(InboxKind::Status, "halfway")).await.unwrap();
    let question = h.store.notify_owner(notify(InboxKind::Question, "keep the old API?")).await.unwrap();
    assert_eq!(question.owner, owner);
    let asked = h.store.get_task("ns", &child.id, None).await.unwrap();
    assert_eq!(asked.status.state, TaskState::InputRequired);
    let inbox = h.store.read_inbox("ns", &owner, 10, Duration::ZERO, InboxRead::Consume).await.unwrap();
    let kinds: Vec<InboxKind> = inbox.iter().map(|message| message.kind).collect();
    assert_eq!(kinds, [InboxKind::Status, InboxKind::Question]);
    let answered = h.store.answer_question("ns", &child.id, user_message("yes, keep it"), None).await.unwrap();
    assert_eq!(answered.status.state, TaskState::Working);
    assert_eq!(answered.history.last().unwrap().joined_text(), "yes, keep it");
    let again = h.store.answer_question("ns", &child.id, user_message("twice"), None).await.unwrap_err();
    assert!(matches!(again, TaskStoreError::NoQuestion { state: TaskState::Working, .. }));
    let orphan = h.own_task("ns", "echo", "no parent").await;
    let lonely = Notification { task_id: orphan.id, lease_id: None, ..notify(InboxKind::Error, "help") };
    assert!(matches!(h.store.notify_owner(lonely).await, Err(TaskStoreError::NoOwner { .. })));
}

async fn each_completion_reaches_the_parent_exactly_once(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let owner = owner_of(&parent);
    let mut children = Vec::new();
    for round in 0..3 {
        let child = spawn(&h, &parent.id, "racer", &format!("race {round}")).await;
        let mut claims =
            h.store.claim_stream(claim_request("racer", &format!("w{round}"), 1, Duration::from_millis(150), 0));
        let claimed = next_claim(&mut claims).await;
        // Two reporters at once — the worker completing and failing — while
        // the lease runs out under them: one report wins, once.
        tokio::time::sleep(Duration::from_millis(140)).await;
        let complete =
            h.store.complete_task("ns", &child.id, &claimed.lease_id, Some(agent_message("done")), Vec::new());
        let fail = h.store.fail_task("ns", &child.id, &claimed.lease_id, "crashed", None);
        let (completed, failed) = tokio::join!(complete, fail);
        assert!(completed.is_ok() as u8 + failed.is_ok() as u8 <= 1, "at most one report wins");
        children.push(child.id);
    }
    for child in &children {
        crate::workers::final_state(&h.store, child).await;
    }
    let inbox = h.store.read_inbox("ns", &owner, 100, Duration::ZERO, InboxRead::Consume).await.unwrap();
    let mut delivered: Vec<String> = inbox.iter().map(|message| message.task_id.clone()).collect();
    delivered.sort();
    children.sort();
    assert_eq!(delivered, children, "one completion per child");
    let outcome = h.store.await_subtasks("ns", &parent.id, &[], false, Duration::ZERO).await.unwrap();
    assert!(outcome.finished.is_empty(), "nothing is delivered a second time");
}

async fn concurrent_awaits_and_inbox_reads_report_each_completion_once(h: Harness) {
    for round in 0..5 {
        let parent = orchestrator_root(&h).await;
        let mut children = Vec::new();
        for index in 0..3 {
            children.push(spawn(&h, &parent.id, "coder", &format!("round {round} part {index}")).await.id);
        }
        complete_in_background(&h, "coder", 3).await.unwrap();
        let (owner, wait) = (owner_of(&parent), Duration::from_secs(1));
        let (first, second, inbox) = tokio::join!(
            h.store.await_subtasks("ns", &parent.id, &[], false, wait),
            h.store.await_subtasks("ns", &parent.id, &[], false, wait),
            h.store.read_inbox("ns", &owner, 10, Duration::ZERO, InboxRead::Consume),
        );
        let awaited = [first.unwrap(), second.unwrap()].into_iter().flat_map(|outcome| outcome.finished);
        let mut reported: Vec<String> = awaited.map(|task| task.id).collect();
        reported.extend(inbox.unwrap().into_iter().map(|message| message.task_id));
        reported.sort();
        children.sort();
        assert_eq!(reported, children, "round {round}: each child reported once");
    }
}

async fn a_message_id_is_reused_only_to_retry_the_same_request(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let mut asked = subtask(&parent.id, "coder", "write the parser");
    // A float that JSON gives back a bit off: a retry is still the same request.
    let score = serde_json::json!({ "score": 3.8003450846204196e-5 });
    asked.message.metadata = score.as_object().cloned();
    let (child, _) = h.store.spawn_subtask(asked.clone(), false, None).await.unwrap();
    let (again, _) = h.store.spawn_subtask(asked.clone(), false, None).await.unwrap();
    assert_eq!(again.id, child.id, "a retry gets the child of the first spawn");
    let other_root = orchestrator_root(&h).await;
    let tasks = task_count(&h).await;
    let holder = |error: TaskStoreError| {
        assert_eq!(error.error_code(), ErrorCode::AlreadyExists, "{error}");
        match error {
            TaskStoreError::RequestKeyInUse { task_id, .. } => task_id,
            other => panic!("{other}"),
        }
    };
    let other_text = Message { parts: vec![Part::text("write the lexer")], ..asked.message.clone() };
    let reuses = [
        NewSubtask { agent_id: "reviewer".into(), ..asked.clone() },
        NewSubtask { parent_id: other_root.id.clone(), ..asked.clone() },
        NewSubtask { message: other_text, ..asked.clone() },
    ];
    for reuse in reuses {
        let error = h.store.spawn_subtask(reuse, true, None).await.unwrap_err();
        assert_eq!(holder(error), child.id);
    }
    // The parent's own first message, for its own agent: refused at once,
    // not a blocking wait on the parent itself.
    let own = NewSubtask { agent_id: "planner".into(), message: parent.history[0].clone(), ..asked.clone() };
    assert_eq!(holder(h.store.spawn_subtask(own, true, None).await.unwrap_err()), parent.id);
    let mut create = new_task("ns", "coder", "write the parser");
    create.message = asked.message.clone();
    assert_eq!(holder(h.store.create_task(create).await.unwrap_err()), child.id, "a subtask's id");
    assert_eq!(task_count(&h).await, tasks, "nothing was created");
    let children = h.repository.children("ns", &parent.id, &[]).await.unwrap();
    assert_eq!(children.iter().map(|task| &task.id).collect::<Vec<_>>(), [&child.id], "nor changed");
}

async fn a_listing_names_the_parent_whose_children_it_lists(h: Harness) {
    let (first, second) = (orchestrator_root(&h).await, orchestrator_root(&h).await);
    let mut children = vec![spawn(&h, &first.id, "a", "one").await.id, spawn(&h, &first.id, "b", "two").await.id];
    spawn(&h, &second.id, "a", "another's").await;
    let query = TaskQuery { parent_id: Some(first.id.clone()), page_size: 10, ..task_query() };
    let page = h.store.list_tasks(query).await.unwrap();
    let mut listed: Vec<String> = page.tasks.into_iter().map(|task| task.id).collect();
    listed.sort();
    children.sort();
    assert_eq!((listed, page.total_size), (children, 2));
    let none = TaskQuery { parent_id: Some("no-such-parent".into()), ..task_query() };
    assert_eq!(h.store.list_tasks(none).await.unwrap().total_size, 0);
}

fn task_query() -> TaskQuery {
    TaskQuery {
        namespace: "ns".into(),
        context_id: None,
        state: None,
        agent_id: None,
        parent_id: None,
        updated_after: None,
        page_size: 1,
        page_token: None,
        history_length: Some(0),
        include_artifacts: false,
    }
}

async fn task_count(h: &Harness) -> u64 {
    h.store.list_tasks(task_query()).await.unwrap().total_size
}

async fn depth_is_limited_by_where_the_tree_started(h: Harness) {
    let agent_root = h.own_task("ns", "solo", "standalone work").await;
    spawn(&h, &agent_root.id, "helper", "help").await;
    let helping = h.claim("ns", "helper").await;
    let error = h.store.spawn_subtask(subtask_of(&helping, "helper", "deeper"), false, None).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::DepthLimit { depth: 2, max: 1, context: SpawnContext::Agent }), "{error}");
    let orchestrated = orchestrator_root(&h).await;
    spawn(&h, &orchestrated.id, "a", "level one").await;
    let level_one = h.claim("ns", "a").await;
    let (level_two, _) = h.store.spawn_subtask(subtask_of(&level_one, "b", "level two"), false, None).await.unwrap();
    assert_eq!(level_two.depth, 2);
    let level_two = h.claim("ns", "b").await;
    let error = h.store.spawn_subtask(subtask_of(&level_two, "c", "level three"), false, None).await.unwrap_err();
    assert!(error.to_string().contains("depth 3 exceeds the maximum of 2 for orchestrator"), "{error}");
}

async fn concurrent_and_total_subtasks_are_limited(h: Harness) {
    let parent = orchestrator_root(&h).await;
    for index in 0..3 {
        spawn(&h, &parent.id, "coder", &format!("part {index}")).await;
    }
    let error = h.store.spawn_subtask(subtask(&parent.id, "coder", "part 3"), false, None).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::ConcurrencyLimit { limit: 3, .. }), "{error}");
    complete_in_background(&h, "coder", 3).await.unwrap();
    spawn(&h, &parent.id, "coder", "part 3").await;
    spawn(&h, &parent.id, "coder", "part 4").await;
    let error = h.store.spawn_subtask(subtask(&parent.id, "writer", "part 5"), false, None).await.unwrap_err();
    assert!(matches!(error, TaskStoreError::TotalLimit { limit: 5, .. }), "{error}");
}

async fn spawn_rate_is_limited(h: Harness) {
    let parent = orchestrator_root(&h).await;
    let mut tight = limits_config();
    tight.limits.max_spawns_per_minute = 2;
    tight.limits.max_concurrent_subtasks = 10;
    let limits = tight.limits;
    for index in 0..2 {
        let child = subtask(&parent.id, "coder", &format!("quick {index}"));
        h.repository.spawn_subtask(&new_task_id(), child, &limits, None).await.unwrap();
    }
    let error = h
        .repository
        .spawn_subtask(&new_task_id(), subtask(&parent.id, "coder", "one too many"), &limits, None)
        .await
        .unwrap_err();
    assert!(matches!(error, TaskStoreError::RateLimit { limit: 2, .. }), "{error}");
}

async fn a_spawn_that_repeats_an_ancestor_is_a_cycle(h: Harness) {
    let root = orchestrator_root(&h).await;
    let child = spawn(&h, &root.id, "coder", "Fix the   bug").await;
    let coding = h.claim("ns", "coder").await;
    let error = h.store.spawn_subtask(subtask_of(&coding, "coder", "fix the bug"), false, None).await.unwrap_err();
    assert!(matches!(&error, TaskStoreError::Cycle { ancestor_id, .. } if ancestor_id == &child.id), "{error}");
    let error =
        h.store.spawn_subtask(subtask_of(&coding, "planner", "PLAN THE RELEASE"), false, None).await.unwrap_err();
    assert!(matches!(&error, TaskStoreError::Cycle { ancestor_id, .. } if ancestor_id == &root.id), "{error}");
    let (other_prompt, _) =
        h.store.spawn_subtask(subtask_of(&coding, "coder", "fix the other bug"), false, None).await.unwrap();
    assert_eq!(other_prompt.depth, 2);
}

/// A worker that moves its own task to CANCELED (UpdateStatus, under its
/// lease) cancels what the task spawned, as CancelTask does; the worker
/// holding a child is told on its claim stream.
async fn a_worker_canceling_its_task_cancels_the_subtree_and_tells_the_workers_below(h: Harness) {
    let mut root = new_task("ns", "planner", "plan the release");
    root.spawn_context = SpawnContext::Orchestrator;
    let root = h.store.create_task(root).await.unwrap();
    let lease = Duration::from_secs(30);
    let mut planners = h.store.claim_stream(claim_request("planner", "planner-1", 1, lease, 0));
    let planning = next_claim(&mut planners).await;
    let under_lease = |agent: &str, text: &str| NewSubtask {
        lease_id: Some(planning.lease_id.clone()),
        ..subtask(&root.id, agent, text)
    };
    let child = h.store.spawn_subtask(under_lease("coder", "code it"), false, None).await.expect("spawn").0;
    let done = h.store.spawn_subtask(under_lease("writer", "write docs"), false, None).await.expect("spawn").0;
    let writing = h.claim("ns", "writer").await;
    let finished = StatusUpdate { state: TaskState::Completed, message: None, lease_id: Some(writing.lease_id) };
    h.store.update_status("ns", &done.id, finished).await.unwrap();
    let mut coders = Box::pin(h.store.claim_stream_with_cancellations(claim_request("coder", "coder-1", 1, lease, 0)));
    let ClaimEvent::Claimed(coding) = next_claim_event(&mut coders).await else { panic!("the child first") };
    assert_eq!(coding.task.id, child.id);
    let grandchild = h.store.spawn_subtask(subtask_of(&coding, "tester", "test it"), false, None).await.unwrap().0;

    let cancel = StatusUpdate {
        state: TaskState::Canceled,
        message: Some(agent_message("the plan was dropped")),
        lease_id: Some(planning.lease_id.clone()),
    };
    let canceled = h.store.update_status("ns", &root.id, cancel).await.unwrap();
    assert_eq!(canceled.status.state, TaskState::Canceled);
    assert_eq!(canceled.status.message.as_ref().unwrap().joined_text(), "the plan was dropped");
    let ClaimEvent::Canceled(told) = next_claim_event(&mut coders).await else { panic!("a notice") };
    assert_eq!(told, child.id, "the worker holding the child is told");
    for id in [&child.id, &grandchild.id] {
        let below = h.store.get_task("ns", id, Some(0)).await.unwrap();
        assert_eq!(below.status.state, TaskState::Canceled, "{id} is canceled with its ancestor");
        assert!(below.status.message.unwrap().joined_text().contains(&root.id), "it says which task took it");
    }
    let untouched = h.store.get_task("ns", &done.id, Some(0)).await.unwrap();
    assert_eq!(untouched.status.state, TaskState::Completed, "finished tasks stay as they were");
    let late = h.store.complete_task("ns", &child.id, &coding.lease_id, None, Vec::new()).await.unwrap_err();
    assert!(matches!(late, TaskStoreError::TaskFinished { state: TaskState::Canceled, .. }), "{late}");
}

async fn start(database: chorus_runtime::testing::TestDatabase) -> Harness {
    Harness::start_with(database, limits_config()).await
}
