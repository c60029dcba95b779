//! Concurrency groups: a run's slot, the queue behind a full group, and a
//! disabled workflow's queue held back.

use chorus_runtime::storage::{Backend, Tx};
use sqlx::{AssertSqlSafe, Row as _};

use super::sql_runs::SqlRunRepository;
use crate::{
    domain::{Run, RunState, Slot},
    error::Result,
};

impl SqlRunRepository {
    /// Serializes the runs of one concurrency group (PostgreSQL; SQLite's
    /// single writer already does).
    pub(super) async fn lock_group(&self, tx: &mut Tx, run: &Run) -> Result<()> {
        if self.db.backend() == Backend::Postgres {
            let key = format!("{}/{}/{}", run.namespace, run.workflow, run.concurrency_key.as_deref().unwrap_or(""));
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))::text AS locked")
                .bind(key)
                .fetch_one(&mut **tx)
                .await?;
        }
        Ok(())
    }

    fn same_key(&self) -> &'static str {
        match self.db.backend() {
            Backend::Postgres => "concurrency_key IS NOT DISTINCT FROM $3",
            Backend::Sqlite => "concurrency_key IS $3",
        }
    }

    /// Whether `run`, when pending, may start: a queued run of a disabled
    /// workflow stays queued (enabling it makes the queue due again).
    pub(super) async fn slot(&self, tx: &mut Tx, run: &Run, limit: i64) -> Result<Slot> {
        if run.state != RunState::Pending {
            return Ok(Slot::Free);
        }
        if self.disabled(tx, run).await? {
            return Ok(Slot::Held);
        }
        Ok(if self.slot_free(tx, run, limit).await? { Slot::Free } else { Slot::Full })
    }

    async fn slot_free(&self, tx: &mut Tx, run: &Run, limit: i64) -> Result<bool> {
        let sql = format!(
            "SELECT COUNT(*) AS active FROM workflow_runs WHERE namespace = $1 AND workflow = $2 AND {} \
             AND state IN ('running', 'waiting')",
            self.same_key()
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(&run.namespace)
            .bind(&run.workflow)
            .bind(run.concurrency_key.as_deref())
            .fetch_one(&mut **tx)
            .await?;
        let active: i64 = row.try_get("active")?;
        Ok(active < limit)
    }

    /// Whether `run`'s workflow is disabled.
    async fn disabled(&self, tx: &mut Tx, run: &Run) -> Result<bool> {
        let row = sqlx::query("SELECT 1 AS held FROM workflow_disabled WHERE namespace = $1 AND name = $2")
            .bind(&run.namespace)
            .bind(&run.workflow)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(row.is_some())
    }

    /// A finished run frees its slot: the oldest pending run of its group is due.
    pub(super) async fn wake_next(&self, tx: &mut Tx, run: &Run, now: i64) -> Result<()> {
        let sql = format!(
            "UPDATE workflow_runs SET due_at = $4, revision = revision + 1 WHERE id = (SELECT id FROM workflow_runs \
             WHERE namespace = $1 AND workflow = $2 AND {} AND state = 'pending' ORDER BY created_at, id LIMIT 1)",
            self.same_key()
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(&run.namespace)
            .bind(&run.workflow)
            .bind(run.concurrency_key.as_deref())
            .bind(now)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
