//! The event-bus results: a table on stdout and a JSON summary of the same
//! figures (`target/bench/eventbus.json` by default).

use std::{fmt::Write as _, path::Path};

use serde::Serialize;

use super::BusResult;
use crate::{
    cpu::CpuUsage,
    flow::FlowResult,
    nats::{NatsResult, NatsServer},
    pgbench::RawResult,
    report::{GOAL_CLIENTS, GOAL_RATIO, percent, write_json},
};

/// Everything the event-bus part of a run measured. Every field is always
/// present (null or empty when not measured).
#[derive(Debug, Serialize)]
pub(crate) struct BusReport {
    pub(crate) config: BusRunConfig,
    /// pgbench at the goal's client count: the raw commit rate.
    pub(crate) raw_postgres: Option<RawResult>,
    pub(crate) chorus: Vec<BusResult>,
    pub(crate) nats_server: Option<NatsServer>,
    pub(crate) nats: Vec<NatsResult>,
    pub(crate) comparisons: Vec<Comparison>,
    pub(crate) goal: BusGoal,
}

/// How the event-bus part was run.
#[derive(Debug, Serialize)]
pub(crate) struct BusRunConfig {
    pub(crate) started_unix: u64,
    pub(crate) seconds: u64,
    pub(crate) warmup_seconds: u64,
    pub(crate) prime_seconds: u64,
    pub(crate) cores: usize,
    /// `a`, `b` after `a`, `c` after `b`; one consumer each.
    pub(crate) handlers: Vec<String>,
    pub(crate) publishers: usize,
    pub(crate) batch_sizes: Vec<u32>,
    /// Most events published and not yet finished.
    pub(crate) backlog: usize,
    pub(crate) max_in_flight: u32,
    pub(crate) ack_batch: usize,
    pub(crate) chorus_bin: Option<String>,
    /// Names of the `CHORUS_*` variables chorus inherited (values omitted).
    pub(crate) chorus_env: Vec<String>,
    pub(crate) postgres_version: Option<String>,
    /// `fsync`, `synchronous_commit`, `wal_sync_method`.
    pub(crate) postgres_durability: Option<String>,
    pub(crate) pgbench_version: Option<String>,
    pub(crate) nats_url: Option<String>,
}

/// chorus at one batch size against the raw commit rate and against NATS.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Comparison {
    pub(crate) batch_size: u32,
    /// Events finished by the chain's last handler, per second.
    pub(crate) chorus_events_per_sec: Option<f64>,
    pub(crate) raw_tps: Option<f64>,
    /// chorus events/s ÷ raw commits/s.
    pub(crate) vs_raw: Option<f64>,
    /// Messages consumed and acked, per second.
    pub(crate) nats_msgs_per_sec: Option<f64>,
    /// chorus events/s ÷ NATS msgs/s.
    pub(crate) vs_nats: Option<f64>,
}

/// The goal: with batching on (the largest batch size above 1), events
/// finished through the chain reach this share of the raw commit rate.
#[derive(Debug, Serialize)]
pub(crate) struct BusGoal {
    pub(crate) batch_size: Option<u32>,
    pub(crate) raw_clients: usize,
    pub(crate) target_ratio: f64,
    pub(crate) ratio: Option<f64>,
    pub(crate) met: Option<bool>,
}

impl Comparison {
    /// The ratios of what was measured (a zero rate compares with nothing).
    fn new(batch_size: u32, chorus: Option<f64>, raw_tps: Option<f64>, nats: Option<f64>) -> Self {
        let raw_tps = raw_tps.filter(|tps| *tps > 0.0);
        let nats = nats.filter(|rate| *rate > 0.0);
        Self {
            batch_size,
            chorus_events_per_sec: chorus,
            raw_tps,
            vs_raw: chorus.zip(raw_tps).map(|(chorus, raw)| chorus / raw),
            nats_msgs_per_sec: nats,
            vs_nats: chorus.zip(nats).map(|(chorus, nats)| chorus / nats),
        }
    }
}

impl BusGoal {
    /// The goal at the largest batch size above 1.
    fn new(comparisons: &[Comparison]) -> Self {
        let batched = comparisons.iter().filter(|comparison| comparison.batch_size > 1);
        let at = batched.max_by_key(|comparison| comparison.batch_size);
        let ratio = at.and_then(|comparison| comparison.vs_raw);
        Self {
            batch_size: at.map(|comparison| comparison.batch_size),
            raw_clients: GOAL_CLIENTS,
            target_ratio: GOAL_RATIO,
            ratio,
            met: ratio.map(|ratio| ratio >= GOAL_RATIO),
        }
    }
}

impl BusReport {
    /// Assembles the report; `raw_postgres` is every pgbench run, of which
    /// the one at the goal's client count is kept.
    pub(crate) fn new(
        config: BusRunConfig,
        raw_postgres: &[RawResult],
        chorus: Vec<BusResult>,
        nats: Option<(NatsServer, Vec<NatsResult>)>,
    ) -> Self {
        let raw_postgres = raw_postgres.iter().find(|raw| raw.clients == GOAL_CLIENTS).cloned();
        let (nats_server, nats) = nats.map_or((None, Vec::new()), |(server, results)| (Some(server), results));
        let raw_tps = raw_postgres.as_ref().map(|raw| raw.tps);
        let comparisons: Vec<Comparison> = config
            .batch_sizes
            .iter()
            .map(|&batch_size| {
                let chorus = chorus.iter().find(|result| result.batch_size == batch_size);
                let nats = nats.iter().find(|result| result.batch_size == batch_size);
                Comparison::new(
                    batch_size,
                    chorus.map(|result| result.flow.finished_per_sec),
                    raw_tps,
                    nats.map(|result| result.flow.finished_per_sec),
                )
            })
            .collect();
        let goal = BusGoal::new(&comparisons);
        Self { config, raw_postgres, chorus, nats_server, nats, comparisons, goal }
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
            "\nEvent bus: {} publisher(s) of batches, ≤ {} events unfinished, consumers holding ≤ {} and acking \
             ≤ {} at once; {} s measured after {} s warm-up (chorus database primed for {} s), {} cores\n  \
             chorus: PublishBatch; handlers a → b → c (b after a, c after b), one Subscribe stream each\n  \
             nats: JetStream publishes pipelined per batch, then their PubAcks; one durable pull consumer, \
             explicit acks",
            config.publishers,
            config.backlog,
            config.max_in_flight,
            config.ack_batch,
            config.seconds,
            config.warmup_seconds,
            config.prime_seconds,
            config.cores
        );
        if let Some(raw) = &self.raw_postgres {
            let _ = writeln!(
                out,
                "Raw PostgreSQL commit rate (pgbench, {} clients): {:.1} tps{}",
                raw.clients,
                raw.tps,
                config.postgres_durability.as_ref().map(|settings| format!(" ({settings})")).unwrap_or_default()
            );
        }
        self.rate_table(&mut out);
        self.commit_table(&mut out);
        self.cpu_table(&mut out);
        self.notes(&mut out);
        let _ = writeln!(out, "JSON summary: {}", json_path.display());
        out
    }

    /// Each system's rows, batch size by batch size.
    fn rows(&self) -> Vec<(&'static str, u32, &FlowResult, &CpuUsage)> {
        let mut rows = Vec::new();
        for &batch in &self.config.batch_sizes {
            for result in self.chorus.iter().filter(|result| result.batch_size == batch) {
                rows.push(("chorus", batch, &result.flow, &result.cpu));
            }
            for result in self.nats.iter().filter(|result| result.batch_size == batch) {
                rows.push(("nats", batch, &result.flow, &result.cpu));
            }
        }
        rows
    }

    fn rate_table(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n{:<7} {:>6} {:>12} {:>11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "system",
            "batch",
            "published/s",
            "finished/s",
            "vs raw*",
            "vs NATS",
            "1st p50",
            "1st p99",
            "done p50",
            "done p99",
            "call p50"
        );
        for (system, batch, flow, _) in self.rows() {
            let comparison = self.comparisons.iter().find(|comparison| comparison.batch_size == batch);
            let (vs_raw, vs_nats) = match (system, comparison) {
                ("chorus", Some(comparison)) => (comparison.vs_raw, comparison.vs_nats),
                _ => (None, None),
            };
            let _ = writeln!(
                out,
                "{:<7} {:>6} {:>12.1} {:>11.1} {:>8} {:>8} {:>8.2} {:>8.2} {:>9.2} {:>9.2} {:>9.2}",
                system,
                batch,
                flow.published_per_sec,
                flow.finished_per_sec,
                percent(vs_raw),
                percent(vs_nats),
                flow.first_delivery.p50_ms,
                flow.first_delivery.p99_ms,
                flow.finished_latency.p50_ms,
                flow.finished_latency.p99_ms,
                flow.publish_call.p50_ms
            );
        }
        let _ = writeln!(
            out,
            "  finished/s: events acked by c, the chain's last handler (NATS: messages acked by its one consumer).\n  \
             * chorus finished/s ÷ raw tps; vs NATS: chorus finished/s ÷ NATS finished/s at the same batch size.\n  \
             Latencies in ms from the publisher's send: 1st: arrival at a (NATS: at the consumer); done: c's ack\n  \
             answered (NATS: ack sent). call: one publish call, the whole batch acknowledged."
        );
    }

    fn commit_table(&self, out: &mut String) {
        if self.chorus.is_empty() {
            return;
        }
        let _ = writeln!(out, "\nPostgreSQL per event, over each chorus server's life (every event finished)");
        let _ = writeln!(
            out,
            "{:>6} {:>9} {:>11} {:>13} {:>10} {:>10}",
            "batch", "events", "commits/ev", "rollbacks/ev", "notify/ev", "commits/s"
        );
        for result in &self.chorus {
            let commits = &result.commits;
            let _ = writeln!(
                out,
                "{:>6} {:>9} {:>11.3} {:>13.3} {:>10.3} {:>10.1}",
                result.batch_size,
                commits.events,
                commits.commits_per_event,
                commits.rollbacks_per_event,
                commits.notifications_per_event,
                commits.commits_per_sec
            );
        }
        let _ = writeln!(
            out,
            "  commits/ev: xact_commit ÷ events, read-only transactions included; notify/ev: wake-up pg_notify\n  \
             calls; commits/s: commits/ev × finished/s"
        );
    }

    fn cpu_table(&self, out: &mut String) {
        let _ = writeln!(out, "\nCPU over the window (% of one core; machine: % of all cores)");
        let _ = writeln!(
            out,
            "{:<7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>8}",
            "system", "batch", "server", "pg", "bench", "others", "machine"
        );
        for (system, batch, _, cpu) in self.rows() {
            let _ = writeln!(
                out,
                "{:<7} {:>6} {:>6.0}% {:>6.0}% {:>6.0}% {:>6.0}% {:>7.0}%",
                system,
                batch,
                cpu.server_pct.unwrap_or_default(),
                cpu.postgres_pct,
                cpu.client_pct,
                cpu.other_pct,
                cpu.machine_busy_pct
            );
        }
    }

    fn notes(&self, out: &mut String) {
        let _ = writeln!(out);
        let flows = self.rows();
        let troubled: Vec<String> = flows
            .iter()
            .filter(|(_, _, flow, _)| flow.anomalies.any())
            .map(|(system, batch, flow, _)| {
                format!(
                    "{system} batch {batch}: {} out of order, {} ahead of their dependency",
                    flow.anomalies.out_of_order, flow.anomalies.ahead_of_dependency
                )
            })
            .collect();
        if troubled.is_empty() {
            let _ = writeln!(
                out,
                "Deliveries: every consumer received its sequences in order, none ahead of its dependency"
            );
        } else {
            let _ = writeln!(out, "DELIVERY ANOMALIES: {}", troubled.join("; "));
        }
        for (system, batch, flow, _) in flows.iter().filter(|(_, _, flow, _)| flow.retried > 0) {
            let _ = writeln!(
                out,
                "RETRIED after Unavailable, {system} batch {batch}: {} time(s); {}",
                flow.retried,
                flow.retry_errors.join(" | ")
            );
        }
        if let Some(server) = &self.nats_server {
            let _ = writeln!(out, "NATS: {}.", server.durability);
            if let Some(command) = &server.command {
                let _ = writeln!(out, "  ({command})");
            }
        }
        let goal = &self.goal;
        let verdict = match goal.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measured",
        };
        let _ = writeln!(
            out,
            "Goal: with batching on (batch {}), events finished through the chain reach ≥ {:.0}% of the raw commit \
             rate at {} clients: {} → {verdict}",
            goal.batch_size.map_or_else(|| "-".to_owned(), |batch| batch.to_string()),
            goal.target_ratio * 100.0,
            goal.raw_clients,
            percent(goal.ratio)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chorus_is_compared_with_the_raw_rate_and_nats() {
        let comparison = Comparison::new(100, Some(3000.0), Some(6000.0), Some(12000.0));
        assert_eq!(comparison.vs_raw, Some(0.5));
        assert_eq!(comparison.vs_nats, Some(0.25));
        let alone = Comparison::new(1, Some(3000.0), Some(0.0), None);
        assert_eq!((alone.raw_tps, alone.vs_raw, alone.vs_nats), (None, None, None));
    }

    #[test]
    fn the_goal_is_judged_at_the_largest_batch() {
        let comparisons = [
            Comparison::new(1, Some(900.0), Some(1000.0), None),
            Comparison::new(100, Some(400.0), Some(1000.0), None),
            Comparison::new(10, Some(600.0), Some(1000.0), None),
        ];
        let goal = BusGoal::new(&comparisons);
        assert_eq!((goal.batch_size, goal.ratio, goal.met), (Some(100), Some(0.4), Some(false)));
        let unbatched = BusGoal::new(&comparisons[..1]);
        assert_eq!((unbatched.batch_size, unbatched.met), (None, None));
    }
}
