//! Runs: start, read, list, cancel, signal, decide gates (watches: `watch.rs`). Every change
//! goes through [`Workflows::transition`], which applies it and the engine's
//! rules under the run's lock and commits both at once.

use std::{sync::Arc, time::Duration};

use chorus_runtime::{
    time::{now_micros, until},
    validate::FieldViolation,
};
use serde_json::{Map, Value};

use super::{ENGINE_KEY, Workflows, feed::Fed};
use crate::{
    domain::{
        Decision, NewRun, Run, RunBody, RunCursor, RunFilter, RunOrigin, RunPage, RunState, Slot, Started, StepState,
        WorkflowSpec,
    },
    engine::{
        plan::Planner,
        render::Scope,
        schedule::{due_at, needs_driver},
    },
    error::{Result, WorkflowError},
    repository::{Fence, Transition},
};

/// A run to start.
#[derive(Debug, Clone, Default)]
pub struct StartCall {
    pub namespace: String,
    pub workflow: String,
    /// `None`: the latest version.
    pub version: Option<u32>,
    pub input: Map<String, Value>,
    pub idempotency_key: Option<String>,
    pub origin: RunOrigin,
    /// The event payload or A2A message that started it.
    pub trigger: Value,
    /// Starts it though the workflow is disabled (an operator's try of a fix).
    pub while_disabled: bool,
}

/// A signal to send.
#[derive(Debug, Clone)]
pub struct SignalCall {
    pub name: String,
    pub payload: Map<String, Value>,
    pub signal_id: String,
    pub sent_by: String,
}

/// A gate decision to make.
#[derive(Debug, Clone)]
pub struct GateCall {
    pub step_id: String,
    pub decision: Decision,
    pub decided_by: String,
    pub reason: String,
    pub data: Map<String, Value>,
    pub iteration: Option<u32>,
}

/// How often a watch, or a get waiting for the run's end, re-reads while
/// this process writes nothing of its run (changes committed by another
/// process reach it no other way).
pub(super) const WATCH_POLL: Duration = Duration::from_millis(250);

/// The wake-up key of a run's driver.
pub(crate) fn drive_key(run_id: &str) -> String {
    format!("drive:{run_id}")
}

impl Workflows {
    /// Applies `apply` and then the engine's rules to a run, atomically.
    /// With a `fence`, only while the claim holds, and the run is released
    /// when no engine needs to hold it any more.
    pub(crate) async fn transition(
        &self,
        namespace: &str,
        run_id: &str,
        spec: &WorkflowSpec,
        fence: Option<&Fence>,
        mut apply: impl FnMut(&Planner<'_>, &mut Run) -> Result<()> + Send,
    ) -> Result<Run> {
        let now = now_micros();
        let planner = Planner { spec, config: &self.vars, now };
        // The run as the write that committed found it (a retried write
        // reads it again), to count what the write finished.
        let mut before = Progress::default();
        let mut change = |run: &mut Run, slot: Slot| {
            before = Progress::of(run);
            apply(&planner, run)?;
            planner.advance(run, slot);
            Ok(Transition { due_at: due_at(run, now), release: fence.is_some() && !needs_driver(run) })
        };
        let written = self.runs.transition(namespace, run_id, fence, now, &mut change).await?;
        let run = written.run;
        if written.wrote {
            self.count_progress(before, &run);
        }
        // Watches in this process get every write at once (those of other
        // processes poll); an engine's driver hears of changes made by
        // others (an API call), in any process, not of its own.
        if written.wrote {
            let finished = run.state.is_finished().then(|| run.clone());
            self.feed.publish(&run.id, Fed { revision: written.revision, events: written.events, finished });
        }
        let due = due_at(&run, now);
        if fence.is_none() {
            self.wakeups.notify(&drive_key(&run.id));
            self.wake_engine_when_due(due, now);
        } else if written.wrote && due.is_some_and(|at| at > now) {
            // A driver let the run go until its timer: engines look then.
            self.wake_engine_when_due(due, now);
        }
        Ok(run)
    }

    /// Counts the steps a write completed, and the run when it finished it;
    /// a run that failed is logged, with why.
    fn count_progress(&self, before: Progress, run: &Run) {
        let after = Progress::of(run);
        let steps = after.steps_completed.saturating_sub(before.steps_completed);
        self.metrics.workflow_steps_completed.get().inc_by(steps as u64);
        if run.state.is_finished() && !before.finished {
            self.metrics.workflow_runs_finished.with([run.state.as_str()]).inc();
            if run.state == RunState::Failed {
                let error = run.body.error.as_deref().unwrap_or("(no reason recorded)");
                let (run_id, namespace, workflow) = (&run.id, &run.namespace, &run.workflow);
                tracing::warn!(%run_id, %namespace, %workflow, error, "workflow run failed");
            }
        }
    }

    /// Engines waiting for due runs look at once when a run is due now, and
    /// when its time comes when that is before their next poll (a later one
    /// they find when they poll: they wait for the earliest due run).
    fn wake_engine_when_due(&self, due_at: Option<i64>, now: i64) {
        let Some(at) = due_at else { return };
        if at <= now {
            return self.wakeups.notify(ENGINE_KEY);
        }
        let wait = until(now, at);
        if wait < self.config().poll() {
            let wakeups = self.wakeups.clone();
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                wakeups.notify(ENGINE_KEY);
            });
        }
    }

    /// The spec of the version a run is on.
    pub(crate) async fn spec_of_run(&self, run: &Run) -> Result<Arc<WorkflowSpec>> {
        self.spec(&run.namespace, &run.workflow, run.version).await
    }

    pub(super) async fn existing(&self, namespace: &str, run_id: &str) -> Result<(Run, Arc<WorkflowSpec>)> {
        let run = self.get_run(namespace, run_id).await?;
        let spec = self.spec_of_run(&run).await?;
        Ok((run, spec))
    }

    /// Starts a run, or returns the one started first with the same key by
    /// the same request; another request under the key is `KeyInUse`.
    pub async fn start_run(&self, call: StartCall) -> Result<Run> {
        // The version's number (and that the workflow is not disabled) is
        // all a start needs of its definition: the parsed spec is cached,
        // and the stored source is not read again.
        let head = self.head(&call.namespace, &call.workflow).await?;
        match head.disabled {
            Some(disabled) if !call.while_disabled => {
                return Err(WorkflowError::Disabled { workflow: call.workflow, disabled });
            }
            Some(_) => tracing::info!(
                workflow = %call.workflow,
                started_by = %call.origin.started_by,
                "a run starts though its workflow is disabled, as asked"
            ),
            None => {}
        }
        let version = call.version.unwrap_or(head.latest);
        let spec = self.spec(&call.namespace, &call.workflow, version).await?;
        // A keyed start keeps what it asked for, to tell its own retry from
        // another start under the same key.
        let requested = if call.idempotency_key.is_some() { call.input.clone() } else { Map::new() };
        let input = checked_input(&spec, call.input)?;
        let now = now_micros();
        let id = uuid::Uuid::now_v7().to_string();
        let mut body = RunBody { input, trigger: call.trigger, origin: call.origin, ..RunBody::default() };
        body.expires_at = spec.state.ttl.map(|ttl| now + chorus_runtime::time::micros(ttl));
        let probe = Run {
            namespace: call.namespace.clone(),
            id: id.clone(),
            workflow: call.workflow.clone(),
            version,
            state: RunState::Pending,
            idempotency_key: None,
            concurrency_key: None,
            body: body.clone(),
            created_at: now,
            updated_at: now,
            finished_at: None,
        };
        let concurrency_key = match spec.concurrency.as_ref().and_then(|c| c.key.as_deref()) {
            Some(key) => Some(Scope::of(&probe, &[], &self.vars, "", 1, None).render(key).map_err(|error| {
                WorkflowError::InvalidArgument(FieldViolation::new("input", format!("concurrency.key: {error}")))
            })?),
            None => None,
        };
        // Without a concurrency limit nothing outside the run has a say in
        // how it starts: it is created started, in one write (unless it
        // finishes at once: that is recorded by a transition).
        let started = spec.concurrency.is_none().then(|| {
            let mut run = probe.clone();
            Planner { spec: &spec, config: &self.vars, now }.advance(&mut run, Slot::Free);
            let changes = crate::engine::schedule::changes(&probe, &run);
            Started { state: run.state, due_at: due_at(&run, now), changes, body: run.body }
        });
        let started = started.filter(|started| !started.state.is_finished());
        let new = NewRun {
            namespace: call.namespace.clone(),
            id,
            workflow: call.workflow,
            version,
            idempotency_key: call.idempotency_key,
            concurrency_key,
            concurrency_limit: spec.concurrency.as_ref().map(|c| c.max),
            body,
            retention_micros: spec.state.retention.map(chorus_runtime::time::micros),
            started,
        };
        let started_due = new.started.as_ref().map(|started| started.due_at);
        // A run to drive at once goes to this process's engine, if it has room.
        let engine = self.engine.get().filter(|_| started_due.flatten().is_some_and(|at| at <= now));
        let taker = engine.and_then(|engine| engine.taker(self.config(), now));
        let created = self.runs.create(new, taker.as_ref(), now).await?;
        let run = created.run;
        if !created.created {
            return self.retried(run, &probe, call.version, requested).await;
        }
        tracing::info!(run_id = %run.id, workflow = %run.workflow, version = run.version, "run started");
        self.metrics.workflow_runs_started.get().inc();
        // Steps done at once (a condition, a set) were done by the create.
        self.count_progress(Progress::default(), &run);
        if let (Some(engine), Some(claim)) = (engine, created.claim) {
            engine.drive(self, claim);
            return Ok(run);
        }
        match started_due {
            Some(due_at) => self.wake_engine_when_due(due_at, now),
            None => return self.transition(&run.namespace, &run.id, &spec, None, |_, _| Ok(())).await,
        }
        Ok(run)
    }

    /// The run first started under a key, when `probe` (this start, its
    /// input checked against its version) asks for it again: the same
    /// workflow, the same version when `pinned`, and the same inputs. Any
    /// other start under the key is refused, and changes nothing.
    async fn retried(
        &self,
        first: Run,
        probe: &Run,
        pinned: Option<u32>,
        requested: Map<String, Value>,
    ) -> Result<Run> {
        let mismatch = if first.workflow != probe.workflow {
            format!("is not a run of {}", probe.workflow)
        } else if pinned.is_some_and(|version| version != first.version) {
            format!("is not on version {}", probe.version)
        } else if !self.same_input(&first, probe, requested).await? {
            "was started with other inputs".to_owned()
        } else {
            return Ok(first);
        };
        Err(WorkflowError::KeyInUse {
            key: first.idempotency_key.unwrap_or_default(),
            run_id: first.id,
            workflow: first.workflow,
            version: first.version,
            mismatch,
        })
    }

    /// Whether `requested`, checked against the version `first` is on
    /// (defaults filled in as they were for it), is the input `first` has.
    async fn same_input(&self, first: &Run, probe: &Run, requested: Map<String, Value>) -> Result<bool> {
        if first.version == probe.version {
            return Ok(first.body.input == probe.body.input);
        }
        let spec = self.spec_of_run(first).await?;
        Ok(checked_input(&spec, requested).is_ok_and(|input| input == first.body.input))
    }

    pub async fn get_run(&self, namespace: &str, run_id: &str) -> Result<Run> {
        self.runs.get(namespace, run_id).await?.ok_or_else(|| WorkflowError::RunNotFound(run_id.to_owned()))
    }

    /// The run once it has finished: as the write of this process that
    /// finishes it left it, or read when its state, looked at every
    /// `WATCH_POLL`, says it has (a write of another process, or one this
    /// waiter lagged behind and missed). The look reads the state alone, so
    /// a wait of hours on a large run costs a key lookup each time; the
    /// first look at a run this process's engine drives reads nothing.
    pub async fn finished_run(&self, namespace: &str, run_id: &str) -> Result<Run> {
        // Subscribed before the first look, so no write falls between the two.
        let mut feed = self.feed.subscribe(run_id);
        let mut held = self.runs.held_state(namespace, run_id);
        loop {
            let state = match held.take() {
                Some(state) => Some(state),
                None => self.runs.state(namespace, run_id).await?,
            };
            match state {
                None => return Err(WorkflowError::RunNotFound(run_id.to_owned())),
                Some(state) if state.is_finished() => return self.get_run(namespace, run_id).await,
                Some(_) => {}
            }
            let poll = tokio::time::Instant::now() + WATCH_POLL;
            while let Ok(Some(fed)) = tokio::time::timeout_at(poll, feed.next()).await {
                if let Some(run) = &fed.finished {
                    return Ok(run.clone());
                }
            }
        }
    }

    pub async fn list_runs(
        &self,
        namespace: &str,
        filter: &RunFilter,
        after: Option<RunCursor>,
        limit: u32,
    ) -> Result<RunPage> {
        self.runs.list(namespace, filter, after, limit).await
    }
}

/// The run's input as declared: defaults filled in, types checked, every
/// required input present, nothing undeclared.
fn checked_input(spec: &WorkflowSpec, mut input: Map<String, Value>) -> Result<Map<String, Value>> {
    let invalid = |name: &str, reason: String| {
        WorkflowError::InvalidArgument(FieldViolation::new(format!("input.{name}"), reason))
    };
    if let Some(unknown) = input.keys().find(|key| !spec.inputs.iter().any(|i| &i.name == *key)) {
        let declared: Vec<&str> = spec.inputs.iter().map(|i| i.name.as_str()).collect();
        return Err(invalid(unknown, format!("is not an input of {}; declared: {}", spec.name, declared.join(", "))));
    }
    let mut missing = Vec::new();
    for declared in &spec.inputs {
        match input.get(&declared.name) {
            Some(value) if !declared.kind.admits(value) => {
                return Err(invalid(&declared.name, format!("must be of type {:?}", declared.kind).to_lowercase()));
            }
            Some(_) => {}
            None if declared.required => missing.push(declared.name.as_str()),
            None => {
                if let Some(default) = &declared.default {
                    input.insert(declared.name.clone(), default.clone());
                }
            }
        }
    }
    match missing.as_slice() {
        [] => Ok(input),
        [name] => Err(invalid(name, "is required".into())),
        names => Err(WorkflowError::InvalidArgument(FieldViolation::new(
            "input",
            format!("misses the required inputs {}", names.join(", ")),
        ))),
    }
}

/// How far a run had come: whether it had finished, and its steps completed.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    finished: bool,
    steps_completed: usize,
}

impl Progress {
    fn of(run: &Run) -> Self {
        let steps_completed = run.body.steps.iter().filter(|step| step.state == StepState::Completed).count();
        Self { finished: run.state.is_finished(), steps_completed }
    }
}
