//! The gateway results: a table on stdout and a JSON summary of the same
//! figures (`target/bench/gateway.json` by default).

use std::{fmt::Write as _, path::Path};

use serde::Serialize;

use super::{Measured, PeerInfo, Point, StreamsResult, System, SystemRuns};
use crate::{report::write_json, scenario::Backend};

/// The goals: at this many clients, chorus answers at least this
/// many times the a2a-sdk's requests/s, with a p99 at most 1/this of its.
pub(crate) const GOAL_CLIENTS: usize = 64;
pub(crate) const GOAL_THROUGHPUT_RATIO: f64 = 20.0;
pub(crate) const GOAL_P99_RATIO: f64 = 20.0;
/// The streams' goal: holding them grows chorus's RSS by less than this.
pub(crate) const GOAL_STREAM_GROWTH_MB: f64 = 100.0;

/// Everything the gateway part of a run measured. Every field is always
/// present (null or empty when not measured).
#[derive(Debug, Serialize)]
pub(crate) struct GatewayReport {
    pub(crate) config: GatewayRunConfig,
    pub(crate) peer: Option<PeerInfo>,
    pub(crate) systems: Vec<SystemRuns>,
    pub(crate) comparisons: Vec<Comparison>,
    pub(crate) streams: Option<StreamsResult>,
    pub(crate) goals: GatewayGoals,
}

/// How the gateway part was run.
#[derive(Debug, Serialize)]
pub(crate) struct GatewayRunConfig {
    pub(crate) started_unix: u64,
    pub(crate) seconds: u64,
    pub(crate) warmup_seconds: u64,
    pub(crate) clients: Vec<usize>,
    pub(crate) backends: Vec<Backend>,
    pub(crate) streams: usize,
    pub(crate) cores: usize,
    pub(crate) chorus_bin: String,
    /// Names of the `CHORUS_*` variables chorus inherited (values omitted).
    pub(crate) chorus_env: Vec<String>,
    pub(crate) postgres_version: Option<String>,
    /// `fsync`, `synchronous_commit`, `wal_sync_method`.
    pub(crate) postgres_durability: Option<String>,
    pub(crate) sqlite_durability: String,
}

/// chorus against its peer at one client count.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Comparison {
    pub(crate) chorus: System,
    pub(crate) peer: System,
    pub(crate) clients: usize,
    pub(crate) chorus_requests_per_sec: f64,
    pub(crate) peer_requests_per_sec: f64,
    /// chorus requests/s ÷ peer requests/s.
    pub(crate) throughput_ratio: Option<f64>,
    pub(crate) chorus_p99_ms: f64,
    pub(crate) peer_p99_ms: f64,
    /// peer p99 ÷ chorus p99.
    pub(crate) p99_ratio: Option<f64>,
    pub(crate) chorus_errors: u64,
    pub(crate) peer_errors: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct GatewayGoals {
    pub(crate) clients: usize,
    pub(crate) target_throughput_ratio: f64,
    pub(crate) target_p99_ratio: f64,
    /// Both ratios at the goal's client count, chorus without errors.
    pub(crate) pairings: Vec<PairGoal>,
    pub(crate) target_stream_growth_mb: f64,
    /// Every stream open and held, and RSS growth under the target.
    pub(crate) streams_met: Option<bool>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct PairGoal {
    pub(crate) chorus: System,
    pub(crate) peer: System,
    pub(crate) throughput_ratio: Option<f64>,
    pub(crate) p99_ratio: Option<f64>,
    pub(crate) met: Option<bool>,
}

impl GatewayReport {
    pub(crate) fn new(config: GatewayRunConfig, measured: Measured) -> Self {
        let Measured { systems, peer, streams } = measured;
        let comparisons = compare(&systems);
        let pairings = comparisons
            .iter()
            .filter(|comparison| comparison.clients == GOAL_CLIENTS)
            .map(|comparison| {
                let ratios = comparison.throughput_ratio.zip(comparison.p99_ratio);
                let reached = ratios
                    .is_some_and(|(throughput, p99)| throughput >= GOAL_THROUGHPUT_RATIO && p99 >= GOAL_P99_RATIO);
                PairGoal {
                    chorus: comparison.chorus,
                    peer: comparison.peer,
                    throughput_ratio: comparison.throughput_ratio,
                    p99_ratio: comparison.p99_ratio,
                    met: Some(reached && comparison.chorus_errors == 0),
                }
            })
            .collect();
        let streams_met = streams.as_ref().map(|streams| {
            streams.opened == streams.streams && streams.ended_early == 0 && streams.growth_mb < GOAL_STREAM_GROWTH_MB
        });
        let goals = GatewayGoals {
            clients: GOAL_CLIENTS,
            target_throughput_ratio: GOAL_THROUGHPUT_RATIO,
            target_p99_ratio: GOAL_P99_RATIO,
            pairings,
            target_stream_growth_mb: GOAL_STREAM_GROWTH_MB,
            streams_met,
        };
        Self { config, peer, systems, comparisons, streams, goals }
    }

    pub(crate) fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        write_json(self, path)
    }

    /// The human-readable tables.
    pub(crate) fn table(&self, json_path: &Path) -> String {
        let mut out = String::new();
        self.header(&mut out);
        self.point_table(&mut out);
        self.ratio_table(&mut out);
        self.streams_lines(&mut out);
        self.goal_lines(&mut out);
        let _ = writeln!(out, "JSON summary: {}", json_path.display());
        out
    }

    fn header(&self, out: &mut String) {
        let config = &self.config;
        let _ = writeln!(
            out,
            "\nA2A gateway: blocking SendMessage (JSON-RPC, A2A-Version: 1.0, a new messageId each) from closed-loop \
             clients, {} s measured after {} s warm-up per point, {} cores\n  \
             chorus: `chorus dev`, POST /a2a/echo: each call is a durable task, created, claimed by the built-in \
             echo worker and completed\n  \
             client: reqwest, HTTP/1.1 keep-alive, one connection and one tokio task per client",
            config.seconds, config.warmup_seconds, config.cores
        );
        if let Some(peer) = &self.peer {
            let _ = writeln!(
                out,
                "  a2a-sdk: {} on a2a-sdk {}, Python {}, uvicorn {} (one worker), POST /",
                Path::new(&peer.script).file_name().map(|name| name.to_string_lossy()).unwrap_or_default(),
                peer.a2a_sdk,
                peer.python,
                peer.uvicorn
            );
        }
        if self.systems.iter().any(|runs| runs.system == System::A2aSdkSqlite) {
            let _ = writeln!(
                out,
                "  a2a-sdk-sqlite: its DatabaseTaskStore on a SQLite file through aiosqlite, with SQLite's defaults \
                 (rollback journal, synchronous=FULL: fsyncs at every commit)"
            );
        }
    }

    fn point_table(&self, out: &mut String) {
        if self.systems.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nSendMessage (latencies of the successful calls, ms; CPU in % of one core, others: the rest of the \
             machine, a high figure means the point was disturbed; machine: % of all cores)"
        );
        let _ = writeln!(
            out,
            "{:<17} {:>7} {:>9} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6} {:>6} {:>7} {:>8}",
            "system", "clients", "req/s", "p50", "p99", "max", "errors", "server", "pg", "bench", "others", "machine"
        );
        for runs in &self.systems {
            for point in &runs.points {
                let _ = writeln!(
                    out,
                    "{:<17} {:>7} {:>9.1} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>6.0}% {:>5.0}% {:>5.0}% {:>6.0}% {:>7.0}%",
                    runs.system.name(),
                    point.clients,
                    point.requests_per_sec,
                    point.latency.p50_ms,
                    point.latency.p99_ms,
                    point.latency.max_ms,
                    point.errors,
                    point.cpu.server_pct.unwrap_or_default(),
                    point.cpu.postgres_pct,
                    point.cpu.client_pct,
                    point.cpu.other_pct,
                    point.cpu.machine_busy_pct
                );
            }
        }
        for (runs, point) in self.systems.iter().flat_map(|runs| runs.points.iter().map(move |point| (runs, point))) {
            if let Some(error) = &point.first_error {
                let _ = writeln!(out, "  {} at {} clients, first error: {error}", runs.system.name(), point.clients);
            }
        }
    }

    fn ratio_table(&self, out: &mut String) {
        if self.comparisons.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nchorus against the a2a-sdk (throughput: chorus req/s ÷ a2a-sdk req/s; p99: a2a-sdk p99 ÷ chorus p99)"
        );
        let _ = writeln!(out, "{:<36} {:>7} {:>11} {:>8}", "pairing", "clients", "throughput", "p99");
        for comparison in &self.comparisons {
            let _ = writeln!(
                out,
                "{:<36} {:>7} {:>11} {:>8}",
                format!("{} vs {}", comparison.chorus.name(), comparison.peer.name()),
                comparison.clients,
                times(comparison.throughput_ratio),
                times(comparison.p99_ratio)
            );
        }
    }

    fn streams_lines(&self, out: &mut String) {
        let Some(streams) = &self.streams else { return };
        let _ = writeln!(
            out,
            "\nSSE streams on chorus (SQLite): {} tck tasks waiting for input, a SubscribeToTask stream on each, \
             one HTTP/1.1 connection per stream\n  \
             opened {} of {} in {:.1} s ({} failed, {} ended by chorus before release); chorus fds {} → {} → {}\n  \
             chorus RSS: {:.1} MB before, {:.1} MB with every stream open, {:.1} MB after closing them: \
             {:+.1} MB ({:.1} KB per stream)",
            streams.streams,
            streams.opened,
            streams.streams,
            streams.open_seconds,
            streams.failed,
            streams.ended_early,
            streams.fds_before,
            streams.fds_open,
            streams.fds_closed,
            streams.rss_before_mb,
            streams.rss_open_mb,
            streams.rss_closed_mb,
            streams.growth_mb,
            streams.per_stream_kb
        );
        if let Some(error) = &streams.first_error {
            let _ = writeln!(out, "  first error: {error}");
        }
    }

    fn goal_lines(&self, out: &mut String) {
        let goals = &self.goals;
        let _ = writeln!(out);
        for goal in &goals.pairings {
            let _ = writeln!(
                out,
                "Goal at {} clients, {} vs {}: ≥ {:.0}× throughput and ≤ 1/{:.0} p99: {} throughput, p99 1/{} → {}",
                goals.clients,
                goal.chorus.name(),
                goal.peer.name(),
                goals.target_throughput_ratio,
                goals.target_p99_ratio,
                times(goal.throughput_ratio),
                goal.p99_ratio.map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.1}")),
                verdict(goal.met)
            );
        }
        if let Some(streams) = &self.streams {
            let _ = writeln!(
                out,
                "Goal: {} open streams grow chorus's RSS by < {:.0} MB: {:+.1} MB → {}",
                streams.streams,
                goals.target_stream_growth_mb,
                streams.growth_mb,
                verdict(goals.streams_met)
            );
        }
    }
}

/// chorus against its peer at every client count both were measured at.
fn compare(systems: &[SystemRuns]) -> Vec<Comparison> {
    let pairs = [
        (System::ChorusSqlite, System::A2aSdkMemory),
        (System::ChorusSqlite, System::A2aSdkSqlite),
        (System::ChorusPostgres, System::A2aSdkPostgres),
    ];
    let find = |system: System| systems.iter().find(|runs| runs.system == system);
    let mut comparisons = Vec::new();
    for (chorus, peer) in pairs {
        let (Some(chorus_runs), Some(peer_runs)) = (find(chorus), find(peer)) else { continue };
        for mine in &chorus_runs.points {
            let Some(theirs) = peer_runs.points.iter().find(|point| point.clients == mine.clients) else { continue };
            comparisons.push(comparison(chorus, peer, mine, theirs));
        }
    }
    comparisons
}

/// Ratios of nothing (no successful call on one side) are left out.
fn comparison(chorus: System, peer: System, mine: &Point, theirs: &Point) -> Comparison {
    let ratio = |over: f64, under: f64| (over > 0.0 && under > 0.0).then(|| over / under);
    Comparison {
        chorus,
        peer,
        clients: mine.clients,
        chorus_requests_per_sec: mine.requests_per_sec,
        peer_requests_per_sec: theirs.requests_per_sec,
        throughput_ratio: ratio(mine.requests_per_sec, theirs.requests_per_sec),
        chorus_p99_ms: mine.latency.p99_ms,
        peer_p99_ms: theirs.latency.p99_ms,
        p99_ratio: ratio(theirs.latency.p99_ms, mine.latency.p99_ms),
        chorus_errors: mine.errors,
        peer_errors: theirs.errors,
    }
}

fn times(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.1}×"))
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cpu::CpuUsage, stats::LatencySummary};

    fn point(clients: usize, requests_per_sec: f64, p99_ms: f64, errors: u64) -> Point {
        Point {
            clients,
            seconds: 10.0,
            requests: (requests_per_sec * 10.0) as u64,
            requests_per_sec,
            errors,
            first_error: None,
            latency: LatencySummary { p99_ms, ..LatencySummary::default() },
            cpu: CpuUsage::default(),
        }
    }

    fn runs(system: System, points: Vec<Point>) -> SystemRuns {
        SystemRuns { system, url: String::new(), points }
    }

    fn config() -> GatewayRunConfig {
        GatewayRunConfig {
            started_unix: 0,
            seconds: 10,
            warmup_seconds: 2,
            clients: vec![1, 64],
            backends: vec![Backend::Sqlite, Backend::Postgres],
            streams: 0,
            cores: 2,
            chorus_bin: String::new(),
            chorus_env: Vec::new(),
            postgres_version: None,
            postgres_durability: None,
            sqlite_durability: String::new(),
        }
    }

    #[test]
    fn chorus_is_compared_with_its_peer_at_each_client_count_and_judged_at_64() {
        let systems = vec![
            runs(System::ChorusSqlite, vec![point(1, 500.0, 2.0, 0), point(64, 5000.0, 10.0, 0)]),
            runs(System::A2aSdkMemory, vec![point(1, 250.0, 10.0, 0), point(64, 250.0, 400.0, 0)]),
            runs(System::A2aSdkSqlite, vec![point(64, 100.0, 1000.0, 0)]),
            runs(System::ChorusPostgres, vec![point(64, 1000.0, 100.0, 3)]),
            runs(System::A2aSdkPostgres, vec![point(64, 50.0, 2000.0, 0)]),
        ];
        let report = GatewayReport::new(config(), Measured { systems, peer: None, streams: None });
        assert_eq!(report.comparisons.len(), 4);
        let first = report.comparisons[0];
        assert_eq!((first.clients, first.throughput_ratio, first.p99_ratio), (1, Some(2.0), Some(5.0)));
        let [memory, sqlite, postgres] = report.goals.pairings.as_slice() else {
            panic!("three pairings at 64 clients")
        };
        assert_eq!((memory.throughput_ratio, memory.p99_ratio, memory.met), (Some(20.0), Some(40.0), Some(true)));
        assert_eq!(
            (sqlite.peer, sqlite.throughput_ratio, sqlite.p99_ratio),
            (System::A2aSdkSqlite, Some(50.0), Some(100.0))
        );
        // 20× and 20× lower, but with errors: not met.
        assert_eq!(
            (postgres.throughput_ratio, postgres.p99_ratio, postgres.met),
            (Some(20.0), Some(20.0), Some(false))
        );
        let table = report.table(Path::new("g.json"));
        assert!(table.contains("NOT met"));
        assert!(table.contains("a2a-sdk-sqlite: its DatabaseTaskStore"), "the peer's SQLite durability is stated");
    }

    #[test]
    fn a_side_without_successes_has_no_ratio_and_misses_the_goal() {
        let systems = vec![
            runs(System::ChorusSqlite, vec![point(64, 0.0, 0.0, 12)]),
            runs(System::A2aSdkMemory, vec![point(64, 250.0, 400.0, 0)]),
        ];
        let report = GatewayReport::new(config(), Measured { systems, peer: None, streams: None });
        let [goal] = report.goals.pairings.as_slice() else { panic!("one pairing") };
        assert_eq!((goal.throughput_ratio, goal.p99_ratio, goal.met), (None, None, Some(false)));
    }
}
