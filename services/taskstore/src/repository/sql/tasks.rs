//! Tasks: create, read, list, converse, move through states, artifacts, cancel.

use std::sync::LazyLock;

use chorus_runtime::storage::{Backend, TransactionScript};
use sqlx::{AnyConnection, Row as _};

use super::{
    EventDetail, SqlTaskRepository, Tx, append_history, apply_status, check_writable, complete_task_view,
    event_payload, record_event, rows,
    rows::{TaskRecord, aggregated_parts, task_columns, to_json, to_json_opt},
    save, set_status,
};
use crate::{
    domain::{
        Artifact, ArtifactChunk, Created, EventKind, Handoff, Message, NewTask, Owner, Role, SpawnContext,
        StatusUpdate, Task, TaskAnswer, TaskPage, TaskQuery, TaskState, TaskStatus, prompt_fingerprint,
    },
    error::{Result, TaskStoreError},
};

/// The filters of a task listing: $1 namespace, $2 context, $3 state, $4 agent,
/// $5 updated-after; empty strings match everything.
macro_rules! list_filters {
    () => {
        "namespace = $1 AND ($2 = '' OR context_id = $2) AND ($3 = '' OR state = $3) \
         AND ($4 = '' OR agent_id = $4) AND status_timestamp >= $5"
    };
}

/// Task $2 with the last $3 messages of its history and its artifacts.
const GET_WHOLE: &str = concat!(
    "SELECT ",
    task_columns!(),
    ", ",
    aggregated_parts!("t", " AND h.position >= t.history_count - $3"),
    " FROM taskstore_tasks t WHERE t.namespace = $1 AND t.id = $2"
);

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
}

/// The task a create with this first message id already made, if any.
pub(super) async fn find_by_request(
    conn: &mut AnyConnection,
    namespace: &str,
    message_id: &str,
) -> Result<Option<Task>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        task_columns!(),
        " FROM taskstore_tasks WHERE namespace = $1 AND request_message_id = $2"
    ))
    .bind(namespace)
    .bind(message_id)
    .fetch_optional(&mut *conn)
    .await?;
    match row {
        Some(row) => Ok(Some(complete_task_view(conn, TaskRecord::decode(&row)?, None, true).await?)),
        None => Ok(None),
    }
}

/// A change an insert logs: its kind, and its payload as a lone write would
/// have logged it.
#[derive(serde::Serialize)]
struct Logged {
    kind: &'static str,
    payload: String,
}

impl Logged {
    fn new(kind: EventKind, status: &TaskStatus, detail: EventDetail<'_>) -> Result<Self> {
        Ok(Self { kind: kind.as_str(), payload: event_payload(status, detail)? })
    }
}

/// An artifact an insert stores (an element of its $26).
#[derive(serde::Serialize)]
struct StoredArtifact<'a> {
    artifact_id: &'a str,
    artifact: String,
}

/// Inserts a task with its first message and records `created`: in
/// `submitted`; with a handoff, already `working` under its lease (that
/// change logged too); with an answer, settled in the answer's state, with
/// its artifacts and message, each change logged in the order a turn would
/// have made it. `None`: a task with the same request key exists already.
pub(super) async fn insert_task(writer: Writer<'_>, insert: TaskInsert<'_>) -> Result<Option<Task>> {
    let now = crate::domain::now_micros();
    let id = insert.id.to_owned();
    let first_message = insert.message.clone().bound_to(&id, &insert.context_id);
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
    let created = EventDetail { message: task.history.first(), ..EventDetail::default() };
    let mut logged = vec![Logged::new(EventKind::Created, &task.status, created)?];
    let handoff = insert.handoff;
    if handoff.is_some() {
        // A handed-off task is claimed from the start: the row says so, and
        // the claim is its second event.
        task.status = TaskStatus { state: TaskState::Working, message: None, timestamp: now };
        task.attempt = 1;
        logged.push(Logged::new(EventKind::StatusChanged, &task.status, EventDetail::default())?);
    }
    if let Some(answer) = insert.answer {
        for artifact in &answer.artifacts {
            let detail = EventDetail { artifact: Some(artifact), last_chunk: true, ..EventDetail::default() };
            logged.push(Logged::new(EventKind::ArtifactUpdated, &task.status, detail)?);
        }
        let message = answer.message.clone().map(|message| message.bound_to(&task.id, &task.context_id));
        task.history.extend(message.clone());
        task.artifacts.clone_from(&answer.artifacts);
        task.status = TaskStatus { state: answer.state, message, timestamp: now };
        logged.push(Logged::new(EventKind::StatusChanged, &task.status, EventDetail::default())?);
    }
    let history = task.history.iter().map(to_json).collect::<Result<Vec<_>>>()?;
    let artifacts = task
        .artifacts
        .iter()
        .map(|artifact| Ok(StoredArtifact { artifact_id: &artifact.artifact_id, artifact: to_json(artifact)? }))
        .collect::<Result<Vec<_>>>()?;
    let with_artifacts = usize::from(!artifacts.is_empty());
    let query = match &writer {
        Writer::In(_, Backend::Postgres) => sqlx::query(INSERT_TASK_POSTGRES[with_artifacts].as_str()),
        Writer::In(_, Backend::Sqlite) => sqlx::query(INSERT_TASK_SQLITE[with_artifacts].as_str()),
        Writer::OwnTransaction(_) => INSERT_TASK_SCRIPT[with_artifacts].query(),
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
        .bind(to_json(&history)?)
        .bind(to_json(&logged)?)
        .bind(to_json_opt(task.status.message.as_ref())?)
        .bind(i64::try_from(task.history.len()).unwrap_or(i64::MAX));
    let query = if artifacts.is_empty() { query } else { query.bind(to_json(&artifacts)?) };
    // Every statement's results: sqlx stops a script at its first result, a
    // row or not, when asked for one row only.
    let rows = match writer {
        Writer::In(conn, _) => query.fetch_all(conn).await?,
        Writer::OwnTransaction(db) => db.run_transaction_script(&INSERT_TASK_SCRIPT[with_artifacts], query).await?,
    };
    let inserted: i64 = rows.last().map(|row| row.try_get("inserted")).transpose()?.unwrap_or(0);
    Ok((inserted != 0).then_some(task))
}

/// A new task row; $1..$21, $24 and $25 as bound in [`insert_task`].
macro_rules! insert_task_row {
    () => {
        "INSERT INTO taskstore_tasks (namespace, id, context_id, agent_id, state, status_timestamp, metadata, \
         parent_id, owner_kind, owner_id, depth, spawn_context, prompt_fingerprint, request_message_id, \
         trace_context, history_count, created_at, worker_id, lease_id, lease_expires_at, attempt, max_retries, \
         status_message) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $25, $16, $17, $18, $19, $20, $21, \
         $24) ON CONFLICT (namespace, request_message_id) DO NOTHING"
    };
}

/// The task row, its history ($22: a JSON list of messages, each as JSON
/// text), its events ($23: a JSON list of `{kind, payload}`, logged in that
/// order) and, in the second form, its artifacts ($26: a JSON list of
/// `{artifact_id, artifact}`).
static INSERT_TASK_POSTGRES: LazyLock<[String; 2]> = LazyLock::new(|| {
    [false, true].map(|artifacts| {
        let stored = if artifacts {
            "stored AS (INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) \
             SELECT namespace, id, a.value ->> 'artifact_id', a.ord - 1, a.value ->> 'artifact' \
             FROM task, json_array_elements($26::json) WITH ORDINALITY AS a(value, ord)), "
        } else {
            ""
        };
        format!(
            "WITH task AS ({row} RETURNING namespace, id, context_id, agent_id, created_at), \
             history AS (INSERT INTO taskstore_history (namespace, task_id, position, message) \
             SELECT namespace, id, h.ord - 1, h.message \
             FROM task, json_array_elements_text($22::json) WITH ORDINALITY AS h(message, ord)), {stored}\
             event AS (INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, \
             created_at) SELECT namespace, id, context_id, agent_id, e.value ->> 'kind', e.value ->> 'payload', \
             created_at FROM task, json_array_elements($23::json) WITH ORDINALITY AS e(value, ord) ORDER BY e.ord) \
             SELECT COUNT(*) AS inserted FROM task",
            row = insert_task_row!(),
        )
    })
});

/// Where [`insert_task`] writes: in a transaction (or, on PostgreSQL, a
/// connection) the caller holds, or, on SQLite, as a script that lands whole
/// (see [`Db::run_transaction_script`](chorus_runtime::storage::Db::run_transaction_script)).
pub(super) enum Writer<'c> {
    In(&'c mut AnyConnection, Backend),
    OwnTransaction(&'c chorus_runtime::storage::Db),
}

/// What [`INSERT_TASK_POSTGRES`] writes, as a SQLite script: each insert
/// after the row's finds it by its new id, which exists only if the row went
/// in (a repeated request key inserts nothing).
static INSERT_TASK_SQLITE: LazyLock<[String; 2]> = LazyLock::new(|| {
    [false, true].map(|artifacts| {
        let stored = if artifacts {
            "INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) \
             SELECT t.namespace, t.id, a.value ->> 'artifact_id', a.key, a.value ->> 'artifact' \
             FROM taskstore_tasks AS t, json_each($26) AS a WHERE t.namespace = $1 AND t.id = $2; "
        } else {
            ""
        };
        format!(
            "{row}; INSERT INTO taskstore_history (namespace, task_id, position, message) \
             SELECT t.namespace, t.id, h.key, h.value FROM taskstore_tasks AS t, json_each($22) AS h \
             WHERE t.namespace = $1 AND t.id = $2; {stored}\
             INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
             SELECT t.namespace, t.id, t.context_id, t.agent_id, e.value ->> 'kind', e.value ->> 'payload', \
             t.created_at FROM taskstore_tasks AS t, json_each($23) AS e WHERE t.namespace = $1 AND t.id = $2 \
             ORDER BY e.key; \
             SELECT COUNT(*) AS inserted FROM taskstore_tasks WHERE namespace = $1 AND id = $2",
            row = insert_task_row!(),
        )
    })
});

/// The create's script in a transaction of its own, or of the batch it waits in.
static INSERT_TASK_SCRIPT: LazyLock<[TransactionScript; 2]> =
    LazyLock::new(|| INSERT_TASK_SQLITE.each_ref().map(|sql| TransactionScript::new(sql)));

impl SqlTaskRepository {
    pub(super) async fn create(&self, id: &str, new: NewTask, handoff: Option<Handoff>) -> Result<Created> {
        let request_key = new.idempotency_key.as_deref().unwrap_or(&new.message.message_id);
        let insert = TaskInsert {
            id,
            namespace: &new.namespace,
            agent_id: &new.agent_id,
            context_id: new.context_id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            message: &new.message,
            metadata: new.metadata.as_ref(),
            parent_id: None,
            owner: None,
            depth: 0,
            spawn_context: new.spawn_context,
            trace_context: &new.trace_context,
            request_key,
            handoff: handoff.as_ref(),
            answer: new.answer.as_ref(),
        };
        // One round trip: on PostgreSQL a statement, its own transaction; on
        // SQLite a script in a transaction of its own.
        let inserted = match self.backend() {
            Backend::Postgres => {
                insert_task(Writer::In(&mut *self.db.acquire().await?, Backend::Postgres), insert).await?
            }
            Backend::Sqlite => insert_task(Writer::OwnTransaction(&self.db), insert).await?,
        };
        let Some(task) = inserted else {
            let task = self.existing(&new.namespace, request_key).await?;
            return Ok(Created { task, handed_off: false });
        };
        if let Some(handoff) = &handoff {
            self.held.hold(&task, &handoff.lease_id);
        }
        Ok(Created { task, handed_off: handoff.is_some() })
    }

    /// Commits a transaction that inserted a task, or, when a task with the
    /// same first message id existed already, returns that one.
    pub(super) async fn commit_insert(
        &self,
        tx: Tx,
        inserted: Option<Task>,
        namespace: &str,
        message_id: &str,
    ) -> Result<Task> {
        if let Some(task) = inserted {
            tx.commit().await?;
            return Ok(task);
        }
        // Release the connection first: SQLite has only one.
        drop(tx);
        self.existing(namespace, message_id).await
    }

    /// The task an earlier create with this first message id made.
    async fn existing(&self, namespace: &str, message_id: &str) -> Result<Task> {
        let mut conn = self.db.read().await?;
        find_by_request(&mut conn, namespace, message_id)
            .await?
            .ok_or_else(|| TaskStoreError::TaskNotFound(message_id.to_owned()))
    }

    pub(super) async fn get(&self, namespace: &str, id: &str, history_length: Option<u32>) -> Result<Task> {
        // The row with its history window and artifacts, in one statement.
        let length = history_length.map_or(i64::MAX, i64::from);
        let mut conn = self.db.read().await?;
        let row = sqlx::query(GET_WHOLE).bind(namespace).bind(id).bind(length).fetch_optional(&mut *conn).await?;
        rows::decode_whole(&row.ok_or_else(|| TaskStoreError::TaskNotFound(id.to_owned()))?)
    }

    pub(super) async fn list(&self, query: TaskQuery) -> Result<TaskPage> {
        let mut conn = self.db.read().await?;
        let state = query.state.map(TaskState::as_str).unwrap_or_default();
        let context_id = query.context_id.as_deref().unwrap_or_default();
        let agent_id = query.agent_id.as_deref().unwrap_or_default();
        let updated_after = query.updated_after.unwrap_or(i64::MIN);
        let (before_timestamp, before_id) =
            query.page_token.as_ref().map_or((i64::MAX, ""), |token| (token.timestamp, token.id.as_str()));
        let rows = sqlx::query(concat!(
            "SELECT ",
            task_columns!(),
            " FROM taskstore_tasks WHERE ",
            list_filters!(),
            " AND (status_timestamp < $6 OR (status_timestamp = $6 AND id < $7)) \
             ORDER BY status_timestamp DESC, id DESC LIMIT $8"
        ))
        .bind(&query.namespace)
        .bind(context_id)
        .bind(state)
        .bind(agent_id)
        .bind(updated_after)
        .bind(before_timestamp)
        .bind(before_id)
        .bind(i64::from(query.page_size) + 1)
        .fetch_all(&mut *conn)
        .await?;
        let total: i64 = sqlx::query_scalar(concat!("SELECT COUNT(*) FROM taskstore_tasks WHERE ", list_filters!()))
            .bind(&query.namespace)
            .bind(context_id)
            .bind(state)
            .bind(agent_id)
            .bind(updated_after)
            .fetch_one(&mut *conn)
            .await?;
        let has_more = rows.len() > query.page_size as usize;
        let mut tasks = Vec::with_capacity(rows.len());
        for row in rows.iter().take(query.page_size as usize) {
            let record = TaskRecord::decode(row)?;
            tasks.push(complete_task_view(&mut conn, record, query.history_length, query.include_artifacts).await?);
        }
        let next_page_token = match tasks.last() {
            Some(last) if has_more => {
                Some(crate::domain::PageToken { timestamp: last.status.timestamp, id: last.id.clone() })
            }
            _ => None,
        };
        Ok(TaskPage { tasks, next_page_token, total_size: u64::try_from(total).unwrap_or(0) })
    }

    pub(super) async fn add_message_to(&self, namespace: &str, task_id: &str, message: Message) -> Result<Task> {
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        let state = record.task.status.state;
        if state.is_terminal() {
            return Err(TaskStoreError::TaskFinished { task_id: task_id.to_owned(), state });
        }
        let message = message.bound_to(task_id, &record.task.context_id);
        append_history(&mut tx, &mut record, &message).await?;
        save(&mut tx, &record).await?;
        let detail = EventDetail { message: Some(&message), ..EventDetail::default() };
        record_event(&mut tx, &record.task, EventKind::MessageAdded, detail).await?;
        if message.role == Role::User && state.is_interrupted() {
            set_status(&mut tx, &mut record, TaskState::Working, None).await?;
        }
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    pub(super) async fn update(&self, namespace: &str, task_id: &str, update: StatusUpdate) -> Result<Task> {
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        check_writable(&record, update.lease_id.as_deref())?;
        apply_status(&mut tx, &mut record, update.state, update.message).await?;
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    pub(super) async fn write_artifact(&self, namespace: &str, task_id: &str, chunk: ArtifactChunk) -> Result<Task> {
        let mut tx = self.begin().await?;
        let record = self.lock_record(&mut tx, namespace, task_id).await?;
        check_writable(&record, chunk.lease_id.as_deref())?;
        store_artifact(&mut tx, &record, &chunk).await?;
        let detail = EventDetail {
            artifact: Some(&chunk.artifact),
            append: chunk.append,
            last_chunk: chunk.last_chunk,
            message: None,
        };
        record_event(&mut tx, &record.task, EventKind::ArtifactUpdated, detail).await?;
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    pub(super) async fn cancel(&self, namespace: &str, id: &str, reason: Option<String>) -> Result<Vec<Task>> {
        let mut tx = self.begin().await?;
        let root = self.lock_record(&mut tx, namespace, id).await?;
        if root.task.status.state.is_terminal() {
            return Err(TaskStoreError::TaskFinished { task_id: id.to_owned(), state: root.task.status.state });
        }
        let subtree: Vec<String> = sqlx::query_scalar(
            "WITH RECURSIVE subtree(id) AS (SELECT $2 UNION ALL SELECT t.id FROM taskstore_tasks t \
             JOIN subtree s ON t.parent_id = s.id WHERE t.namespace = $1) SELECT id FROM subtree",
        )
        .bind(namespace)
        .bind(id)
        .fetch_all(&mut *tx)
        .await?;
        let text = reason.map_or_else(|| "canceled".to_owned(), |reason| format!("canceled: {reason}"));
        let mut canceled = Vec::new();
        for task_id in subtree {
            let mut record = self.lock_record(&mut tx, namespace, &task_id).await?;
            if record.task.status.state.is_terminal() {
                continue;
            }
            let message = Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text.clone());
            set_status(&mut tx, &mut record, TaskState::Canceled, Some(message)).await?;
            // The root comes back whole (the caller answers with it); the rest as ids.
            let whole = task_id == id;
            let history_length = if whole { None } else { Some(0) };
            canceled.push(complete_task_view(&mut tx, record, history_length, whole).await?);
        }
        tx.commit().await?;
        Ok(canceled)
    }
}

/// Adds, replaces or extends one artifact of a task.
pub(super) async fn store_artifact(conn: &mut AnyConnection, record: &TaskRecord, chunk: &ArtifactChunk) -> Result<()> {
    let task = &record.task;
    let artifact_id = &chunk.artifact.artifact_id;
    let existing: Option<String> = sqlx::query_scalar(
        "SELECT artifact FROM taskstore_artifacts WHERE namespace = $1 AND task_id = $2 AND artifact_id = $3",
    )
    .bind(&task.namespace)
    .bind(&task.id)
    .bind(artifact_id)
    .fetch_optional(&mut *conn)
    .await?;
    let stored = match (existing, chunk.append) {
        (Some(existing), true) => {
            let mut artifact: Artifact = rows::from_json(&existing)?;
            artifact.parts.extend(chunk.artifact.parts.iter().cloned());
            artifact
        }
        (None, true) => {
            return Err(TaskStoreError::ArtifactNotFound {
                task_id: task.id.clone(),
                artifact_id: artifact_id.clone(),
            });
        }
        (_, false) => chunk.artifact.clone(),
    };
    sqlx::query(
        "INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) VALUES ($1, $2, $3, \
         (SELECT COUNT(*) FROM taskstore_artifacts WHERE namespace = $1 AND task_id = $2), $4) \
         ON CONFLICT (namespace, task_id, artifact_id) DO UPDATE SET artifact = excluded.artifact",
    )
    .bind(&task.namespace)
    .bind(&task.id)
    .bind(artifact_id)
    .bind(to_json(&stored)?)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
