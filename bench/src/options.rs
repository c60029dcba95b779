//! The command line: what to measure, how long, against what.

use std::{path::PathBuf, time::Duration};

use anyhow::bail;
use clap::Parser;

use crate::{
    eventbus::BusPlan,
    gateway::GatewayOptions,
    hub::HubPlan,
    report::GOAL_CLIENTS,
    scenario::{Backend, Plan},
};

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Scenario {
    Taskstore,
    Eventbus,
    Nats,
    Hub,
    /// The A2A gateway against the a2a-sdk reference server, and SSE stream memory.
    Gateway,
    /// First-chunk latency through `chorus acp` beside direct A2A streaming.
    Acp,
    /// Durable workflow steps/s and commits per step beside the raw commit rate; resume after SIGKILL.
    Workflow,
}

#[derive(Debug, Parser)]
#[command(
    name = "chorus-bench",
    about = "Task-store round trips, event-bus throughput and hub messaging against the raw PostgreSQL commit rate, \
             NATS JetStream and Redis Streams; the A2A gateway against the a2a-sdk reference server"
)]
pub(crate) struct Options {
    /// What to measure.
    #[arg(long, env = "CHORUS_BENCH_SCENARIOS", value_enum, value_delimiter = ',', default_values = ["taskstore", "eventbus", "nats", "hub", "gateway", "acp", "workflow"])]
    pub(crate) scenarios: Vec<Scenario>,
    /// Measured seconds of each run.
    #[arg(long, env = "CHORUS_BENCH_SECONDS", default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Seconds of round trips that fill each new chorus database before the
    /// first measured run (0: measure from empty tables).
    #[arg(long, env = "CHORUS_BENCH_PRIME", default_value_t = 3)]
    pub(crate) prime: u64,
    /// Warm-up seconds before each chorus run's measured window.
    #[arg(long, env = "CHORUS_BENCH_WARMUP", default_value_t = 2)]
    pub(crate) warmup: u64,
    /// Concurrent task-store clients, one run each (pgbench -c, chorus workers).
    #[arg(long, env = "CHORUS_BENCH_CLIENTS", value_delimiter = ',', default_values_t = [1, 16])]
    pub(crate) clients: Vec<usize>,
    /// Backends to run the task store and the hub on (PostgreSQL also runs pgbench).
    #[arg(long, env = "CHORUS_BENCH_BACKENDS", value_enum, value_delimiter = ',', default_values = ["postgres", "sqlite"])]
    pub(crate) backends: Vec<Backend>,
    /// A PostgreSQL maintenance database; scratch databases are made beside it.
    #[arg(
        long,
        env = "CHORUS_BENCH_POSTGRES_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    pub(crate) postgres_url: String,
    /// A release `chorus` binary to use instead of building one.
    #[arg(long, env = "CHORUS_BENCH_BIN")]
    pub(crate) chorus_bin: Option<PathBuf>,
    #[arg(long, env = "CHORUS_BENCH_PGBENCH", default_value = "pgbench")]
    pub(crate) pgbench: PathBuf,
    /// The task-store JSON summary (default: target/bench/taskstore.json).
    #[arg(long, env = "CHORUS_BENCH_OUTPUT")]
    pub(crate) output: Option<PathBuf>,
    /// Events per PublishBatch (and per pipelined JetStream batch), one
    /// event-bus and one NATS run each.
    #[arg(long, env = "CHORUS_BENCH_BATCH_SIZES", value_delimiter = ',', default_values_t = [100, 1])]
    pub(crate) batch_sizes: Vec<u32>,
    /// Concurrent publishers of the event-bus and NATS runs.
    #[arg(long, env = "CHORUS_BENCH_PUBLISHERS", default_value_t = 4)]
    pub(crate) publishers: usize,
    /// Most events published and not yet finished by the last consumer.
    #[arg(long, env = "CHORUS_BENCH_BACKLOG", default_value_t = 2000)]
    pub(crate) backlog: usize,
    /// Most unacked deliveries a consumer holds (Subscribe and StreamInbox
    /// max_in_flight, JetStream max_ack_pending, Redis XREADGROUP COUNT).
    #[arg(long, env = "CHORUS_BENCH_MAX_IN_FLIGHT", default_value_t = 500)]
    pub(crate) max_in_flight: u32,
    /// Most deliveries one Ack (or XACK) call carries.
    #[arg(long, env = "CHORUS_BENCH_ACK_BATCH", default_value_t = 200)]
    pub(crate) ack_batch: usize,
    /// A NATS server with JetStream; a scratch stream is made on it.
    #[arg(long, env = "CHORUS_BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub(crate) nats_url: String,
    /// The event-bus JSON summary (default: target/bench/eventbus.json).
    #[arg(long, env = "CHORUS_BENCH_EVENTBUS_OUTPUT")]
    pub(crate) eventbus_output: Option<PathBuf>,
    /// Subscribers of the hub's fan-out topic (JetStream consumers, Redis groups).
    #[arg(long, env = "CHORUS_BENCH_HUB_SUBSCRIBERS", default_value_t = 10)]
    pub(crate) hub_subscribers: usize,
    /// Most publishes the hub's fan-out publisher has in flight (pipelined).
    #[arg(long, env = "CHORUS_BENCH_HUB_PUBLISHES_IN_FLIGHT", default_value_t = 16)]
    pub(crate) hub_publishes_in_flight: usize,
    /// Most fan-out messages published and not yet acked by every subscriber.
    #[arg(long, env = "CHORUS_BENCH_HUB_BACKLOG", default_value_t = 1000)]
    pub(crate) hub_backlog: usize,
    /// Publishes per second of the hub's equal-load fan-out, the same for
    /// every system.
    #[arg(long, env = "CHORUS_BENCH_HUB_RATE", default_value_t = 200.0)]
    pub(crate) hub_rate: f64,
    /// Sender → receiver pairs of the hub's direct round trips.
    #[arg(long, env = "CHORUS_BENCH_HUB_PAIRS", default_value_t = 16)]
    pub(crate) hub_pairs: usize,
    /// A Redis server; scratch streams are made on it.
    #[arg(long, env = "CHORUS_BENCH_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub(crate) redis_url: String,
    /// The hub JSON summary (default: target/bench/hub.json).
    #[arg(long, env = "CHORUS_BENCH_HUB_OUTPUT")]
    pub(crate) hub_output: Option<PathBuf>,
    /// Prompts timed on each path of the `acp` scenario.
    #[arg(long, env = "CHORUS_BENCH_ACP_SAMPLES", default_value_t = 500)]
    pub(crate) acp_samples: usize,
    #[command(flatten)]
    pub(crate) gateway: GatewayOptions,
}

impl Options {
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if !(1..=600).contains(&self.seconds) || self.warmup > 60 || self.prime > 60 {
            bail!("--seconds must be 1..=600, --warmup and --prime at most 60");
        }
        // pgbench and the chorus pool must fit in max_connections (100 by default).
        if self.clients.is_empty() || self.clients.iter().any(|&clients| !(1..=64).contains(&clients)) {
            bail!("--clients must list counts from 1 to 64");
        }
        if self.backends.is_empty() {
            bail!("--backends must name at least one backend");
        }
        if self.scenarios.is_empty() {
            bail!("--scenarios must name at least one scenario");
        }
        let largest_batch = self.batch_sizes.iter().copied().max().unwrap_or(0);
        if self.batch_sizes.is_empty() || self.batch_sizes.iter().any(|&batch| !(1..=1000).contains(&batch)) {
            bail!("--batch-sizes must list sizes from 1 to 1000");
        }
        if !(1..=64).contains(&self.publishers) {
            bail!("--publishers must be 1..=64");
        }
        if !(largest_batch as usize..=1_000_000).contains(&self.backlog) {
            bail!("--backlog must hold the largest batch and be at most 1000000");
        }
        if !(1..=1000).contains(&self.max_in_flight) || !(1..=1000).contains(&self.ack_batch) {
            bail!("--max-in-flight and --ack-batch must be 1..=1000");
        }
        if !(1..=100).contains(&self.hub_subscribers) || !(1..=64).contains(&self.hub_pairs) {
            bail!("--hub-subscribers must be 1..=100 and --hub-pairs 1..=64");
        }
        // The hub refuses sends past an inbox's max_queue_depth (10000 by default).
        if !(1..=256).contains(&self.hub_publishes_in_flight) || !(1..=10_000).contains(&self.hub_backlog) {
            bail!("--hub-publishes-in-flight must be 1..=256 and --hub-backlog 1..=10000");
        }
        if !(1.0..=10_000.0).contains(&self.hub_rate) {
            bail!("--hub-rate must be 1..=10000 publishes/s");
        }
        if self.has(Scenario::Gateway) {
            self.gateway.check()?;
        }
        Ok(())
    }

    pub(crate) fn has(&self, scenario: Scenario) -> bool {
        self.scenarios.contains(&scenario)
    }

    /// The client counts pgbench runs at: the task store's on PostgreSQL,
    /// and the goal's for the event bus.
    pub(crate) fn raw_clients(&self) -> Vec<usize> {
        let mut clients = Vec::new();
        if self.has(Scenario::Taskstore) && self.backends.contains(&Backend::Postgres) {
            clients.extend(&self.clients);
        }
        if self.has(Scenario::Eventbus) || (self.has(Scenario::Hub) && self.backends.contains(&Backend::Postgres)) {
            clients.push(GOAL_CLIENTS);
        }
        if self.has(Scenario::Workflow) {
            clients.push(crate::workflow::RUNS_IN_FLIGHT);
        }
        clients.sort_unstable();
        clients.dedup();
        clients
    }

    pub(crate) fn bus_plan(&self) -> BusPlan {
        BusPlan {
            batch_sizes: self.batch_sizes.clone(),
            publishers: self.publishers,
            backlog: self.backlog,
            max_in_flight: self.max_in_flight,
            ack_batch: self.ack_batch,
            prime: Duration::from_secs(self.prime),
            warmup: Duration::from_secs(self.warmup),
            measure: Duration::from_secs(self.seconds),
        }
    }

    pub(crate) fn hub_plan(&self) -> HubPlan {
        HubPlan {
            subscribers: self.hub_subscribers,
            publishes_in_flight: self.hub_publishes_in_flight,
            backlog: self.hub_backlog,
            max_in_flight: self.max_in_flight,
            ack_batch: self.ack_batch,
            steady_rate: self.hub_rate,
            pairs: self.hub_pairs,
            prime: Duration::from_secs(self.prime),
            warmup: Duration::from_secs(self.warmup),
            measure: Duration::from_secs(self.seconds),
        }
    }

    pub(crate) fn plan(&self) -> Plan {
        Plan {
            clients: self.clients.clone(),
            prime: Duration::from_secs(self.prime),
            warmup: Duration::from_secs(self.warmup),
            measure: Duration::from_secs(self.seconds),
        }
    }
}
