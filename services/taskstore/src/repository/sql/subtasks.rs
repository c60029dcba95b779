//! Subtasks: spawning under the safety limits, completions, notifications,
//! questions and the owner's inbox.

use chorus_runtime::storage::Backend;
use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::{
    EventDetail, SqlTaskRepository, append_history, apply_status, check_lease, check_writable, complete_task_view,
    create::{Request, TaskInsert, Writer, find_by_request, insert_task},
    inbox::{await_child, inbox_columns, questions_answered},
    record_event,
    rows::{self, TaskRecord, task_columns, to_json},
    save, set_status,
};
use crate::{
    domain::{
        EventKind, InboxKind, InboxMessage, Limits, Message, NewSubtask, Notification, Owner, OwnerKind, PushLease,
        Role, Task, TaskState, now_micros, prompt_fingerprint,
    },
    error::{Result, TaskStoreError},
};

const ONE_MINUTE_MICROS: i64 = 60_000_000;

impl SqlTaskRepository {
    /// Spawns child `id`; a blocking spawn keeps the child's completion for
    /// its own answer until `awaited_until`.
    pub(super) async fn spawn(
        &self,
        id: &str,
        subtask: NewSubtask,
        limits: &Limits,
        awaited_until: Option<i64>,
    ) -> Result<Task> {
        let request = Request {
            namespace: &subtask.namespace,
            key: &subtask.message.message_id,
            agent_id: &subtask.agent_id,
            parent_id: Some(&subtask.parent_id),
            message: &subtask.message,
        };
        let mut tx = self.begin().await?;
        if let Some(existing) = find_by_request(&mut tx, &request).await? {
            if let Some(until) = awaited_until {
                await_child(&mut tx, &existing.namespace, &existing.id, until).await?;
                tx.commit().await?;
            }
            return Ok(existing);
        }
        // Locking the parent serialises its spawns, so the counts below hold.
        let parent = self.lock_record(&mut tx, &subtask.namespace, &subtask.parent_id).await?;
        // A leased parent spawns only under its lease: a worker that lost it
        // would spawn children twice.
        check_lease(&parent, subtask.lease_id.as_deref())?;
        check_spawn_limits(&mut tx, &parent, &subtask, limits).await?;
        let owner =
            subtask.owner.clone().unwrap_or_else(|| Owner { kind: OwnerKind::Worker, id: subtask.parent_id.clone() });
        let insert = TaskInsert {
            id,
            namespace: &subtask.namespace,
            agent_id: &subtask.agent_id,
            context_id: parent.task.context_id.clone(),
            message: &subtask.message,
            metadata: subtask.metadata.as_ref(),
            parent_id: Some(&subtask.parent_id),
            owner: Some(&owner),
            depth: parent.task.depth + 1,
            spawn_context: parent.task.spawn_context,
            trace_context: &subtask.trace_context,
            request_key: request.key,
            handoff: None,
            answer: None,
            follow: None,
            run_by_creator: false,
        };
        let inserted = insert_task(Writer::In(&mut tx, self.backend()), insert).await?;
        if let (Some(child), Some(until)) = (&inserted, awaited_until) {
            await_child(&mut tx, &child.namespace, &child.id, until).await?;
        }
        self.commit_insert(tx, inserted, &request).await
    }

    pub(super) async fn children_of(&self, namespace: &str, parent_id: &str, task_ids: &[String]) -> Result<Vec<Task>> {
        let mut conn = self.db.read().await?;
        super::read_record(&mut conn, namespace, parent_id).await?;
        // Unnamed, a finished child is of interest while its completion waits
        // to be taken: not while a blocking spawn keeps it, nor while a
        // reader holds it ($3: now), for they report it.
        let rows = if task_ids.is_empty() {
            sqlx::query(concat!(
                "SELECT ",
                task_columns!(),
                " FROM taskstore_tasks t WHERE namespace = $1 AND parent_id = $2 AND (state NOT IN \
                 ('completed', 'failed', 'canceled', 'rejected') OR ((t.awaited_until IS NULL \
                 OR t.awaited_until <= $3) AND EXISTS (SELECT 1 FROM taskstore_inbox i \
                 WHERE i.namespace = t.namespace AND i.task_id = t.id AND i.kind = 'completion' \
                 AND i.read_at IS NULL AND (i.invisible_until IS NULL OR i.invisible_until <= $3)))) \
                 ORDER BY created_at, id"
            ))
            .bind(namespace)
            .bind(parent_id)
            .bind(now_micros())
        } else {
            sqlx::query(concat!(
                "SELECT ",
                task_columns!(),
                " FROM taskstore_tasks WHERE namespace = $1 AND parent_id = $2 ORDER BY created_at, id"
            ))
            .bind(namespace)
            .bind(parent_id)
        }
        .fetch_all(&mut *conn)
        .await?;
        let mut children = Vec::with_capacity(rows.len());
        for row in &rows {
            let record = TaskRecord::decode(row)?;
            if task_ids.is_empty() || task_ids.contains(&record.task.id) {
                children.push(complete_task_view(&mut conn, record, None, true).await?);
            }
        }
        if let Some(missing) = task_ids.iter().find(|id| !children.iter().any(|child| &child.id == *id)) {
            return Err(TaskStoreError::TaskNotFound(missing.clone()));
        }
        Ok(children)
    }

    pub(super) async fn notify(&self, notification: Notification) -> Result<(InboxMessage, Task)> {
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, &notification.namespace, &notification.task_id).await?;
        check_writable(&record, notification.lease_id.as_deref())?;
        let Some(owner) = record.task.owner.clone() else {
            return Err(TaskStoreError::NoOwner { task_id: notification.task_id });
        };
        let message = notification.message.clone().bound_to(&record.task.id, &record.task.context_id)?;
        if let Some(sent) = sent_before(&mut tx, self.backend(), &notification, &message).await? {
            let task = complete_task_view(&mut tx, record, None, true).await?;
            return Ok((sent, task));
        }
        if notification.kind == InboxKind::Question {
            apply_status(&mut tx, &mut record, TaskState::InputRequired, Some(message.clone())).await?;
        }
        let row = sqlx::query(concat!(
            "INSERT INTO taskstore_inbox (namespace, owner_kind, owner_id, task_id, parent_task_id, kind, message, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ",
            inbox_columns!()
        ))
        .bind(&notification.namespace)
        .bind(owner.kind.as_str())
        .bind(&owner.id)
        .bind(&record.task.id)
        .bind(record.task.parent_id.as_deref())
        .bind(notification.kind.as_str())
        .bind(to_json(&message)?)
        .bind(now_micros())
        .fetch_one(&mut *tx)
        .await?;
        let inbox_message = rows::decode_inbox(&row)?;
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok((inbox_message, task))
    }

    pub(super) async fn answer(
        &self,
        namespace: &str,
        task_id: &str,
        answer: Message,
        follow: Option<PushLease>,
    ) -> Result<Task> {
        let mut tx = self.begin().await?;
        let mut record = self.lock_record(&mut tx, namespace, task_id).await?;
        // A retry of an answer that landed (the task may be working on, or
        // asking its next question): the task as it is.
        if answered_before(&mut tx, self.backend(), namespace, task_id, &answer).await? {
            return complete_task_view(&mut tx, record, None, true).await;
        }
        let state = record.task.status.state;
        if !state.is_interrupted() {
            return Err(TaskStoreError::NoQuestion { task_id: task_id.to_owned(), state });
        }
        if follow.is_some() {
            super::turns::follow_in(&mut tx, namespace, task_id, follow.as_ref()).await?;
        }
        let answer = Message { role: Role::User, ..answer }.bound_to(task_id, &record.task.context_id)?;
        append_history(&mut tx, &mut record, &answer).await?;
        save(&mut tx, &record).await?;
        let detail = EventDetail { message: Some(&answer), ..EventDetail::default() };
        record_event(&mut tx, &record.task, EventKind::MessageAdded, detail).await?;
        set_status(&mut tx, &mut record, TaskState::Working, None).await?;
        questions_answered(&mut tx, namespace, task_id).await?;
        let task = complete_task_view(&mut tx, record, None, true).await?;
        tx.commit().await?;
        Ok(task)
    }
}

/// Whether `answer` is in the task's history already: a message of its id
/// and parts, compared as stored. A message reusing an id with other words
/// is new (some clients reuse ids).
async fn answered_before(
    conn: &mut AnyConnection,
    backend: Backend,
    namespace: &str,
    task_id: &str,
    answer: &Message,
) -> Result<bool> {
    if answer.message_id.is_empty() {
        return Ok(false);
    }
    let sql = format!(
        "SELECT message FROM taskstore_history WHERE namespace = $1 AND task_id = $2 AND {}",
        rows::message_id_is_3(backend)
    );
    let stored: Vec<String> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(namespace)
        .bind(task_id)
        .bind(&answer.message_id)
        .fetch_all(conn)
        .await?;
    let asked = rows::as_stored(answer)?;
    for message in stored {
        if rows::from_json::<Message>(&message)?.parts == asked.parts {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The notification a retried `NotifyOwner` sent first: the task's message
/// under the same message id, when it has the same kind and parts (compared
/// as stored); another under the id is
/// [`NotificationKeyInUse`](TaskStoreError::NotificationKeyInUse).
async fn sent_before(
    conn: &mut AnyConnection,
    backend: Backend,
    notification: &Notification,
    message: &Message,
) -> Result<Option<InboxMessage>> {
    if message.message_id.is_empty() {
        return Ok(None);
    }
    let sql = format!(
        "SELECT {} FROM taskstore_inbox WHERE namespace = $1 AND task_id = $2 AND kind <> 'completion' AND {} \
         ORDER BY id LIMIT 1",
        inbox_columns!(),
        rows::message_id_is_3(backend)
    );
    let row = sqlx::query(AssertSqlSafe(sql))
        .bind(&notification.namespace)
        .bind(&notification.task_id)
        .bind(&message.message_id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let sent = rows::decode_inbox(&row)?;
    let sent_parts = sent.message.as_ref().map(|first| &first.parts);
    if sent.kind == notification.kind && sent_parts == Some(&rows::as_stored(message)?.parts) {
        return Ok(Some(sent));
    }
    let (key, task_id) = (message.message_id.clone(), notification.task_id.clone());
    Err(TaskStoreError::NotificationKeyInUse { key, task_id, kind: sent.kind.as_str() })
}

/// Applies the safety limits to a spawn below `parent`, each with its own error.
async fn check_spawn_limits(
    conn: &mut AnyConnection,
    parent: &TaskRecord,
    subtask: &NewSubtask,
    limits: &Limits,
) -> Result<()> {
    let parent_task = &parent.task;
    if parent_task.status.state.is_terminal() {
        return Err(TaskStoreError::TaskFinished { task_id: parent_task.id.clone(), state: parent_task.status.state });
    }
    let depth = parent_task.depth + 1;
    let max_depth = limits.max_depth(parent_task.spawn_context);
    if depth > max_depth {
        return Err(TaskStoreError::DepthLimit { depth, max: max_depth, context: parent_task.spawn_context });
    }
    let counts = sqlx::query(
        "SELECT COUNT(*) AS total, \
         COALESCE(SUM(CASE WHEN state IN ('completed', 'failed', 'canceled', 'rejected') THEN 0 ELSE 1 END), 0) \
         AS unfinished, COALESCE(SUM(CASE WHEN created_at >= $3 THEN 1 ELSE 0 END), 0) AS recent \
         FROM taskstore_tasks WHERE namespace = $1 AND parent_id = $2",
    )
    .bind(&parent_task.namespace)
    .bind(&parent_task.id)
    .bind(now_micros() - ONE_MINUTE_MICROS)
    .fetch_one(&mut *conn)
    .await?;
    let parent_id = parent_task.id.clone();
    if counts.try_get::<i64, _>("unfinished")? >= i64::from(limits.max_concurrent_subtasks) {
        return Err(TaskStoreError::ConcurrencyLimit { parent_id, limit: limits.max_concurrent_subtasks });
    }
    if counts.try_get::<i64, _>("total")? >= i64::from(limits.max_total_subtasks) {
        return Err(TaskStoreError::TotalLimit { parent_id, limit: limits.max_total_subtasks });
    }
    if counts.try_get::<i64, _>("recent")? >= i64::from(limits.max_spawns_per_minute) {
        return Err(TaskStoreError::RateLimit { parent_id, limit: limits.max_spawns_per_minute });
    }
    if !limits.reject_cycles {
        return Ok(());
    }
    let fingerprint = prompt_fingerprint(&subtask.agent_id, &subtask.message.joined_text());
    let ancestor: Option<String> = sqlx::query_scalar(
        "WITH RECURSIVE ancestors(id, parent_id, prompt_fingerprint) AS ( \
         SELECT id, parent_id, prompt_fingerprint FROM taskstore_tasks WHERE namespace = $1 AND id = $2 \
         UNION ALL SELECT t.id, t.parent_id, t.prompt_fingerprint FROM taskstore_tasks t \
         JOIN ancestors a ON t.id = a.parent_id WHERE t.namespace = $1) \
         SELECT id FROM ancestors WHERE prompt_fingerprint = $3 LIMIT 1",
    )
    .bind(&parent_task.namespace)
    .bind(&parent_task.id)
    .bind(&fingerprint)
    .fetch_optional(&mut *conn)
    .await?;
    match ancestor {
        Some(ancestor_id) => Err(TaskStoreError::Cycle { agent_id: subtask.agent_id.clone(), ancestor_id }),
        None => Ok(()),
    }
}
