//! The SQL run repository: one implementation for PostgreSQL and SQLite.
//!
//! A run is one row whose `body` holds its step records, decisions and
//! signals; every change reads it under the row's lock (`FOR UPDATE` on
//! PostgreSQL; SQLite's single writer serializes), applies the engine's rules
//! and writes it back with its events in the same transaction — except the
//! changes of the engine that holds the run, which start from its own last
//! write and land only over it (see `held`).
//!
//! A run is looked up by its primary key alone, and whatever else must match
//! (its namespace, its claim) is checked on the row found. With
//! `namespace = $1` or `lease_owner = $2` beside `id = $1`, PostgreSQL's
//! cached plan, made while the table was young, walked `workflow_runs_recent`
//! (every run of the namespace) or `workflow_runs_owner` (every run the engine
//! holds) for the one id, a cost that grew with the table.

use async_trait::async_trait;
use chorus_runtime::storage::{Backend, Db, placeholders};
use sqlx::{AssertSqlSafe, Row as _};

use super::{
    held::{HeldOutcome, HeldRuns, insert_events},
    run_rows::{COLUMNS, Stored, corrupt, decode, encode_body, event_bodies, purge_at, recorded, settle},
    runs::{Change, Claim, Created, EventPage, Fence, RunRepository, Taker, TriggerCursor, Unfinished, Written},
};
use crate::{
    domain::{NewRun, Run, RunChange, RunCursor, RunEvent, RunFilter, RunPage, RunState, Slot},
    engine::schedule::changes,
    error::{Result, WorkflowError},
};

/// A new run, claimed or not; $1..$15 as [`RunRepository::create`] binds them.
macro_rules! insert_run {
    () => {
        "INSERT INTO workflow_runs (id, namespace, workflow, version, state, idempotency_key, concurrency_key, \
         concurrency_limit, body, created_at, updated_at, due_at, retention, lease_owner, lease_token, lease_until) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $12, $11, $13, $14, $15) \
         ON CONFLICT (namespace, idempotency_key) DO NOTHING"
    };
}

const INSERT_RUN: &str = insert_run!();
/// The run and its events ($16, a JSON array of their bodies) in one
/// statement, committed with the writes that wait with it; a row per event.
const INSERT_RUN_POSTGRES: &str = concat!(
    "WITH run AS (",
    insert_run!(),
    " RETURNING id) INSERT INTO workflow_run_events (run_id, body, created_at) \
     SELECT id, e.body, $10 FROM run, json_array_elements_text(CAST($16 AS json)) WITH ORDINALITY AS e(body, n) \
     ORDER BY e.n RETURNING 1"
);

/// Run storage on a [`Db`].
#[derive(Debug, Clone)]
pub struct SqlRunRepository {
    pub(super) db: Db,
    pub(super) held: HeldRuns,
}

impl SqlRunRepository {
    pub fn new(db: Db) -> Self {
        Self { held: HeldRuns::new(db.clone()), db }
    }
}

#[async_trait]
impl RunRepository for SqlRunRepository {
    async fn create(&self, new: NewRun, taker: Option<&Taker>, now: i64) -> Result<Created> {
        let mut run = Run {
            namespace: new.namespace,
            id: new.id,
            workflow: new.workflow,
            version: new.version,
            state: RunState::Pending,
            idempotency_key: new.idempotency_key,
            concurrency_key: new.concurrency_key,
            body: new.body,
            created_at: now,
            updated_at: now,
            finished_at: None,
        };
        let mut events = event_bodies(&run, &[RunChange::RunStateChanged])?;
        let mut due_at = Some(now);
        if let Some(started) = new.started {
            run.state = started.state;
            run.body = started.body;
            due_at = started.due_at;
            events.extend(event_bodies(&run, &started.changes)?);
        }
        let body = encode_body(&run.body)?;
        // A claim like a claim statement's first on the run (tokens count from 0).
        let fence = taker.map(|taker| Fence { owner: taker.owner.clone(), token: 1 });
        let bind = |sql: &'static str| {
            sqlx::query(sql)
                .bind(&run.id)
                .bind(&run.namespace)
                .bind(&run.workflow)
                .bind(i64::from(run.version))
                .bind(run.state.as_str())
                .bind(run.idempotency_key.as_deref())
                .bind(run.concurrency_key.as_deref())
                .bind(new.concurrency_limit.map(i64::from))
                .bind(&body)
                .bind(now)
                .bind(new.retention_micros)
                .bind(due_at)
                .bind(fence.as_ref().map(|fence| fence.owner.as_str()))
                .bind(fence.as_ref().map_or(0, |fence| fence.token))
                .bind(taker.map(|taker| taker.lease_until))
        };
        let inserted = match self.db.backend() {
            Backend::Postgres => {
                // A row per event logged: none when the run was not inserted.
                let query = bind(INSERT_RUN_POSTGRES).bind(serde_json::to_string(&events).map_err(corrupt)?);
                !self.db.run_grouped(query).await?.is_empty()
            }
            Backend::Sqlite => {
                let mut tx = self.db.begin().await?;
                let inserted = bind(INSERT_RUN).execute(&mut *tx).await?.rows_affected() > 0;
                if inserted {
                    insert_events(&mut tx, &run.id, now, &events).await?;
                    tx.commit().await?;
                }
                inserted
            }
        };
        if !inserted {
            let key = run.idempotency_key.as_deref().unwrap_or_default();
            let sql = format!("SELECT {COLUMNS} FROM workflow_runs WHERE namespace = $1 AND idempotency_key = $2");
            let row = sqlx::query(AssertSqlSafe(sql))
                .bind(&run.namespace)
                .bind(key)
                .fetch_one(&mut *self.db.acquire().await?)
                .await?;
            return Ok(Created { run: decode(&row)?.run, created: false, claim: None });
        }
        let claim = fence.map(|fence| {
            let claim = Claim::on(&run, fence.clone());
            // Held as claimed, so the engine's first change needs no read.
            let stored = Stored {
                run: run.clone(),
                concurrency_limit: new.concurrency_limit.map(i64::from),
                retention: new.retention_micros,
                due_at,
                lease: Some(fence),
                revision: 0,
                fresh: true,
            };
            self.held.hold(&run.id, Some(stored));
            claim
        });
        Ok(Created { run, created: true, claim })
    }

    async fn get(&self, namespace: &str, run_id: &str) -> Result<Option<Run>> {
        let sql = format!("SELECT {COLUMNS} FROM workflow_runs WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql)).bind(run_id).fetch_optional(&mut *self.db.read().await?).await?;
        let run = row.map(|row| decode(&row).map(|stored| stored.run)).transpose()?;
        Ok(run.filter(|run| run.namespace == namespace))
    }

    async fn state(&self, namespace: &str, run_id: &str) -> Result<Option<RunState>> {
        let row = sqlx::query("SELECT namespace, state FROM workflow_runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&mut *self.db.read().await?)
            .await?;
        let Some(row) = row else { return Ok(None) };
        if row.try_get::<String, _>("namespace")? != namespace {
            return Ok(None);
        }
        let state: String = row.try_get("state")?;
        RunState::parse(&state).map(Some).ok_or_else(|| corrupt(format!("run state {state}")))
    }

    fn held_state(&self, namespace: &str, run_id: &str) -> Option<RunState> {
        self.held.state(namespace, run_id)
    }

    async fn list(&self, namespace: &str, filter: &RunFilter, after: Option<RunCursor>, limit: u32) -> Result<RunPage> {
        let mut sql = format!("SELECT {COLUMNS} FROM workflow_runs WHERE namespace = $1");
        let mut next = 2;
        let mut clause = |sql: &mut String, text: &str, count: usize| {
            sql.push_str(&text.replace('?', &placeholders(next, count)));
            next += count;
        };
        if filter.workflow.is_some() {
            clause(&mut sql, " AND workflow = ?", 1);
        }
        if filter.version.is_some() {
            clause(&mut sql, " AND version = ?", 1);
        }
        if !filter.states.is_empty() {
            clause(&mut sql, " AND state IN (?)", filter.states.len());
        }
        if filter.created_after.is_some() {
            clause(&mut sql, " AND created_at >= ?", 1);
        }
        if after.is_some() {
            let (first, second) = (next, next + 1);
            sql.push_str(&format!(" AND (created_at < ${first} OR (created_at = ${first} AND id < ${second}))"));
            next += 2;
        }
        sql.push_str(&format!(" ORDER BY created_at DESC, id DESC LIMIT ${next}"));
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(namespace);
        if let Some(workflow) = &filter.workflow {
            query = query.bind(workflow.clone());
        }
        if let Some(version) = filter.version {
            query = query.bind(i64::from(version));
        }
        for state in &filter.states {
            query = query.bind(state.as_str());
        }
        if let Some(created_after) = filter.created_after {
            query = query.bind(created_after);
        }
        if let Some(cursor) = &after {
            query = query.bind(cursor.created_at).bind(cursor.id.clone());
        }
        let rows = query.bind(i64::from(limit) + 1).fetch_all(&mut *self.db.read().await?).await?;
        let mut runs = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut run = decode(row)?.run;
            if !filter.include_steps {
                run.body.steps.clear();
                run.body.gate_decisions.clear();
                run.body.signals.clear();
            }
            runs.push(run);
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let more = runs.len() > limit;
        runs.truncate(limit);
        let next =
            runs.last().filter(|_| more).map(|last| RunCursor { created_at: last.created_at, id: last.id.clone() });
        Ok(RunPage { runs, next })
    }

    async fn transition(
        &self,
        namespace: &str,
        run_id: &str,
        fence: Option<&Fence>,
        now: i64,
        change: &mut Change<'_>,
    ) -> Result<Written> {
        if let Some(fence) = fence
            && let Some(held) = self.held.take(namespace, run_id, fence)
        {
            match self.held.transition(held, now, change).await {
                HeldOutcome::Written(written) => return Ok(written),
                // Nothing to write: the copy answers if the row is still the
                // one it copies, which one read of its revision tells — or,
                // for the first look at a run just claimed or created here,
                // the claim or create itself did (every write of it is fenced
                // by the revision; one made meanwhile by this process's API
                // dropped the copy, one made elsewhere makes the next write
                // miss, like one made just after a read).
                HeldOutcome::Unchanged(stored) if stored.fresh || self.unchanged_since(&stored).await? => {
                    let written = Written {
                        run: stored.run.clone(),
                        revision: stored.revision,
                        wrote: false,
                        events: Vec::new(),
                    };
                    self.held.hold(run_id, Some(Stored { fresh: false, ..stored }));
                    return Ok(written);
                }
                HeldOutcome::Unchanged(_) | HeldOutcome::Missed => {}
            }
        }
        // Read under the row's lock, change, write back.
        let mut tx = self.db.begin().await?;
        let sql = format!("SELECT {COLUMNS} FROM workflow_runs WHERE id = $1{}", self.db.on_postgres(" FOR UPDATE"));
        let row = sqlx::query(AssertSqlSafe(sql)).bind(run_id).fetch_optional(&mut *tx).await?;
        let stored = match row {
            Some(row) => decode(&row)?,
            None => return Err(WorkflowError::RunNotFound(run_id.to_owned())),
        };
        if stored.run.namespace != namespace {
            return Err(WorkflowError::RunNotFound(run_id.to_owned()));
        }
        if fence.is_some() && stored.lease.as_ref() != fence {
            self.held.hold(run_id, None);
            return Err(WorkflowError::LeaseLost(run_id.to_owned()));
        }
        let before = stored.run.clone();
        let mut run = before.clone();
        let slot = match stored.concurrency_limit {
            Some(limit) => {
                self.lock_group(&mut tx, &run).await?;
                self.slot(&mut tx, &run, limit).await?
            }
            None => Slot::Free,
        };
        let mut transition = change(&mut run, slot)?;
        if settle(&stored, &run, &mut transition, now) {
            // Nothing changed: nothing to write, no commit to wait for.
            tx.rollback().await?;
            let revision = stored.revision;
            if fence.is_some() {
                self.held.hold(run_id, Some(stored));
            }
            return Ok(Written { run, revision, wrote: false, events: Vec::new() });
        }
        let events = changes(&before, &run);
        if !events.is_empty() {
            run.updated_at = now;
        }
        let lease = if transition.release { ", lease_owner = NULL, lease_until = NULL" } else { "" };
        let sql = format!(
            "UPDATE workflow_runs SET state = $2, body = $3, updated_at = $4, finished_at = $5, due_at = $6, \
             purge_at = $7, revision = revision + 1{lease} WHERE id = $1"
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(&run.id)
            .bind(run.state.as_str())
            .bind(encode_body(&run.body)?)
            .bind(run.updated_at)
            .bind(run.finished_at)
            .bind(transition.due_at)
            .bind(purge_at(stored.retention, &run, now))
            .execute(&mut *tx)
            .await?;
        let ids = insert_events(&mut tx, &run.id, now, &event_bodies(&run, &events)?).await?;
        if stored.concurrency_limit.is_some() && run.state.is_finished() && !before.state.is_finished() {
            self.wake_next(&mut tx, &run, now).await?;
        }
        tx.commit().await?;
        let revision = if fence.is_some() {
            self.held.hold_written(stored, &run, transition)
        } else {
            // A change from outside the engine (an API call): the engine's
            // copy, if it holds the run, is behind the row now.
            self.held.hold(run_id, None);
            stored.revision + 1
        };
        let events = recorded(&run, events, ids, now);
        Ok(Written { run, revision, wrote: true, events })
    }

    async fn first_statistics(&self, min_runs: i64) -> Result<bool> {
        const TABLES: [&str; 2] = ["workflow_runs", "workflow_run_events"];
        Ok(self.db.analyze_once_filled("workflow_runs", &TABLES, min_runs).await?)
    }

    async fn claim_due(&self, owner: &str, now: i64, lease_until: i64, limit: u32) -> Result<Vec<Claim>> {
        self.claim(owner, now, lease_until, limit).await
    }

    async fn next_due(&self, after: i64) -> Result<Option<i64>> {
        let next = sqlx::query_scalar("SELECT MIN(due_at) FROM workflow_runs WHERE due_at > $1")
            .bind(after)
            .fetch_one(&mut *self.db.read().await?)
            .await?;
        Ok(next)
    }

    async fn adopt(&self, owner: &str, claimed_before: i64, lease_until: i64) -> Result<Vec<Claim>> {
        self.take_back(owner, claimed_before, lease_until).await
    }

    async fn renew(&self, owner: &str, lease_until: i64) -> Result<u64> {
        self.renew_claims(owner, lease_until).await
    }

    async fn events(&self, namespace: &str, run_id: &str, after: i64, limit: u32) -> Result<EventPage> {
        #[derive(serde::Deserialize)]
        struct Body {
            state: RunState,
            change: RunChange,
        }
        // One statement, so the revision and the events come from one snapshot.
        let rows = sqlx::query(
            "SELECT r.namespace, r.revision, e.id, e.body, e.created_at FROM workflow_runs r \
             LEFT JOIN (SELECT id, body, created_at FROM workflow_run_events WHERE run_id = $1 AND id > $2 \
                        ORDER BY id LIMIT $3) e ON 1 = 1 \
             WHERE r.id = $1 ORDER BY e.id",
        )
        .bind(run_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        let mut page = EventPage::default();
        // Every row is the one run's: another namespace's run is no run here.
        if let Some(row) = rows.first()
            && row.try_get::<&str, _>("namespace")? != namespace
        {
            return Ok(page);
        }
        for row in &rows {
            page.revision = Some(row.try_get("revision")?);
            let Some(cursor) = row.try_get::<Option<i64>, _>("id")? else { continue };
            let body: String = row.try_get("body")?;
            let body: Body = serde_json::from_str(&body).map_err(corrupt)?;
            page.events.push(RunEvent {
                cursor,
                run_id: run_id.to_owned(),
                state: body.state,
                change: body.change,
                time: row.try_get("created_at")?,
            });
        }
        Ok(page)
    }

    async fn purge(&self, now: i64) -> Result<u64> {
        let mut tx = self.db.begin().await?;
        sqlx::query(
            "DELETE FROM workflow_run_events WHERE run_id IN (SELECT id FROM workflow_runs WHERE purge_at <= $1)",
        )
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let deleted = sqlx::query("DELETE FROM workflow_runs WHERE purge_at <= $1").bind(now).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(deleted.rows_affected())
    }

    async fn unfinished(&self) -> Result<Vec<Unfinished>> {
        self.count_unfinished().await
    }

    async fn trigger_cursor(&self, namespace: &str) -> Result<Option<TriggerCursor>> {
        self.read_trigger_cursor(namespace).await
    }

    async fn set_trigger_cursor(&self, namespace: &str, cursor: &TriggerCursor) -> Result<()> {
        self.save_trigger_cursor(namespace, cursor).await
    }
}
