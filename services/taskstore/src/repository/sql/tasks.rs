//! Tasks: read, list, converse, move through states, artifacts, cancel
//! (creating one is in `create`).

use std::collections::VecDeque;

use chorus_runtime::{storage::Backend, validate::FieldViolation};
use sqlx::{Any, AnyConnection, AssertSqlSafe, Row as _, any::AnyArguments, query::Query};

use super::{
    EventDetail, SqlTaskRepository, append_history, apply_status, check_fence, check_lease, check_writable,
    complete_task_view, record_event, rows,
    rows::{TaskRecord, aggregated_parts, task_columns, to_json},
    save, set_status,
};
use crate::{
    domain::{Artifact, ArtifactChunk, EventKind, Message, Role, StatusUpdate, Task, TaskPage, TaskQuery, TaskState},
    error::{Result, TaskStoreError},
};

/// The conditions of a task listing after its namespace ($1): only those
/// the query sets, so that each combination is planned on its own and a
/// context's listing reads its index. The text values bind from $2 on, in
/// order, then the updated-after time when set; returns the next number.
fn list_filters(query: &TaskQuery) -> (String, Vec<&str>, usize) {
    let mut sql = String::from("namespace = $1");
    let mut texts = Vec::new();
    let columns = [
        ("context_id", query.context_id.as_deref()),
        ("state", query.state.map(TaskState::as_str)),
        ("agent_id", query.agent_id.as_deref()),
        ("parent_id", query.parent_id.as_deref()),
    ];
    for (column, value) in columns {
        if let Some(value) = value {
            texts.push(value);
            sql.push_str(&format!(" AND {column} = ${}", texts.len() + 1));
        }
    }
    let mut next = texts.len() + 2;
    if query.updated_after.is_some() {
        sql.push_str(&format!(" AND status_timestamp >= ${next}"));
        next += 1;
    }
    (sql, texts, next)
}

type AnyQuery<'q> = Query<'q, Any, AnyArguments>;

/// Binds what [`list_filters`] asks for.
fn bind_filters<'q>(statement: AnyQuery<'q>, query: &'q TaskQuery, texts: &[&'q str]) -> AnyQuery<'q> {
    let statement = texts.iter().fold(statement.bind(&query.namespace), |statement, text| statement.bind(*text));
    match query.updated_after {
        Some(after) => statement.bind(after),
        None => statement,
    }
}

/// Task $2 with the last $3 messages of its history and its artifacts.
const GET_WHOLE: &str = concat!(
    "SELECT ",
    task_columns!(),
    ", ",
    aggregated_parts!("t", " AND h.position >= t.history_count - $3"),
    " FROM taskstore_tasks t WHERE t.namespace = $1 AND t.id = $2"
);

impl SqlTaskRepository {
    pub(super) async fn get(&self, namespace: &str, id: &str, history_length: Option<u32>) -> Result<Task> {
        // The row with its history window and artifacts, in one statement.
        let length = history_length.map_or(i64::MAX, i64::from);
        let mut conn = self.db.read().await?;
        let row = sqlx::query(GET_WHOLE).bind(namespace).bind(id).bind(length).fetch_optional(&mut *conn).await?;
        rows::decode_whole(&row.ok_or_else(|| TaskStoreError::TaskNotFound(id.to_owned()))?)
    }

    pub(super) async fn list(&self, query: TaskQuery) -> Result<TaskPage> {
        let mut conn = self.db.read().await?;
        let (filters, texts, next) = list_filters(&query);
        let (before_timestamp, before_id) =
            query.page_token.as_ref().map_or((i64::MAX, ""), |token| (token.timestamp, token.id.as_str()));
        let page = format!(
            "SELECT {} FROM taskstore_tasks WHERE {filters} AND (status_timestamp < ${next} \
             OR (status_timestamp = ${next} AND id < ${})) ORDER BY status_timestamp DESC, id DESC LIMIT ${}",
            task_columns!(),
            next + 1,
            next + 2
        );
        let rows = bind_filters(sqlx::query(AssertSqlSafe(page)), &query, &texts)
            .bind(before_timestamp)
            .bind(before_id)
            .bind(i64::from(query.page_size) + 1)
            .fetch_all(&mut *conn)
            .await?;
        // Counted on the first page only: the later ones carry its count.
        let total = match query.page_token.as_ref().and_then(|token| token.total_for(&query)) {
            Some(total) => total,
            None => {
                let count = format!("SELECT COUNT(*) FROM taskstore_tasks WHERE {filters}");
                let counted = bind_filters(sqlx::query(AssertSqlSafe(count)), &query, &texts);
                u64::try_from(counted.fetch_one(&mut *conn).await?.try_get::<i64, _>(0)?).unwrap_or(0)
            }
        };
        let has_more = rows.len() > query.page_size as usize;
        let mut tasks = Vec::with_capacity(rows.len());
        for row in rows.iter().take(query.page_size as usize) {
            let record = TaskRecord::decode(row)?;
            tasks.push(complete_task_view(&mut conn, record, query.history_length, query.include_artifacts).await?);
        }
        let mut page = TaskPage { tasks, next_page_token: None, total_size: total, filters: query.filters() };
        page.next_page_token = page.tasks.last().filter(|_| has_more).map(|last| page.after(last));
        Ok(page)
    }

    pub(super) async fn bytes_of(&self, namespace: &str, task_id: &str) -> Result<u64> {
        let sql = match self.backend() {
            Backend::Postgres => TASK_BYTES_POSTGRES,
            Backend::Sqlite => TASK_BYTES_SQLITE,
        };
        let mut conn = self.db.read().await?;
        let bytes: i64 = sqlx::query_scalar(sql).bind(namespace).bind(task_id).fetch_one(&mut *conn).await?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    pub(super) async fn add_message_to(
        &self,
        namespace: &str,
        task_id: &str,
        message: Message,
        lease_id: Option<&str>,
    ) -> Result<Task> {
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        let state = record.task.status.state;
        if state.is_terminal() {
            return Err(TaskStoreError::TaskFinished { task_id: task_id.to_owned(), state });
        }
        // The agent's words come from whoever holds the task; anyone may add
        // a user's (a client's follow-up), naming a lease or not.
        match message.role {
            Role::Agent => check_lease(&record, lease_id)?,
            Role::User => check_fence(&record, lease_id)?,
        }
        let message = message.bound_to(task_id, &record.task.context_id)?;
        append_history(&mut tx, &mut record, &message).await?;
        save(&mut tx, &record).await?;
        let detail = EventDetail { message: Some(&message), ..EventDetail::default() };
        record_event(&mut tx, &record.task, EventKind::MessageAdded, detail).await?;
        if message.role == Role::User && state.is_interrupted() {
            set_status(&mut tx, &mut record, TaskState::Working, None).await?;
            super::inbox::questions_answered(&mut tx, namespace, task_id).await?;
        }
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }

    /// Moves the task to the state asked; a task canceled so takes its
    /// unfinished subtree with it, as a cancel does. Returns the task whole,
    /// then the tasks below it canceled (without history).
    pub(super) async fn update(&self, namespace: &str, task_id: &str, update: StatusUpdate) -> Result<Vec<Task>> {
        // A status is the agent's word; a user's goes in with AddMessage.
        if update.message.as_ref().is_some_and(|message| message.role == Role::User) {
            return Err(
                FieldViolation::new("message.role", "must be ROLE_AGENT: a status message is the agent's").into()
            );
        }
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        check_writable(&record, update.lease_id.as_deref())?;
        apply_status(&mut tx, &mut record, update.state, update.message).await?;
        let mut changed = vec![complete_task_view(&mut tx, record, None, true).await?];
        if update.state == TaskState::Canceled {
            let text = format!("canceled: task {task_id} above it was canceled");
            changed.extend(self.cancel_below(&mut tx, namespace, task_id, &text).await?);
        }
        tx.commit().await?;
        Ok(changed)
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
        let text = reason.map_or_else(|| "canceled".to_owned(), |reason| format!("canceled: {reason}"));
        let mut record = self.lock_record(&mut tx, namespace, id).await?;
        let state = record.task.status.state;
        if state.is_terminal() {
            return Err(TaskStoreError::TaskFinished { task_id: id.to_owned(), state });
        }
        set_status(&mut tx, &mut record, TaskState::Canceled, Some(agent_note(&text))).await?;
        // The root comes back whole (the caller answers with it); the rest as ids.
        let mut canceled = vec![complete_task_view(&mut tx, record, None, true).await?];
        canceled.extend(self.cancel_below(&mut tx, namespace, id, &text).await?);
        tx.commit().await?;
        Ok(canceled)
    }

    /// Cancels the unfinished tasks below `root`, which is finished and
    /// locked, with `text` as their status message; returns them without
    /// history. Top down, each task's children are read only once it is
    /// locked: a spawn below it has then either committed, and its child is
    /// read here, or waits for the lock and finds its parent finished.
    async fn cancel_below(&self, tx: &mut AnyConnection, namespace: &str, root: &str, text: &str) -> Result<Vec<Task>> {
        let mut canceled = Vec::new();
        let mut subtree = VecDeque::from(children_ids(tx, namespace, root).await?);
        while let Some(task_id) = subtree.pop_front() {
            let mut record = self.lock_record(tx, namespace, &task_id).await?;
            subtree.extend(children_ids(tx, namespace, &task_id).await?);
            if record.task.status.state.is_terminal() {
                continue;
            }
            set_status(tx, &mut record, TaskState::Canceled, Some(agent_note(text))).await?;
            canceled.push(complete_task_view(tx, record, Some(0), false).await?);
        }
        Ok(canceled)
    }
}

/// The bytes of a task's stored messages and artifacts, $1 and $2 its key;
/// `$message` and `$artifact` measure one row's.
macro_rules! task_bytes {
    ($message:literal, $artifact:literal) => {
        concat!(
            "SELECT CAST(COALESCE((SELECT SUM(",
            $message,
            ") FROM taskstore_history WHERE namespace = $1 AND task_id = $2), 0) + COALESCE((SELECT SUM(",
            $artifact,
            ") FROM taskstore_artifacts WHERE namespace = $1 AND task_id = $2), 0) AS BIGINT) AS bytes"
        )
    };
}
const TASK_BYTES_POSTGRES: &str = task_bytes!("octet_length(message)", "octet_length(artifact)");
/// SQLite's `length` of a text counts characters; of a blob, bytes.
const TASK_BYTES_SQLITE: &str = task_bytes!("length(CAST(message AS BLOB))", "length(CAST(artifact AS BLOB))");

/// The store's own status message.
fn agent_note(text: &str) -> Message {
    Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text)
}

/// The ids of a task's children, oldest first.
async fn children_ids(conn: &mut AnyConnection, namespace: &str, parent_id: &str) -> Result<Vec<String>> {
    let ids = sqlx::query_scalar(
        "SELECT id FROM taskstore_tasks WHERE namespace = $1 AND parent_id = $2 ORDER BY created_at, id",
    )
    .bind(namespace)
    .bind(parent_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(ids)
}

/// Adds, replaces or extends one artifact of a task; an artifact whose last
/// chunk came is extended no more.
pub(super) async fn store_artifact(conn: &mut AnyConnection, record: &TaskRecord, chunk: &ArtifactChunk) -> Result<()> {
    let task = &record.task;
    let artifact_id = &chunk.artifact.artifact_id;
    let existing: Option<(String, Option<i64>)> = sqlx::query_as(
        "SELECT artifact, closed FROM taskstore_artifacts WHERE namespace = $1 AND task_id = $2 AND artifact_id = $3",
    )
    .bind(&task.namespace)
    .bind(&task.id)
    .bind(artifact_id)
    .fetch_optional(&mut *conn)
    .await?;
    let stored = match (existing, chunk.append) {
        (Some((_, Some(1))), true) => {
            return Err(TaskStoreError::ArtifactClosed { task_id: task.id.clone(), artifact_id: artifact_id.clone() });
        }
        (Some((existing, _)), true) => {
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
        "INSERT INTO taskstore_artifacts (namespace, task_id, artifact_id, position, artifact, closed) \
         VALUES ($1, $2, $3, (SELECT COUNT(*) FROM taskstore_artifacts WHERE namespace = $1 AND task_id = $2), $4, $5) \
         ON CONFLICT (namespace, task_id, artifact_id) DO UPDATE SET artifact = excluded.artifact, \
         closed = excluded.closed",
    )
    .bind(&task.namespace)
    .bind(&task.id)
    .bind(artifact_id)
    .bind(to_json(&stored)?)
    .bind(i64::from(chunk.last_chunk))
    .execute(&mut *conn)
    .await?;
    Ok(())
}
