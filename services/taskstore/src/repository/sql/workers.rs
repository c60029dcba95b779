//! Workers: claims under a lease, renewals, completion, failure, expiry.

use std::time::Duration;

use super::{
    EventDetail, SqlTaskRepository, apply_status, check_writable, complete_task_view,
    endings::{Ending, end_attempt, hand_back},
    event_payload, record_event,
    rows::{TaskRecord, task_columns},
    tasks::store_artifact,
};
use crate::{
    domain::{
        Artifact, ArtifactChunk, ClaimRequest, Claimed, Completed, EventKind, Expiry, Message, Renewal, Role, Task,
        TaskState, TaskStatus, WorkerLeases, now_micros, repeated_artifact_id,
    },
    error::{Result, TaskStoreError},
};
use chorus_runtime::{storage::Backend, time::micros, validate::FieldViolation};
use sqlx::Row as _;

/// A task worker `$worker` may claim at `$now` (parameters): queued, run by
/// a worker, and past any pause a retry asked for, or one that keeps
/// another worker only from it.
macro_rules! claimable {
    ($now:literal, $worker:literal) => {
        concat!(
            "state = 'submitted' AND run_by_creator = 0 AND (not_before IS NULL OR not_before <= ",
            $now,
            " OR held_from <> ",
            $worker,
            ")"
        )
    };
}

/// Leases up to $8 claimable tasks, skipping rows other claims hold, and
/// records their `status_changed` events ($9: the payload), in one statement.
/// The lease's length ($6 - $3) is kept for the renewals that name none.
/// Each task's lease id is the claim's ($5) and its own id: a write about one
/// task under another's lease is refused.
const CLAIM_AND_LOG_POSTGRES: &str = concat!(
    "WITH claimed AS (UPDATE taskstore_tasks SET state = 'working', status_message = NULL, status_timestamp = $3, \
     worker_id = $4, lease_id = $5 || '.' || id, lease_expires_at = $6, lease_length = $6 - $3, max_retries = $7, \
     attempt = attempt + 1 \
     WHERE (namespace, id) IN (SELECT namespace, id FROM taskstore_tasks \
     WHERE namespace = $1 AND agent_id = $2 AND ",
    claimable!("$3", "$4"),
    " ORDER BY created_at, id LIMIT $8 FOR UPDATE SKIP LOCKED) RETURNING ",
    task_columns!(),
    "), logged AS (INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
     SELECT namespace, id, context_id, agent_id, 'status_changed', $9, $3 FROM claimed) \
     SELECT * FROM claimed"
);
const CLAIM_SQLITE: &str = concat!(
    "UPDATE taskstore_tasks SET state = 'working', status_message = NULL, status_timestamp = $3, worker_id = $4, \
     lease_id = $5 || '.' || id, lease_expires_at = $6, lease_length = $6 - $3, max_retries = $7, \
     attempt = attempt + 1 \
     WHERE (namespace, id) IN (SELECT namespace, id FROM taskstore_tasks \
     WHERE namespace = $1 AND agent_id = $2 AND ",
    claimable!("$3", "$4"),
    " ORDER BY created_at, id LIMIT $8) RETURNING ",
    task_columns!()
);

/// Back to claimable: task $4 of a claim its worker never received. The claim's
/// `working` event stays in the log; the next claim records another.
const RELEASE: &str = "UPDATE taskstore_tasks SET state = 'submitted', status_message = NULL, status_timestamp = $3, \
     worker_id = NULL, lease_id = NULL, lease_expires_at = NULL, attempt = attempt - 1 \
     WHERE namespace = $1 AND lease_id = $2 AND id = $4 AND state = 'working'";

/// The worker's leased tasks of the agent with their lease's end, and one
/// task of the agent claimable at $4 (now) if there is any (without). A
/// worker serving several agents has room for each: its tasks of other
/// agents do not count.
const CLAIM_PRECHECK: &str = concat!(
    "SELECT id, lease_expires_at FROM taskstore_tasks WHERE namespace = $1 AND worker_id = $2 AND agent_id = $3 \
     UNION ALL SELECT id, NULL FROM (SELECT id FROM taskstore_tasks WHERE namespace = $1 AND agent_id = $3 AND ",
    claimable!("$4", "$2"),
    " LIMIT 1) ready"
);

/// Extends a live lease from $4 (now) by $5, or when $5 is NULL by the
/// length it was granted for ($6 when none was kept); a length given is kept
/// for the renewals after it.
const RENEW: &str = "UPDATE taskstore_tasks SET lease_expires_at = $4 + COALESCE($5, lease_length, $6), \
     lease_length = COALESCE($5, lease_length, $6) \
     WHERE namespace = $1 AND id = $2 AND lease_id = $3 AND worker_id IS NOT NULL RETURNING lease_expires_at";

/// Leases expired by $1, oldest first; one that ran out before $3 (the
/// reaper's start) only once its length passed since then. A task has a
/// lease end exactly while it has a worker: `worker_id IS NOT NULL` lets the
/// planner read only the live leases, through `taskstore_tasks_worker`.
macro_rules! expired_leases {
    () => {
        concat!(
            "SELECT ",
            task_columns!(),
            " FROM taskstore_tasks WHERE worker_id IS NOT NULL AND lease_expires_at < $1 \
             AND $1 >= $3 + COALESCE(lease_length, 0) \
             ORDER BY lease_expires_at LIMIT $2"
        )
    };
}
const EXPIRED_POSTGRES: &str = concat!(expired_leases!(), " FOR UPDATE SKIP LOCKED");
const EXPIRED_SQLITE: &str = expired_leases!();

/// The tasks of agent $3 leased to worker $2, live or not.
macro_rules! run_leases {
    () => {
        concat!(
            "SELECT ",
            task_columns!(),
            " FROM taskstore_tasks WHERE namespace = $1 AND worker_id = $2 AND agent_id = $3"
        )
    };
}
/// Waits for a row another writer holds (a reaper expiring it, say), then
/// reads it again: a row that writer took out of the run is not returned.
const RUN_POSTGRES: &str = concat!(run_leases!(), " FOR UPDATE");
const RUN_SQLITE: &str = run_leases!();

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
            .bind(now_micros())
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

    pub(super) async fn release(&self, namespace: &str, task_id: &str, lease_id: &str) -> Result<bool> {
        let released = sqlx::query(RELEASE)
            .bind(namespace)
            .bind(lease_id)
            .bind(now_micros())
            .bind(task_id)
            .execute(&mut *self.db.acquire().await?)
            .await?
            .rows_affected();
        Ok(released > 0)
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
            let mut record = TaskRecord::decode(row)?;
            let (trace_context, lease_id) = (record.trace_context.clone(), record.lease_id.take().unwrap_or_default());
            let task = complete_task_view(&mut conn, record, None, true).await?;
            claimed.push(Claimed { task, lease_id, lease_expires_at: lease.expires_at, trace_context });
        }
        Ok(claimed)
    }

    async fn claim_on_sqlite(&self, request: &ClaimRequest, lease: &Lease<'_>) -> Result<Vec<Claimed>> {
        let mut tx = self.begin().await?;
        let rows = bind_claim(sqlx::query(CLAIM_SQLITE), request, lease).fetch_all(&mut *tx).await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut record = TaskRecord::decode(row)?;
            let (trace_context, lease_id) = (record.trace_context.clone(), record.lease_id.take().unwrap_or_default());
            record_event(&mut tx, &record.task, EventKind::StatusChanged, EventDetail::default()).await?;
            let task = complete_task_view(&mut tx, record, None, true).await?;
            claimed.push(Claimed { task, lease_id, lease_expires_at: lease.expires_at, trace_context });
        }
        tx.commit().await?;
        Ok(claimed)
    }

    /// Extends the lease by `lease`, or by the length it was granted for
    /// (`fallback` for a lease granted before lengths were kept).
    pub(super) async fn renew(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        lease: Option<Duration>,
        fallback: Duration,
    ) -> Result<Renewal> {
        let mut conn = self.db.acquire().await?;
        // Measured after the wait for a connection, which must not eat into the lease.
        let renewed: Option<i64> = sqlx::query_scalar(RENEW)
            .bind(namespace)
            .bind(task_id)
            .bind(lease_id)
            .bind(now_micros())
            .bind(lease.map(micros))
            .bind(micros(fallback))
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(lease_expires_at) = renewed {
            return Ok(Renewal { lease_expires_at, canceled: false });
        }
        let record = super::read_record(&mut conn, namespace, task_id).await?;
        let state = record.task.status.state;
        if state == TaskState::Canceled && record.lease_id.as_deref() == Some(lease_id) {
            return Ok(Renewal { lease_expires_at: 0, canceled: true });
        }
        // A lease that ended with its task, as a worker's last renewal may
        // find it: nothing is lost, the task is done.
        if state.is_terminal() && record.lease_id.as_deref() == Some(lease_id) {
            return Err(TaskStoreError::TaskFinished { task_id: task_id.to_owned(), state });
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
    ) -> Result<Completed> {
        check_completion(message.as_ref(), &artifacts)?;
        let held = self.held.take(namespace, task_id, lease_id);
        if let Some(task) =
            self.complete_at_once(namespace, task_id, lease_id, held, message.as_ref(), &artifacts).await?
        {
            return Ok(Completed { task, now: true });
        }
        // The transaction: the task changed since its claim, or the precise
        // error when it cannot be completed.
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        // A finished task keeps its last lease: this one completed it, with
        // the same final message (none, or one of the same id).
        let final_id = |message: Option<&Message>| message.map(|message| message.message_id.clone());
        let same = final_id(message.as_ref()) == final_id(record.task.status.message.as_ref());
        if record.task.status.state == TaskState::Completed && record.lease_id.as_deref() == Some(lease_id) && same {
            return Ok(Completed { task: complete_task_view(&mut tx, record, None, true).await?, now: false });
        }
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
        Ok(Completed { task, now: true })
    }

    /// Ends the attempt of the task the caller holds under `lease_id`, short
    /// of completing it, as `ending` says.
    pub(super) async fn end_held(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        ending: Ending<'_>,
    ) -> Result<Task> {
        self.held.take(namespace, task_id, lease_id);
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        check_writable(&record, Some(lease_id))?;
        match ending {
            Ending::Failed { reason, retry } => {
                end_attempt(&mut tx, &mut record, reason, retry).await?;
            }
            Ending::HandedBack { reason, back } => hand_back(&mut tx, &mut record, reason, back).await?,
        }
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    /// The queued tasks and the oldest one's creation, read through the
    /// partial index of claimable tasks.
    pub(super) async fn queued(&self) -> Result<(u64, Option<i64>)> {
        let (queued, oldest): (i64, Option<i64>) = sqlx::query_as(
            "SELECT COUNT(*), MIN(created_at) FROM taskstore_tasks WHERE state = 'submitted' AND run_by_creator = 0",
        )
        .fetch_one(&mut *self.db.read().await?)
        .await?;
        Ok((u64::try_from(queued).unwrap_or_default(), oldest))
    }

    pub(super) async fn expire(&self, now: i64, started: i64, limit: u32) -> Result<Vec<Expiry>> {
        let sql = match self.backend() {
            Backend::Postgres => EXPIRED_POSTGRES,
            Backend::Sqlite => EXPIRED_SQLITE,
        };
        let leases = sqlx::query(sql).bind(now).bind(i64::from(limit)).bind(started);
        self.end_leases(leases, "worker lease expired").await
    }

    pub(super) async fn end_run(&self, namespace: &str, worker_id: &str, agent_id: &str) -> Result<Vec<Expiry>> {
        let sql = match self.backend() {
            Backend::Postgres => RUN_POSTGRES,
            Backend::Sqlite => RUN_SQLITE,
        };
        let leases = sqlx::query(sql).bind(namespace).bind(worker_id).bind(agent_id);
        self.end_leases(leases, "worker restarted").await
    }

    /// Ends the attempt of every task `leases` selects (and locks), for
    /// `reason`: each is requeued while its agent's retries last.
    async fn end_leases(
        &self,
        leases: sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments>,
        reason: &str,
    ) -> Result<Vec<Expiry>> {
        let mut tx = self.begin().await?;
        let rows = leases.fetch_all(&mut *tx).await?;
        let mut ended = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut record = TaskRecord::decode(row)?;
            let requeued = end_attempt(&mut tx, &mut record, reason, Some(Duration::ZERO)).await?;
            ended.push(Expiry { task: complete_task_view(&mut tx, record, Some(0), false).await?, requeued });
        }
        tx.commit().await?;
        Ok(ended)
    }
}

/// A completion is the agent's: its final message is no user's, and its
/// artifacts are whole, one per id (two would leave only the last).
fn check_completion(message: Option<&Message>, artifacts: &[Artifact]) -> Result<()> {
    if message.is_some_and(|message| message.role == Role::User) {
        return Err(FieldViolation::new("message.role", "must be ROLE_AGENT: the final message is the agent's").into());
    }
    if let Some(id) = repeated_artifact_id(artifacts) {
        return Err(FieldViolation::new("artifacts", format!("gives artifact {id} twice")).into());
    }
    Ok(())
}
