//! A run's row as the run repository reads and writes it.

use sqlx::{Row as _, any::AnyRow};

use super::runs::{Fence, Transition};
use crate::{
    domain::{Run, RunBody, RunChange, RunEvent, RunState},
    error::{Result, WorkflowError},
};

pub(super) const COLUMNS: &str = "id, namespace, workflow, version, state, idempotency_key, concurrency_key, \
     concurrency_limit, body, created_at, updated_at, finished_at, retention, due_at, lease_owner, lease_token, revision";

/// A run row with what only the repository needs.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) run: Run,
    pub(super) concurrency_limit: Option<i64>,
    pub(super) retention: Option<i64>,
    pub(super) due_at: Option<i64>,
    pub(super) lease: Option<Fence>,
    pub(super) revision: i64,
    /// The row as a claim or create of this process has just returned or
    /// written it, not yet looked at by a transition: the engine's first
    /// transition of the run trusts it without reading the row's revision.
    pub(super) fresh: bool,
}

/// Settles a transition's due time and tells whether the transition leaves
/// the row as `stored` has it (nothing to write): the run as it was, the same
/// due time, no release.
///
/// A run that was already due and still is keeps the time it first became
/// due. Its row's due index then stays as it was, so PostgreSQL can update
/// the row in place (a HOT update) while an engine drives the run, and a
/// transition that changes nothing else writes nothing. The oldest due runs
/// are still claimed first.
pub(super) fn settle(stored: &Stored, run: &Run, transition: &mut Transition, now: i64) -> bool {
    if let (Some(since), Some(at)) = (stored.due_at, transition.due_at)
        && since <= now
        && at <= now
    {
        transition.due_at = Some(since);
    }
    *run == stored.run && transition.due_at == stored.due_at && !transition.release
}

pub(super) fn corrupt(error: impl std::fmt::Display) -> WorkflowError {
    WorkflowError::Corrupt(error.to_string())
}

pub(super) fn decode(row: &AnyRow) -> Result<Stored> {
    let state: String = row.try_get("state")?;
    let body: String = row.try_get("body")?;
    let version: i64 = row.try_get("version")?;
    let owner: Option<String> = row.try_get("lease_owner")?;
    let token: i64 = row.try_get("lease_token")?;
    let run = Run {
        namespace: row.try_get("namespace")?,
        id: row.try_get("id")?,
        workflow: row.try_get("workflow")?,
        version: u32::try_from(version).map_err(corrupt)?,
        state: RunState::parse(&state).ok_or_else(|| corrupt(format!("run state {state}")))?,
        idempotency_key: row.try_get("idempotency_key")?,
        concurrency_key: row.try_get("concurrency_key")?,
        body: serde_json::from_str(&body).map_err(corrupt)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        finished_at: row.try_get("finished_at")?,
    };
    Ok(Stored {
        run,
        concurrency_limit: row.try_get("concurrency_limit")?,
        retention: row.try_get("retention")?,
        due_at: row.try_get("due_at")?,
        lease: owner.map(|owner| Fence { owner, token }),
        revision: row.try_get("revision")?,
        fresh: false,
    })
}

pub(super) fn encode_body(body: &RunBody) -> Result<String> {
    serde_json::to_string(body).map_err(corrupt)
}

/// When a run that just finished may be deleted.
pub(super) fn purge_at(retention: Option<i64>, run: &Run, now: i64) -> Option<i64> {
    retention.filter(|_| run.state.is_finished()).map(|retention| now + retention)
}

/// The events a write recorded, from their changes and the ids they got.
pub(super) fn recorded(run: &Run, changes: Vec<RunChange>, ids: Vec<i64>, now: i64) -> Vec<RunEvent> {
    changes
        .into_iter()
        .zip(ids)
        .map(|(change, cursor)| RunEvent { cursor, run_id: run.id.clone(), state: run.state, change, time: now })
        .collect()
}

/// An event's body: the run's state after the change, and the change.
#[derive(serde::Serialize)]
struct EventBody<'a> {
    state: RunState,
    change: &'a RunChange,
}

/// The bodies of a run's events, in order; written straight from the
/// changes, not through a copy of them as `serde_json::Value`s.
pub(super) fn event_bodies(run: &Run, events: &[RunChange]) -> Result<Vec<String>> {
    events
        .iter()
        .map(|change| serde_json::to_string(&EventBody { state: run.state, change }).map_err(corrupt))
        .collect()
}
