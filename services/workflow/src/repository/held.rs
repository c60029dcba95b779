//! Writes of the runs an engine holds. The claiming engine keeps each run as
//! it last wrote it, changes that copy and writes it back without reading the
//! row first: the write lands only if the row still has the revision and the
//! claim the engine wrote, so a change made meanwhile by anyone else (an API
//! call, another engine) makes it miss, and the engine falls back to a locked
//! read. Writes that wait at the same time go to the database together — one
//! statement and one commit on PostgreSQL, one transaction on SQLite — which
//! is how 64 runs in flight share commits instead of queueing for one each.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use chorus_runtime::{
    batch::Batcher,
    storage::{Backend, Db, Tx, placeholders},
};
use futures_util::FutureExt as _;
use serde::Serialize;
use sqlx::{AssertSqlSafe, Row as _};

use super::{
    run_rows::{Stored, encode_body, event_bodies, purge_at, recorded, settle},
    runs::{Change, Fence, Transition, Written},
};
use crate::{
    domain::{Run, RunState, Slot},
    engine::schedule::changes,
};

/// The most writes one batch carries, and batches at once.
const BATCH: usize = 128;
const IN_FLIGHT: usize = 2;

/// A run's new row, written only over `revision` under the claim (`owner`, `token`).
#[derive(Debug, Serialize)]
struct HeldWrite {
    id: String,
    revision: i64,
    owner: String,
    token: i64,
    state: &'static str,
    /// Sent beside the other columns, not inside their JSON: see `POSTGRES_BATCH`.
    #[serde(skip)]
    body: String,
    updated_at: i64,
    finished_at: Option<i64>,
    due_at: Option<i64>,
    purge_at: Option<i64>,
    release: bool,
    /// Event bodies, in order.
    #[serde(skip)]
    events: Vec<String>,
    #[serde(skip)]
    now: i64,
}

/// What the held copy of a run made of a transition.
pub(super) enum HeldOutcome {
    /// Written over the copy's revision.
    Written(Written),
    /// The change changed nothing in the copy, which is handed back: whether
    /// an outside change waits in the row, the copy cannot say.
    Unchanged(Stored),
    /// The row moved on, or the write failed: the copy is forgotten.
    Missed,
}

/// The ids of a landed write's events, in order.
type Landed = Option<Vec<i64>>;

/// The runs this process's engine holds, as it last wrote them, and the
/// batcher their writes go through. Cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct HeldRuns {
    runs: Arc<Mutex<HashMap<String, Stored>>>,
    /// Answers each write with the ids of its events when it landed; `None`
    /// when the row moved on, or the batch failed: either way the caller
    /// reads the row afresh under its lock.
    batcher: Batcher<HeldWrite, Landed>,
}

impl HeldRuns {
    pub(super) fn new(db: Db) -> Self {
        let batcher = Batcher::new(BATCH, IN_FLIGHT, move |writes: Vec<HeldWrite>| {
            let db = db.clone();
            async move { write_batch(&db, &writes).await }.boxed()
        });
        Self { runs: Arc::default(), batcher }
    }

    /// The run this engine holds under `fence`, as it last wrote it, taken
    /// out until the transition puts back what it wrote (runs under a
    /// concurrency limit are never held: their changes look at others).
    pub(super) fn take(&self, namespace: &str, run_id: &str, fence: &Fence) -> Option<Stored> {
        let mut held = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let stored = held.remove(run_id)?;
        (stored.run.namespace == namespace && stored.lease.as_ref() == Some(fence)).then_some(stored)
    }

    /// The state of a run this engine holds, as it last wrote it.
    pub(super) fn state(&self, namespace: &str, run_id: &str) -> Option<RunState> {
        let held = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(run_id).filter(|stored| stored.run.namespace == namespace).map(|stored| stored.run.state)
    }

    /// Remembers (or, with `None`, forgets) how this engine left a run it holds.
    pub(super) fn hold(&self, run_id: &str, stored: Option<Stored>) {
        let mut held = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        match stored.filter(|stored| stored.concurrency_limit.is_none()) {
            Some(stored) => held.insert(run_id.to_owned(), stored),
            None => held.remove(run_id),
        };
    }

    /// Applies `change` to the held copy and writes it over that revision.
    pub(super) async fn transition(&self, held: Stored, now: i64, change: &mut Change<'_>) -> HeldOutcome {
        let mut run = held.run.clone();
        let Ok(mut transition) = change(&mut run, Slot::Free) else { return HeldOutcome::Missed };
        if settle(&held, &run, &mut transition, now) {
            return HeldOutcome::Unchanged(held);
        }
        self.write(held, run, transition, now).await.map_or(HeldOutcome::Missed, HeldOutcome::Written)
    }

    async fn write(&self, held: Stored, mut run: Run, transition: Transition, now: i64) -> Option<Written> {
        let before = &held.run;
        let events = changes(before, &run);
        if !events.is_empty() {
            run.updated_at = now;
        }
        let fence = held.lease.clone()?;
        let write = HeldWrite {
            id: run.id.clone(),
            revision: held.revision,
            owner: fence.owner.clone(),
            token: fence.token,
            state: run.state.as_str(),
            body: encode_body(&run.body).ok()?,
            updated_at: run.updated_at,
            finished_at: run.finished_at,
            due_at: transition.due_at,
            purge_at: purge_at(held.retention, &run, now),
            release: transition.release,
            events: event_bodies(&run, &events).ok()?,
            now,
        };
        let Some(ids) = self.batcher.call(write).await.flatten() else {
            self.hold(&run.id, None);
            return None;
        };
        let revision = self.hold_written(held, &run, transition);
        let events = recorded(&run, events, ids, now);
        Some(Written { run, revision, wrote: true, events })
    }

    /// Remembers a run as this engine just wrote it over `stored` (forgets it
    /// when released); the run's new revision.
    pub(super) fn hold_written(&self, stored: Stored, run: &Run, transition: Transition) -> i64 {
        let revision = stored.revision + 1;
        let kept = (!transition.release).then(|| Stored {
            run: run.clone(),
            concurrency_limit: stored.concurrency_limit,
            retention: stored.retention,
            due_at: transition.due_at,
            lease: stored.lease,
            revision,
            fresh: false,
        });
        self.hold(&run.id, kept);
        revision
    }
}

/// Writes a batch; whether each landed, in order.
async fn write_batch(db: &Db, writes: &[HeldWrite]) -> Vec<Landed> {
    let mut landed = match db.backend() {
        Backend::Postgres => write_postgres(db, writes).await,
        Backend::Sqlite => write_sqlite(db, writes).await,
    }
    .unwrap_or_else(|error| {
        tracing::debug!(%error, writes = writes.len(), "batched run writes failed; each run is read afresh");
        HashMap::new()
    });
    writes.iter().map(|write| landed.remove(&write.id)).collect()
}

#[derive(Serialize)]
struct EventRow<'a> {
    run_id: &'a str,
    created_at: i64,
}

/// One statement: the rows whose revision and claim still match are
/// updated, and only their events inserted, in the order given. It returns a
/// row per updated run and a row per event inserted, not the two joined: the
/// planner, expecting a row or two from each, joined them by a nested loop,
/// comparing every run with every event.
///
/// The rows are found by primary key (`id = ANY`), and the claim's owner is
/// compared with `IS NOT DISTINCT FROM`, which no index serves: with a plain
/// `=` the planner walked the claim index or, with statistics taken while the
/// table was young, read the whole table on every batch — a cost that grew
/// with every run ever kept.
///
/// The run and event bodies, JSON documents of kilobytes, come as two texts
/// of bodies joined by the record separator U+001E, which a JSON document
/// never holds unescaped; the n-th body belongs to the n-th row of the JSON
/// lists beside them. Inside those lists they would be escaped here and
/// unescaped there character by character, about half of the statement's time.
const POSTGRES_BATCH: &str = "\
WITH input AS (
    SELECT i.*, b.body
    FROM ROWS FROM (json_to_recordset(CAST($1 AS json)) AS (id text, revision bigint, owner text, token bigint,
        state text, updated_at bigint, finished_at bigint, due_at bigint, purge_at bigint, release boolean))
        WITH ORDINALITY AS i(id, revision, owner, token, state, updated_at, finished_at, due_at, purge_at, release, n)
    JOIN unnest(string_to_array(CAST($3 AS text), chr(30))) WITH ORDINALITY AS b(body, n) ON b.n = i.n
), updated AS (
    UPDATE workflow_runs r SET state = i.state, body = i.body, updated_at = i.updated_at,
        finished_at = i.finished_at, due_at = i.due_at, purge_at = i.purge_at, revision = r.revision + 1,
        lease_owner = CASE WHEN i.release THEN NULL ELSE r.lease_owner END,
        lease_until = CASE WHEN i.release THEN NULL ELSE r.lease_until END
    FROM input i
    WHERE r.id = ANY(ARRAY(SELECT id FROM input)) AND r.id = i.id AND r.revision = i.revision
        AND r.lease_token = i.token AND r.lease_owner IS NOT DISTINCT FROM i.owner
    RETURNING r.id
), inserted AS (
    INSERT INTO workflow_run_events (run_id, body, created_at)
    SELECT e.run_id, b.body, e.created_at
    FROM ROWS FROM (json_to_recordset(CAST($2 AS json)) AS (run_id text, created_at bigint))
        WITH ORDINALITY AS e(run_id, created_at, n)
    JOIN unnest(string_to_array(CAST($4 AS text), chr(30))) WITH ORDINALITY AS b(body, n) ON b.n = e.n
    WHERE e.run_id IN (SELECT id FROM updated)
    ORDER BY e.n
    RETURNING run_id, id
)
SELECT id, NULL AS event_id FROM updated UNION ALL SELECT run_id, id FROM inserted";

/// What `POSTGRES_BATCH` joins the bodies with.
const BODY_SEPARATOR: &str = "\u{1e}";

fn json(value: &impl Serialize) -> Result<String, sqlx::Error> {
    serde_json::to_string(value).map_err(|error| sqlx::Error::Encode(error.into()))
}

async fn write_postgres(db: &Db, writes: &[HeldWrite]) -> Result<HashMap<String, Vec<i64>>, sqlx::Error> {
    // Rows are locked in the order listed: by id, as the lease renewal locks
    // them, so the two never wait on each other in a cycle.
    let mut writes: Vec<&HeldWrite> = writes.iter().collect();
    writes.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    let (events, event_bodies): (Vec<EventRow<'_>>, Vec<&str>) = writes
        .iter()
        .flat_map(|write| {
            write.events.iter().map(|body| (EventRow { run_id: &write.id, created_at: write.now }, body.as_str()))
        })
        .unzip();
    let run_bodies: Vec<&str> = writes.iter().map(|write| write.body.as_str()).collect();
    let rows = sqlx::query(POSTGRES_BATCH)
        .bind(json(&writes)?)
        .bind(json(&events)?)
        .bind(run_bodies.join(BODY_SEPARATOR))
        .bind(event_bodies.join(BODY_SEPARATOR))
        .fetch_all(&mut *db.acquire().await?)
        .await?;
    let mut landed: HashMap<String, Vec<i64>> = HashMap::new();
    for row in &rows {
        let ids = landed.entry(row.try_get("id")?).or_default();
        ids.extend(row.try_get::<Option<i64>, _>("event_id")?);
    }
    for ids in landed.values_mut() {
        ids.sort_unstable();
    }
    Ok(landed)
}

/// One transaction: each row updated if its revision and claim still match,
/// and its events inserted if it was.
async fn write_sqlite(db: &Db, writes: &[HeldWrite]) -> Result<HashMap<String, Vec<i64>>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let mut landed = HashMap::new();
    for write in writes {
        let lease = if write.release { ", lease_owner = NULL, lease_until = NULL" } else { "" };
        let sql = format!(
            "UPDATE workflow_runs SET state = $5, body = $6, updated_at = $7, finished_at = $8, due_at = $9, \
             purge_at = $10, revision = revision + 1{lease} \
             WHERE id = $1 AND revision = $2 AND lease_owner = $3 AND lease_token = $4"
        );
        let updated = sqlx::query(AssertSqlSafe(sql))
            .bind(&write.id)
            .bind(write.revision)
            .bind(&write.owner)
            .bind(write.token)
            .bind(write.state)
            .bind(&write.body)
            .bind(write.updated_at)
            .bind(write.finished_at)
            .bind(write.due_at)
            .bind(write.purge_at)
            .execute(&mut *tx)
            .await?;
        if updated.rows_affected() == 0 {
            continue;
        }
        let ids = insert_events(&mut tx, &write.id, write.now, &write.events).await?;
        landed.insert(write.id.clone(), ids);
    }
    tx.commit().await?;
    Ok(landed)
}

/// Inserts a run's events (their bodies, in order) in `tx`; their ids, in order.
pub(super) async fn insert_events(
    tx: &mut Tx,
    run_id: &str,
    now: i64,
    bodies: &[String],
) -> Result<Vec<i64>, sqlx::Error> {
    if bodies.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<String> =
        (0..bodies.len()).map(|index| format!("($1, {}, $2)", placeholders(index + 3, 1))).collect();
    let sql =
        format!("INSERT INTO workflow_run_events (run_id, body, created_at) VALUES {} RETURNING id", rows.join(", "));
    let mut query = sqlx::query_scalar(AssertSqlSafe(sql)).bind(run_id).bind(now);
    for body in bodies {
        query = query.bind(body);
    }
    let mut ids: Vec<i64> = query.fetch_all(&mut **tx).await?;
    // Ids are drawn in the order the rows are listed.
    ids.sort_unstable();
    Ok(ids)
}
