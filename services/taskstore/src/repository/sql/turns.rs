//! The gateways that follow the tasks whose turns they run themselves,
//! each under a lease (see migration 11).

use chorus_runtime::storage::Backend;
use sqlx::Row as _;

use super::SqlTaskRepository;
use crate::{
    domain::{PushLease, TaskKey, TaskState},
    error::{Result, TaskStoreError},
};

/// The final states, in SQL.
macro_rules! finished {
    () => {
        "('completed', 'failed', 'canceled', 'rejected')"
    };
}

const FOLLOW: &str =
    "UPDATE taskstore_tasks SET turn_follower = $3, turn_follower_until = $4 WHERE namespace = $1 AND id = $2";

/// Extends to $2 the leases follower $1 holds on the tasks of $3 (a JSON
/// list of keys), and lets go of those finished; returns each with its state.
macro_rules! renew_turns {
    ($keys:literal) => {
        concat!(
            "UPDATE taskstore_tasks SET turn_follower = CASE WHEN state IN ",
            finished!(),
            " THEN NULL ELSE turn_follower END, turn_follower_until = CASE WHEN state IN ",
            finished!(),
            " THEN NULL ELSE $2 END WHERE turn_follower = $1 AND (namespace, id) IN (",
            $keys,
            ") RETURNING namespace, id, state"
        )
    };
}
const RENEW_POSTGRES: &str = renew_turns!(
    "SELECT k.namespace, k.task_id FROM json_to_recordset(CAST($3 AS json)) AS k(namespace text, task_id text)"
);
const RENEW_SQLITE: &str = renew_turns!("SELECT k.value ->> 'namespace', k.value ->> 'task_id' FROM json_each($3) k");

/// Unfinished tasks whose follower's lease ended by $3, at most $4.
macro_rules! claimable {
    () => {
        concat!(
            "SELECT namespace, id FROM taskstore_tasks WHERE turn_follower IS NOT NULL AND turn_follower_until <= $3 \
             AND state NOT IN ",
            finished!(),
            " LIMIT $4"
        )
    };
}
/// Hands them to follower $1 until $2, skipping rows another claim holds.
const CLAIM_POSTGRES: &str = concat!(
    "UPDATE taskstore_tasks SET turn_follower = $1, turn_follower_until = $2 WHERE (namespace, id) IN (",
    claimable!(),
    " FOR UPDATE SKIP LOCKED) RETURNING namespace, id"
);
const CLAIM_SQLITE: &str = concat!(
    "UPDATE taskstore_tasks SET turn_follower = $1, turn_follower_until = $2 WHERE (namespace, id) IN (",
    claimable!(),
    ") RETURNING namespace, id"
);
/// Finished tasks whose follower died before it let go of them.
const FORGET_FINISHED: &str = concat!(
    "UPDATE taskstore_tasks SET turn_follower = NULL, turn_follower_until = NULL \
     WHERE turn_follower IS NOT NULL AND turn_follower_until <= $1 AND state IN ",
    finished!()
);

const RELEASE: &str = "UPDATE taskstore_tasks SET turn_follower_until = $2 \
     WHERE turn_follower = $1 AND turn_follower_until > $2";

/// A task's key as the renewal's JSON list ($3) holds it.
#[derive(serde::Serialize)]
struct KeyRow<'a> {
    namespace: &'a str,
    task_id: &'a str,
}

fn key_of(row: &sqlx::any::AnyRow) -> Result<TaskKey> {
    Ok(TaskKey { namespace: row.try_get("namespace")?, task_id: row.try_get("id")? })
}

/// Has `lease`'s follower (`None`: no one) follow a task, on `conn` (in the
/// caller's transaction, if it has one); whether the task exists.
pub(super) async fn follow_in(
    conn: &mut sqlx::AnyConnection,
    namespace: &str,
    task_id: &str,
    lease: Option<&PushLease>,
) -> Result<bool> {
    let followed = sqlx::query(FOLLOW)
        .bind(namespace)
        .bind(task_id)
        .bind(lease.map(|lease| lease.follower.as_str()))
        .bind(lease.map(|lease| lease.until))
        .execute(conn)
        .await?;
    Ok(followed.rows_affected() != 0)
}

impl SqlTaskRepository {
    pub(super) async fn follow(&self, namespace: &str, task_id: &str, lease: Option<&PushLease>) -> Result<()> {
        if !follow_in(&mut *self.db.acquire().await?, namespace, task_id, lease).await? {
            return Err(TaskStoreError::TaskNotFound(task_id.to_owned()));
        }
        Ok(())
    }

    pub(super) async fn renew_followed(&self, lease: &PushLease, following: &[TaskKey]) -> Result<Vec<TaskKey>> {
        if following.is_empty() {
            return Ok(Vec::new());
        }
        let renew = match self.backend() {
            Backend::Postgres => RENEW_POSTGRES,
            Backend::Sqlite => RENEW_SQLITE,
        };
        let keys: Vec<KeyRow<'_>> =
            following.iter().map(|key| KeyRow { namespace: &key.namespace, task_id: &key.task_id }).collect();
        let rows = super::push::renew_leased(&mut *self.db.acquire().await?, renew, lease, &keys).await?;
        let mut held = Vec::with_capacity(rows.len());
        for row in &rows {
            let state: String = row.try_get("state")?;
            if !TaskState::parse(&state).is_some_and(TaskState::is_terminal) {
                held.push(key_of(row)?);
            }
        }
        Ok(held)
    }

    pub(super) async fn claim_followed(&self, lease: &PushLease, now: i64, limit: u32) -> Result<Vec<TaskKey>> {
        let mut conn = self.db.acquire().await?;
        sqlx::query(FORGET_FINISHED).bind(now).execute(&mut *conn).await?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let claim = match self.backend() {
            Backend::Postgres => CLAIM_POSTGRES,
            Backend::Sqlite => CLAIM_SQLITE,
        };
        let rows = super::push::claim_leased(&mut conn, claim, lease, now, limit).await?;
        rows.iter().map(key_of).collect()
    }

    pub(super) async fn release_followed(&self, follower: &str, now: i64) -> Result<u64> {
        let released = sqlx::query(RELEASE).bind(follower).bind(now).execute(&mut *self.db.acquire().await?).await?;
        Ok(released.rows_affected())
    }
}
