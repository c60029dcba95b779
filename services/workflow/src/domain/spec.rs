//! The parsed content of a workflow definition.

use std::{collections::BTreeSet, time::Duration};

use serde_json::{Map, Value};

use super::StepKind;

/// A valid workflow definition.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowSpec {
    /// The YAML `name`: the workflow's identity across versions.
    pub name: String,
    pub description: String,
    pub trigger: Trigger,
    pub inputs: Vec<Input>,
    pub steps: Vec<Step>,
    pub state: StatePolicy,
    pub concurrency: Option<Concurrency>,
}

/// What starts a run besides an explicit start.
#[derive(Debug, Clone, PartialEq)]
pub enum Trigger {
    /// Started explicitly only (API, CLI, A2A).
    Manual,
    /// An event-bus event of `event_type` whose payload has the `filter`
    /// fields, and for which `condition` (an expression over `event`) holds.
    Event { event_type: String, filter: Map<String, Value>, condition: Option<String> },
    /// A cron schedule (5 to 7 fields), validated at definition time.
    Cron { schedule: String },
}

/// The type of a run input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputType {
    String,
    Number,
    Integer,
    Boolean,
    Object,
    Array,
}

impl InputType {
    /// The YAML spellings, in the order problems list them.
    pub const NAMES: &'static str = "string, number, integer, boolean, object, array";

    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "string" => Self::String,
            "number" => Self::Number,
            "integer" => Self::Integer,
            "boolean" => Self::Boolean,
            "object" => Self::Object,
            "array" => Self::Array,
            _ => return None,
        })
    }

    /// Whether `value` is of this type.
    pub fn admits(self, value: &Value) -> bool {
        match self {
            Self::String => value.is_string(),
            Self::Number => value.is_number(),
            Self::Integer => value.is_i64() || value.is_u64(),
            Self::Boolean => value.is_boolean(),
            Self::Object => value.is_object(),
            Self::Array => value.is_array(),
        }
    }
}

/// A declared run input.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub name: String,
    pub kind: InputType,
    pub required: bool,
    pub default: Option<Value>,
    pub description: String,
}

/// One step. `condition`, when set, skips the step when it is false.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub id: String,
    pub condition: Option<String>,
    pub action: Action,
    /// The names its templates and conditions use (`inputs`, `run`, step
    /// ids, ...): all its templates see, and all a run's scope needs to hold
    /// for it.
    pub roots: BTreeSet<String>,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Spawn(Spawn),
    Delegate(Delegate),
    Message(MessageStep),
    /// Only a condition: its output is whether it held.
    Condition,
    Wait(Wait),
    Parallel(Parallel),
    Gate(Gate),
}

impl Action {
    /// The kind of step records of this action.
    pub fn kind(&self) -> StepKind {
        match self {
            Self::Spawn(_) => StepKind::Spawn,
            Self::Delegate(_) => StepKind::Delegate,
            Self::Message(_) => StepKind::Message,
            Self::Condition => StepKind::Condition,
            Self::Wait(_) => StepKind::Wait,
            Self::Parallel(_) => StepKind::Parallel,
            Self::Gate(_) => StepKind::Gate,
        }
    }
}

/// Who a spawned task is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpawnTarget {
    Agent(String),
    Role(String),
}

/// Retry with exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// Delay before the second attempt; doubled for each next one.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

/// A task for an agent or role with templated input, awaited durably.
#[derive(Debug, Clone, PartialEq)]
pub struct Spawn {
    pub target: SpawnTarget,
    /// Strings anywhere in it are templates.
    pub input: Value,
    pub timeout: Option<Duration>,
    pub retry: Option<Retry>,
}

/// A message to an external A2A agent through the gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct Delegate {
    pub agent: String,
    pub input: Value,
    pub timeout: Option<Duration>,
    pub retry: Option<Retry>,
}

/// Where a `message` step sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageTarget {
    /// A hub topic.
    Topic(String),
    /// A hub agent (may be a template, such as `{{ config.notify }}`).
    Agent(String),
    /// An outbound webhook URL.
    Webhook(String),
    /// An event of this type on the bus, in the run's namespace.
    Event(String),
}

/// A hub message, outbound webhook or bus event.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageStep {
    pub to: MessageTarget,
    /// A template; `None`: the message carries `data` alone.
    pub text: Option<String>,
    /// Values whose strings are templates; `Null`: none.
    pub data: Value,
    pub message_type: Option<String>,
    pub retry: Option<Retry>,
}

/// A durable timer or a named external signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    Timer(Duration),
    Signal { name: String, timeout: Option<Duration> },
}

/// How a parallel step joins its branches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinMode {
    /// The first failing branch cancels the others and fails the step.
    FailFast,
    /// Every branch runs to its end; the step fails if any branch failed.
    AllSettled,
}

/// One branch of a parallel step: its steps run in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    pub name: String,
    pub steps: Vec<Step>,
}

/// Whether a step of `steps` (branches included) waits for signal `name`.
pub fn waits_for_signal(steps: &[Step], name: &str) -> bool {
    steps.iter().any(|step| match &step.action {
        Action::Wait(Wait::Signal { name: waited, .. }) => waited == name,
        Action::Parallel(parallel) => parallel.branches.iter().any(|branch| waits_for_signal(&branch.steps, name)),
        _ => false,
    })
}

/// Fan-out over branches, joined when they end.
#[derive(Debug, Clone, PartialEq)]
pub struct Parallel {
    pub branches: Vec<Branch>,
    pub mode: JoinMode,
    /// The most branches active at once (`None`: all of them); the others
    /// start in the order declared as active ones end.
    pub max_concurrency: Option<u32>,
}

/// Who decides a gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateMode {
    /// Decided by the `approve_when` expression.
    Auto,
    /// Decided by a person or agent of the reviewers role.
    Hitl,
}

/// What happens after the last allowed rejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExhausted {
    /// Hand the decision to `escalate_to`.
    Escalate,
    /// Fail the run.
    Fail,
}

/// An approval point.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    pub mode: GateMode,
    /// The role that decides a HITL gate.
    pub reviewers: Option<String>,
    /// AUTO: the expression that approves.
    pub approve_when: Option<String>,
    /// The first step of the phase a rejection runs again: an earlier step.
    pub rerun_from: Option<String>,
    pub max_rejections: u32,
    pub on_exhausted: OnExhausted,
    /// The role that decides after escalation.
    pub escalate_to: Option<String>,
    pub expires_after: Option<Duration>,
    /// What the reviewers see; strings anywhere in it are templates.
    pub artifacts: Value,
}

/// Where run state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// In the configured database (PostgreSQL or SQLite).
    Durable,
}

/// Run state policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatePolicy {
    pub persistence: Persistence,
    /// How long a run's state lives while the run is unfinished.
    pub ttl: Option<Duration>,
    /// How long a finished run is kept.
    pub retention: Option<Duration>,
}

/// A limit on concurrent runs, optionally per key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    pub max: u32,
    /// An expression over `trigger` and `inputs`; runs with equal keys share the limit.
    pub key: Option<String>,
}

impl Concurrency {
    /// Why a run of `workflow` (with the concurrency key `key`) waits for a slot.
    pub fn holding(&self, workflow: &str, key: Option<&str>) -> String {
        let key = key.map(|key| format!(" with key `{key}`")).unwrap_or_default();
        let runs = if self.max == 1 { "1 run" } else { &format!("{} runs", self.max) };
        format!("waiting for a slot: at most {runs} of `{workflow}`{key} at once")
    }
}
