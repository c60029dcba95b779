//! The hub results: a table on stdout and a JSON summary of the same
//! figures (`target/bench/hub.json` by default).

use std::{fmt::Write as _, path::Path};

use serde::Serialize;

use super::{FanoutResult, Measured, System, SystemRuns, redis::RedisServer};
use crate::{
    cpu::CpuUsage,
    nats::NatsServer,
    pgbench::RawResult,
    report::{GOAL_CLIENTS, GOAL_RATIO, percent, write_json},
    scenario::Backend,
};

/// The latency goal: chorus's publish → deliver p50 at the equal load is
/// at most this many times JetStream's.
pub(crate) const LATENCY_GOAL_RATIO: f64 = 3.0;

/// How chorus opens SQLite (`services/runtime/src/storage.rs`).
pub(crate) const SQLITE_DURABILITY: &str = "chorus opens SQLite with journal_mode=WAL and synchronous=NORMAL: a \
                                             commit survives chorus crashing, not the machine (the WAL is fsynced \
                                             at checkpoints)";

/// Everything the hub part of a run measured. Every field is always
/// present (null or empty when not measured).
#[derive(Debug, Serialize)]
pub(crate) struct HubReport {
    pub(crate) config: HubRunConfig,
    /// pgbench at the goal's client count: the raw commit rate.
    pub(crate) raw_postgres: Option<RawResult>,
    pub(crate) systems: Vec<SystemRuns>,
    pub(crate) nats_server: NatsServer,
    pub(crate) redis_server: RedisServer,
    pub(crate) comparisons: Vec<Comparison>,
    pub(crate) goals: HubGoals,
}

/// How the hub part was run.
#[derive(Debug, Serialize)]
pub(crate) struct HubRunConfig {
    pub(crate) started_unix: u64,
    pub(crate) seconds: u64,
    pub(crate) warmup_seconds: u64,
    pub(crate) prime_seconds: u64,
    pub(crate) cores: usize,
    pub(crate) backends: Vec<Backend>,
    pub(crate) subscribers: usize,
    pub(crate) publishes_in_flight: usize,
    /// Most messages published and not yet acked by every subscriber.
    pub(crate) backlog: usize,
    pub(crate) max_in_flight: u32,
    pub(crate) ack_batch: usize,
    /// Publishes per second of the equal-load runs.
    pub(crate) steady_rate: f64,
    pub(crate) pairs: usize,
    pub(crate) chorus_bin: String,
    /// Names of the `CHORUS_*` variables chorus inherited (values omitted).
    pub(crate) chorus_env: Vec<String>,
    pub(crate) postgres_version: Option<String>,
    /// `fsync`, `synchronous_commit`, `wal_sync_method`.
    pub(crate) postgres_durability: Option<String>,
    pub(crate) sqlite_durability: String,
    pub(crate) pgbench_version: Option<String>,
    pub(crate) nats_url: String,
    pub(crate) redis_url: String,
}

/// One system against the raw commit rate and against JetStream.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Comparison {
    pub(crate) system: System,
    /// Saturated fan-out: messages acked by subscribers per second.
    pub(crate) deliveries_per_sec: f64,
    /// deliveries/s ÷ raw commits/s.
    pub(crate) vs_raw: Option<f64>,
    /// Equal load: publish → deliver p50.
    pub(crate) steady_deliver_p50_ms: f64,
    /// That p50 ÷ JetStream's.
    pub(crate) steady_p50_vs_nats: Option<f64>,
}

/// The two goals.
#[derive(Debug, Serialize)]
pub(crate) struct HubGoals {
    /// chorus on PostgreSQL delivers at least half the raw commit rate.
    pub(crate) delivery: Goal,
    /// chorus's publish → deliver p50 at equal load is within 3× JetStream's,
    /// on each backend.
    pub(crate) latency: Vec<Goal>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Goal {
    pub(crate) system: System,
    /// delivery: at least this; latency: at most this.
    pub(crate) target_ratio: f64,
    pub(crate) ratio: Option<f64>,
    pub(crate) met: Option<bool>,
}

impl HubReport {
    /// Assembles the report; `raw_postgres` is every pgbench run, of which
    /// the one at the goal's client count is kept.
    pub(crate) fn new(config: HubRunConfig, raw_postgres: &[RawResult], measured: Measured) -> Self {
        let Measured { systems, nats_server, redis_server } = measured;
        let raw_postgres = raw_postgres.iter().find(|raw| raw.clients == GOAL_CLIENTS).cloned();
        let comparisons = compare(&systems, raw_postgres.as_ref().map(|raw| raw.tps));
        let goals = goals(&comparisons);
        Self { config, raw_postgres, systems, nats_server, redis_server, comparisons, goals }
    }

    pub(crate) fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        write_json(self, path)
    }

    /// The human-readable tables.
    pub(crate) fn table(&self, json_path: &Path) -> String {
        let mut out = String::new();
        self.header(&mut out);
        self.saturated_table(&mut out);
        self.steady_table(&mut out);
        self.direct_table(&mut out);
        self.notes(&mut out);
        let _ = writeln!(out, "JSON summary: {}", json_path.display());
        out
    }

    fn header(&self, out: &mut String) {
        let config = &self.config;
        let _ = writeln!(
            out,
            "\nHub: fan-out from 1 publisher (≤ {} publishes in flight) to {} subscribers (each holding ≤ {} \
             unacked, acking ≤ {} per call), ≤ {} messages not yet acked by every subscriber; direct round trips \
             from {} pairs; {} s measured after {} s warm-up (chorus databases primed for {} s), {} cores\n  \
             chorus: Publish, pipelined (the hub has no batch publish: \"batching\" here is several publishes in \
             flight and batched Acks); a StreamInbox per subscriber; direct: SendDirect → StreamInbox → Ack\n  \
             nats: JetStream, file storage; fan-out: interest-retention stream, a durable pull consumer per \
             subscriber, explicit acks (not answered); direct: work-queue stream, a consumer per pair, acks \
             confirmed (double ack)\n  \
             redis: Streams; fan-out: XADD, a consumer group per subscriber, XREADGROUP BLOCK, XACK of what was \
             read; direct: a stream and a group per pair, XADD → XREADGROUP → XACK",
            config.publishes_in_flight,
            config.subscribers,
            config.max_in_flight,
            config.ack_batch,
            config.backlog,
            config.pairs,
            config.seconds,
            config.warmup_seconds,
            config.prime_seconds,
            config.cores
        );
        if let Some(raw) = &self.raw_postgres {
            let _ = writeln!(out, "Raw PostgreSQL commit rate (pgbench, {} clients): {:.1} tps", raw.clients, raw.tps);
        }
    }

    fn saturated_table(&self, out: &mut String) {
        let _ = writeln!(out, "\nFan-out, as fast as the subscribers drain (latencies in ms, from the publish)");
        let _ = writeln!(
            out,
            "{:<16} {:>11} {:>12} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7} {:>6} {:>6}",
            "system",
            "publish/s",
            "deliveries/s",
            "vs raw",
            "dlv p50",
            "dlv p99",
            "ack p50",
            "ack p99",
            "call p50",
            "commits/d",
            "server",
            "pg",
            "bench"
        );
        for (runs, comparison) in self.systems.iter().zip(&self.comparisons) {
            let run = &runs.saturated;
            let _ = writeln!(
                out,
                "{:<16} {:>11.1} {:>12.1} {:>7} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9} {}",
                runs.system.name(),
                run.publishes_per_sec,
                run.deliveries_per_sec,
                percent(comparison.vs_raw),
                run.deliver.p50_ms,
                run.deliver.p99_ms,
                run.acked.p50_ms,
                run.acked.p99_ms,
                run.publish_call.p50_ms,
                run.commits_per_delivery.map_or_else(|| "-".to_owned(), |commits| format!("{commits:.2}")),
                cpu_columns(&run.cpu)
            );
        }
        let _ = writeln!(
            out,
            "  vs raw: deliveries/s ÷ the raw commit rate. dlv: publish → arrival at a subscriber; ack: → its ack \
             answered (nats: sent);\n  call: the Publish call. commits/d: PostgreSQL transactions over the \
             server's life per delivery. CPU in % of one core"
        );
    }

    fn steady_table(&self, out: &mut String) {
        let _ = writeln!(out, "\nFan-out at equal load: {} publishes/s asked of every system", self.config.steady_rate);
        let _ = writeln!(
            out,
            "{:<16} {:>11} {:>12} {:>8} {:>8} {:>8} {:>8} {:>10} {:>7} {:>6} {:>6}",
            "system",
            "publish/s",
            "deliveries/s",
            "dlv p50",
            "dlv p99",
            "ack p50",
            "ack p99",
            "p50 ÷ nats",
            "server",
            "pg",
            "bench"
        );
        for (runs, comparison) in self.systems.iter().zip(&self.comparisons) {
            let run = &runs.steady;
            let _ = writeln!(
                out,
                "{:<16} {:>11.1} {:>12.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10} {}",
                runs.system.name(),
                run.publishes_per_sec,
                run.deliveries_per_sec,
                run.deliver.p50_ms,
                run.deliver.p99_ms,
                run.acked.p50_ms,
                run.acked.p99_ms,
                comparison.steady_p50_vs_nats.map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.2}×")),
                cpu_columns(&run.cpu)
            );
        }
    }

    fn direct_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\nDirect round trips, {} pairs one message at a time: send → receive → ack answered (ms)",
            self.config.pairs
        );
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>10} {:>7} {:>6} {:>6}",
            "system", "rt/s", "p50", "p99", "send p50", "dlv p50", "ack p50", "commits/rt", "server", "pg", "bench"
        );
        for runs in &self.systems {
            let run = &runs.direct;
            let _ = writeln!(
                out,
                "{:<16} {:>9.1} {:>8.2} {:>8.2} {:>9.2} {:>8.2} {:>8.2} {:>10} {}",
                runs.system.name(),
                run.round_trips_per_sec,
                run.latency.p50_ms,
                run.latency.p99_ms,
                run.send.p50_ms,
                run.deliver.p50_ms,
                run.ack.p50_ms,
                run.commits_per_round_trip.map_or_else(|| "-".to_owned(), |commits| format!("{commits:.2}")),
                cpu_columns(&run.cpu)
            );
        }
        let _ = writeln!(
            out,
            "  send: the send call; dlv: send answered → the receiver has it (0 when it came first); ack: the \
             receiver's ack call"
        );
    }

    fn notes(&self, out: &mut String) {
        let _ = writeln!(out);
        let runs = || {
            self.systems.iter().flat_map(|runs| {
                [("fan-out", &runs.saturated), ("equal load", &runs.steady)].map(|run| (runs.system, run))
            })
        };
        let counted = |count: fn(&FanoutResult) -> u64| -> Vec<String> {
            runs()
                .filter(|(_, (_, run))| count(run) > 0)
                .map(|(system, (load, run))| format!("{} {load}: {}", system.name(), count(run)))
                .collect()
        };
        let (repeated, reordered) = (counted(|run| run.repeated), counted(|run| run.out_of_order));
        if repeated.is_empty() {
            let _ = writeln!(out, "Deliveries: every subscriber received each message once");
        } else {
            let _ = writeln!(out, "DELIVERIES REPEATED: {}", repeated.join("; "));
        }
        if !reordered.is_empty() {
            let _ = writeln!(
                out,
                "Deliveries after a later-sequenced one (publishes in flight together commit in any order, and \
                 none is promised between them): {}",
                reordered.join("; ")
            );
        }
        let steady_rate = self.config.steady_rate;
        for runs in self.systems.iter().filter(|runs| runs.steady.kept_up == Some(false)) {
            let _ = writeln!(
                out,
                "BELOW THE RATE ASKED: {} published {:.1} of the {steady_rate} publishes/s asked at equal load: it \
                 was saturated, so its latencies there include queueing",
                runs.system.name(),
                runs.steady.publishes_per_sec
            );
        }
        let _ = writeln!(out, "Durability of an acknowledged write:");
        if let Some(settings) = &self.config.postgres_durability {
            let _ = writeln!(out, "  PostgreSQL: {settings}");
        }
        if self.config.backends.contains(&Backend::Sqlite) {
            let _ = writeln!(out, "  SQLite: {}", self.config.sqlite_durability);
        }
        let _ = writeln!(out, "  NATS: {}.", self.nats_server.durability);
        let _ = writeln!(out, "  Redis: {}.", self.redis_server.durability);
        let goals = &self.goals;
        let _ = writeln!(
            out,
            "Goal 1: durable delivery (chorus on PostgreSQL, saturated fan-out, batched acks and pipelined publishes) \
             ≥ {:.0}% of the raw commit rate at {GOAL_CLIENTS} clients: {} → {}",
            goals.delivery.target_ratio * 100.0,
            percent(goals.delivery.ratio),
            verdict(goals.delivery.met)
        );
        for goal in &goals.latency {
            let _ = writeln!(
                out,
                "Goal 2: publish → deliver p50 at {} publishes/s within {:.0}× JetStream's, {}: {} → {}",
                self.config.steady_rate,
                goal.target_ratio,
                goal.system.name(),
                goal.ratio.map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.2}×")),
                verdict(goal.met)
            );
        }
    }
}

fn cpu_columns(cpu: &CpuUsage) -> String {
    format!("{:>6.0}% {:>5.0}% {:>5.0}%", cpu.server_pct.unwrap_or_default(), cpu.postgres_pct, cpu.client_pct)
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    }
}

/// Each system against the raw commit rate and JetStream (a zero rate or
/// latency compares with nothing).
fn compare(systems: &[SystemRuns], raw_tps: Option<f64>) -> Vec<Comparison> {
    let raw_tps = raw_tps.filter(|tps| *tps > 0.0);
    let nats_p50 = systems
        .iter()
        .find(|runs| runs.system == System::Nats)
        .map(|runs| runs.steady.deliver.p50_ms)
        .filter(|p50| *p50 > 0.0);
    systems
        .iter()
        .map(|runs| Comparison {
            system: runs.system,
            deliveries_per_sec: runs.saturated.deliveries_per_sec,
            vs_raw: raw_tps.map(|raw| runs.saturated.deliveries_per_sec / raw),
            steady_deliver_p50_ms: runs.steady.deliver.p50_ms,
            steady_p50_vs_nats: nats_p50.map(|nats| runs.steady.deliver.p50_ms / nats),
        })
        .collect()
}

/// Goal 1 on chorus's PostgreSQL run; goal 2 on each chorus run.
fn goals(comparisons: &[Comparison]) -> HubGoals {
    let find = |system: System| comparisons.iter().find(|comparison| comparison.system == system);
    let delivery_ratio = find(System::ChorusPostgres).and_then(|comparison| comparison.vs_raw);
    let delivery = Goal {
        system: System::ChorusPostgres,
        target_ratio: GOAL_RATIO,
        ratio: delivery_ratio,
        met: delivery_ratio.map(|ratio| ratio >= GOAL_RATIO),
    };
    let latency = [System::ChorusPostgres, System::ChorusSqlite]
        .into_iter()
        .filter_map(find)
        .map(|comparison| Goal {
            system: comparison.system,
            target_ratio: LATENCY_GOAL_RATIO,
            ratio: comparison.steady_p50_vs_nats,
            met: comparison.steady_p50_vs_nats.map(|ratio| ratio <= LATENCY_GOAL_RATIO),
        })
        .collect();
    HubGoals { delivery, latency }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        hub::{direct::DirectResult, fanout::FanoutResult},
        stats::LatencySummary,
    };

    fn fanout(deliveries_per_sec: f64, p50_ms: f64) -> FanoutResult {
        FanoutResult {
            target_rate: None,
            kept_up: None,
            seconds: 1.0,
            publishes: 0,
            publishes_per_sec: deliveries_per_sec / 10.0,
            deliveries: 0,
            deliveries_per_sec,
            all_deliveries: 0,
            publish_call: LatencySummary::default(),
            deliver: LatencySummary { p50_ms, ..LatencySummary::default() },
            acked: LatencySummary::default(),
            out_of_order: 0,
            repeated: 0,
            cpu: CpuUsage::default(),
            commits_per_delivery: None,
        }
    }

    fn runs(system: System, deliveries_per_sec: f64, steady_p50_ms: f64) -> SystemRuns {
        let direct = DirectResult {
            pairs: 1,
            seconds: 1.0,
            round_trips: 0,
            round_trips_per_sec: 0.0,
            all_round_trips: 0,
            latency: LatencySummary::default(),
            send: LatencySummary::default(),
            deliver: LatencySummary::default(),
            ack: LatencySummary::default(),
            cpu: CpuUsage::default(),
            commits_per_round_trip: None,
        };
        SystemRuns {
            system,
            saturated: fanout(deliveries_per_sec, 50.0),
            steady: fanout(2000.0, steady_p50_ms),
            direct,
        }
    }

    #[test]
    fn every_system_is_compared_with_the_raw_rate_and_jetstream() {
        let systems = [
            runs(System::ChorusPostgres, 3000.0, 6.0),
            runs(System::ChorusSqlite, 9000.0, 1.5),
            runs(System::Nats, 60000.0, 2.0),
        ];
        let comparisons = compare(&systems, Some(6000.0));
        assert_eq!(comparisons[0].vs_raw, Some(0.5));
        assert_eq!(comparisons[1].vs_raw, Some(1.5));
        assert_eq!(comparisons[0].steady_p50_vs_nats, Some(3.0));
        assert_eq!(comparisons[2].steady_p50_vs_nats, Some(1.0));
        let goals = goals(&comparisons);
        assert_eq!((goals.delivery.ratio, goals.delivery.met), (Some(0.5), Some(true)), "at the target is met");
        let latency: Vec<_> = goals.latency.iter().map(|goal| (goal.system, goal.met)).collect();
        assert_eq!(latency, vec![(System::ChorusPostgres, Some(true)), (System::ChorusSqlite, Some(true))]);
    }

    #[test]
    fn goals_are_missed_or_unmeasured() {
        let systems = [runs(System::ChorusPostgres, 2999.0, 6.1), runs(System::Nats, 60000.0, 2.0)];
        let missed = goals(&compare(&systems, Some(6000.0)));
        assert_eq!(missed.delivery.met, Some(false));
        assert_eq!(missed.latency[0].met, Some(false));
        let alone = goals(&compare(&systems[..1], Some(0.0)));
        assert_eq!((alone.delivery.ratio, alone.delivery.met), (None, None), "no raw rate");
        assert_eq!((alone.latency[0].ratio, alone.latency[0].met), (None, None), "no JetStream");
    }
}
