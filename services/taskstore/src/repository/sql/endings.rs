//! How a worker's attempt at a task it holds ends, short of completing it:
//! handed back (its attempt not counted), or failed, requeued while the
//! agent's retries last.

use std::time::Duration;

use super::{apply_status, rows::TaskRecord, set_status};
use crate::{
    domain::{HandBack, Message, Role, TaskState, now_micros},
    error::{Result, TaskStoreError},
};
use chorus_runtime::time::micros;

/// How a worker's attempt at a task it holds ends, short of completing it.
pub(super) enum Ending<'a> {
    /// Failed: requeued after the `retry` pause while the agent's retries
    /// last, else `failed`.
    Failed { reason: &'a str, retry: Option<Duration> },
    /// Handed back: requeued as `back` says, the attempt not counted.
    HandedBack { reason: &'a str, back: HandBack },
}

/// Puts a task its worker holds back in the queue, its attempt not counted:
/// one working, or one waiting on a question, which the next worker asks
/// again (the worker that asked is going away and cannot take the answer).
pub(super) async fn hand_back(
    conn: &mut sqlx::AnyConnection,
    record: &mut TaskRecord,
    reason: &str,
    back: HandBack,
) -> Result<()> {
    let from = record.task.status.state;
    if !matches!(from, TaskState::Working | TaskState::InputRequired | TaskState::AuthRequired) {
        return Err(TaskStoreError::IllegalTransition {
            task_id: record.task.id.clone(),
            from,
            to: TaskState::Submitted,
        });
    }
    record.task.attempt = record.task.attempt.saturating_sub(1);
    // The worker that hands it back, which the others may pass.
    let held_from = record.worker_id.clone().filter(|_| back.others_first);
    let mut text = format!("{reason}; handed back to the queue, the attempt not counted");
    match (&held_from, back.after.is_zero()) {
        (_, true) => {}
        (Some(worker), false) => text.push_str(&format!(
            ", for another worker now or {worker} again in {}",
            chorus_runtime::time::humanize(back.after)
        )),
        (None, false) => {
            text.push_str(&format!(", to be taken again in {}", chorus_runtime::time::humanize(back.after)))
        }
    }
    let message = Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text);
    // Requeueing is the store's own move, outside the A2A state machine.
    set_status(conn, record, TaskState::Submitted, Some(message)).await?;
    put_off(conn, record, back.after, held_from.as_deref()).await
}

/// Keeps a requeued task from being claimed before `after` has passed, by
/// any worker or only by `held_from`. With no pause nothing changes: the
/// row's `not_before` is past (the claim that began the attempt needed it
/// to be), or keeps only the worker an earlier hand-back named from it.
async fn put_off(
    conn: &mut sqlx::AnyConnection,
    record: &TaskRecord,
    after: Duration,
    held_from: Option<&str>,
) -> Result<()> {
    if after.is_zero() {
        return Ok(());
    }
    sqlx::query("UPDATE taskstore_tasks SET not_before = $3, held_from = $4 WHERE namespace = $1 AND id = $2")
        .bind(&record.task.namespace)
        .bind(&record.task.id)
        .bind(now_micros().saturating_add(micros(after)))
        .bind(held_from)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Ends a worker's attempt: back to `submitted` when a `retry` is asked (to
/// be claimed once its pause, if not zero, has passed) and the agent's
/// retries last, else `failed` with `reason`. Returns whether requeued.
pub(super) async fn end_attempt(
    conn: &mut sqlx::AnyConnection,
    record: &mut TaskRecord,
    reason: &str,
    retry: Option<Duration>,
) -> Result<bool> {
    let requeue = retry.is_some() && record.task.attempt <= record.max_retries;
    let later = retry.filter(|after| requeue && !after.is_zero());
    let text = match (requeue, later) {
        (true, None) => {
            format!("{reason}; requeued after attempt {} of {}", record.task.attempt, record.max_retries + 1)
        }
        (true, Some(after)) => format!(
            "{reason}; requeued after attempt {} of {}, to be taken again in {}",
            record.task.attempt,
            record.max_retries + 1,
            chorus_runtime::time::humanize(after)
        ),
        (false, _) => reason.to_owned(),
    };
    let message = Message::text(uuid::Uuid::new_v4().to_string(), Role::Agent, text);
    if requeue {
        // Requeueing is the store's own move, outside the A2A state machine.
        set_status(conn, record, TaskState::Submitted, Some(message)).await?;
        put_off(conn, record, later.unwrap_or_default(), None).await?;
    } else {
        apply_status(conn, record, TaskState::Failed, Some(message)).await?;
    }
    Ok(requeue)
}
