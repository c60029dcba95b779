//! Workflow definitions as the engine sees them, free of wire types.

mod definition;
mod problem;
mod run;
mod spec;

pub use self::{
    definition::{Definition, DefinitionPage, Disabled, Head, NewDefinition, PageToken, Put, StoredTrigger},
    problem::{Problem, Severity, has_errors, sort_problems},
    run::{
        Decision, GateDecision, NewRun, OriginKind, Outcome, Run, RunBody, RunChange, RunCursor, RunEvent, RunFilter,
        RunOrigin, RunPage, RunState, Signal, Slot, Started, StepKind, StepRecord, StepState, branches_failed,
    },
    spec::{
        Action, Branch, Concurrency, Delegate, Gate, GateMode, Input, InputType, JoinMode, MessageStep, MessageTarget,
        OnExhausted, Parallel, Persistence, Retry, Spawn, SpawnTarget, StatePolicy, Step, Trigger, Wait, WorkflowSpec,
        waits_for_signal,
    },
};
