//! Runs on real services: every step kind, conditions, parallel joins, gates,
//! signals, timers, retries, cancellation, versioning, concurrency limits and
//! namespace isolation.

use chorus_workflow::{
    domain::{Decision, RunFilter, RunState, StepState},
    error::WorkflowError,
    service::{SignalCall, StartCall},
};
use serde_json::{Map, json};

use crate::{
    harness::{Harness, NS, conformance},
    hitl_gates::gate,
};

conformance!(
    spawned_steps_pass_outputs_on_and_a_false_condition_skips,
    comparisons_with_a_missing_value_are_false_and_a_skipped_output_renders_empty,
    parallel_fail_fast_cancels_and_all_settled_waits,
    a_parallel_step_whose_branches_all_wait_leaves_the_run_waiting,
    a_signal_sent_early_is_kept_and_one_sent_late_wakes_the_wait,
    timers_fire_and_failed_attempts_retry,
    canceling_a_run_cancels_its_task,
    a_run_stays_on_its_version,
    concurrency_limits_queue_runs,
    starts_are_idempotent_and_inputs_checked,
    a_key_reused_by_another_start_is_refused_and_changes_nothing,
    runs_never_cross_namespaces,
    two_engines_share_runs_without_running_a_step_twice,
    a_timer_fires_on_time_while_another_branch_holds_the_engine,
    a_get_that_waits_answers_once_the_run_has_finished,
);

async fn spawned_steps_pass_outputs_on_and_a_false_condition_skips(h: Harness) {
    h.put(
        "name: review\ninputs:\n  pr: {type: string, required: true}\nsteps:\n\
         - id: first\n  spawn: {agent: coder, input: \"unsure: review {{ inputs.pr }}\"}\n\
         - id: second\n  condition: \"{{ first.output.confidence }} < 0.8\"\n  spawn: {agent: coder, input: \"again - {{ first.output.summary }}\"}\n\
         - id: third\n  condition: \"{{ second.output.confidence }} < 0.8\"\n  spawn: {agent: coder, input: never}\n\
         - id: gate_ok\n  condition: \"{{ inputs.pr }} == 'pr-7'\"\n",
    )
    .await;
    let run = h.run("review", json!({"pr": "pr-7"})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let states: Vec<(&str, StepState)> = run.body.steps.iter().map(|s| (s.step_id.as_str(), s.state)).collect();
    assert_eq!(
        states,
        [
            ("first", StepState::Completed),
            ("second", StepState::Completed),
            ("third", StepState::Skipped),
            ("gate_ok", StepState::Completed)
        ]
    );
    let second = &run.body.steps[1];
    assert_eq!(second.input["input"], json!("again - did: unsure: review pr-7"));
    assert!(second.external_id.is_some(), "the task id is recorded");
    assert!(run.body.steps[2].skip_reason.as_deref().unwrap_or_default().contains("was false"));
    let output = run.body.output.expect("output");
    assert_eq!(output["first"]["confidence"], json!(0.5));
}

async fn comparisons_with_a_missing_value_are_false_and_a_skipped_output_renders_empty(h: Harness) {
    h.put(
        "name: missing\ninputs:\n  n: {type: number}\nsteps:\n\
         - id: review\n  condition: \"false\"\n  spawn: {agent: coder, input: never}\n\
         - id: unsure\n  condition: \"{{ review.output.confidence }} < 0.8\"\n\
         - id: sure\n  condition: \"{{ review.output.confidence }} >= 0.8\"\n\
         - id: other\n  condition: \"{{ inputs.n }} != 1\"\n\
         - id: guarded\n  condition: \"{{ inputs.n is not defined or inputs.n < 1 }}\"\n\
         - id: note\n  message: {topic: news, text: \"review: [{{ review.output }}]\"}\n",
    )
    .await;
    let run = h.run("missing", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let states: Vec<(&str, StepState)> = run.body.steps.iter().map(|s| (s.step_id.as_str(), s.state)).collect();
    assert_eq!(
        states,
        [
            ("review", StepState::Skipped),
            ("unsure", StepState::Skipped),
            ("sure", StepState::Skipped),
            ("other", StepState::Skipped),
            ("guarded", StepState::Completed),
            ("note", StepState::Completed)
        ]
    );
    assert_eq!(run.body.steps[5].input["text"], json!("review: []"));
}

async fn parallel_fail_fast_cancels_and_all_settled_waits(h: Harness) {
    let source = |name: &str, mode: &str| {
        let steps = r#"steps:
- id: fan
  parallel:
    mode: MODE
    branches:
    - name: bad
      steps:
      - id: boom
        spawn: {agent: coder, input: please fail}
    - name: good
      steps:
      - id: hold
        wait: {signal: go}
      - id: after
        spawn: {agent: coder, input: ok}
"#;
        format!("name: {name}\n{}", steps.replace("MODE", mode))
    };
    h.put(&source("fast", "fail_fast")).await;
    h.put(&source("settled", "all_settled")).await;
    let fast = h.run("fast", json!({})).await;
    let fast = h.finished(&fast.id).await;
    assert_eq!(fast.state, RunState::Failed);
    let hold = fast.body.steps.iter().find(|s| s.step_id == "hold").expect("hold ran");
    assert_eq!(hold.state, StepState::Canceled, "fail-fast cancels the other branch");
    assert!(fast.body.error.as_deref().unwrap_or_default().contains("branch `bad`"), "{:?}", fast.body.error);

    let settled = h.run("settled", json!({})).await;
    h.until(&settled.id, "the bad branch to fail", |run| {
        run.body.steps.iter().any(|s| s.step_id == "boom" && s.state == StepState::Failed)
    })
    .await;
    let still = h.workflows.get_run(NS, &settled.id).await.expect("run");
    assert!(!still.state.is_finished(), "all-settled waits for the other branch");
    signal(&h, &settled.id, "go", "s1").await;
    let settled = h.finished(&settled.id).await;
    assert_eq!(settled.state, RunState::Failed);
    let after = settled.body.steps.iter().find(|s| s.step_id == "after").expect("after ran");
    assert_eq!(after.state, StepState::Completed, "the good branch ran to its end");
}

async fn a_parallel_step_whose_branches_all_wait_leaves_the_run_waiting(h: Harness) {
    h.put(
        r#"name: paused
steps:
- id: fan
  parallel:
    branches:
    - name: told
      steps:
      - id: hold
        wait: {signal: go}
    - name: approved
      steps:
      - id: check
        gate: {mode: HITL, reviewers: ops}
"#,
    )
    .await;
    let run = h.run("paused", json!({})).await;
    let run = h
        .until(&run.id, "both branches to wait", |run| {
            run.body.steps.iter().filter(|s| s.step_id != "fan" && s.state == StepState::Waiting).count() == 2
        })
        .await;
    assert_eq!(run.state, RunState::Waiting, "nothing works while every branch waits: {run:#?}");
    let waiting = RunFilter { states: vec![RunState::Waiting], ..RunFilter::default() };
    let listed = h.workflows.list_runs(NS, &waiting, None, 10).await.expect("list");
    assert_eq!(listed.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [run.id.as_str()]);
    signal(&h, &run.id, "go", "g").await;
    h.workflows.decide_gate(NS, &run.id, gate("check", Decision::Approve, "ops", "fine")).await.expect("approve");
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
}

pub(crate) const GATED: &str = "name: gated\nsteps:\n\
    - id: design\n  spawn: {agent: coder, input: \"design it\"}\n\
    - id: signoff\n  gate:\n    mode: HITL\n    reviewers: architects\n    max_rejections: 1\n    on_exhausted: escalate\n    escalate_to: cto\n    artifacts: {summary: \"{{ design.output.summary }}\"}\n\
    - id: build\n  spawn: {agent: coder, input: \"build {{ signoff.output.decision }}\"}\n";

pub(crate) async fn signal(h: &Harness, run_id: &str, name: &str, id: &str) -> bool {
    let call = SignalCall {
        name: name.into(),
        payload: json!({"by": "ops"}).as_object().cloned().unwrap_or_default(),
        signal_id: id.into(),
        sent_by: "ops".into(),
    };
    h.workflows.signal_run(NS, run_id, call).await.expect("signal")
}

async fn a_signal_sent_early_is_kept_and_one_sent_late_wakes_the_wait(h: Harness) {
    h.put(
        "name: signals\nsteps:\n- id: pause\n  wait: {signal: resume}\n\
         - id: nap\n  wait: {duration: 300ms}\n- id: second\n  wait: {signal: ship}\n",
    )
    .await;
    let run = h.run("signals", json!({})).await;
    h.waiting(&run.id).await;
    assert!(!signal(&h, &run.id, "ship", "early").await, "the early signal is new");
    assert!(signal(&h, &run.id, "ship", "early").await, "the same id again is a duplicate");
    let other = |name: &str, by: &str| SignalCall {
        name: name.into(),
        payload: json!({ "by": by }).as_object().cloned().unwrap_or_default(),
        signal_id: "early".into(),
        sent_by: "ops".into(),
    };
    for (call, mismatch) in [(other("ship", "qa"), "another payload"), (other("resume", "ops"), "another name")] {
        let refused = h.workflows.signal_run(NS, &run.id, call).await.expect_err("the id holds another signal");
        assert!(matches!(refused, WorkflowError::SignalIdInUse { .. }), "{refused:?}");
        assert!(refused.to_string().contains(mismatch), "{refused}");
    }
    let call =
        SignalCall { name: "nobody-waits".into(), payload: Map::new(), signal_id: "x".into(), sent_by: "ops".into() };
    let unread = h.workflows.signal_run(NS, &run.id, call).await.expect_err("no wait for it");
    assert!(unread.to_string().contains("no step of workflow signals (version 1) waits for signal `nobody-waits`"));
    signal(&h, &run.id, "resume", "late").await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let consumed: Vec<(&str, Option<&str>)> =
        run.body.signals.iter().map(|s| (s.id.as_str(), s.consumed_by_step_id.as_deref())).collect();
    assert_eq!(consumed, [("early", Some("second")), ("late", Some("pause"))]);
    assert_eq!(run.body.steps[0].output.as_ref().expect("output")["payload"]["by"], json!("ops"));
}

async fn timers_fire_and_failed_attempts_retry(h: Harness) {
    h.put(
        "name: retrying\nsteps:\n- id: nap\n  wait: {duration: 100ms}\n\
         - id: work\n  spawn: {agent: coder, input: flaky job, retry: {max_attempts: 3, backoff: 50ms}}\n\
         - id: doomed\n  spawn: {agent: coder, input: fail, retry: {max_attempts: 2, backoff: 10ms}}\n",
    )
    .await;
    let run = h.run("retrying", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed);
    let attempts: Vec<(&str, u32, StepState)> =
        run.body.steps.iter().map(|s| (s.step_id.as_str(), s.attempt, s.state)).collect();
    assert_eq!(
        attempts,
        [
            ("nap", 1, StepState::Completed),
            ("work", 1, StepState::Failed),
            ("work", 2, StepState::Completed),
            ("doomed", 1, StepState::Failed),
            ("doomed", 2, StepState::Failed),
        ]
    );
    assert_ne!(run.body.steps[1].external_id, run.body.steps[2].external_id, "each attempt is its own task");
}

async fn canceling_a_run_cancels_its_task(h: Harness) {
    h.put("name: long\nsteps:\n- id: work\n  spawn: {agent: coder, input: slow}\n").await;
    let run = h.run("long", json!({})).await;
    let run =
        h.until(&run.id, "the task to exist", |r| r.body.steps.first().is_some_and(|s| s.external_id.is_some())).await;
    let task_id = run.body.steps[0].external_id.clone().expect("task");
    let canceled = h.workflows.cancel_run(NS, &run.id, "not needed", "ana").await.expect("cancel");
    assert_eq!(canceled.state, RunState::Canceled);
    assert_eq!(canceled.body.steps[0].state, StepState::Canceled);
    let mut tasks =
        chorus_proto::taskstore::task_store_client::TaskStoreClient::connect(h.url()).await.expect("client");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let request = chorus_proto::taskstore::GetTaskRequest {
            namespace: NS.into(),
            id: task_id.clone(),
            history_length: Some(0),
        };
        let task = tasks.get_task(request).await.expect("task").into_inner();
        if task.status.expect("status").state() == chorus_proto::taskstore::TaskState::Canceled {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the task was not canceled");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let again = h.workflows.cancel_run(NS, &run.id, "", "").await.expect_err("finished");
    assert!(matches!(again, WorkflowError::RunFinished { state: "canceled", .. }), "{again:?}");
}

async fn a_run_stays_on_its_version(h: Harness) {
    h.put("name: versioned\nsteps:\n- id: hold\n  wait: {signal: go}\n- id: v1\n  condition: \"true\"\n").await;
    let run = h.run("versioned", json!({})).await;
    h.waiting(&run.id).await;
    h.put("name: versioned\nsteps:\n- id: hold\n  wait: {signal: go}\n- id: v2\n  condition: \"true\"\n").await;
    signal(&h, &run.id, "go", "g").await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.version, 1);
    assert_eq!(run.body.steps.last().expect("last").step_id, "v1");
    let newer = h.run("versioned", json!({})).await;
    assert_eq!(newer.version, 2);
}

async fn concurrency_limits_queue_runs(h: Harness) {
    h.put(
        "name: limited\ninputs:\n  team: {type: string}\nconcurrency: {max: 1, key: \"{{ inputs.team }}\"}\n\
         steps:\n- id: hold\n  wait: {signal: go}\n",
    )
    .await;
    let first = h.run("limited", json!({"team": "a"})).await;
    let second = h.run("limited", json!({"team": "a"})).await;
    let other = h.run("limited", json!({"team": "b"})).await;
    h.waiting(&first.id).await;
    h.waiting(&other.id).await;
    // The engine looks at the queued run, finds no slot, and says so.
    let queued = h.until(&second.id, "the engine to find no slot", |run| run.body.pending_reason.is_some()).await;
    assert_eq!(queued.state, RunState::Pending, "the second run of team a waits for a slot");
    assert_eq!(
        queued.body.pending_reason.as_deref(),
        Some("waiting for a slot: at most 1 run of `limited` with key `a` at once")
    );
    signal(&h, &first.id, "go", "1").await;
    h.finished(&first.id).await;
    let started = h.waiting(&second.id).await;
    assert_eq!(started.body.pending_reason, None, "a run that started no longer waits for a slot");
    let third = h.run("limited", json!({"team": "a"})).await;
    h.until(&third.id, "the engine to find no slot", |run| run.body.pending_reason.is_some()).await;
    let canceled = h.workflows.cancel_run(NS, &third.id, "not needed", "ana").await.expect("cancel");
    assert_eq!(canceled.body.pending_reason, None, "a canceled run waits for nothing");
}

async fn starts_are_idempotent_and_inputs_checked(h: Harness) {
    h.put("name: keyed\ninputs:\n  n: {type: integer, required: true}\nsteps:\n- id: hold\n  wait: {signal: go}\n")
        .await;
    let call = |input: serde_json::Value| StartCall {
        namespace: NS.into(),
        workflow: "keyed".into(),
        input: input.as_object().cloned().unwrap_or_default(),
        idempotency_key: Some("k1".into()),
        ..StartCall::default()
    };
    let first = h.workflows.start_run(call(json!({"n": 1}))).await.expect("start");
    let again = h.workflows.start_run(call(json!({"n": 1}))).await.expect("start again");
    assert_eq!(first.id, again.id);
    for bad in [json!({}), json!({"n": "one"}), json!({"n": 1, "x": 2})] {
        let mut call = call(bad);
        call.idempotency_key = None;
        let error = h.workflows.start_run(call).await.expect_err("bad input");
        assert!(matches!(error, WorkflowError::InvalidArgument(_)), "{error:?}");
    }
    let missing = StartCall { namespace: NS.into(), workflow: "nope".into(), ..StartCall::default() };
    assert!(matches!(h.workflows.start_run(missing).await, Err(WorkflowError::NotFound(_))));
    let page = h.workflows.list_runs(NS, &Default::default(), None, 50).await.expect("list");
    assert_eq!(page.runs.len(), 1, "nothing was created by the bad starts");
}

async fn a_key_reused_by_another_start_is_refused_and_changes_nothing(h: Harness) {
    const KEYED: &str =
        "name: keyed\ninputs:\n  n: {type: integer, required: true}\nsteps:\n- id: hold\n  wait: {signal: go}\n";
    h.put(KEYED).await;
    h.put("name: other\nsteps:\n- id: hold\n  wait: {signal: go}\n").await;
    let call = |workflow: &str, input: serde_json::Value| StartCall {
        namespace: NS.into(),
        workflow: workflow.into(),
        input: input.as_object().cloned().unwrap_or_default(),
        idempotency_key: Some("k1".into()),
        ..StartCall::default()
    };
    let first = h.workflows.start_run(call("keyed", json!({"n": 1}))).await.expect("start");
    // A new version whose new input has a default: a retry is still the same start.
    h.put(&KEYED.replace("required: true}", "required: true}\n  m: {type: integer, default: 2}")).await;
    let retried = h.workflows.start_run(call("keyed", json!({"n": 1}))).await.expect("the same start again");
    assert_eq!((retried.id.as_str(), retried.version), (first.id.as_str(), 1));
    let mut pinned = call("keyed", json!({"n": 1}));
    pinned.version = Some(2);
    let refused = [
        (call("other", json!({})), "which is not a run of other"),
        (call("keyed", json!({"n": 2})), "which was started with other inputs"),
        (pinned, "which is not on version 2"),
    ];
    for (start, mismatch) in refused {
        let error = h.workflows.start_run(start).await.expect_err("another start under the key");
        let message = error.to_string();
        assert!(matches!(error, WorkflowError::KeyInUse { .. }), "{error:?}");
        assert!(message.contains(&format!("idempotency key `k1` is already used by run {} of keyed v1", first.id)));
        assert!(message.contains(mismatch), "{message}");
        assert_eq!(tonic::Status::from(error).code(), tonic::Code::AlreadyExists);
    }
    let page = h.workflows.list_runs(NS, &Default::default(), None, 50).await.expect("list");
    assert_eq!(page.runs.len(), 1, "the refused starts created nothing");
    let after = h.workflows.get_run(NS, &first.id).await.expect("the first run");
    assert_eq!(after.body.input, json!({"n": 1}).as_object().cloned().unwrap_or_default());
}

async fn runs_never_cross_namespaces(h: Harness) {
    h.put(GATED).await;
    let run = h.run("gated", json!({})).await;
    let other = "team-b";
    assert!(matches!(h.workflows.get_run(other, &run.id).await, Err(WorkflowError::RunNotFound(_))));
    assert!(matches!(h.workflows.cancel_run(other, &run.id, "", "").await, Err(WorkflowError::RunNotFound(_))));
    let call = SignalCall { name: "x".into(), payload: Map::new(), signal_id: "s".into(), sent_by: String::new() };
    assert!(matches!(h.workflows.signal_run(other, &run.id, call).await, Err(WorkflowError::RunNotFound(_))));
    assert!(matches!(h.workflows.watch_run(other, &run.id, 0).await.err(), Some(WorkflowError::RunNotFound(_))));
    assert!(matches!(h.workflows.watch_run(NS, "no-such-run", 0).await.err(), Some(WorkflowError::RunNotFound(_))));
    let page = h.workflows.list_runs(other, &Default::default(), None, 50).await.expect("list");
    assert!(page.runs.is_empty());
    let start = StartCall { namespace: other.into(), workflow: "gated".into(), ..StartCall::default() };
    assert!(matches!(h.workflows.start_run(start).await, Err(WorkflowError::NotFound(_))));
}

async fn two_engines_share_runs_without_running_a_step_twice(h: Harness) {
    let (_second, _stop) = h.spawn_engine(crate::harness::test_config());
    h.put(
        "name: shared\nsteps:\n- id: a\n  spawn: {agent: coder, input: one}\n\
         - id: b\n  spawn: {agent: coder, input: two}\n- id: c\n  wait: {duration: 10ms}\n",
    )
    .await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(h.run("shared", json!({})).await.id);
    }
    for id in &ids {
        let run = h.finished(id).await;
        assert_eq!(run.state, RunState::Completed, "{run:#?}");
        assert_eq!(run.body.steps.len(), 3, "each step recorded once: {run:#?}");
    }
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM taskstore_tasks")
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("count");
    assert_eq!(tasks, 24, "one task per spawn step");
}

async fn a_timer_fires_on_time_while_another_branch_holds_the_engine(h: Harness) {
    let source = r#"name: mixed
steps:
- id: fan
  parallel:
    mode: all_settled
    branches:
    - name: slow
      steps:
      - id: work
        spawn: {agent: nobody-yet, input: x}
    - name: timed
      steps:
      - id: nap
        wait: {duration: 300ms}
      - id: after_nap
        condition: "true"
"#;
    h.put(source).await;
    let started = tokio::time::Instant::now();
    let run = h.run("mixed", json!({})).await;
    h.until(&run.id, "the timed branch to finish", |r| {
        r.body.steps.iter().any(|s| s.step_id == "after_nap" && s.state == StepState::Completed)
    })
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "the timer waited for a refresh (5 s)");
    let run = h.workflows.get_run(NS, &run.id).await.expect("run");
    assert_eq!(run.state, RunState::Running, "the spawn still waits for a worker");
}

async fn a_get_that_waits_answers_once_the_run_has_finished(h: Harness) {
    h.put("name: held\nsteps:\n- id: hold\n  wait: {signal: go}\n").await;
    // One run finished by a write of this process (heard at once), one by
    // another process's (found by polling).
    let here = h.run("held", json!({})).await;
    let there = h.run("held", json!({})).await;
    let other = h.with_config(crate::harness::test_config());
    for (run, workflows) in [(&here, &h.workflows), (&there, &other)] {
        h.waiting(&run.id).await;
        let waiter = {
            let (workflows, id) = (h.workflows.clone(), run.id.clone());
            tokio::spawn(async move { workflows.finished_run(NS, &id).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "no answer while the run waits");
        let call = SignalCall { name: "go".into(), payload: Map::new(), signal_id: "g".into(), sent_by: "ops".into() };
        workflows.signal_run(NS, &run.id, call).await.expect("signal");
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await;
        let finished = answer.expect("an answer once finished").expect("the waiter").expect("the run");
        assert_eq!(finished.state, RunState::Completed, "{finished:#?}");
        assert_eq!(finished.body.steps[0].state, StepState::Completed);
    }
    let again = h.workflows.finished_run(NS, &here.id).await.expect("a finished run at once");
    assert_eq!(again.state, RunState::Completed);
    assert!(matches!(h.workflows.finished_run("team-b", &here.id).await, Err(WorkflowError::RunNotFound(_))));
    assert!(matches!(h.workflows.finished_run(NS, "no-such-run").await, Err(WorkflowError::RunNotFound(_))));
}
