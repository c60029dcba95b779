//! What the run gauges read: the unfinished runs by state.

use sqlx::Row as _;

use super::{run_rows::corrupt, runs::Unfinished, sql_runs::SqlRunRepository};
use crate::{domain::RunState, error::Result};

impl SqlRunRepository {
    /// Through the partial index `workflow_runs_unfinished`.
    pub(super) async fn count_unfinished(&self) -> Result<Vec<Unfinished>> {
        let rows = sqlx::query(
            "SELECT state, COUNT(*) AS runs, MIN(updated_at) AS since FROM workflow_runs \
             WHERE state IN ('pending', 'running', 'waiting') GROUP BY state",
        )
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        rows.iter()
            .map(|row| {
                let state: String = row.try_get("state")?;
                let runs: i64 = row.try_get("runs")?;
                Ok(Unfinished {
                    state: RunState::parse(&state).ok_or_else(|| corrupt(format!("run state {state}")))?,
                    runs: u64::try_from(runs).unwrap_or(0),
                    since: row.try_get("since")?,
                })
            })
            .collect()
    }
}
