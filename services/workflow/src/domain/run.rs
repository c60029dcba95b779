//! Runs as the engine keeps them: the run, its step records, gate decisions
//! and signals, and the events a watch sees. Times are microseconds since the
//! Unix epoch.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Whether a pending run may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Its concurrency limit has room, or it has none.
    Free,
    /// Its concurrency limit is reached.
    Full,
    /// Its workflow is disabled: it stays queued until it is enabled.
    Held,
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Accepted; waiting for a concurrency slot or its first step.
    Pending,
    /// A step is working.
    Running,
    /// Every active step waits: on a timer, a signal or a gate decision.
    Waiting,
    Completed,
    Failed,
    Canceled,
}

impl RunState {
    pub const ALL: [Self; 6] =
        [Self::Pending, Self::Running, Self::Waiting, Self::Completed, Self::Failed, Self::Canceled];

    pub fn is_finished(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled)
    }

    /// The spelling stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }
}

/// What a step does, as its records say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Spawn,
    Delegate,
    Message,
    Condition,
    Wait,
    Parallel,
    Gate,
}

/// Where one step record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    Pending,
    Running,
    /// On a timer, a signal, a gate decision or a retry's backoff.
    Waiting,
    Completed,
    Failed,
    Skipped,
    Canceled,
}

impl StepState {
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Skipped | Self::Canceled)
    }
}

/// The most failed branches a parallel step's error names; the others are
/// counted (each branch's own records say why it failed).
const NAMED_BRANCH_FAILURES: usize = 5;

/// A parallel step's error, from its failed branches' (`branch `a`: why`).
pub fn branches_failed(mut failures: Vec<String>) -> String {
    let more = failures.len().saturating_sub(NAMED_BRANCH_FAILURES);
    failures.truncate(NAMED_BRANCH_FAILURES);
    if more > 0 {
        failures.push(format!("and {more} more failed branches (their steps say why)"));
    }
    failures.join("; ")
}

/// One execution of one step. A retry, or a rerun after a gate rejection,
/// gets a new record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// 1, 2, 3, ... in the run.
    pub seq: u32,
    pub step_id: String,
    pub kind: StepKind,
    pub state: StepState,
    /// The parallel step whose branch holds this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_step_id: Option<String>,
    pub iteration: u32,
    pub attempt: u32,
    /// The input after templates were rendered.
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<String>,
    /// The side effect's id: a task, a hub message, a bus event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for_signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<i64>,
    /// A canceled spawn whose task has not been canceled yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_pending: bool,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
}

impl StepRecord {
    /// The idempotency key of this record's side effect: the same for every
    /// try of one (run, step, iteration, attempt), so a crash between issuing
    /// and recording never duplicates it. A message's attempts all send one
    /// message (an attempt that failed may have reached its receiver, its
    /// answer lost): its key is the same for each, so a receiver drops a
    /// retry of what it has.
    pub fn effect_key(&self, run_id: &str) -> String {
        match self.kind {
            StepKind::Message => format!("workflow:{run_id}:{}:{}", self.step_id, self.iteration),
            _ => format!("workflow:{run_id}:{}:{}:{}", self.step_id, self.iteration, self.attempt),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Approve,
    Reject,
}

/// What the engine did with a gate decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Continued,
    Rerun,
    Escalated,
    Failed,
    /// Nobody decided before the gate's deadline; the run failed.
    Expired,
}

/// A decision on a gate, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateDecision {
    pub step_id: String,
    pub iteration: u32,
    pub decision: Decision,
    pub outcome: Outcome,
    pub decided_by: String,
    pub reason: String,
    pub data: Map<String, Value>,
    pub automatic: bool,
    pub decided_at: i64,
}

/// An external signal sent to a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    pub id: String,
    pub name: String,
    pub payload: Map<String, Value>,
    pub sent_by: String,
    pub received_at: i64,
    /// The wait step it satisfied; `None` while kept for a later wait.
    pub consumed_by_step_id: Option<String>,
}

/// How a run was started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunOrigin {
    pub kind: OriginKind,
    pub started_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginKind {
    #[default]
    Api,
    Event,
    A2a,
    Cron,
}

/// A run with everything recorded about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub namespace: String,
    pub id: String,
    pub workflow: String,
    pub version: u32,
    pub state: RunState,
    pub idempotency_key: Option<String>,
    /// The rendered `concurrency.key`; runs with equal keys share the limit.
    pub concurrency_key: Option<String>,
    pub body: RunBody,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

/// The part of a run kept as one document: it changes together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunBody {
    pub input: Map<String, Value>,
    /// The trigger's event payload (event runs) or message (A2A runs).
    #[serde(default)]
    pub trigger: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    /// Why a pending run has not started: its concurrency limit is reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<String>,
    pub origin: RunOrigin,
    /// Shared: a copy of the run (the engine keeps the one it last wrote)
    /// shares the records neither copy changed, and telling which changed
    /// compares pointers first ([`RunBody::step_mut`] unshares one).
    #[serde(default)]
    pub steps: Vec<Arc<StepRecord>>,
    #[serde(default)]
    pub gate_decisions: Vec<GateDecision>,
    #[serde(default)]
    pub signals: Vec<Signal>,
    /// The run fails when still unfinished at this time (`state.ttl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

impl RunBody {
    /// The record at `index`, to change: a copy of it when another copy of
    /// the run shares it.
    pub fn step_mut(&mut self, index: usize) -> &mut StepRecord {
        Arc::make_mut(&mut self.steps[index])
    }
}

/// A run to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub namespace: String,
    pub id: String,
    pub workflow: String,
    pub version: u32,
    pub idempotency_key: Option<String>,
    pub concurrency_key: Option<String>,
    /// The most runs of this workflow (and key) active at once.
    pub concurrency_limit: Option<u32>,
    pub body: RunBody,
    /// Kept this long after it finishes (`state.retention`).
    pub retention_micros: Option<i64>,
    /// What the engine's rules made of the run at once, when they could
    /// (no concurrency limit to consult): it is stored so, not pending.
    pub started: Option<Started>,
}

/// A run as the engine's rules started it, from pending.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    pub state: RunState,
    pub body: RunBody,
    /// When an engine must look at it; `None`: only an outside change will.
    pub due_at: Option<i64>,
    /// What changed from pending, in order.
    pub changes: Vec<RunChange>,
}

/// What a watch sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RunChange {
    RunStateChanged,
    StepUpdated { step: Arc<StepRecord> },
    GateDecided { decision: GateDecision },
    SignalReceived { signal: Signal },
}

/// One committed change of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// Orders a run's events; a watch resumes after it.
    pub cursor: i64,
    pub run_id: String,
    /// The run's state after the change.
    pub state: RunState,
    pub change: RunChange,
    pub time: i64,
}

/// Which runs a list returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    pub workflow: Option<String>,
    pub version: Option<u32>,
    pub states: Vec<RunState>,
    pub created_after: Option<i64>,
    pub include_steps: bool,
}

/// Where a run list continues: below this (created_at, id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    pub created_at: i64,
    pub id: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RunPage {
    pub runs: Vec<Run>,
    pub next: Option<RunCursor>,
}

#[cfg(test)]
mod tests {
    use super::branches_failed;

    #[test]
    fn a_parallel_step_names_five_failed_branches_and_counts_the_others() {
        let failures = |count: usize| (1..=count).map(|n| format!("branch `b{n}`: refused")).collect::<Vec<_>>();
        assert_eq!(branches_failed(failures(2)), "branch `b1`: refused; branch `b2`: refused");
        let five = branches_failed(failures(5));
        assert_eq!(five.matches("refused").count(), 5, "{five}");
        assert!(!five.contains("more"), "{five}");
        let hundred = branches_failed(failures(100));
        assert!(hundred.starts_with(&five), "{hundred}");
        assert!(hundred.ends_with("; and 95 more failed branches (their steps say why)"), "{hundred}");
    }
}
