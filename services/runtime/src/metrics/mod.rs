//! Prometheus metrics, served on `/metrics` by every server.
//!
//! [`Metrics`] is a cheap handle: the server builder makes one, counts
//! every gRPC call and HTTP request in its layers ([`observe`]), and hands
//! clones to the services it runs, which count what happens in them where it
//! happens. Labels take values from bounded sets only (states, outcomes,
//! route templates, the methods of known services): never a namespace, an
//! id or anything else a caller chooses, so `/metrics` holds no tenant data
//! and its size stays fixed.

mod family;
pub(crate) mod observe;

use std::sync::{Arc, Mutex};

pub use family::{Counter, Family, Gauge, Held, Histogram, Metric};

use crate::storage::{Backend, Db};

/// What becomes of a task a worker took, as `chorus_worker_tasks_total` counts it.
pub const WORKER_OUTCOMES: [&str; 7] =
    ["completed", "failed", "retried", "rejected", "handed_back", "canceled", "lease_lost"];

/// Sets a queue's two gauges: how many wait, and how long the oldest of
/// them, created at `oldest` (µs since the epoch), has waited (0: none).
pub fn set_queue(waiting: &Family<0, Gauge>, oldest_age: &Family<0, Gauge>, count: u64, oldest: Option<i64>) {
    waiting.get().set(i64::try_from(count).unwrap_or(i64::MAX));
    let age = oldest.map_or(0, |created| (crate::time::now_micros() - created).max(0) / 1_000_000);
    oldest_age.get().set(age);
}

/// The content type of the Prometheus text format the families are written in.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every series of one process. Cheap to clone; clones count into the same series.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Arc<Registry>);

impl std::ops::Deref for Metrics {
    type Target = Registry;

    fn deref(&self) -> &Registry {
        &self.0
    }
}

/// The series themselves; reached through [`Metrics`].
#[derive(Debug)]
pub struct Registry {
    /// gRPC calls by `service`, `method` and `code` (the gRPC status code).
    pub grpc_requests: Family<3, Counter>,
    /// Latency of unary gRPC calls by `service` and `method`.
    pub grpc_latency: Family<2, Histogram>,
    /// HTTP requests by `route` (its template), `method`, `status` and
    /// `kind` (`http`, `sse` or `websocket`).
    pub http_requests: Family<4, Counter>,
    /// Time to answer an HTTP request that is no stream (SSE, WebSocket),
    /// by `route` and `method`.
    pub http_latency: Family<2, Histogram>,
    pub a2a_jsonrpc_calls: Family<2, Counter>,
    /// Streams open now by `protocol` (`grpc`: server-streaming calls; `sse`).
    pub streams_in_flight: Family<1, Gauge>,
    pub tasks_created: Family<0, Counter>,
    /// Tasks that reached a final `state`.
    pub tasks_finished: Family<1, Counter>,
    pub tasks_queued: Family<0, Gauge>,
    pub oldest_queued_task_age: Family<0, Gauge>,
    /// Tasks handed to workers (a claim or a hand-off).
    pub task_claims: Family<0, Counter>,
    /// Worker leases that ran out, by `outcome` (`requeued` or `failed`).
    pub lease_expiries: Family<1, Counter>,
    pub outbox_events_relayed: Family<0, Counter>,
    /// How long the oldest task event not yet relayed has waited, as the
    /// relay of this process last read the log.
    pub outbox_lag: Family<0, Gauge>,
    pub eventbus_deliveries: Family<0, Counter>,
    pub eventbus_dead_letters: Family<0, Counter>,
    pub hub_messages_sent: Family<0, Counter>,
    /// Messages waiting in inboxes, in the whole database.
    pub hub_inbox_messages: Family<0, Gauge>,
    /// Deliveries not done yet, in the whole database, and how long the
    /// oldest has existed.
    pub eventbus_backlog: Family<0, Gauge>,
    pub eventbus_backlog_oldest_age: Family<0, Gauge>,
    pub workflow_runs_started: Family<0, Counter>,
    /// Workflow runs that reached a final `state`.
    pub workflow_runs_finished: Family<1, Counter>,
    pub workflow_steps_completed: Family<0, Counter>,
    /// Unfinished workflow runs by `state`, in the whole database.
    pub workflow_runs_unfinished: Family<1, Gauge>,
    /// How long the least recently changed unfinished run of each `state`
    /// has not changed.
    pub workflow_runs_idle: Family<1, Gauge>,
    /// Push notification attempts by `outcome` (`delivered` or `failed`).
    pub push_notifications: Family<1, Counter>,
    /// Tasks the workers of this process were done with, by `outcome`
    /// ([`WORKER_OUTCOMES`]).
    pub worker_tasks: Family<1, Counter>,
    /// Tasks the workers of this process are working on now.
    pub worker_tasks_in_flight: Family<0, Gauge>,
    /// Claim streams the workers of this process hold open now.
    pub worker_claim_streams: Family<0, Gauge>,
    /// The databases whose pools are reported, read when scraped.
    pools: Mutex<Vec<Db>>,
}

impl Default for Registry {
    fn default() -> Self {
        let registry = Self {
            grpc_requests: Family::new(
                "chorus_grpc_requests_total",
                "gRPC calls handled, by service, method and status code.",
                ["service", "method", "code"],
            ),
            grpc_latency: Family::new(
                "chorus_grpc_request_duration_seconds",
                "Time to answer a unary gRPC call, by service and method.",
                ["service", "method"],
            ),
            http_requests: Family::new(
                "chorus_http_requests_total",
                "HTTP requests handled, by route template, method, status and kind (http, sse, websocket).",
                ["route", "method", "status", "kind"],
            ),
            http_latency: Family::new(
                "chorus_http_request_duration_seconds",
                "Time to answer an HTTP request that is not a stream (SSE, WebSocket), by route template and method.",
                ["route", "method"],
            ),
            a2a_jsonrpc_calls: Family::new(
                "chorus_a2a_jsonrpc_calls_total",
                "A2A JSON-RPC calls answered (their errors travel in HTTP 200s), by method and outcome: ok, or the \
                 A2A error's name (TASK_NOT_FOUND, INVALID_PARAMS, UNAVAILABLE, ...).",
                ["method", "outcome"],
            ),
            streams_in_flight: Family::new(
                "chorus_streams_in_flight",
                "Response streams open now: server-streaming gRPC calls and SSE responses.",
                ["protocol"],
            ),
            tasks_created: Family::new("chorus_tasks_created_total", "Tasks created.", []),
            tasks_finished: Family::new(
                "chorus_tasks_finished_total",
                "Tasks that reached a final state, by state.",
                ["state"],
            ),
            tasks_queued: Family::new(
                "chorus_tasks_queued",
                "Tasks waiting for a worker (submitted), in the whole database; read by the task store every few \
                 seconds.",
                [],
            ),
            oldest_queued_task_age: Family::new(
                "chorus_tasks_queued_oldest_age_seconds",
                "How long the oldest task waiting for a worker has existed (0: none waits).",
                [],
            ),
            task_claims: Family::new("chorus_task_claims_total", "Tasks handed to workers.", []),
            lease_expiries: Family::new(
                "chorus_task_lease_expiries_total",
                "Worker leases that ran out, by outcome (requeued, failed).",
                ["outcome"],
            ),
            outbox_events_relayed: Family::new(
                "chorus_outbox_events_relayed_total",
                "Task events the outbox relay published to the event bus.",
                [],
            ),
            outbox_lag: Family::new(
                "chorus_outbox_lag_seconds",
                "How long the oldest task event not yet published to the event bus has waited, as the outbox relay \
                 of this process last read the log (0 when it is caught up, or relays nothing).",
                [],
            ),
            eventbus_deliveries: Family::new(
                "chorus_eventbus_deliveries_total",
                "Events delivered to subscribers.",
                [],
            ),
            eventbus_dead_letters: Family::new(
                "chorus_eventbus_dead_letters_total",
                "Events moved to a dead-letter queue.",
                [],
            ),
            hub_messages_sent: Family::new("chorus_hub_messages_sent_total", "Hub messages sent.", []),
            hub_inbox_messages: Family::new(
                "chorus_hub_inbox_messages",
                "Messages waiting in agents' inboxes (neither acked nor expired), in the whole database; read by the \
                 hub every 5 s.",
                [],
            ),
            eventbus_backlog: Family::new(
                "chorus_eventbus_backlog",
                "Deliveries not done yet (waiting, in flight, or failed and waiting for a retry; not dead letters), \
                 in the whole database; read by the event bus every 5 s.",
                [],
            ),
            eventbus_backlog_oldest_age: Family::new(
                "chorus_eventbus_backlog_oldest_age_seconds",
                "How long the oldest delivery not done yet has existed (0: none).",
                [],
            ),
            workflow_runs_started: Family::new("chorus_workflow_runs_started_total", "Workflow runs started.", []),
            workflow_runs_finished: Family::new(
                "chorus_workflow_runs_finished_total",
                "Workflow runs that reached a final state, by state.",
                ["state"],
            ),
            workflow_steps_completed: Family::new(
                "chorus_workflow_steps_completed_total",
                "Workflow steps completed.",
                [],
            ),
            workflow_runs_unfinished: Family::new(
                "chorus_workflow_runs_unfinished",
                "Unfinished workflow runs in the database, by state (pending, running, waiting), as the engine read \
                 them last.",
                ["state"],
            ),
            workflow_runs_idle: Family::new(
                "chorus_workflow_runs_idle_seconds",
                "How long the unfinished workflow run of each state that changed least recently has not changed: a \
                 stuck run, or a gate nobody decides.",
                ["state"],
            ),
            push_notifications: Family::new(
                "chorus_push_notifications_total",
                "Push notifications, by outcome: delivered, or failed after their retries.",
                ["outcome"],
            ),
            worker_tasks: Family::new(
                "chorus_worker_tasks_total",
                "Tasks the workers of this process were done with, by outcome: completed, failed, retried (failed, \
                 asking for a retry), rejected, handed_back, canceled, lease_lost.",
                ["outcome"],
            ),
            worker_tasks_in_flight: Family::new(
                "chorus_worker_tasks_in_flight",
                "Tasks the workers of this process are working on now.",
                [],
            ),
            worker_claim_streams: Family::new(
                "chorus_worker_claim_streams",
                "Claim streams the workers of this process hold open to their task store now (one per agent while \
                 connected).",
                [],
            ),
            pools: Mutex::default(),
        };
        // Each series of a fixed set of labels is there from the start, at
        // 0: a rule on its rate or increase needs no `or vector(0)`.
        for state in ["completed", "failed", "canceled", "rejected"] {
            registry.tasks_finished.with([state]);
        }
        for state in ["completed", "failed", "canceled"] {
            registry.workflow_runs_finished.with([state]);
        }
        for state in ["pending", "running", "waiting"] {
            registry.workflow_runs_unfinished.with([state]);
            registry.workflow_runs_idle.with([state]);
        }
        for outcome in ["requeued", "failed"] {
            registry.lease_expiries.with([outcome]);
        }
        for outcome in ["delivered", "failed"] {
            registry.push_notifications.with([outcome]);
        }
        for outcome in WORKER_OUTCOMES {
            registry.worker_tasks.with([outcome]);
        }
        registry
    }
}

impl Metrics {
    /// Reports `db`'s connection pool (its size and idle connections).
    pub fn watch_pool(&self, db: &Db) {
        self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(db.clone());
    }

    /// Every series in the Prometheus text format 0.0.4.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        self.grpc_requests.encode(&mut out);
        self.grpc_latency.encode(&mut out);
        self.http_requests.encode(&mut out);
        self.http_latency.encode(&mut out);
        self.a2a_jsonrpc_calls.encode(&mut out);
        self.streams_in_flight.encode(&mut out);
        self.tasks_created.encode(&mut out);
        self.tasks_finished.encode(&mut out);
        self.tasks_queued.encode(&mut out);
        self.oldest_queued_task_age.encode(&mut out);
        self.task_claims.encode(&mut out);
        self.lease_expiries.encode(&mut out);
        self.outbox_events_relayed.encode(&mut out);
        self.outbox_lag.encode(&mut out);
        self.eventbus_deliveries.encode(&mut out);
        self.eventbus_dead_letters.encode(&mut out);
        self.hub_messages_sent.encode(&mut out);
        self.hub_inbox_messages.encode(&mut out);
        self.eventbus_backlog.encode(&mut out);
        self.eventbus_backlog_oldest_age.encode(&mut out);
        self.workflow_runs_started.encode(&mut out);
        self.workflow_runs_finished.encode(&mut out);
        self.workflow_steps_completed.encode(&mut out);
        self.workflow_runs_unfinished.encode(&mut out);
        self.workflow_runs_idle.encode(&mut out);
        self.push_notifications.encode(&mut out);
        self.worker_tasks.encode(&mut out);
        self.worker_tasks_in_flight.encode(&mut out);
        self.worker_claim_streams.encode(&mut out);
        self.encode_pools(&mut out);
        out
    }

    /// The pools' gauges, read now: the pool keeps its counts in memory.
    fn encode_pools(&self, out: &mut String) {
        let size = Family::<1, Gauge>::new(
            "chorus_db_pool_connections",
            "Connections the database pool holds (on SQLite, the writer's and the readers'), by backend.",
            ["backend"],
        );
        let idle = Family::<1, Gauge>::new(
            "chorus_db_pool_idle_connections",
            "Idle connections in the database pool, those kept warm between calls included, by backend.",
            ["backend"],
        );
        let waiting = Family::<1, Gauge>::new(
            "chorus_db_pool_waiting_calls",
            "Calls waiting for a connection to run statements outside transactions, by backend: above 0 for long, the \
             pool is too small for the load (storage.max_connections).",
            ["backend"],
        );
        for db in self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter() {
            let backend = match db.backend() {
                Backend::Postgres => "postgres",
                Backend::Sqlite => "sqlite",
            };
            let counts = db.connections();
            size.with([backend]).set(i64::from(counts.connections));
            idle.with([backend]).set(i64::try_from(counts.idle).unwrap_or(i64::MAX));
            waiting.with([backend]).set(i64::try_from(counts.waiting).unwrap_or(i64::MAX));
        }
        size.encode(out);
        idle.encode(out);
        waiting.encode(out);
    }
}
