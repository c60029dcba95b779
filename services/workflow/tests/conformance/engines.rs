//! Engines coming and going: a spawn issued by an engine that died before
//! recording it is found again, not made twice; an engine restarted under
//! its name resumes its runs at once. Each test drives its own engines.

use std::time::Duration;

use chorus_proto::taskstore::{
    CreateTaskRequest, Message, Part, Role, part::Content, task_store_client::TaskStoreClient,
};
use chorus_workflow::{
    WorkflowConfig,
    domain::{NewRun, RunBody, RunState, StepRecord},
    error::WorkflowError,
    repository::{Fence, RunRepository, Taker, Transition, Unfinished, sql_runs::SqlRunRepository},
    service::StartCall,
};
use serde_json::json;

use crate::harness::{AGENT, Harness, NS, test_config};

chorus_runtime::backend_suite!(crate::harness::Harness::bare;
    a_spawn_issued_before_a_crash_is_found_not_made_twice,
    an_engine_restarted_under_its_name_resumes_its_runs_at_once,
    webhooks_to_private_addresses_are_refused_unless_allowed,
    an_engine_never_writes_its_copy_of_a_run_over_a_change_made_meanwhile,
    a_change_made_here_before_the_engines_first_look_is_seen,
    a_new_database_gets_its_first_statistics_once_it_holds_runs,
    a_run_that_stays_due_keeps_the_time_it_became_due,
    the_engine_writes_the_run_it_holds_without_reading_it,
    a_renewal_extends_every_claim_even_one_locked_meanwhile,
    the_gauges_count_unfinished_runs_by_state,
    a_run_created_for_an_engine_is_its_claim_from_the_start,
    a_run_started_beside_an_engine_is_created_claimed_for_it,
    a_restarted_engine_takes_back_only_the_claims_made_before_it_started,
    a_timer_wakes_its_engine_before_the_next_poll,
    an_engine_started_meanwhile_wakes_for_a_timer_set_before,
);

async fn task_count(h: &Harness) -> i64 {
    sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM taskstore_tasks")
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("count")
}

async fn a_spawn_issued_before_a_crash_is_found_not_made_twice(h: Harness) {
    h.put("name: once\nsteps:\n- id: work\n  spawn: {agent: coder, input: do it}\n").await;
    let run = h.run("once", json!({})).await;
    let record = StepRecord::clone(run.body.steps.first().expect("the spawn's record"));
    assert!(record.external_id.is_none(), "no engine has issued it yet");
    // What a crashed engine left behind: the task exists, the record does not know it.
    let key = record.effect_key(&run.id);
    let message = Message {
        message_id: key.clone(),
        role: Role::User.into(),
        parts: vec![Part { content: Some(Content::Text("do it".into())), ..Part::default() }],
        ..Message::default()
    };
    let request = CreateTaskRequest {
        namespace: NS.into(),
        agent_id: AGENT.into(),
        message: Some(message),
        idempotency_key: key,
        ..CreateTaskRequest::default()
    };
    let mut tasks = TaskStoreClient::connect(h.url()).await.expect("client");
    let issued = tasks.create_task(request).await.expect("create").into_inner();
    let (_engine, _stop) = h.spawn_engine(test_config());
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    assert_eq!(run.body.steps[0].external_id.as_deref(), Some(issued.id.as_str()), "the engine adopted the task");
    assert_eq!(task_count(&h).await, 1, "the spawn was not made twice");
}

async fn an_engine_restarted_under_its_name_resumes_its_runs_at_once(h: Harness) {
    // Nobody works for `later` yet: the engine holds the run while it awaits the task.
    h.put("name: slowish\nsteps:\n- id: a\n  spawn: {agent: later, input: go}\n").await;
    // Claims that would take a minute to lapse: only adoption can resume the run in time.
    let config = WorkflowConfig { engine_id: Some("engine-a".into()), lease_ms: 60_000, ..test_config() };
    let (_first, stop) = h.spawn_engine(config.clone());
    let run = h.run("slowish", json!({})).await;
    h.until(&run.id, "the task to exist", |r| r.body.steps.first().is_some_and(|s| s.external_id.is_some())).await;
    stop.cancel();
    let held: Option<String> = sqlx::query_scalar("SELECT lease_owner FROM workflow_runs WHERE id = $1")
        .bind(&run.id)
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("owner");
    assert_eq!(held.as_deref(), Some("engine-a"), "the stopped engine still holds the run");
    h.start_worker("later").await;
    let started = tokio::time::Instant::now();
    let (_second, _stop) = h.spawn_engine(config);
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    assert!(started.elapsed() < Duration::from_secs(10), "resumed at once, not when the claim lapsed");
}

async fn webhooks_to_private_addresses_are_refused_unless_allowed(h: Harness) {
    let (url, seen) = crate::steps::receiver().await;
    let (_engine, _stop) = h.spawn_engine(WorkflowConfig { allow_private_webhooks: false, ..test_config() });
    // A refusal is no transient failure: the step's retries are not spent on it.
    let retry = "retry: {max_attempts: 3, backoff: 10ms}";
    h.put(&format!("name: hook\nsteps:\n- id: call\n  message: {{webhook: \"{url}\", text: hi, {retry}}}\n")).await;
    // A name is vetted when the client resolves it, not only a literal address.
    let by_name = url.replace("127.0.0.1", "localhost");
    h.put(&format!("name: hook-name\nsteps:\n- id: call\n  message: {{webhook: \"{by_name}\", text: hi}}\n")).await;
    for workflow in ["hook", "hook-name"] {
        let run = h.run(workflow, json!({})).await;
        let run = h.finished(&run.id).await;
        assert_eq!((run.state, run.body.steps.len()), (RunState::Failed, 1), "one attempt: {run:#?}");
        let error = run.body.steps[0].error.clone().unwrap_or_default();
        assert!(error.contains("not a public address") && error.contains("allow_private_webhooks"), "{error}");
    }
    assert!(seen.lock().expect("seen").is_empty(), "nothing was sent");
}

async fn claim_of(h: &Harness, run_id: &str) -> (Option<String>, i64) {
    sqlx::query_as("SELECT lease_owner, lease_token FROM workflow_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("the run's claim")
}

/// A run created for an engine is claimed from its first write: no other
/// engine claims it, its engine writes it under that claim (from the copy it
/// holds), renews it and loses it, once it lapses, like any claim. A second
/// start with the run's idempotency key claims nothing.
async fn a_run_created_for_an_engine_is_its_claim_from_the_start(h: Harness) {
    let engine = SqlRunRepository::new(h.db.clone());
    let taker = Taker { owner: "engine-a".into(), lease_until: 100 };
    let new = NewRun { idempotency_key: Some("once".into()), ..bare_run("run-taken") };
    let created = engine.create(new.clone(), Some(&taker), 1).await.expect("create");
    assert!(created.created);
    let claim = created.claim.expect("created claimed");
    assert_eq!((claim.run_id.as_str(), &claim.fence), ("run-taken", &Fence { owner: "engine-a".into(), token: 1 }));
    assert_eq!(claim_of(&h, "run-taken").await, (Some("engine-a".into()), 1));
    assert!(engine.claim_due("engine-b", 50, 200, 10).await.expect("claim").is_empty(), "engine-a holds it");
    let again = engine.create(NewRun { id: "run-again".into(), ..new }, Some(&taker), 2).await.expect("create again");
    assert_eq!((again.run.id.as_str(), again.created, again.claim), ("run-taken", false, None));
    let mut work = |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        run.body.input.insert("worked".into(), json!(true));
        Ok(Transition { due_at: Some(0), release: false })
    };
    let written = engine.transition(NS, "run-taken", Some(&claim.fence), 3, &mut work).await.expect("write");
    assert!(written.wrote && written.run.body.input.contains_key("worked"));
    assert_eq!(engine.renew("engine-a", 300).await.expect("renew"), 1);
    assert!(engine.claim_due("engine-b", 250, 400, 10).await.expect("claim").is_empty(), "renewed");
    let taken = engine.claim_due("engine-b", 350, 400, 10).await.expect("take over");
    assert_eq!(taken.iter().map(|claim| claim.fence.token).collect::<Vec<_>>(), [2], "lapsed: taken over");
    let lost = engine.transition(NS, "run-taken", Some(&claim.fence), 351, &mut work).await.expect_err("fenced");
    assert!(matches!(lost, WorkflowError::LeaseLost(_)), "{lost:?}");
}

/// A run started through a service an engine was spawned on, due at once,
/// is created claimed for that engine, which drives it from there.
async fn a_run_started_beside_an_engine_is_created_claimed_for_it(h: Harness) {
    // Nobody works for `later` yet: the engine holds the run while it awaits the task.
    h.put("name: slowish\nsteps:\n- id: a\n  spawn: {agent: later, input: go}\n").await;
    let (workflows, _stop) = h.spawn_engine(WorkflowConfig { engine_id: Some("engine-a".into()), ..test_config() });
    let call = StartCall { namespace: NS.into(), workflow: "slowish".into(), ..StartCall::default() };
    let run = workflows.start_run(call).await.expect("the run starts");
    assert_eq!(claim_of(&h, &run.id).await, (Some("engine-a".into()), 1), "claimed as it was created");
    h.start_worker("later").await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
}

/// Engines that look for due runs once a minute unless woken.
fn minute_polls() -> WorkflowConfig {
    WorkflowConfig { poll_ms: 60_000, ..test_config() }
}

async fn start(workflows: &chorus_workflow::Workflows, workflow: &str) -> String {
    let call = StartCall { namespace: NS.into(), workflow: workflow.into(), ..StartCall::default() };
    workflows.start_run(call).await.expect("the run starts").id
}

/// A run waiting on a timer needs no engine until the timer fires; the
/// engine that let it go looks again then, not at its next poll.
async fn a_timer_wakes_its_engine_before_the_next_poll(h: Harness) {
    h.put("name: naps\nsteps:\n- id: one\n  wait: {duration: 300ms}\n- id: two\n  wait: {duration: 300ms}\n").await;
    let (workflows, _stop) = h.spawn_engine(minute_polls());
    let run_id = start(&workflows, "naps").await;
    let run = h.finished(&run_id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
}

/// An engine that starts while a run waits on a timer (set by an engine
/// gone since) wakes when it fires, not at its first poll after.
async fn an_engine_started_meanwhile_wakes_for_a_timer_set_before(h: Harness) {
    h.put("name: nap\nsteps:\n- id: one\n  wait: {duration: 1s}\n").await;
    let (workflows, stop) = h.spawn_engine(minute_polls());
    let run_id = start(&workflows, "nap").await;
    h.waiting(&run_id).await;
    stop.cancel();
    let (_second, _stop) = h.spawn_engine(minute_polls());
    let run = h.finished(&run_id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
}

/// An engine restarted under its name takes back the runs it held before
/// (their claims end before the new start's first claim could), not those it
/// was handed since it started: those keep their claim, and a driver that
/// holds it is not fenced off.
async fn a_restarted_engine_takes_back_only_the_claims_made_before_it_started(h: Harness) {
    let engine = SqlRunRepository::new(h.db.clone());
    for (id, owner, lease_until) in
        [("run-old", "engine-a", 100), ("run-new", "engine-a", 900), ("run-b", "engine-b", 100)]
    {
        let taker = Taker { owner: owner.into(), lease_until };
        engine.create(bare_run(id), Some(&taker), 1).await.expect("create");
    }
    let taken = engine.adopt("engine-a", 500, 1_000).await.expect("adopt");
    let taken: Vec<(&str, i64)> = taken.iter().map(|claim| (claim.run_id.as_str(), claim.fence.token)).collect();
    assert_eq!(taken, [("run-old", 2)]);
    assert_eq!(claim_of(&h, "run-new").await, (Some("engine-a".into()), 1), "claimed since the start: kept");
    assert_eq!(claim_of(&h, "run-b").await, (Some("engine-b".into()), 1), "another engine's: untouched");
}

/// A run with no definition behind it, for tests of the repository alone.
fn bare_run(id: &str) -> NewRun {
    NewRun {
        namespace: NS.into(),
        id: id.into(),
        workflow: "bare".into(),
        version: 1,
        idempotency_key: None,
        concurrency_key: None,
        concurrency_limit: None,
        body: RunBody::default(),
        retention_micros: None,
        started: None,
    }
}

async fn leases(h: &Harness) -> Vec<(String, Option<i64>)> {
    sqlx::query_as("SELECT id, lease_until FROM workflow_runs ORDER BY id")
        .fetch_all(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("leases")
}

/// A renewal extends every claim the engine holds. On PostgreSQL a row
/// locked meanwhile (as the engine's batched writes lock theirs) is renewed
/// once it is free, and only the engine's own claims are touched.
async fn a_renewal_extends_every_claim_even_one_locked_meanwhile(h: Harness) {
    let engine = SqlRunRepository::new(h.db.clone());
    for (at, id) in [(1, "run-a"), (2, "run-b"), (3, "run-c")] {
        engine.create(bare_run(id), None, at).await.expect("create");
    }
    assert_eq!(engine.claim_due("engine-a", 5, 100, 2).await.expect("claim").len(), 2, "the two due first");
    assert_eq!(engine.claim_due("engine-b", 5, 100, 2).await.expect("claim").len(), 1);
    let postgres = h.db.backend() == chorus_runtime::storage::Backend::Postgres;
    let locker = if postgres {
        let mut tx = h.db.begin().await.expect("begin");
        sqlx::query("SELECT id FROM workflow_runs WHERE id = 'run-b' FOR UPDATE")
            .execute(&mut *tx)
            .await
            .expect("lock run-b");
        Some(tx)
    } else {
        None
    };
    let renewal = {
        let engine = SqlRunRepository::new(h.db.clone());
        tokio::spawn(async move { engine.renew("engine-a", 500).await })
    };
    if let Some(tx) = locker {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!renewal.is_finished(), "the renewal waits for the locked row");
        tx.commit().await.expect("unlock");
    }
    assert_eq!(renewal.await.expect("join").expect("renew"), 2);
    let expected = [("run-a", Some(500)), ("run-b", Some(500)), ("run-c", Some(100))];
    assert_eq!(leases(&h).await, expected.map(|(id, until)| (id.to_owned(), until)));
}

async fn due_at(h: &Harness, run_id: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT due_at FROM workflow_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("due_at")
}

/// While an engine drives a run, each write asks for the run to be due now;
/// the row keeps the time it first became due (so the due index is left
/// alone), and a transition that changes nothing else writes nothing.
async fn a_run_that_stays_due_keeps_the_time_it_became_due(h: Harness) {
    let engine = SqlRunRepository::new(h.db.clone());
    engine.create(bare_run("run-due"), None, 1).await.expect("create");
    assert_eq!(due_at(&h, "run-due").await, Some(1));
    let fence = engine.claim_due("engine-a", 2, 100, 10).await.expect("claim").remove(0).fence;
    let mut due_now = |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        run.body.input.insert("worked".into(), json!(true));
        Ok(Transition { due_at: Some(10), release: false })
    };
    let written = engine.transition(NS, "run-due", Some(&fence), 10, &mut due_now).await.expect("write");
    assert!(written.wrote);
    assert_eq!(due_at(&h, "run-due").await, Some(1), "still due since 1");
    let mut unchanged = |_: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        Ok(Transition { due_at: Some(20), release: false })
    };
    let written = engine.transition(NS, "run-due", Some(&fence), 20, &mut unchanged).await.expect("no-op");
    assert!(!written.wrote, "nothing but the due time changed: nothing written");
    // A time still to come, or none, is written as asked.
    let mut later = |_: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        Ok(Transition { due_at: Some(500), release: false })
    };
    engine.transition(NS, "run-due", Some(&fence), 30, &mut later).await.expect("later");
    assert_eq!(due_at(&h, "run-due").await, Some(500));
    let mut never = |_: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        Ok(Transition { due_at: None, release: false })
    };
    engine.transition(NS, "run-due", Some(&fence), 40, &mut never).await.expect("never");
    assert_eq!(due_at(&h, "run-due").await, None);
    // Both ways of writing keep it: the engine's held copy and a locked read.
    let mut now_again = |_: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        Ok(Transition { due_at: Some(50), release: false })
    };
    engine.transition(NS, "run-due", None, 50, &mut now_again).await.expect("due again");
    let mut still = |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        run.body.input.insert("more".into(), json!(true));
        Ok(Transition { due_at: Some(60), release: false })
    };
    engine.transition(NS, "run-due", None, 60, &mut still).await.expect("locked write");
    assert_eq!(due_at(&h, "run-due").await, Some(50));
}

/// The engine's write of a run it holds is one batched statement that does
/// not read the row: a change slipped into the row without counting up its
/// revision (no chorus write does that) goes unseen and is written over. Were
/// the batch to fail, the engine would read the row afresh and keep it.
async fn the_engine_writes_the_run_it_holds_without_reading_it(h: Harness) {
    let engine = SqlRunRepository::new(h.db.clone());
    engine.create(bare_run("run-blind"), None, 1).await.expect("create");
    let fence = engine.claim_due("engine-a", 2, 100, 10).await.expect("claim").remove(0).fence;
    let mark = |key: &'static str| {
        move |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
            run.body.input.insert(key.into(), json!(true));
            Ok(Transition { due_at: Some(0), release: false })
        }
    };
    engine.transition(NS, "run-blind", Some(&fence), 3, &mut mark("first")).await.expect("first write");
    let body: String = sqlx::query_scalar("SELECT body FROM workflow_runs WHERE id = $1")
        .bind("run-blind")
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("body");
    let mut body: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
    body["input"]["slipped"] = json!(true);
    sqlx::query("UPDATE workflow_runs SET body = $1 WHERE id = $2")
        .bind(body.to_string())
        .bind("run-blind")
        .execute(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("slip a change in");
    let run = engine.transition(NS, "run-blind", Some(&fence), 4, &mut mark("second")).await.expect("again").run;
    let stored = engine.get(NS, "run-blind").await.expect("get").expect("the run");
    assert_eq!(stored.body.input, run.body.input);
    let mut keys: Vec<&str> = stored.body.input.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["first", "second"], "written from the held copy, in one statement");
}

/// The run tables of a new PostgreSQL database are analysed once they hold
/// a few runs (SQLite needs no statistics), events with them.
async fn a_new_database_gets_its_first_statistics_once_it_holds_runs(h: Harness) {
    let runs = SqlRunRepository::new(h.db.clone());
    let postgres = h.db.backend() == chorus_runtime::storage::Backend::Postgres;
    assert_eq!(runs.first_statistics(3).await.expect("look"), !postgres, "no runs yet");
    for n in 0..3 {
        runs.create(bare_run(&format!("run-{n}")), None, 1).await.expect("create");
    }
    // Row counts reach the activity statistics within a second or so.
    let started = tokio::time::Instant::now();
    while !runs.first_statistics(3).await.expect("look") {
        assert!(started.elapsed() < Duration::from_secs(10), "never analysed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if postgres {
        let events: f32 =
            sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = to_regclass('workflow_run_events')")
                .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
                .await
                .expect("reltuples");
        assert_eq!(events, 3.0, "the events table was analysed with it (a creation event per run)");
    }
}

/// The engine's first look at a run created (or claimed) for it trusts the
/// copy the create left, without a read; a change this process makes before
/// that look drops the copy, so the look reads the row and sees the change.
async fn a_change_made_here_before_the_engines_first_look_is_seen(h: Harness) {
    let runs = SqlRunRepository::new(h.db.clone());
    let taker = Taker { owner: "engine-a".into(), lease_until: 100 };
    let created = runs.create(bare_run("run-fresh"), Some(&taker), 1).await.expect("create");
    let fence = created.claim.expect("created claimed").fence;
    assert_eq!(runs.held_state(NS, "run-fresh"), Some(RunState::Pending), "held as created");
    assert_eq!(runs.held_state("elsewhere", "run-fresh"), None, "held in its namespace only");
    let keep = Transition { due_at: Some(0), release: false };
    let mut api = |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        run.body.input.insert("api".into(), json!(true));
        Ok(keep)
    };
    runs.transition(NS, "run-fresh", None, 2, &mut api).await.expect("the API writes");
    assert_eq!(runs.held_state(NS, "run-fresh"), None, "the engine's copy is dropped");
    let mut nothing = |_: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| Ok(keep);
    let seen = runs.transition(NS, "run-fresh", Some(&fence), 3, &mut nothing).await.expect("the first look").run;
    assert!(seen.body.input.contains_key("api"), "{:?}", seen.body.input);
    assert_eq!(runs.held_state(NS, "run-fresh"), Some(RunState::Pending), "held again, as read");
}

/// The engine holding a run writes its changes over its own last write
/// without reading the row; a change someone else made in between must make
/// that write miss, and the engine's change apply to the row as it now is.
async fn an_engine_never_writes_its_copy_of_a_run_over_a_change_made_meanwhile(h: Harness) {
    let engine = SqlRunRepository::new(h.db.clone());
    let api = SqlRunRepository::new(h.db.clone());
    engine.create(bare_run("run-held"), None, 1).await.expect("create");
    let claims = engine.claim_due("engine-a", 2, 100, 10).await.expect("claim");
    let fence = claims.into_iter().find(|claim| claim.run_id == "run-held").expect("claimed").fence;
    let keep = Transition { due_at: Some(0), release: false };
    let mark = |key: &'static str| {
        move |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
            run.body.input.insert(key.into(), json!(true));
            Ok(keep)
        }
    };
    engine.transition(NS, "run-held", Some(&fence), 3, &mut mark("engine-first")).await.expect("engine writes");
    api.transition(NS, "run-held", None, 4, &mut mark("api")).await.expect("api writes");
    // A transition that changes nothing in the engine's copy still sees the change.
    let mut nothing = |_: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| Ok(keep);
    let seen = engine.transition(NS, "run-held", Some(&fence), 4, &mut nothing).await.expect("look").run;
    assert!(seen.body.input.contains_key("api"), "{:?}", seen.body.input);
    let run = engine.transition(NS, "run-held", Some(&fence), 5, &mut mark("engine-second")).await.expect("again").run;
    let mut keys: Vec<&str> = run.body.input.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["api", "engine-first", "engine-second"], "the outside change survives");
    let stored = api.get(NS, "run-held").await.expect("get").expect("the run");
    assert_eq!(stored.body.input, run.body.input);
    // A claim taken over by another engine fences the first one out, held copy or not.
    let taken = engine.claim_due("engine-b", 200, 300, 10).await.expect("take over");
    assert!(taken.iter().any(|claim| claim.run_id == "run-held"));
    let lost = engine.transition(NS, "run-held", Some(&fence), 6, &mut mark("stale")).await.expect_err("fenced");
    assert!(matches!(lost, chorus_workflow::error::WorkflowError::LeaseLost(_)), "{lost:?}");
    let stored = api.get(NS, "run-held").await.expect("get").expect("the run");
    assert!(!stored.body.input.contains_key("stale"));
}

/// What the run gauges read: the unfinished runs by state, and when the
/// least recently changed of each last changed; finished runs are not counted.
async fn the_gauges_count_unfinished_runs_by_state(h: Harness) {
    let runs = SqlRunRepository::new(h.db.clone());
    assert_eq!(runs.unfinished().await.expect("count"), [], "none yet");
    for (id, at) in [("run-a", 5), ("run-b", 9), ("run-c", 20)] {
        runs.create(bare_run(id), None, at).await.expect("create");
    }
    let mut finish = |run: &mut chorus_workflow::domain::Run, _: chorus_workflow::domain::Slot| {
        run.state = RunState::Completed;
        run.finished_at = Some(12);
        Ok(Transition { due_at: None, release: false })
    };
    runs.transition(NS, "run-a", None, 12, &mut finish).await.expect("finish");
    let counted = runs.unfinished().await.expect("count");
    assert_eq!(counted, [Unfinished { state: RunState::Pending, runs: 2, since: 9 }]);
}
