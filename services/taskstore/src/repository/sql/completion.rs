//! A completion at once: the task completed under its lease, with its
//! message, artifacts, events and owner's inbox, and read back whole, in one
//! round trip — a statement on PostgreSQL, a script in a transaction on
//! SQLite. What it did not do (the task changed, or was never this lease's)
//! the transaction in `workers` does, with its precise errors.

use std::sync::LazyLock;

use chorus_runtime::storage::{Backend, TransactionScript};

use super::{
    EventDetail, SqlTaskRepository, complete_task_view, event_payload,
    held::HeldClaim,
    read_record,
    rows::{TaskRecord, aggregated_parts, decode_parts, decode_whole, task_columns, to_json, to_json_opt},
};
use crate::{
    domain::{Artifact, Message, Task, TaskState, TaskStatus, now_micros},
    error::Result,
};

/// The states a task may complete from, as an SQL list.
static COMPLETABLE: LazyLock<String> = LazyLock::new(|| {
    TaskState::ALL
        .into_iter()
        .filter(|state| state.can_become(TaskState::Completed))
        .map(|state| format!("'{}'", state.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
});

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
            from = COMPLETABLE.as_str(),
            columns = task_columns!(),
            parts = aggregated_parts!("done", ""),
        )
    };
    [false, true]
        .map(|owned| [false, true].map(|message| [false, true].map(|artifacts| statement(owned, message, artifacts))))
});

/// One artifact of a one-statement completion (an element of its $9), or of
/// an answered create (of its $27).
#[derive(serde::Serialize)]
struct CompletedArtifact<'a> {
    ord: usize,
    artifact_id: &'a str,
    artifact: String,
    payload: String,
}

/// The artifacts of a completion as its statement's $9 (or of an answered
/// create, as its $27), each with the event it logs (carrying the task's
/// `status` before the completion).
pub(super) fn completed_artifacts(status: &TaskStatus, artifacts: &[Artifact]) -> Result<String> {
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

/// The same completion on SQLite, as a script run in a transaction: the
/// row, then — each only where the row now shows this completion ($5 its
/// time) — the message ($6 = 1), the artifacts with their events ($9, may be
/// NULL), the status event, the owner's inbox; then the task whole, as the
/// writes left it. `$8` (NULL: no check) is the status time the row must
/// still have. The script lands whole: when it completes nothing, it writes
/// nothing either.
static COMPLETE_SQLITE: LazyLock<TransactionScript> = LazyLock::new(|| {
    let ours =
        "t.namespace = $1 AND t.id = $2 AND t.lease_id = $3 AND t.state = 'completed' AND t.status_timestamp = $5";
    TransactionScript::new(&format!(
        "UPDATE taskstore_tasks SET state = 'completed', status_message = $4, status_timestamp = $5, \
         worker_id = NULL, lease_expires_at = NULL, history_count = history_count + $6 \
         WHERE namespace = $1 AND id = $2 AND lease_id = $3 AND state IN ({from}) \
         AND ($8 IS NULL OR status_timestamp = $8); \
         INSERT INTO taskstore_history (namespace, task_id, position, message) \
         SELECT t.namespace, t.id, t.history_count - 1, $4 FROM taskstore_tasks t WHERE {ours} AND $6 = 1; \
         INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact) \
         SELECT t.namespace, t.id, a.value ->> 'artifact_id', (a.value ->> 'ord') + (SELECT COUNT(*) \
         FROM taskstore_artifacts x WHERE x.namespace = t.namespace AND x.task_id = t.id), a.value ->> 'artifact' \
         FROM taskstore_tasks t, json_each($9) a WHERE {ours} \
         ON CONFLICT (namespace, task_id, artifact_id) DO UPDATE SET artifact = excluded.artifact; \
         INSERT INTO taskstore_events (namespace, task_id, context_id, agent_id, kind, payload, created_at) \
         SELECT t.namespace, t.id, t.context_id, t.agent_id, e.kind, e.payload, $5 FROM taskstore_tasks t, \
         (SELECT a.value ->> 'ord' AS ord, 'artifact_updated' AS kind, a.value ->> 'payload' AS payload \
         FROM json_each($9) a UNION ALL SELECT 2147483647, 'status_changed', $7) e WHERE {ours} ORDER BY e.ord; \
         INSERT INTO taskstore_inbox (namespace, owner_kind, owner_id, task_id, parent_task_id, kind, message, \
         task_state, created_at) SELECT t.namespace, t.owner_kind, t.owner_id, t.id, t.parent_id, 'completion', $4, \
         'completed', $5 FROM taskstore_tasks t WHERE {ours} AND t.owner_kind IS NOT NULL \
         ON CONFLICT (namespace, task_id) WHERE kind = 'completion' DO NOTHING; \
         SELECT {columns}, {parts} FROM taskstore_tasks t WHERE {ours}",
        from = COMPLETABLE.as_str(),
        columns = task_columns!(),
        parts = aggregated_parts!("t", ""),
    ))
});

/// What a completion writes, made before it goes to either backend.
struct Completion {
    status: TaskStatus,
    message_json: Option<String>,
    /// The status event's payload.
    payload: String,
    /// The status time the row must still have, when anything written was
    /// made from it.
    unchanged_since: Option<i64>,
    /// The artifacts and their events' payloads (see [`CompletedArtifact`]).
    stored: Option<String>,
}

impl SqlTaskRepository {
    /// Completes a task whose lease the caller holds in one round trip,
    /// which also records the artifacts, the events and the owner's
    /// completion and returns the task whole. A message or artifacts need
    /// what the claim left in the row (its context, the status the artifacts'
    /// events carry): remembered from the claim when it was made here, else
    /// read first; the task is then completed only if that status still
    /// holds. `None` when it completed nothing: the task is finished, leased
    /// to someone else, or changed since (or, unread, not there). Its
    /// artifacts' ids are distinct: `complete` checked them first.
    pub(super) async fn complete_at_once(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        held: Option<HeldClaim>,
        message: Option<&Message>,
        artifacts: &[Artifact],
    ) -> Result<Option<Task>> {
        let read = match held {
            _ if message.is_none() && artifacts.is_empty() => None,
            Some(held) => Some(held),
            None => {
                let record = read_record(&mut *self.db.read().await?, namespace, task_id).await?;
                Some(HeldClaim { context_id: record.task.context_id, status: record.task.status })
            }
        };
        let message = match (message, &read) {
            // A message is stored bound to its task's context, which never changes.
            (Some(message), Some(read)) => Some(message.clone().bound_to(task_id, &read.context_id)?),
            _ => None,
        };
        let stored = match &read {
            Some(read) if !artifacts.is_empty() => Some(completed_artifacts(&read.status, artifacts)?),
            _ => None,
        };
        let status = TaskStatus { state: TaskState::Completed, message, timestamp: now_micros() };
        let completion = Completion {
            message_json: to_json_opt(status.message.as_ref())?,
            payload: event_payload(&status, EventDetail::default())?,
            unchanged_since: read.map(|read| read.status.timestamp),
            stored,
            status,
        };
        match self.backend() {
            Backend::Postgres => self.complete_on_postgres(namespace, task_id, lease_id, completion, artifacts).await,
            Backend::Sqlite => self.complete_on_sqlite(namespace, task_id, lease_id, completion).await,
        }
    }

    async fn complete_on_postgres(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        completion: Completion,
        artifacts: &[Artifact],
    ) -> Result<Option<Task>> {
        // Most completed tasks have no owner: try that statement first, then
        // the one that also writes the owner's inbox. Each commits with the
        // writes that wait with it.
        let with_message = completion.status.message.is_some();
        let mut found = None;
        for statements in COMPLETE_POSTGRES.iter() {
            let statement = &statements[usize::from(with_message)][usize::from(completion.stored.is_some())];
            let mut query = sqlx::query(statement.as_str())
                .bind(namespace)
                .bind(task_id)
                .bind(lease_id)
                .bind(completion.message_json.as_deref())
                .bind(completion.status.timestamp)
                .bind(i64::from(with_message))
                .bind(completion.payload.as_str());
            if let Some(since) = completion.unchanged_since {
                query = query.bind(since);
            }
            if let Some(stored) = &completion.stored {
                query = query.bind(stored.as_str());
            }
            found = self.db.run_grouped(query).await?.into_iter().next();
            if found.is_some() {
                break;
            }
        }
        let Some(row) = found else { return Ok(None) };
        let record = TaskRecord::decode(&row)?;
        // The statement read the history and artifacts as they were before
        // its own writes.
        let (mut history, mut stored_before) = decode_parts(&row)?;
        history.extend(completion.status.message);
        if i64::try_from(history.len()) != Ok(record.history_count) {
            // A message added while the statement waited for the row.
            return Ok(Some(complete_task_view(&mut *self.db.read().await?, record, None, true).await?));
        }
        for artifact in artifacts {
            match stored_before.iter_mut().find(|stored| stored.artifact_id == artifact.artifact_id) {
                Some(stored) => *stored = artifact.clone(),
                None => stored_before.push(artifact.clone()),
            }
        }
        Ok(Some(Task { history, artifacts: stored_before, ..record.task }))
    }

    async fn complete_on_sqlite(
        &self,
        namespace: &str,
        task_id: &str,
        lease_id: &str,
        completion: Completion,
    ) -> Result<Option<Task>> {
        let query = COMPLETE_SQLITE
            .query()
            .bind(namespace)
            .bind(task_id)
            .bind(lease_id)
            .bind(completion.message_json.as_deref())
            .bind(completion.status.timestamp)
            .bind(i64::from(completion.status.message.is_some()))
            .bind(completion.payload.as_str())
            .bind(completion.unchanged_since)
            .bind(completion.stored.as_deref());
        let rows = self.db.run_transaction_script(&COMPLETE_SQLITE, query).await?;
        rows.last().map(decode_whole).transpose()
    }
}
