//! Workers: claims under a lease, renewals, completion, failure, expiry.

use std::{collections::HashSet, sync::LazyLock, time::Duration};

use super::{
    EventDetail, SqlTaskRepository, apply_status, check_writable, complete_task_view, event_payload,
    held::HeldClaim,
    read_record, record_event,
    rows::{TaskRecord, aggregated_parts, decode_parts, task_columns, to_json, to_json_opt},
    set_status,
    tasks::store_artifact,
};
use crate::{
    domain::{
        Artifact, ArtifactChunk, ClaimRequest, Claimed, EventKind, Expiry, Message, Renewal, Role, Task, TaskState,
        TaskStatus, WorkerLeases, now_micros,
    },
    error::{Result, TaskStoreError},
};
use chorus_runtime::{storage::Backend, time::micros};
use sqlx::Row as _;

/// Leases up to $8 claimable tasks, skipping rows other claims hold, and
/// records their `status_changed` events ($9: the payload), in one statement.
const CLAIM_AND_LOG_POSTGRES: &str = concat!(
    "WITH claimed AS (UPDATE taskstore_tasks SET state = 'working', status_message = NULL, status_timestamp = $3, \
     worker_id = $4, lease_id = $5, lease_expires_at = $6, max_retries = $7, attempt = attempt + 1 \
     WHERE (namespace, id) IN (SELECT namespace, id FROM taskstore_tasks \
     WHERE namespace = $1 AND agent_id = $2 AND state = 'submitted' ORDER BY created_at, id LIMIT $8 \
     FOR UPDATE SKIP LOCKED) RETURNING ",
    task_columns!(),
    "), logged AS (INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
     SELECT namespace, id, context_id, agent_id, 'status_changed', $9, $3 FROM claimed) \
     SELECT * FROM claimed"
);
const CLAIM_SQLITE: &str = concat!(
    "UPDATE taskstore_tasks SET state = 'working', status_message = NULL, status_timestamp = $3, worker_id = $4, \
     lease_id = $5, lease_expires_at = $6, max_retries = $7, attempt = attempt + 1 \
     WHERE (namespace, id) IN (SELECT namespace, id FROM taskstore_tasks \
     WHERE namespace = $1 AND agent_id = $2 AND state = 'submitted' ORDER BY created_at, id LIMIT $8) RETURNING ",
    task_columns!()
);

/// Back to claimable: a claim its worker never received. The claim's
/// `working` event stays in the log; the next claim records another.
const RELEASE: &str = "UPDATE taskstore_tasks SET state = 'submitted', status_message = NULL, status_timestamp = $3, \
     worker_id = NULL, lease_id = NULL, lease_expires_at = NULL, attempt = attempt - 1 \
     WHERE namespace = $1 AND lease_id = $2 AND state = 'working'";

/// The worker's leased tasks with their lease's end, and one claimable task
/// of its agent if there is any (without).
const CLAIM_PRECHECK: &str = "SELECT id, lease_expires_at FROM taskstore_tasks WHERE namespace = $1 AND worker_id = $2 \
     UNION ALL SELECT id, NULL FROM (SELECT id FROM taskstore_tasks \
     WHERE namespace = $1 AND agent_id = $3 AND state = 'submitted' LIMIT 1) ready";

/// Completes task $2 when lease $3 holds it and its state may become
/// `completed`: the row ($4 the status message, $5 its time), the message in
/// the history when there is one ($6 = 1), the artifacts with their events
/// when there are any ($9: a JSON list of `{ord, artifact_id, artifact,
/// payload}`), the status event ($7 its payload, logged after the artifacts')
/// and, for an owned task, the owner's completion; returns the row with the
/// history and artifacts as they were. A statement that writes artifacts or a
/// message was written from a read of the row, and completes it only while
/// its status is still that read's ($8 its time). Each shape of completion
/// has its own statement, so PostgreSQL sets up only the tables it writes:
/// `[owned][message][artifacts]`, each index 1 for yes.
static COMPLETE_POSTGRES: LazyLock<[[[String; 2]; 2]; 2]> = LazyLock::new(|| {
    let from: Vec<String> = TaskState::ALL
        .into_iter()
        .filter(|state| state.can_become(TaskState::Completed))
        .map(|state| format!("'{}'", state.as_str()))
        .collect();
    let statement = |owned: bool, message: bool, artifacts: bool| {
        let history = if message {
            "history AS (INSERT INTO taskstore_history (namespace, task_id, position, message) \
             SELECT namespace, id, history_count - 1, $4 FROM done), "
        } else {
            ""
        };
        let (owner, inbox) = if owned {
            (
                "owner_kind IS NOT NULL",
                ", inbox AS (INSERT INTO taskstore_inbox (namespace, owner_kind, owner_id, task_id, parent_task_id, \
                 kind, message, task_state, created_at) SELECT namespace, owner_kind, owner_id, id, parent_id, \
                 'completion', $4, 'completed', $5 FROM done \
                 ON CONFLICT (namespace, task_id) WHERE kind = 'completion' DO NOTHING)",
            )
        } else {
            ("owner_kind IS NULL", "")
        };
        let unchanged = if message || artifacts { " AND status_timestamp = $8" } else { "" };
        let (stored, events) = if artifacts {
            (
                "stored AS (INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) \
                 SELECT done.namespace, done.id, a.artifact_id, a.ord + (SELECT COUNT(*) FROM taskstore_artifacts x \
                 WHERE x.namespace = done.namespace AND x.task_id = done.id), a.artifact \
                 FROM done, json_to_recordset($9::json) AS a(ord int, artifact_id text, artifact text) \
                 ON CONFLICT (namespace, task_id, artifact_id) DO UPDATE SET artifact = excluded.artifact), ",
                "SELECT ord, 'artifact_updated' AS kind, payload FROM json_to_recordset($9::json) \
                 AS a(ord int, payload text) UNION ALL ",
            )
        } else {
            ("", "")
        };
        format!(
            "WITH done AS (UPDATE taskstore_tasks SET state = 'completed', status_message = $4, \
             status_timestamp = $5, worker_id = NULL, lease_expires_at = NULL, history_count = history_count + $6 \
             WHERE namespace = $1 AND id = $2 AND lease_id = $3 AND state IN ({from}) AND {owner}{unchanged} \
             RETURNING {columns}), {history}{stored}\
             event AS (INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, \
             created_at) SELECT done.namespace, done.id, done.context_id, done.agent_id, e.kind, e.payload, $5 \
             FROM done, ({events}SELECT 2147483647, 'status_changed', $7) AS e(ord, kind, payload) \
             ORDER BY e.ord){inbox} \
             SELECT done.*, {parts} FROM done",
            from = from.join(", "),
            columns = task_columns!(),
            parts = aggregated_parts!("done", ""),
        )
    };
    [false, true]
        .map(|owned| [false, true].map(|message| [false, true].map(|artifacts| statement(owned, message, artifacts))))
});

/// One artifact of a one-statement completion (an element of its $9).
#[derive(serde::Serialize)]
struct CompletedArtifact<'a> {
    ord: usize,
    artifact_id: &'a str,
    artifact: String,
    payload: String,
}

/// Whether no two artifacts share an id: one statement cannot write a row twice.
fn distinct_ids(artifacts: &[Artifact]) -> bool {
    let mut seen = HashSet::new();
    artifacts.iter().all(|artifact| seen.insert(artifact.artifact_id.as_str()))
}

/// The artifacts of a completion as its statement's $9, each with the event
/// it logs (carrying the task's `status` before the completion).
fn completed_artifacts(status: &TaskStatus, artifacts: &[Artifact]) -> Result<String> {
    let rows = artifacts
        .iter()
        .enumerate()
        .map(|(ord, artifact)| {
            let detail = EventDetail { artifact: Some(artifact), last_chunk: true, ..EventDetail::default() };
            Ok(CompletedArtifact {
                ord,
                artifact_id: &artifact.artifact_id,
                artifact: to_json(artifact)?,
                payload: event_payload(status, detail)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    to_json(&rows)
}

/// Expired leases, oldest first. A task has a lease end exactly while it has
/// a worker: `worker_id IS NOT NULL` lets the planner read only the live
/// leases, through `taskstore_tasks_worker`.
macro_rules! expired_leases {
    () => {
        concat!(
            "SELECT ",
            task_columns!(),
            " FROM taskstore_tasks WHERE worker_id IS NOT NULL AND lease_expires_at < $1 \
             ORDER BY lease_expires_at LIMIT $2"
        )
    };
}
const EXPIRED_POSTGRES: &str = concat!(expired_leases!(), " FOR UPDATE SKIP LOCKED");
const EXPIRED_SQLITE: &str = expired_leases!();

/// The lease a claim hands out.
struct Lease<'a> {
    id: &'a str,
    expires_at: i64,
    now: i64,
    /// How many tasks it may take.
    slots: i64,
}

/// Binds $1..$8 of a claim statement.
fn bind_claim<'q>(
    query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    request: &'q ClaimRequest,
    lease: &Lease<'q>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    query
        .bind(&request.namespace)
        .bind(&request.agent_id)
        .bind(lease.now)
        .bind(&request.worker_id)
        .bind(lease.id)
        .bind(lease.expires_at)
        .bind(i64::from(request.max_retries))
        .bind(lease.slots)
}

impl SqlTaskRepository {
    /// One read outside any transaction: most claim attempts (a worker at
    /// capacity, or nothing to do) end with it, without BEGIN and ROLLBACK.
    pub(super) async fn leases(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<WorkerLeases> {
        let rows = sqlx::query(CLAIM_PRECHECK)
            .bind(namespace)
            .bind(worker_id)
            .bind(agent_id)
            .fetch_all(&mut *self.db.read().await?)
            .await?;
        let mut leases = WorkerLeases::default();
        for row in &rows {
            match row.try_get::<Option<i64>, _>("lease_expires_at")? {
                Some(until) => leases.active.push((row.try_get("id")?, until)),
                None => leases.ready = true,
            }
        }
        Ok(leases)
    }

    pub(super) async fn claim(&self, request: &ClaimRequest, slots: u32) -> Result<Vec<Claimed>> {
        if slots == 0 {
            return Ok(Vec::new());
        }
        let now = now_micros();
        let lease_id = uuid::Uuid::new_v4().to_string();
        let lease_expires_at = now.saturating_add(micros(request.lease));
        let lease = Lease { id: &lease_id, expires_at: lease_expires_at, now, slots: i64::from(slots) };
        let mut claimed = match self.backend() {
            Backend::Postgres => self.claim_on_postgres(request, &lease).await?,
            Backend::Sqlite => self.claim_on_sqlite(request, &lease).await?,
        };
        claimed.sort_by(|a, b| (a.task.created_at, &a.task.id).cmp(&(b.task.created_at, &b.task.id)));
        for claim in &claimed {
            self.held.hold(&claim.task, &claim.lease_id);
        }
        Ok(claimed)
    }

    pub(super) async fn release(&self, namespace: &str, lease_id: &str) -> Result<u64> {
        let released = sqlx::query(RELEASE)
            .bind(namespace)
            .bind(lease_id)
            .bind(now_micros())
            .execute(&mut *self.db.acquire().await?)
            .await?
            .rows_affected();
        Ok(released)
    }

    /// One statement leases the tasks and records their events; the tasks'
    /// history is read after it (they are ours now).
    async fn claim_on_postgres(&self, request: &ClaimRequest, lease: &Lease<'_>) -> Result<Vec<Claimed>> {
        let working = TaskStatus { state: TaskState::Working, message: None, timestamp: lease.now };
        let payload = event_payload(&working, EventDetail::default())?;
        let mut conn = self.db.acquire().await?;
        let rows =
            bind_claim(sqlx::query(CLAIM_AND_LOG_POSTGRES), request, lease).bind(payload).fetch_all(&mut *conn).await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            let record = TaskRecord::decode(row)?;
            let trace_context = record.trace_context.clone();
            let task = complete_task_view(&mut conn, record, None, true).await?;
            claimed.push(Claimed {
                task,
                lease_id: lease.id.to_owned(),
                lease_expires_at: lease.expires_at,
                trace_context,
            });
        }
        Ok(claimed)
    }

    async fn claim_on_sqlite(&self, request: &ClaimRequest, lease: &Lease<'_>) -> Result<Vec<Claimed>> {
        let mut tx = self.begin().await?;
        let rows = bind_claim(sqlx::query(CLAIM_SQLITE), request, lease).fetch_all(&mut *tx).await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            let record = TaskRecord::decode(row)?;
            let trace_context = record.trace_context.clone();
            record_event(&mut tx, &record.task, EventKind::StatusChanged, EventDetail::default()).await?;
            let task = complete_task_view(&mut tx, record, None, true).await?;
            claimed.push(Claimed {
                task,
                lease_id: lease.id.to_owned(),
                lease_expires_at: lease.expires_at,
                trace_context,
            });
        }
        tx.commit().await?;
        Ok(claimed)
    }

    pub(super) async fn renew(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        lease: Duration,
    ) -> Result<Renewal> {
        let mut conn = self.db.acquire().await?;
        // Measured after the wait for a connection, which must not eat into the lease.
        let lease_expires_at = now_micros().saturating_add(micros(lease));
        let renewed = sqlx::query(
            "UPDATE taskstore_tasks SET lease_expires_at = $4 WHERE namespace = $1 AND id = $2 AND lease_id = $3 \
             AND worker_id IS NOT NULL",
        )
        .bind(namespace)
        .bind(task_id)
        .bind(lease_id)
        .bind(lease_expires_at)
        .execute(&mut *conn)
        .await?;
        if renewed.rows_affected() == 1 {
            return Ok(Renewal { lease_expires_at, canceled: false });
        }
        let record = super::read_record(&mut conn, namespace, task_id).await?;
        if record.task.status.state == TaskState::Canceled && record.lease_id.as_deref() == Some(lease_id) {
            return Ok(Renewal { lease_expires_at: 0, canceled: true });
        }
        Err(TaskStoreError::LeaseLost { task_id: task_id.to_owned(), lease_id: lease_id.to_owned() })
    }

    pub(super) async fn complete(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        message: Option<Message>,
        artifacts: Vec<Artifact>,
    ) -> Result<Task> {
        let held = self.held.take(namespace, task_id, lease_id);
        if self.backend() == Backend::Postgres
            && distinct_ids(&artifacts)
            && let Some(task) =
                self.complete_in_one_statement(namespace, task_id, lease_id, held, message.as_ref(), &artifacts).await?
        {
            return Ok(task);
        }
        // The transaction: what the statement cannot do (SQLite, an artifact
        // id given twice), or the precise error when it completed nothing.
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        check_writable(&record, Some(lease_id))?;
        for artifact in artifacts {
            let chunk = ArtifactChunk { artifact, append: false, last_chunk: true, lease_id: None };
            store_artifact(&mut tx, &record, &chunk).await?;
            let detail = EventDetail { artifact: Some(&chunk.artifact), last_chunk: true, ..EventDetail::default() };
            record_event(&mut tx, &record.task, EventKind::ArtifactUpdated, detail).await?;
        }
        apply_status(&mut tx, &mut record, TaskState::Completed, message).await?;
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    /// Completes a task whose lease the caller holds in one statement,
    /// which also records the artifacts, the events and the owner's
    /// completion and returns the task whole. A message or artifacts need
    /// what the claim left in the row (its context, the status the artifacts'
    /// events carry): remembered from the claim when it was made here, else
    /// read first; the statement then completes the task only if that status
    /// still holds. `None` when it completed nothing: the task is finished,
    /// leased to someone else, or changed since (or, unread, not there).
    async fn complete_in_one_statement(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        held: Option<HeldClaim>,
        message: Option<&Message>,
        artifacts: &[Artifact],
    ) -> Result<Option<Task>> {
        let mut conn = self.db.acquire().await?;
        let read = match held {
            _ if message.is_none() && artifacts.is_empty() => None,
            Some(held) => Some(held),
            None => {
                let record = read_record(&mut conn, namespace, task_id).await?;
                Some(HeldClaim { context_id: record.task.context_id, status: record.task.status })
            }
        };
        let message = match (message, &read) {
            // A message is stored bound to its task's context, which never changes.
            (Some(message), Some(read)) => Some(message.clone().bound_to(task_id, &read.context_id)),
            _ => None,
        };
        let stored = match &read {
            Some(read) if !artifacts.is_empty() => Some(completed_artifacts(&read.status, artifacts)?),
            _ => None,
        };
        let status = TaskStatus { state: TaskState::Completed, message, timestamp: now_micros() };
        let message_json = to_json_opt(status.message.as_ref())?;
        let payload = event_payload(&status, EventDetail::default())?;
        // Most completed tasks have no owner: try that statement first, then
        // the one that also writes the owner's inbox.
        let with_message = status.message.is_some();
        let mut found = None;
        for statements in COMPLETE_POSTGRES.iter() {
            let statement = &statements[usize::from(with_message)][usize::from(stored.is_some())];
            let mut query = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                .bind(namespace)
                .bind(task_id)
                .bind(lease_id)
                .bind(message_json.as_deref())
                .bind(status.timestamp)
                .bind(i64::from(with_message))
                .bind(payload.as_str());
            if let Some(read) = &read {
                query = query.bind(read.status.timestamp);
            }
            if let Some(stored) = &stored {
                query = query.bind(stored.as_str());
            }
            found = query.fetch_optional(&mut *conn).await?;
            if found.is_some() {
                break;
            }
        }
        let Some(row) = found else { return Ok(None) };
        let record = TaskRecord::decode(&row)?;
        // The statement read the history and artifacts as they were before
        // its own writes.
        let (mut history, mut stored_before) = decode_parts(&row)?;
        history.extend(status.message);
        if i64::try_from(history.len()) != Ok(record.history_count) {
            // A message added while the statement waited for the row.
            return Ok(Some(complete_task_view(&mut conn, record, None, true).await?));
        }
        for artifact in artifacts {
            match stored_before.iter_mut().find(|stored| stored.artifact_id == artifact.artifact_id) {
                Some(stored) => *stored = artifact.clone(),
                None => stored_before.push(artifact.clone()),
            }
        }
        Ok(Some(Task { history, artifacts: stored_before, ..record.task }))
    }

    pub(super) async fn fail(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        reason: &str,
        retry: bool,
    ) -> Result<Task> {
        self.held.take(namespace, task_id, lease_id);
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        check_writable(&record, Some(lease_id))?;
        end_attempt(&mut tx, &mut record, reason, retry).await?;
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    pub(super) async fn expire(&self, now: i64, limit: u32) -> Result<Vec<Expiry>> {
        let sql = match self.backend() {
            Backend::Postgres => EXPIRED_POSTGRES,
            Backend::Sqlite => EXPIRED_SQLITE,
        };
        let mut tx = self.begin().await?;
        let rows = sqlx::query(sql).bind(now).bind(i64::from(limit)).fetch_all(&mut *tx).await?;
        let mut expired = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut record = TaskRecord::decode(row)?;
            let requeued = end_attempt(&mut tx, &mut record, "worker lease expired", true).await?;
            expired.push(Expiry { task: complete_task_view(&mut tx, record, Some(0), false).await?, requeued });
        }
        tx.commit().await?;
        Ok(expired)
    }
}

/// Ends a worker's attempt: back to `submitted` when `retry` is asked and the
/// agent's retries last, else `failed` with `reason`. Returns whether requeued.
async fn end_attempt(
    conn: &mut sqlx::AnyConnection,
    record: &mut TaskRecord,
    reason: &str,
    retry: bool,
) -> Result<bool> {
    let requeue = retry && record.task.attempt <= record.max_retries;
    let text = if requeue {
        format!("{reason}; requeued after attempt {} of {}", record.task.attempt, record.max_retries + 1)
    } else {
        reason.to_owned()
    };
    let message = Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text);
    if requeue {
        // Requeueing is the store's own move, outside the A2A state machine.
        set_status(conn, record, TaskState::Submitted, Some(message)).await?;
    } else {
        apply_status(conn, record, TaskState::Failed, Some(message)).await?;
    }
    Ok(requeue)
}
