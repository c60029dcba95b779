//! `workflow`: durable steps through the workflow engine on PostgreSQL.
//!
//! A 10-step linear workflow whose steps are webhook `message` steps to a
//! sink in this process — a real side effect per step, and no other
//! service's commits — is kept at 64 runs in flight. Reported: completed
//! steps per second beside pgbench's raw commit rate at the same client
//! count, PostgreSQL commits per step, the per-step overhead (from one step's
//! end to the next one's start, as the records say), the CPU each step costs
//! chorus, PostgreSQL and this process beside what a pgbench commit costs,
//! and how soon runs resume after the engine is killed with SIGKILL and
//! started again.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use chorus_proto::workflow::{
    GetRunRequest, ListRunsRequest, PutDefinitionRequest, Run, RunState, StartRunRequest,
    workflow_client::WorkflowClient,
};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::{
    cpu::{CpuSnapshot, CpuUsage},
    pgbench::RawResult,
    postgres::Admin,
    server::Server,
    stats::LatencySummary,
};

/// Runs in flight, and pgbench's client count beside them.
pub(crate) const RUNS_IN_FLIGHT: usize = 64;
const STEPS: usize = 10;
const COMMIT_GOAL: f64 = 2.0;
const RATIO_GOAL: f64 = 0.5;
const RESUME_GOAL_MS: f64 = 1000.0;
/// Runs, steps and kills of the resume measurement.
const RESUME_RUNS: usize = 16;
const RESUME_STEPS: usize = 20;
/// Each step of the resume measurement's runs waits this long (a durable timer).
const RESUME_WAIT_MICROS: i64 = 200_000;
const KILLS: usize = 3;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct WorkflowReport {
    pub(crate) seconds: u64,
    pub(crate) runs_in_flight: usize,
    pub(crate) runs_completed: u64,
    pub(crate) steps_per_second: f64,
    pub(crate) raw_tps: f64,
    pub(crate) ratio_of_raw: f64,
    /// Write transactions (transaction ids assigned) per step: the engine's
    /// own commits, durable or not.
    pub(crate) writes_per_step: f64,
    /// Every commit pg_stat_database counts per step, reads included.
    pub(crate) commits_per_step: f64,
    /// A step's duration: from its record's start to its end, the webhook
    /// call and the commit of its result included.
    pub(crate) step_latency: LatencySummary,
    /// How long the first step after the kill waited for the restarted
    /// engine, from its announcement or, when later, from the moment the
    /// step was due: under the same engine name, and under a new one.
    pub(crate) resume_same_name: LatencySummary,
    pub(crate) resume_new_name: LatencySummary,
    /// Where the CPU went while steps were measured (server: chorus), and
    /// during pgbench's run at the same client count (client: pgbench).
    pub(crate) cpu: CpuUsage,
    pub(crate) raw_cpu: CpuUsage,
}

/// Core time per unit of work, in microseconds: `pct` of one core spent at
/// `rate` units per second.
fn micros_per(pct: f64, rate: f64) -> f64 {
    if rate > 0.0 { pct / 100.0 * 1e6 / rate } else { 0.0 }
}

fn linear(name: &str, step: &str, count: usize) -> String {
    let steps: String =
        (1..=count).map(|n| format!("- id: s{n}\n  {}\n", step.replace("{n}", &n.to_string()))).collect();
    format!("name: {name}\nsteps:\n{steps}")
}

/// A webhook receiver that answers every call with 200.
async fn sink() -> anyhow::Result<String> {
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

async fn client(server: &Server) -> anyhow::Result<WorkflowClient<Channel>> {
    Ok(WorkflowClient::connect(server.endpoint.clone()).await?)
}

async fn put(client: &mut WorkflowClient<Channel>, source: String) -> anyhow::Result<()> {
    let request = PutDefinitionRequest { namespace: "bench".into(), source, ..PutDefinitionRequest::default() };
    client.put_definition(request).await.context("put the bench workflow")?;
    Ok(())
}

/// Starts a run and waits for its end, as a client wanting only its result
/// would (its events are not streamed); the run as it ended.
async fn one_run(client: &mut WorkflowClient<Channel>, workflow: &str) -> anyhow::Result<Run> {
    let request =
        StartRunRequest { namespace: "bench".into(), workflow: workflow.into(), ..StartRunRequest::default() };
    let run = client.start_run(request).await?.into_inner();
    let get = GetRunRequest { namespace: "bench".into(), run_id: run.id, wait_finished: true };
    Ok(client.get_run(get).await?.into_inner())
}

fn micros(at: Option<&prost_types::Timestamp>) -> i64 {
    at.map_or(0, |at| at.seconds * 1_000_000 + i64::from(at.nanos / 1_000))
}

/// Each step's duration, in microseconds.
fn durations(run: &Run) -> Vec<u64> {
    run.steps
        .iter()
        .map(|step| u64::try_from(micros(step.finished_at.as_ref()) - micros(step.started_at.as_ref())).unwrap_or(0))
        .collect()
}

/// The cluster's next transaction id (the call takes one itself).
async fn next_xid(database_url: &str) -> anyhow::Result<i64> {
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(database_url).await?;
    let xid: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text").fetch_one(&mut connection).await?;
    Ok(xid.parse()?)
}

pub(crate) async fn run(
    admin: &Admin,
    binary: &Path,
    seconds: u64,
    warmup: u64,
    raw: &[RawResult],
    interrupt: &CancellationToken,
) -> anyhow::Result<WorkflowReport> {
    let raw_at_runs = raw.iter().find(|r| r.clients == RUNS_IN_FLIGHT);
    let (raw_tps, raw_cpu) = raw_at_runs.map_or((0.0, CpuUsage::default()), |r| (r.tps, r.cpu));
    admin
        .with_scratch("workflow", interrupt, |db| async move {
            let workdir = tempfile::tempdir()?;
            let env = [
                ("CHORUS_WORKFLOW__ALLOW_PRIVATE_WEBHOOKS", "true".to_owned()),
                ("CHORUS_WORKFLOW__DEFINITIONS_DIR", workdir.path().join("none").display().to_string()),
                ("CHORUS_WORKFLOW__ENGINE_ID", "bench-engine".to_owned()),
            ];
            let mut server = Server::start_with_env(binary, "workflow", &db.url, workdir.path(), &env).await?;
            let url = sink().await?;
            let mut control = client(&server).await?;
            let step = format!("message: {{webhook: \"{url}\", text: \"step {{n}} of {{{{ run.id }}}}\"}}");
            put(&mut control, linear("linear", &step, STEPS)).await?;
            eprintln!("workflow: {RUNS_IN_FLIGHT} runs of {STEPS} webhook steps in flight, {warmup} s + {seconds} s…");
            let mut counter = admin.commit_counter(&db.name).await?;
            let completed = Arc::new(AtomicU64::new(0));
            let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
            let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop = CancellationToken::new();
            let mut loops = Vec::new();
            for _ in 0..RUNS_IN_FLIGHT {
                let (mut client, stop) = (client(&server).await?, stop.clone());
                let (completed, samples, measuring) =
                    (Arc::clone(&completed), Arc::clone(&samples), Arc::clone(&measuring));
                loops.push(tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let run = one_run(&mut client, "linear").await?;
                        anyhow::ensure!(
                            run.state() == RunState::Completed,
                            "a bench run ended {:?}: {}",
                            run.state(),
                            run.error
                        );
                        if measuring.load(Ordering::Relaxed) && !stop.is_cancelled() {
                            completed.fetch_add(1, Ordering::Relaxed);
                            samples.lock().expect("samples").extend(durations(&run));
                        }
                    }
                    anyhow::Ok(())
                }));
            }
            tokio::time::sleep(Duration::from_secs(warmup)).await;
            let before = counter.read().await?;
            let xid_before = next_xid(&db.url).await?;
            let cpu_before = CpuSnapshot::take(Some(server.pid), std::process::id())?;
            measuring.store(true, Ordering::Relaxed);
            let started = Instant::now();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let runs = completed.load(Ordering::Relaxed);
            let cpu = cpu_before.usage_until(&CpuSnapshot::take(Some(server.pid), std::process::id())?);
            let after = counter.read().await?;
            let writes = (next_xid(&db.url).await? - xid_before - 1) as f64;
            let elapsed = started.elapsed().as_secs_f64();
            stop.cancel();
            for handle in loops {
                handle.await??;
            }
            server.check_running()?;
            let steps = runs as f64 * STEPS as f64;
            let steps_per_second = steps / elapsed;
            let commits = before.until(after).committed as f64;
            let step_latency = LatencySummary::from_micros(std::mem::take(&mut *samples.lock().expect("samples")));
            eprintln!("workflow: resume after SIGKILL, {KILLS} kills each way…");
            let (server, resume_same_name, resume_new_name) =
                resume(server, binary, &db.url, workdir.path(), &env).await?;
            server.stop().await?;
            Ok(WorkflowReport {
                seconds,
                runs_in_flight: RUNS_IN_FLIGHT,
                runs_completed: runs,
                steps_per_second,
                raw_tps,
                ratio_of_raw: if raw_tps > 0.0 { steps_per_second / raw_tps } else { 0.0 },
                writes_per_step: if steps > 0.0 { writes / steps } else { 0.0 },
                commits_per_step: if steps > 0.0 { commits / steps } else { 0.0 },
                step_latency,
                resume_same_name,
                resume_new_name,
                cpu,
                raw_cpu,
            })
        })
        .await
}

/// Kills the engine while runs of short timed waits go on and starts it
/// again (under its name, then under a new one); how long after the new
/// process announced itself the first step after the kill began.
async fn resume(
    mut server: Server,
    binary: &Path,
    database_url: &str,
    workdir: &Path,
    env: &[(&str, String)],
) -> anyhow::Result<(Server, LatencySummary, LatencySummary)> {
    let mut control = client(&server).await?;
    let wait = format!("wait: {{duration: {}ms}}", RESUME_WAIT_MICROS / 1000);
    put(&mut control, linear("waits", &wait, RESUME_STEPS)).await?;
    let mut results = Vec::new();
    for rename in [false, true] {
        let mut samples = Vec::new();
        for kill in 0..KILLS {
            let mut control = client(&server).await?;
            for _ in 0..RESUME_RUNS {
                let request = StartRunRequest {
                    namespace: "bench".into(),
                    workflow: "waits".into(),
                    ..StartRunRequest::default()
                };
                control.start_run(request).await?;
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
            let mut env = env.to_vec();
            if rename {
                env.retain(|(key, _)| *key != "CHORUS_WORKFLOW__ENGINE_ID");
                env.push(("CHORUS_WORKFLOW__ENGINE_ID", format!("bench-engine-{kill}")));
            }
            let killed_at = micros_now();
            server.stop().await?;
            server = Server::start_with_env(binary, "workflow", database_url, workdir, &env).await?;
            let announced = micros_now();
            let mut control = client(&server).await?;
            samples.push(resume_delay(&mut control, killed_at, announced).await?);
            cancel_all(&mut control).await?;
        }
        results.push(LatencySummary::from_micros(samples));
    }
    Ok((server, results[0], results[1]))
}

fn micros_now() -> i64 {
    chorus_micros(std::time::SystemTime::now())
}

fn chorus_micros(at: std::time::SystemTime) -> i64 {
    at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// How long the first step after the restart waited for the engine: from
/// the later of the restarted engine's announcement and the moment that
/// step was due (its run's timer fired), to its start, in microseconds.
/// Runs between steps are waiting on a timer; the wait is the workflow's,
/// not the restart's, so it is not counted (polling).
async fn resume_delay(client: &mut WorkflowClient<Channel>, killed_at: i64, announced: i64) -> anyhow::Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = ListRunsRequest {
            namespace: "bench".into(),
            workflow: "waits".into(),
            states: vec![RunState::Running.into(), RunState::Waiting.into(), RunState::Completed.into()],
            include_steps: true,
            page_size: 100,
            ..ListRunsRequest::default()
        };
        let runs = client.list_runs(request).await?.into_inner().runs;
        let first = runs
            .iter()
            .flat_map(|run| run.steps.iter().map(move |step| (run, step)))
            .filter(|(_, step)| micros(step.created_at.as_ref()) > killed_at)
            .min_by_key(|(_, step)| micros(step.created_at.as_ref()));
        if let Some((run, step)) = first {
            let due = run
                .steps
                .iter()
                .find(|timer| timer.seq + 1 == step.seq)
                .map_or(0, |timer| micros(timer.started_at.as_ref()) + RESUME_WAIT_MICROS);
            let late = micros(step.created_at.as_ref()) - announced.max(due);
            return Ok(u64::try_from(late).unwrap_or(0));
        }
        anyhow::ensure!(Instant::now() < deadline, "no run resumed within 30 s of the restart");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn cancel_all(client: &mut WorkflowClient<Channel>) -> anyhow::Result<()> {
    let request = ListRunsRequest {
        namespace: "bench".into(),
        states: vec![RunState::Pending.into(), RunState::Running.into(), RunState::Waiting.into()],
        page_size: 100,
        ..ListRunsRequest::default()
    };
    for run in client.list_runs(request).await?.into_inner().runs {
        let cancel = chorus_proto::workflow::CancelRunRequest {
            namespace: "bench".into(),
            run_id: run.id,
            ..Default::default()
        };
        let _ = client.cancel_run(cancel).await;
    }
    Ok(())
}

impl std::fmt::Display for WorkflowReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = |met: bool| if met { "met" } else { "NOT met" };
        writeln!(
            f,
            "\n## workflow engine: {STEPS}-step linear workflow (webhook steps), {} runs in flight, PostgreSQL",
            self.runs_in_flight
        )?;
        writeln!(f, "| measure | chorus | goal |")?;
        writeln!(f, "|---|---|---|")?;
        writeln!(
            f,
            "| durable steps/s | {:.0} ({} runs in {} s) | |",
            self.steps_per_second, self.runs_completed, self.seconds
        )?;
        writeln!(f, "| raw PostgreSQL commits/s (pgbench, {} clients) | {:.0} | |", self.runs_in_flight, self.raw_tps)?;
        writeln!(
            f,
            "| steps/s ÷ raw tps | {:.1} % | ≥ {:.0} %: {} |",
            self.ratio_of_raw * 100.0,
            RATIO_GOAL * 100.0,
            mark(self.ratio_of_raw >= RATIO_GOAL)
        )?;
        writeln!(
            f,
            "| write commits per step (transaction ids) | {:.2} | ≤ {COMMIT_GOAL}: {} |",
            self.writes_per_step,
            mark(self.writes_per_step <= COMMIT_GOAL)
        )?;
        writeln!(f, "| all commits per step, reads included (pg_stat_database) | {:.2} | |", self.commits_per_step)?;
        writeln!(
            f,
            "| step latency p50 / p99 (webhook + recording) | {:.2} / {:.2} ms | |",
            self.step_latency.p50_ms, self.step_latency.p99_ms
        )?;
        let (cpu, raw) = (&self.cpu, &self.raw_cpu);
        let step = |pct: f64| micros_per(pct, self.steps_per_second);
        writeln!(
            f,
            "| CPU per step: chorus / PostgreSQL / bench (machine {:.0} % busy) | {:.0} / {:.0} / {:.0} µs | |",
            cpu.machine_busy_pct,
            step(cpu.server_pct.unwrap_or_default()),
            step(cpu.postgres_pct),
            step(cpu.client_pct)
        )?;
        writeln!(
            f,
            "| CPU per pgbench commit: PostgreSQL / pgbench (machine {:.0} % busy) | {:.0} / {:.0} µs | |",
            raw.machine_busy_pct,
            micros_per(raw.postgres_pct, self.raw_tps),
            micros_per(raw.client_pct, self.raw_tps)
        )?;
        let same = &self.resume_same_name;
        writeln!(
            f,
            "| resume after SIGKILL, same engine name: p50 / max | {:.0} / {:.0} ms | ≤ {RESUME_GOAL_MS:.0} ms: {} |",
            same.p50_ms,
            same.max_ms,
            mark(same.max_ms <= RESUME_GOAL_MS)
        )?;
        let new = &self.resume_new_name;
        writeln!(
            f,
            "| resume after SIGKILL, new engine name (claims lapse): p50 / max | {:.0} / {:.0} ms | |",
            new.p50_ms, new.max_ms
        )
    }
}
