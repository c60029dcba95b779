//! The workflow engine under crashes, over real processes on one PostgreSQL:
//! the task store, bus and hub each in a `chorus serve` process, the phase
//! agents in `chorus agent phases`, and two `chorus serve workflow` engine
//! replicas running the shipped seed-001 delivery pipeline
//! (`workflows/software-delivery.yaml`). While three runs go through their
//! phases and gates, the engines are killed with SIGKILL and restarted, one
//! at a time and both at once right after a task appears (between issuing a
//! spawn and recording it, most likely). Every run must complete, no spawn
//! or message may happen twice, and the gate history must be exactly the
//! decisions that were made.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use chorus_proto::workflow::{
    self as pb, DecideGateRequest, GetRunRequest, ListRunsRequest, RunState, StartRunRequest, StepKind, StepState,
    workflow_client::WorkflowClient,
};
use chorus_runtime::testing::PostgresDatabase;
use chorus_tests::{Sandbox, server::Server};
use tokio::time::Instant;
use tonic::transport::Channel;

const NS: &str = "default";
const RUNS: usize = 3;
/// Fewest engine kills while the runs go.
const MIN_KILLS: usize = 20;
/// Pauses before the kills, in turn, in milliseconds.
const PAUSES_MS: [u64; 7] = [250, 600, 150, 400, 700, 300, 500];
/// Every how many kills both engines die together, right after a task appears.
const BOTH_EVERY: usize = 4;
const FINISH_DEADLINE: Duration = Duration::from_secs(180);

/// A decision the test made: (run, gate, iteration, approved).
type Made = BTreeSet<(String, String, u32, bool)>;

struct Stack {
    sandbox: Sandbox,
    database: String,
    services: String,
    events: String,
    hub: String,
    engines: [Option<Server>; 2],
}

impl Stack {
    async fn engine(&self, name: &str) -> Server {
        self.sandbox
            .serve("workflow", &self.database)
            .name(name)
            .env("CHORUS_WORKFLOW__DEFINITIONS_DIR", self.sandbox.path().join("workflows"))
            .env("CHORUS_WORKFLOW__TASKSTORE_URL", &self.services)
            .env("CHORUS_WORKFLOW__EVENTBUS_URL", &self.events)
            .env("CHORUS_WORKFLOW__HUB_URL", &self.hub)
            .env("CHORUS_WORKFLOW__LEASE_MS", "500")
            .env("CHORUS_WORKFLOW__POLL_MS", "50")
            .start()
            .await
    }

    /// A replica that is up (never the one being restarted).
    async fn client(&self) -> WorkflowClient<Channel> {
        let live = self.engines.iter().flatten().next().expect("a live engine");
        WorkflowClient::new(live.channel().await)
    }

    async fn restart(&mut self, index: usize) {
        if let Some(engine) = self.engines[index].take() {
            engine.kill().await;
        }
        self.engines[index] = Some(self.engine(&format!("engine {index}")).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_killed_at_random_points_lose_nothing_and_repeat_nothing() {
    let Some(database) = PostgresDatabase::create_or_skip().await else { return };
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("workflows dir");
    std::fs::write(
        sandbox.path().join("workflows/software-delivery.yaml"),
        include_str!("../../workflows/software-delivery.yaml"),
    )
    .expect("write the pipeline");
    let taskstore = sandbox.serve("taskstore", database.url()).start().await;
    let eventbus = sandbox.serve("eventbus", database.url()).start().await;
    let hub = sandbox.serve("hub", database.url()).start().await;
    let _agents = sandbox.builtin_agent("phases", taskstore.url(), NS);
    let mut stack = Stack {
        database: database.url().to_owned(),
        services: taskstore.url().to_owned(),
        events: eventbus.url().to_owned(),
        hub: hub.url().to_owned(),
        sandbox,
        engines: [None, None],
    };
    let (a, b) = tokio::join!(stack.engine("engine 0"), stack.engine("engine 1"));
    stack.engines = [Some(a), Some(b)];

    let mut runs = Vec::new();
    let mut client = stack.client().await;
    for n in 0..RUNS {
        let mut input = prost_types::Struct::default();
        input.fields.insert("epic".into(), string(&format!("epic {n}")));
        let request = StartRunRequest {
            namespace: NS.into(),
            workflow: "software-delivery".into(),
            input: Some(input),
            idempotency_key: format!("epic-{n}"),
            ..StartRunRequest::default()
        };
        runs.push(client.start_run(request).await.expect("start").into_inner().id);
    }

    let made = Arc::new(Mutex::new(Made::new()));
    let deadline = Instant::now() + FINISH_DEADLINE;
    let mut kills = 0;
    let mut tasks_seen = count_tasks(&stack.database).await;
    loop {
        decide_waiting_gates(&mut stack.client().await, &runs, &made).await;
        if kills >= MIN_KILLS && all_finished(&mut stack.client().await, &runs).await {
            break;
        }
        assert!(Instant::now() < deadline, "the runs did not finish in time after {kills} kills");
        if kills < MIN_KILLS {
            let busy = !all_finished(&mut stack.client().await, &runs).await;
            assert!(
                busy || kills >= MIN_KILLS / 2,
                "the runs finished before half the kills: make the pipeline longer"
            );
            tokio::time::sleep(Duration::from_millis(PAUSES_MS[kills % PAUSES_MS.len()])).await;
            if kills % BOTH_EVERY == BOTH_EVERY - 1 {
                tasks_seen = kill_both_after_a_new_task(&mut stack, tasks_seen).await;
            } else {
                stack.restart(kills % 2).await;
            }
            kills += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let mut client = stack.client().await;
    let mut spawns = 0;
    for run_id in &runs {
        let run = client
            .get_run(GetRunRequest { namespace: NS.into(), run_id: run_id.clone(), wait_finished: false })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(run.state(), RunState::Completed, "{run:#?}");
        let mut keys = BTreeSet::new();
        for step in &run.steps {
            assert!(keys.insert((step.step_id.clone(), step.iteration, step.attempt)), "a step ran twice: {run:#?}");
            if step.kind() == StepKind::Spawn {
                assert!(!step.external_id.is_empty(), "a spawn without its task: {step:#?}");
                spawns += 1;
            }
        }
        let decided: Made = run
            .gate_decisions
            .iter()
            .filter(|d| !d.automatic)
            .map(|d| (run_id.clone(), d.step_id.clone(), d.iteration, d.decision() == pb::Decision::Approve))
            .collect();
        let expected: Made = made.lock().expect("made").iter().filter(|d| &d.0 == run_id).cloned().collect();
        assert_eq!(decided, expected, "the gate history is exactly the decisions made");
        assert_eq!(run.gate_decisions.iter().filter(|d| !d.automatic).count(), expected.len(), "none recorded twice");
        if run_id == &runs[0] {
            let rerun = run.steps.iter().any(|s| s.step_id == "discovery" && s.iteration == 2);
            assert!(rerun, "the rejected backlog ran discovery again: {run:#?}");
        }
    }
    eprintln!("{kills} kills; {spawns} spawn attempts; {} decisions", made.lock().expect("made").len());
    assert_eq!(count_tasks(&stack.database).await, spawns, "one task per spawn attempt, none issued twice");
    assert_eq!(count_announcements(&stack.database).await, RUNS as i64, "one announcement per run");
    assert!(kills >= MIN_KILLS);
}

fn string(text: &str) -> prost_types::Value {
    prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(text.into())) }
}

/// Decides one waiting gate (one a kill, so the work spreads over the
/// kills): approves, except the first backlog approval of the first run,
/// which is rejected once (its phase runs again).
async fn decide_waiting_gates(client: &mut WorkflowClient<Channel>, runs: &[String], made: &Mutex<Made>) {
    let request = ListRunsRequest {
        namespace: NS.into(),
        states: vec![RunState::Waiting.into()],
        include_steps: true,
        ..ListRunsRequest::default()
    };
    let Ok(page) = client.list_runs(request).await else { return };
    for run in page.into_inner().runs {
        for step in run.steps.iter().filter(|s| s.kind() == StepKind::Gate && s.state() == StepState::Waiting) {
            let reject = run.id == runs[0] && step.step_id == "backlog_approval" && step.iteration == 1;
            let decision = if reject { pb::Decision::Reject } else { pb::Decision::Approve };
            let request = DecideGateRequest {
                namespace: NS.into(),
                run_id: run.id.clone(),
                step_id: step.step_id.clone(),
                decision: decision.into(),
                decided_by: "e2e".into(),
                reason: if reject { "more user stories".into() } else { "ok".into() },
                iteration: Some(step.iteration),
                ..DecideGateRequest::default()
            };
            if client.decide_gate(request).await.is_ok() {
                made.lock().expect("made").insert((run.id.clone(), step.step_id.clone(), step.iteration, !reject));
                return;
            }
        }
    }
}

async fn all_finished(client: &mut WorkflowClient<Channel>, runs: &[String]) -> bool {
    for run_id in runs {
        let request = GetRunRequest { namespace: NS.into(), run_id: run_id.clone(), wait_finished: false };
        match client.get_run(request).await {
            Ok(run) if matches!(run.get_ref().state(), RunState::Completed | RunState::Failed | RunState::Canceled) => {
            }
            _ => return false,
        }
    }
    true
}

/// Kills both engines as soon as a new task appears, then starts them again.
async fn kill_both_after_a_new_task(stack: &mut Stack, seen: i64) -> i64 {
    let until = Instant::now() + Duration::from_secs(3);
    let mut now_seen = seen;
    while now_seen == seen && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
        now_seen = count_tasks(&stack.database).await;
    }
    let (a, b) = (stack.engines[0].take(), stack.engines[1].take());
    for engine in [a, b].into_iter().flatten() {
        engine.kill().await;
    }
    let (a, b) = tokio::join!(stack.engine("engine 0"), stack.engine("engine 1"));
    stack.engines = [Some(a), Some(b)];
    now_seen
}

async fn query_count(database_url: &str, sql: &'static str) -> i64 {
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(database_url).await.expect("connect");
    sqlx::query_scalar(sql).fetch_one(&mut connection).await.expect("count")
}

async fn count_tasks(database_url: &str) -> i64 {
    query_count(database_url, "SELECT COUNT(*) FROM taskstore_tasks").await
}

async fn count_announcements(database_url: &str) -> i64 {
    query_count(database_url, "SELECT COUNT(*) FROM hub_messages WHERE sender = 'workflow:software-delivery'").await
}
