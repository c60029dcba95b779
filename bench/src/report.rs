//! The task-store results: a table on stdout and a JSON summary of the same
//! figures (`target/bench/taskstore.json` by default).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use serde::Serialize;

use crate::{
    pgbench::RawResult,
    scenario::{Backend, COMMIT_BUDGET, ChorusResult},
};

/// The goal: this many concurrent workers reach this share of the raw
/// commit rate (at the designed 3 commits per round trip).
pub(crate) const GOAL_CLIENTS: usize = 16;
pub(crate) const GOAL_RATIO: f64 = 0.5;

/// Everything one run measured. Every field is always present (null when not
/// measured), so the structure is the same from run to run.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) config: RunConfig,
    pub(crate) raw_postgres: Vec<RawResult>,
    pub(crate) chorus: Vec<ChorusResult>,
    pub(crate) goal: Goal,
}

/// How the run was made.
#[derive(Debug, Serialize)]
pub(crate) struct RunConfig {
    pub(crate) started_unix: u64,
    pub(crate) seconds: u64,
    pub(crate) warmup_seconds: u64,
    pub(crate) prime_seconds: u64,
    pub(crate) clients: Vec<usize>,
    pub(crate) backends: Vec<Backend>,
    pub(crate) cores: usize,
    pub(crate) commit_budget_per_round_trip: f64,
    pub(crate) chorus_bin: String,
    /// Names of the `CHORUS_*` variables chorus inherited (values omitted).
    pub(crate) chorus_env: Vec<String>,
    pub(crate) postgres_version: Option<String>,
    pub(crate) pgbench_version: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Goal {
    pub(crate) clients: usize,
    pub(crate) target_ratio: f64,
    /// 3 × chorus round trips/s ÷ raw tps, both at `clients`.
    pub(crate) ratio: Option<f64>,
    pub(crate) met: Option<bool>,
}

impl Report {
    /// Assembles the report, comparing each PostgreSQL run with pgbench at
    /// the same client count.
    pub(crate) fn new(config: RunConfig, raw_postgres: Vec<RawResult>, mut chorus: Vec<ChorusResult>) -> Self {
        for result in chorus.iter_mut().filter(|result| result.backend == Backend::Postgres) {
            if let Some(raw) = raw_postgres.iter().find(|raw| raw.clients == result.clients) {
                result.compare_with_raw(raw.tps);
            }
        }
        let ratio = chorus
            .iter()
            .find(|result| result.backend == Backend::Postgres && result.clients == GOAL_CLIENTS)
            .and_then(|result| result.vs_raw)
            .map(|vs_raw| vs_raw.budget_commit_ratio);
        let goal = Goal {
            clients: GOAL_CLIENTS,
            target_ratio: GOAL_RATIO,
            ratio,
            met: ratio.map(|ratio| ratio >= GOAL_RATIO),
        };
        Self { config, raw_postgres, chorus, goal }
    }

    pub(crate) fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        write_json(self, path)
    }

    /// The human-readable tables.
    pub(crate) fn table(&self, json_path: &Path) -> String {
        let mut out = String::new();
        let config = &self.config;
        let _ = writeln!(
            out,
            "\nchorus task store: CreateTask → ClaimedTask → CompleteTask, {} s measured after {} s warm-up \
             (databases primed for {} s), {} cores{}",
            config.seconds,
            config.warmup_seconds,
            config.prime_seconds,
            config.cores,
            config.postgres_version.as_ref().map(|version| format!(", PostgreSQL {version}")).unwrap_or_default()
        );
        self.raw_table(&mut out);
        self.round_trip_table(&mut out);
        self.phase_table(&mut out);
        self.commit_table(&mut out);
        self.goal_line(&mut out);
        let _ = writeln!(out, "JSON summary: {}", json_path.display());
        out
    }

    fn raw_table(&self, out: &mut String) {
        if self.raw_postgres.is_empty() {
            return;
        }
        let _ = writeln!(out, "\nRaw PostgreSQL commits (pgbench: one INSERT per transaction, autocommit)");
        let _ = writeln!(
            out,
            "{:>7} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7} {:>8} {:>7} {:>8}",
            "clients", "tps", "avg ms", "p50 ms", "p99 ms", "commits/tx", "pg cpu", "pgbench", "others", "machine"
        );
        for raw in &self.raw_postgres {
            let _ = writeln!(
                out,
                "{:>7} {:>10.1} {:>8.3} {:>8.3} {:>8.3} {:>10.2} {:>6.0}% {:>7.0}% {:>6.0}% {:>7.0}%",
                raw.clients,
                raw.tps,
                raw.latency_avg_ms,
                raw.latency.p50_ms,
                raw.latency.p99_ms,
                raw.commits_per_transaction,
                raw.cpu.postgres_pct,
                raw.cpu.client_pct,
                raw.cpu.other_pct,
                raw.cpu.machine_busy_pct
            );
        }
    }

    fn round_trip_table(&self, out: &mut String) {
        let _ = writeln!(out, "\nchorus round trips (latency: CreateTask start → CompleteTask acknowledged)");
        let _ = writeln!(
            out,
            "{:<8} {:>7} {:>9} {:>8} {:>8} {:>12} {:>10} {:>10}",
            "backend", "clients", "rt/s", "p50 ms", "p99 ms", "commits/s*", "raw tps", "vs raw**"
        );
        for result in &self.chorus {
            let _ = writeln!(
                out,
                "{:<8} {:>7} {:>9.1} {:>8.3} {:>8.3} {:>12.1} {:>10} {:>10}",
                backend_name(result.backend),
                result.clients,
                result.round_trips_per_sec,
                result.latency.p50_ms,
                result.latency.p99_ms,
                result.budget_commits_per_sec,
                result.vs_raw.map_or_else(|| "-".to_owned(), |vs_raw| format!("{:.1}", vs_raw.raw_tps)),
                percent(result.vs_raw.map(|vs_raw| vs_raw.budget_commit_ratio))
            );
        }
        let _ = writeln!(out, "  * {COMMIT_BUDGET} × rt/s: the commits the round trips cost at the designed budget");
        let _ = writeln!(out, "  ** commits/s* ÷ raw tps at the same client count, which is also rt/s ÷ (raw tps / 3)");
    }

    fn phase_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nWhere a round trip goes (p50 ms) and CPU over the window (% of one core; machine: % of all cores)"
        );
        let _ = writeln!(
            out,
            "{:<8} {:>7} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8}",
            "backend", "clients", "create", "claim", "complete", "chorus", "pg", "bench", "others", "machine"
        );
        for result in &self.chorus {
            let cpu = &result.cpu;
            let _ = writeln!(
                out,
                "{:<8} {:>7} {:>8.3} {:>8.3} {:>9.3} {:>6.0}% {:>6.0}% {:>6.0}% {:>6.0}% {:>7.0}%",
                backend_name(result.backend),
                result.clients,
                result.phases.create.p50_ms,
                result.phases.claim.p50_ms,
                result.phases.complete.p50_ms,
                cpu.server_pct.unwrap_or_default(),
                cpu.postgres_pct,
                cpu.client_pct,
                cpu.other_pct,
                cpu.machine_busy_pct
            );
        }
    }

    fn commit_table(&self, out: &mut String) {
        let measured: Vec<&ChorusResult> = self.chorus.iter().filter(|result| result.commits.is_some()).collect();
        if measured.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nCommits per round trip on PostgreSQL, measured over each server's life (budget: {COMMIT_BUDGET} writes)"
        );
        let _ = writeln!(
            out,
            "{:>7} {:>11} {:>10} {:>9} {:>10} {:>15} {:>9} {:>12} {:>9} {:>10}",
            "clients",
            "round trips",
            "commits/rt",
            "writes/rt",
            "notify/rt",
            "keys/rt t/e/c",
            "other/rt",
            "rollbacks/rt",
            "writes/s",
            "writes/raw"
        );
        for result in measured {
            let Some(commits) = result.commits else { continue };
            let per_rt = |count: u64| count as f64 / commits.round_trips.max(1) as f64;
            let notes = commits.notifications;
            let split = format!(
                "{:.2}/{:.2}/{:.2}",
                per_rt(notes.task_keys),
                per_rt(notes.events_keys),
                per_rt(notes.claim_keys)
            );
            let _ = writeln!(
                out,
                "{:>7} {:>11} {:>10.2} {:>9.2} {:>10.2} {:>15} {:>9.2} {:>12.2} {:>9.1} {:>10}",
                result.clients,
                commits.round_trips,
                commits.commits_per_round_trip,
                commits.writes_per_round_trip,
                commits.notifications_per_round_trip,
                split,
                commits.other_per_round_trip,
                commits.rollbacks_per_round_trip,
                commits.writes_per_sec,
                percent(result.vs_raw.and_then(|vs_raw| vs_raw.measured_write_ratio))
            );
        }
        let _ = writeln!(
            out,
            "  commits/rt: xact_commit ÷ every round trip the server served. writes/rt: task-store write\n  \
             transactions (distinct transactions in its event log), the durable commits the budget counts.\n  \
             notify/rt: wake-up pg_notify calls (keys/rt: the task/events/claim keys they carried), each\n  \
             committed by the sender. other/rt: the rest, read-only transactions: autocommit reads, chorus's\n  \
             LISTEN backend reading notifications (one per batch), the reaper's scans, start-up.\n  \
             writes/s: writes/rt × rt/s; writes/raw: writes/s ÷ raw tps at the same client count"
        );
    }

    fn goal_line(&self, out: &mut String) {
        let goal = &self.goal;
        let verdict = match goal.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let _ = writeln!(
            out,
            "\nGoal: {} workers reach ≥ {:.0}% of the raw commit rate: {} → {verdict}",
            goal.clients,
            goal.target_ratio * 100.0,
            percent(goal.ratio)
        );
    }
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
    }
}

pub(crate) fn percent(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_owned(), |ratio| format!("{:.1}%", ratio * 100.0))
}

/// Writes a JSON summary to `path`, creating its directory.
pub(crate) fn write_json(report: &impl Serialize, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(report).context("cannot serialise the report")?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// Where a JSON summary goes by default: `target/bench/<name>` in the
/// workspace (or under `CARGO_TARGET_DIR`).
pub(crate) fn default_json_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or_else(|| Path::new(".")).join("target")
    });
    target.join("bench").join(name)
}
