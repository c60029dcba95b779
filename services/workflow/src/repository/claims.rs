//! An engine's claims on runs: taking the due runs, taking back its own
//! after a restart under its name, renewing them, and telling whether the copy
//! of a run it holds is still the row.

use chorus_runtime::storage::Backend;
use sqlx::AssertSqlSafe;

use super::{
    run_rows::{COLUMNS, Stored, corrupt, decode},
    runs::Claim,
    sql_runs::SqlRunRepository,
};
use crate::error::Result;

/// Lease writes (claims, renewals) are single statements whose commit does
/// not wait for the disk on PostgreSQL: the statement's own transaction turns
/// `synchronous_commit` off (a lease lost in a crash only means the run is
/// claimed again). The condition makes the setting part of the statement.
const RELAXED: &str = "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting) ";
const IS_RELAXED: &str = " AND (SELECT setting FROM relaxed) = 'off'";

impl SqlRunRepository {
    /// `UPDATE workflow_runs SET {set} WHERE {condition}`, relaxed on PostgreSQL.
    fn relaxed_update(&self, set: &str, condition: &str, returning: &str) -> String {
        format!(
            "{}UPDATE workflow_runs SET {set} WHERE {condition}{}{returning}",
            self.db.on_postgres(RELAXED),
            self.db.on_postgres(IS_RELAXED),
        )
    }

    /// `id` among the ids `subquery` locks, skipping rows locked elsewhere.
    ///
    /// On PostgreSQL the ids are an array the rows are then found by, one
    /// primary-key lookup each, however many the planner expects. As
    /// `id IN (subquery)` it joined the subquery's rows with the table, and
    /// for a claim of up to 450 runs (an engine's free room) it expected so
    /// many that it read the whole table to hash-join them: a bench run
    /// caught a claim of the few due runs reading all 10,689, every poll.
    fn among_locked(&self, subquery: &str) -> String {
        match self.db.backend() {
            Backend::Postgres => format!("id = ANY(ARRAY({subquery} FOR UPDATE SKIP LOCKED))"),
            Backend::Sqlite => format!("id IN ({subquery})"),
        }
    }

    /// Claims up to `limit` due runs no live engine holds.
    pub(super) async fn claim(&self, owner: &str, now: i64, lease_until: i64, limit: u32) -> Result<Vec<Claim>> {
        let sql = self.relaxed_update(
            "lease_owner = $1, lease_token = lease_token + 1, lease_until = $2",
            &self.among_locked(
                "SELECT id FROM workflow_runs WHERE due_at <= $3 AND (lease_until IS NULL OR lease_until < $3) \
                 ORDER BY due_at LIMIT $4",
            ),
            &format!(" RETURNING {COLUMNS}"),
        );
        let query = sqlx::query(AssertSqlSafe(sql)).bind(owner).bind(lease_until).bind(now).bind(i64::from(limit));
        self.claims(query).await
    }

    /// Claims anew every run `owner` held before it restarted.
    pub(super) async fn take_back(&self, owner: &str, claimed_before: i64, lease_until: i64) -> Result<Vec<Claim>> {
        let sql = self.relaxed_update(
            "lease_token = lease_token + 1, lease_until = $2",
            "lease_owner = $1 AND lease_until < $3",
            &format!(" RETURNING {COLUMNS}"),
        );
        self.claims(sqlx::query(AssertSqlSafe(sql)).bind(owner).bind(lease_until).bind(claimed_before)).await
    }

    /// Runs a claiming statement that returns the claimed rows. The engine
    /// holds each run as claimed, so its first change needs no read.
    async fn claims<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> Result<Vec<Claim>> {
        let rows = query.fetch_all(&mut *self.db.acquire().await?).await?;
        let mut claims = Vec::with_capacity(rows.len());
        for row in &rows {
            let stored = Stored { fresh: true, ..decode(row)? };
            let fence = stored.lease.clone().ok_or_else(|| corrupt("a claimed run without its claim"))?;
            let claim = Claim::on(&stored.run, fence);
            self.held.hold(&claim.run_id, Some(stored));
            claims.push(claim);
        }
        Ok(claims)
    }

    /// Renews first the rows nobody has locked, in one statement, then, on
    /// PostgreSQL, the few that were (rows the engine's batched writes hold
    /// for a moment) one at a time, each in a statement of its own that waits
    /// for that row alone. Waiting for them in one statement held every row it
    /// had renewed until the last wait ended — a third of the engine's rows
    /// at 64 runs in flight, for 105 ms on average in one bench run — and the
    /// engine's writes to those rows queued behind it.
    pub(super) async fn renew_claims(&self, owner: &str, lease_until: i64) -> Result<u64> {
        let mut connection = self.db.acquire().await?;
        let free = self.relaxed_update(
            "lease_until = $2",
            &self.among_locked("SELECT id FROM workflow_runs WHERE lease_owner = $1 ORDER BY id"),
            "",
        );
        let query = sqlx::query(AssertSqlSafe(free)).bind(owner).bind(lease_until);
        let mut renewed = query.execute(&mut *connection).await?.rows_affected();
        if self.db.backend() == Backend::Postgres {
            let behind: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM workflow_runs WHERE lease_owner = $1 AND lease_until < $2 ORDER BY id",
            )
            .bind(owner)
            .bind(lease_until)
            .fetch_all(&mut *connection)
            .await?;
            // The row by its primary key (`IS NOT DISTINCT FROM` serves no index: see `sql_runs`).
            let one = self.relaxed_update(
                "lease_until = $2",
                "id = $3 AND lease_owner IS NOT DISTINCT FROM $1 AND lease_until < $2",
                "",
            );
            for id in behind {
                let query = sqlx::query(AssertSqlSafe(one.as_str())).bind(owner).bind(lease_until).bind(id);
                renewed += query.execute(&mut *connection).await?.rows_affected();
            }
        }
        Ok(renewed)
    }

    /// Whether a run's row still has the revision and claim of `stored`.
    pub(super) async fn unchanged_since(&self, stored: &Stored) -> Result<bool> {
        let Some(fence) = &stored.lease else { return Ok(false) };
        // By the primary key alone (see `sql_runs`).
        let row: Option<(i64, Option<String>, i64)> =
            sqlx::query_as("SELECT revision, lease_owner, lease_token FROM workflow_runs WHERE id = $1")
                .bind(&stored.run.id)
                .fetch_optional(&mut *self.db.read().await?)
                .await?;
        Ok(row.is_some_and(|(revision, owner, token)| {
            revision == stored.revision && owner.as_ref() == Some(&fence.owner) && token == fence.token
        }))
    }
}
