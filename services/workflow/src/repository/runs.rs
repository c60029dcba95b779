//! The storage contract for runs.

use async_trait::async_trait;

use crate::{
    domain::{NewRun, Run, RunCursor, RunEvent, RunFilter, RunPage, RunState, Slot},
    error::Result,
};

/// An engine's claim on a run: only writes under the current claim land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub owner: String,
    pub token: i64,
}

/// A run an engine claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub namespace: String,
    pub run_id: String,
    /// The definition version the run is on.
    pub workflow: String,
    pub version: u32,
    pub fence: Fence,
}

impl Claim {
    /// The claim `fence` on `run`.
    pub(crate) fn on(run: &Run, fence: Fence) -> Self {
        Self {
            namespace: run.namespace.clone(),
            run_id: run.id.clone(),
            workflow: run.workflow.clone(),
            version: run.version,
            fence,
        }
    }
}

/// The engine a new run is claimed for as it is created: one in the
/// starting process with room for it, so the run skips the wait for a claim
/// (and the claim's own write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taker {
    pub owner: String,
    pub lease_until: i64,
}

/// What a create did.
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    pub run: Run,
    /// False: the run is the one created first with the same idempotency key.
    pub created: bool,
    /// The taker's claim on the run, when it was created for one.
    pub claim: Option<Claim>,
}

/// What a transition's change decided about the run's scheduling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// When an engine must look at the run next.
    pub due_at: Option<i64>,
    /// The claiming engine lets the run go.
    pub release: bool,
}

/// A run as a transition left it, and what the transition wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub run: Run,
    /// The run's revision after the transition; each write counts it up by one.
    pub revision: i64,
    /// Whether the transition wrote the run (it may write no events).
    pub wrote: bool,
    /// The events it recorded, in order.
    pub events: Vec<RunEvent>,
}

/// A run's events after a cursor, and the run's revision when they were read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventPage {
    pub events: Vec<RunEvent>,
    /// `None` when the run is gone.
    pub revision: Option<i64>,
}

/// The last bus event a namespace's triggers judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TriggerCursor {
    pub after_sequence: u64,
    /// When that event was published (µs): a log that started over and
    /// grew past the sequence again has another event there. `None` for a
    /// cursor saved before the time was kept, or at the log's start.
    pub published_at: Option<i64>,
}

/// The unfinished runs of one state, as the gauges tell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfinished {
    pub state: RunState,
    pub runs: u64,
    /// When the least recently changed of them last changed (µs).
    pub since: i64,
}

/// A change applied to a run read under its lock. The [`Slot`] says whether
/// a pending run may start under its concurrency limit.
pub type Change<'a> = dyn FnMut(&mut Run, Slot) -> Result<Transition> + Send + 'a;

/// Where runs are kept. Every change of a run is serialized by the run's
/// lock and recorded as events in the same transaction.
#[async_trait]
pub trait RunRepository: Send + Sync + std::fmt::Debug {
    /// Creates a run (pending, due now; as started when `run.started` says
    /// so), claimed for `taker` when given, or returns the one created first
    /// with the same idempotency key.
    async fn create(&self, run: NewRun, taker: Option<&Taker>, now: i64) -> Result<Created>;

    /// A run in a namespace, with everything recorded about it.
    async fn get(&self, namespace: &str, run_id: &str) -> Result<Option<Run>>;

    /// A run's state alone (its body is not read).
    async fn state(&self, namespace: &str, run_id: &str) -> Result<Option<RunState>>;

    /// The state of a run this process's engine holds, as the engine last
    /// wrote it, without a read (a change made since by another process is
    /// not in it); `None` when the engine holds no such run.
    fn held_state(&self, namespace: &str, run_id: &str) -> Option<RunState>;

    /// Newest first, after `after`, at most `limit`.
    async fn list(&self, namespace: &str, filter: &RunFilter, after: Option<RunCursor>, limit: u32) -> Result<RunPage>;

    /// Reads the run under its lock, applies `change`, and writes the run and
    /// its events in one transaction. With a `fence`, fails with
    /// `LeaseLost` unless the claim is still the run's. `NotFound` outside
    /// `namespace`.
    async fn transition(
        &self,
        namespace: &str,
        run_id: &str,
        fence: Option<&Fence>,
        now: i64,
        change: &mut Change<'_>,
    ) -> Result<Written>;

    /// Gives the run tables their first statistics once they hold `min_runs`
    /// runs, if the database has none yet; whether it has now.
    async fn first_statistics(&self, min_runs: i64) -> Result<bool>;

    /// Claims up to `limit` runs that are due and not claimed by a live
    /// engine, until `lease_until`.
    async fn claim_due(&self, owner: &str, now: i64, lease_until: i64, limit: u32) -> Result<Vec<Claim>>;

    /// The earliest time after `after` at which a run becomes due (its
    /// timer, backoff or deadline), if any: when an engine must look next.
    async fn next_due(&self, after: i64) -> Result<Option<i64>>;

    /// Takes back, under new claims until `lease_until`, the runs `owner`
    /// held before it restarted (an engine's id is stable across restarts
    /// when configured): those whose claim ends before `claimed_before`.
    /// Claims the engine made since it started end later, and are left as
    /// they are.
    async fn adopt(&self, owner: &str, claimed_before: i64, lease_until: i64) -> Result<Vec<Claim>>;

    /// Extends every claim `owner` holds; the number of runs still held.
    async fn renew(&self, owner: &str, lease_until: i64) -> Result<u64>;

    /// A run's events after `after`, at most `limit`, and the run's revision,
    /// read together; no revision when `namespace` has no such run.
    async fn events(&self, namespace: &str, run_id: &str, after: i64, limit: u32) -> Result<EventPage>;

    /// Deletes finished runs whose retention ended; how many.
    async fn purge(&self, now: i64) -> Result<u64>;

    /// The unfinished runs of every database namespace, by state (only the
    /// states some run is in).
    async fn unfinished(&self) -> Result<Vec<Unfinished>>;

    /// How far a namespace's triggers read the event bus.
    async fn trigger_cursor(&self, namespace: &str) -> Result<Option<TriggerCursor>>;

    async fn set_trigger_cursor(&self, namespace: &str, cursor: &TriggerCursor) -> Result<()>;
}
