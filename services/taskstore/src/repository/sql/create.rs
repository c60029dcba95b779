//! Creating a task: its row, first message and events (and, for a task
//! handed to a worker or answered at once, what that changed) in one write.

use std::sync::LazyLock;

use chorus_runtime::{
    storage::{Backend, TransactionScript},
    time::micros,
};
use sqlx::{AnyConnection, Row as _};

use super::{
    EventDetail, SqlTaskRepository, Tx, complete_task_view,
    completion::completed_artifacts,
    event_payload, rows,
    rows::{TaskRecord, task_columns, to_json, to_json_opt},
};
use crate::{
    domain::{
        Created, Handoff, Message, NewTask, Owner, PushLease, SpawnContext, Task, TaskAnswer, TaskState, TaskStatus,
        prompt_fingerprint,
    },
    error::{Result, TaskStoreError},
};

/// Everything a new task row needs.
pub(super) struct TaskInsert<'a> {
    pub(super) id: &'a str,
    pub(super) namespace: &'a str,
    pub(super) agent_id: &'a str,
    pub(super) context_id: String,
    pub(super) message: &'a Message,
    pub(super) metadata: Option<&'a crate::domain::JsonObject>,
    pub(super) parent_id: Option<&'a str>,
    pub(super) owner: Option<&'a Owner>,
    pub(super) depth: u32,
    pub(super) spawn_context: SpawnContext,
    pub(super) trace_context: &'a std::collections::HashMap<String, String>,
    /// Creates with the same key in a namespace make one task.
    pub(super) request_key: &'a str,
    /// The lease of the worker that takes the new task at once, if any.
    pub(super) handoff: Option<&'a Handoff>,
    /// The agent's answer, which settles the task as it is made.
    pub(super) answer: Option<&'a TaskAnswer>,
    /// The gateway that follows the new task's turn from the start.
    pub(super) follow: Option<&'a PushLease>,
    /// Its creator runs its turns, not a worker.
    pub(super) run_by_creator: bool,
}

/// What a create or spawn asks for under its request key (its first
/// message's id, or a create's idempotency key).
pub(super) struct Request<'a> {
    pub(super) namespace: &'a str,
    pub(super) key: &'a str,
    pub(super) agent_id: &'a str,
    pub(super) parent_id: Option<&'a str>,
    pub(super) message: &'a Message,
}

/// The task an earlier request under this one's key made, if any, when this
/// one is a retry of it; a different request under the key is
/// [`RequestKeyInUse`](TaskStoreError::RequestKeyInUse).
pub(super) async fn find_by_request(conn: &mut AnyConnection, request: &Request<'_>) -> Result<Option<Task>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        task_columns!(),
        " FROM taskstore_tasks WHERE namespace = $1 AND request_message_id = $2"
    ))
    .bind(request.namespace)
    .bind(request.key)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let task = complete_task_view(conn, TaskRecord::decode(&row)?, None, true).await?;
    retry_of(task, request).map(Some)
}

/// `task`, made under the request's key, if the request asks for what it was
/// made for: the same agent, below the same parent (or none), with the same
/// first message, whatever that message's id (under an idempotency key a
/// retry need not repeat it).
fn retry_of(task: Task, request: &Request<'_>) -> Result<Task> {
    let mismatch = if task.agent_id != request.agent_id {
        format!("is for agent {}", task.agent_id)
    } else if task.parent_id.as_deref() != request.parent_id {
        task.parent_id
            .as_ref()
            .map_or_else(|| "is not a subtask".to_owned(), |parent| format!("is a subtask of {parent}"))
    } else if !same_first_message(&task, request.message)? {
        "began with another message".to_owned()
    } else {
        return Ok(task);
    };
    Err(TaskStoreError::RequestKeyInUse { key: request.key.to_owned(), task_id: task.id, mismatch })
}

/// Whether the task's first message says what `message` says: its role and
/// parts (its id and metadata aside: a retry may describe itself anew),
/// compared as stored.
fn same_first_message(task: &Task, message: &Message) -> Result<bool> {
    let Some(first) = task.history.first() else {
        return Ok(false);
    };
    let asked = rows::as_stored(message)?;
    Ok(asked.role == first.role && asked.parts == first.parts)
}

/// Inserts a task with its first message and records `created`: in
/// `submitted`; with a handoff, already `working` under its lease; with an
/// answer, settled in the answer's state with its artifacts and message.
/// Each change is logged as a lone write would have logged it, in the order
/// a turn would have made it. `None`: a task with the same request key
/// exists already.
pub(super) async fn insert_task(writer: Writer<'_>, insert: TaskInsert<'_>) -> Result<Option<Task>> {
    let now = crate::domain::now_micros();
    let id = insert.id.to_owned();
    let first_message = insert.message.clone().bound_to(&id, &insert.context_id)?;
    let history = to_json(&first_message)?;
    let mut task = Task {
        namespace: insert.namespace.to_owned(),
        id,
        context_id: insert.context_id.clone(),
        agent_id: insert.agent_id.to_owned(),
        status: TaskStatus { state: TaskState::Submitted, message: None, timestamp: now },
        artifacts: Vec::new(),
        history: vec![first_message],
        metadata: insert.metadata.cloned(),
        parent_id: insert.parent_id.map(str::to_owned),
        owner: insert.owner.cloned(),
        depth: insert.depth,
        spawn_context: insert.spawn_context,
        attempt: 0,
        created_at: now,
    };
    let detail = EventDetail { message: task.history.first(), ..EventDetail::default() };
    let payload = event_payload(&task.status, detail)?;
    let handoff = insert.handoff;
    if handoff.is_some() {
        task.status = TaskStatus { state: TaskState::Working, message: None, timestamp: now };
        task.attempt = 1;
    }
    let mut stored = None;
    if let Some(answer) = insert.answer {
        if !answer.artifacts.is_empty() {
            // Each artifact's event carries the status it was added in.
            stored = Some(completed_artifacts(&task.status, &answer.artifacts)?);
        }
        let message = answer.message.clone().map(|message| message.bound_to(&task.id, &task.context_id)).transpose()?;
        task.history.extend(message.clone());
        task.artifacts.clone_from(&answer.artifacts);
        task.status = TaskStatus { state: answer.state, message, timestamp: now };
    }
    // A task handed off or answered left `submitted` as it was made: that
    // change is its last event.
    let changed = (task.status.state != TaskState::Submitted)
        .then(|| event_payload(&task.status, EventDetail::default()))
        .transpose()?;
    let shape = usize::from(stored.is_some());
    let backend = match &writer {
        Writer::In(_, backend) => *backend,
        Writer::OwnTransaction(db) => db.backend(),
    };
    let query = match (&writer, backend) {
        (_, Backend::Postgres) => sqlx::query(INSERT_TASK_POSTGRES[shape].as_str()),
        (Writer::In(..), Backend::Sqlite) => sqlx::query(INSERT_TASK_SQLITE[shape].as_str()),
        (Writer::OwnTransaction(_), Backend::Sqlite) => INSERT_TASK_SCRIPT[shape].query(),
    };
    // One round trip writes the task, its history, artifacts and events.
    let query = query
        .bind(insert.namespace)
        .bind(&task.id)
        .bind(&insert.context_id)
        .bind(insert.agent_id)
        .bind(task.status.state.as_str())
        .bind(now)
        .bind(rows::metadata_json(insert.metadata)?)
        .bind(insert.parent_id)
        .bind(insert.owner.map(|owner| owner.kind.as_str()))
        .bind(insert.owner.map(|owner| owner.id.as_str()))
        .bind(i64::from(insert.depth))
        .bind(insert.spawn_context.as_str())
        .bind(prompt_fingerprint(insert.agent_id, &insert.message.joined_text()))
        .bind(insert.request_key)
        .bind(to_json(insert.trace_context)?)
        .bind(now)
        .bind(handoff.map(|handoff| handoff.worker_id.as_str()))
        .bind(handoff.map(|handoff| handoff.lease_id.as_str()))
        .bind(handoff.map(|handoff| handoff.lease_expires_at))
        .bind(i64::from(task.attempt))
        .bind(i64::from(handoff.map_or(0, |handoff| handoff.max_retries)))
        .bind(history)
        .bind(payload)
        .bind(changed)
        .bind(to_json_opt(task.status.message.as_ref())?)
        .bind(handoff.map(|handoff| micros(handoff.lease)))
        .bind(insert.follow.map(|lease| lease.follower.as_str()))
        .bind(insert.follow.map(|lease| lease.until))
        .bind(i64::from(insert.run_by_creator));
    let query = match stored {
        Some(stored) => query.bind(stored),
        None => query,
    };
    // Every statement's results: sqlx stops a script at its first result, a
    // row or not, when asked for one row only.
    let rows = match (writer, backend) {
        (Writer::In(conn, _), _) => query.fetch_all(conn).await?,
        (Writer::OwnTransaction(db), Backend::Postgres) => db.run_grouped(query).await?,
        (Writer::OwnTransaction(db), Backend::Sqlite) => {
            db.run_transaction_script(&INSERT_TASK_SCRIPT[shape], query).await?
        }
    };
    let inserted: i64 = rows.last().map(|row| row.try_get("inserted")).transpose()?.unwrap_or(0);
    Ok((inserted != 0).then_some(task))
}

/// A new task row; $1..$21, $25 (its status message), $26 (its lease's
/// length), $27, $28 (who follows its turn, until when) and $29 (whether its
/// creator runs it) as bound in [`insert_task`].
macro_rules! insert_task_row {
    () => {
        "INSERT INTO taskstore_tasks (namespace, id, context_id, agent_id, state, status_timestamp, metadata, \
         parent_id, owner_kind, owner_id, depth, spawn_context, prompt_fingerprint, request_message_id, \
         trace_context, history_count, created_at, worker_id, lease_id, lease_expires_at, attempt, max_retries, \
         status_message, lease_length, turn_follower, turn_follower_until, run_by_creator) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
         CASE WHEN $25 IS NULL THEN 1 ELSE 2 END, $16, $17, $18, $19, $20, $21, $25, $26, $27, $28, $29) \
         ON CONFLICT (namespace, request_message_id) DO NOTHING"
    };
}

/// The task row; its history: the first message ($22), then the status
/// message ($25) when there is one; its events: `created` ($23), then, in
/// the second form, the artifacts' (with the artifacts themselves, $30 as
/// [`completed_artifacts`] makes it), then `status_changed` ($24) when the
/// task left `submitted` as it was made.
static INSERT_TASK_POSTGRES: LazyLock<[String; 2]> = LazyLock::new(|| {
    [false, true].map(|artifacts| {
        let (stored, artifact_events) = if artifacts {
            (
                "stored AS (INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) \
                 SELECT namespace, id, a.artifact_id, a.ord, a.artifact \
                 FROM task, json_to_recordset($30::json) AS a(ord int, artifact_id text, artifact text)), ",
                "SELECT ord, 'artifact_updated', payload FROM json_to_recordset($30::json) AS a(ord int, payload text) \
                 UNION ALL ",
            )
        } else {
            ("", "")
        };
        format!(
            "WITH task AS ({row} RETURNING namespace, id, context_id, agent_id, created_at), \
             history AS (INSERT INTO taskstore_history (namespace, task_id, position, message) \
             SELECT namespace, id, 0, $22 FROM task \
             UNION ALL SELECT namespace, id, 1, $25 FROM task WHERE $25 IS NOT NULL), {stored}\
             event AS (INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, \
             created_at) SELECT task.namespace, task.id, task.context_id, task.agent_id, e.kind, e.payload, \
             task.created_at FROM task, (SELECT -1, 'created', $23 UNION ALL {artifact_events}\
             SELECT 2147483647, 'status_changed', $24 WHERE $24 IS NOT NULL) AS e(ord, kind, payload) \
             ORDER BY e.ord) \
             SELECT COUNT(*) AS inserted FROM task",
            row = insert_task_row!(),
        )
    })
});

/// Where [`insert_task`] writes: in a transaction the caller holds, or in
/// one of its own or of the batch it waits in: on PostgreSQL as one
/// statement (see [`Db::run_grouped`](chorus_runtime::storage::Db::run_grouped)),
/// on SQLite as a script that lands whole (see
/// [`Db::run_transaction_script`](chorus_runtime::storage::Db::run_transaction_script)).
pub(super) enum Writer<'c> {
    In(&'c mut AnyConnection, Backend),
    OwnTransaction(&'c chorus_runtime::storage::Db),
}

/// What [`INSERT_TASK_POSTGRES`] writes, as a SQLite script: each insert
/// after the row's finds it by its new id, which exists only if the row went
/// in (a repeated request key inserts nothing).
static INSERT_TASK_SQLITE: LazyLock<[String; 2]> = LazyLock::new(|| {
    [false, true].map(|artifacts| {
        let (stored, artifact_events) = if artifacts {
            (
                "INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) \
                 SELECT t.namespace, t.id, a.value ->> 'artifact_id', a.value ->> 'ord', a.value ->> 'artifact' \
                 FROM taskstore_tasks t, json_each($30) a WHERE t.namespace = $1 AND t.id = $2; ",
                "SELECT a.value ->> 'ord', 'artifact_updated', a.value ->> 'payload' FROM json_each($30) a UNION ALL ",
            )
        } else {
            ("", "")
        };
        format!(
            "{row}; INSERT INTO taskstore_history (namespace, task_id, position, message) \
             SELECT namespace, id, 0, $22 FROM taskstore_tasks WHERE namespace = $1 AND id = $2 \
             UNION ALL SELECT namespace, id, 1, $25 FROM taskstore_tasks \
             WHERE namespace = $1 AND id = $2 AND $25 IS NOT NULL; {stored}\
             INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
             SELECT t.namespace, t.id, t.context_id, t.agent_id, e.kind, e.payload, t.created_at \
             FROM taskstore_tasks t, (SELECT -1 AS ord, 'created' AS kind, $23 AS payload UNION ALL \
             {artifact_events}SELECT 2147483647, 'status_changed', $24 WHERE $24 IS NOT NULL) e \
             WHERE t.namespace = $1 AND t.id = $2 ORDER BY e.ord; \
             SELECT COUNT(*) AS inserted FROM taskstore_tasks WHERE namespace = $1 AND id = $2",
            row = insert_task_row!(),
        )
    })
});

/// The create's script in a transaction of its own, or of the batch it waits in.
static INSERT_TASK_SCRIPT: LazyLock<[TransactionScript; 2]> =
    LazyLock::new(|| INSERT_TASK_SQLITE.each_ref().map(|sql| TransactionScript::new(sql)));

impl SqlTaskRepository {
    pub(super) async fn create(
        &self,
        id: &str,
        new: NewTask,
        handoff: Option<Handoff>,
        follow: Option<PushLease>,
    ) -> Result<Created> {
        let request = Request {
            namespace: &new.namespace,
            key: new.idempotency_key.as_deref().unwrap_or(&new.message.message_id),
            agent_id: &new.agent_id,
            parent_id: None,
            message: &new.message,
        };
        let insert = TaskInsert {
            id,
            namespace: &new.namespace,
            agent_id: &new.agent_id,
            context_id: (new.context_id.clone().or_else(|| new.message.context_id.clone()))
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            message: &new.message,
            metadata: new.metadata.as_ref(),
            parent_id: None,
            owner: None,
            depth: 0,
            spawn_context: new.spawn_context,
            trace_context: &new.trace_context,
            request_key: request.key,
            handoff: handoff.as_ref(),
            answer: new.answer.as_ref(),
            follow: follow.as_ref(),
            run_by_creator: new.run_by_creator,
        };
        // One round trip: on PostgreSQL a statement, on SQLite a script, in
        // a transaction of its own or of the batch it waits in.
        let inserted = insert_task(Writer::OwnTransaction(&self.db), insert).await?;
        let Some(task) = inserted else {
            let task = self.existing(&request).await?;
            if let Some(lease) = follow.filter(|_| !task.status.state.is_terminal()) {
                self.follow(&task.namespace, &task.id, Some(&lease)).await?;
            }
            return Ok(Created { task, handed_off: false });
        };
        if let Some(handoff) = &handoff {
            self.held.hold(&task, &handoff.lease_id);
        }
        Ok(Created { task, handed_off: handoff.is_some() })
    }

    /// Commits a transaction that inserted a task, or, when an earlier
    /// request under the same key made one, returns that one if this request
    /// is a retry of it.
    pub(super) async fn commit_insert(&self, tx: Tx, inserted: Option<Task>, request: &Request<'_>) -> Result<Task> {
        if let Some(task) = inserted {
            tx.commit().await?;
            return Ok(task);
        }
        // Release the connection first: SQLite has only one.
        drop(tx);
        self.existing(request).await
    }

    /// The task an earlier request under this one's key made, if this one
    /// is a retry of it.
    async fn existing(&self, request: &Request<'_>) -> Result<Task> {
        let mut conn = self.db.read().await?;
        find_by_request(&mut conn, request).await?.ok_or_else(|| TaskStoreError::TaskNotFound(request.key.to_owned()))
    }
}
