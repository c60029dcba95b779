//! Retention: finished task trees past `taskstore.retention_ms` are deleted
//! with everything that belongs to them.
//!
//! A tree goes whole, found from its root, once every task in it finished
//! before the cutoff: a root finished long ago may still have a live child
//! (a parent may complete before the subtasks it spawned), and deleting the
//! root alone would leave that child pointing at nothing. Events the outbox
//! relay has not published yet hold their tree back, so the event bus still
//! gets every change.

use chorus_runtime::storage::Backend;
use sqlx::{AnyConnection, AssertSqlSafe, Row as _};

use super::SqlTaskRepository;
use crate::{
    domain::{PurgeCursor, Purged},
    error::Result,
};

/// Most task ids one delete names.
const IDS_PER_DELETE: usize = 500;

/// Finished roots that finished at or before $1, after the root
/// ($2, $3, $4) in the order they finished; up to $5.
macro_rules! finished_roots {
    () => {
        "SELECT namespace, id, status_timestamp FROM taskstore_tasks \
         WHERE parent_id IS NULL AND state IN ('completed', 'failed', 'canceled', 'rejected') \
         AND status_timestamp <= $1 AND (status_timestamp, namespace, id) > ($2, $3, $4) \
         ORDER BY status_timestamp, namespace, id LIMIT $5"
    };
}
/// Another replica's purge skips the roots this one holds.
const ROOTS_POSTGRES: &str = concat!(finished_roots!(), " FOR UPDATE SKIP LOCKED");
const ROOTS_SQLITE: &str = finished_roots!();

/// Every task of the tree of root $2 in namespace $1, and whether it may go:
/// finished at or before $3, with every event of it past each relay's cursor.
const TREE: &str = "WITH RECURSIVE tree(id) AS (SELECT CAST($2 AS TEXT) UNION ALL \
     SELECT t.id FROM taskstore_tasks t JOIN tree ON t.namespace = $1 AND t.parent_id = tree.id) \
     SELECT t.id, CASE WHEN t.state IN ('completed', 'failed', 'canceled', 'rejected') AND t.status_timestamp <= $3 \
     AND NOT EXISTS (SELECT 1 FROM taskstore_events e JOIN taskstore_outbox o \
     ON (e.tx_id, e.id) > (o.cursor_tx, o.cursor_id) WHERE e.namespace = $1 AND e.task_id = t.id) \
     THEN 1 ELSE 0 END AS done FROM tree JOIN taskstore_tasks t ON t.namespace = $1 AND t.id = tree.id";

/// The tables of what belongs to a task, each naming it in `task_id`.
const OWNED: [&str; 5] =
    ["taskstore_events", "taskstore_inbox", "taskstore_push_configs", "taskstore_history", "taskstore_artifacts"];

impl SqlTaskRepository {
    pub(super) async fn purge(&self, finished_before: i64, after: Option<&PurgeCursor>, limit: u32) -> Result<Purged> {
        let mut tx = self.begin().await?;
        let roots = match self.backend() {
            Backend::Postgres => ROOTS_POSTGRES,
            Backend::Sqlite => ROOTS_SQLITE,
        };
        let rows = sqlx::query(roots)
            .bind(finished_before)
            .bind(after.map_or(i64::MIN, |cursor| cursor.finished_at))
            .bind(after.map_or("", |cursor| cursor.namespace.as_str()))
            .bind(after.map_or("", |cursor| cursor.id.as_str()))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        let mut purged = Purged::default();
        for row in &rows {
            let root = PurgeCursor {
                namespace: row.try_get("namespace")?,
                id: row.try_get("id")?,
                finished_at: row.try_get("status_timestamp")?,
            };
            if let Some(tree) = purgeable_tree(&mut tx, &root, finished_before).await? {
                purged.tasks += delete_tasks(&mut tx, &root.namespace, &tree).await?;
            }
            purged.next = Some(root);
        }
        tx.commit().await?;
        if rows.len() < limit as usize {
            purged.next = None;
        }
        Ok(purged)
    }
}

/// The ids of the root's tree when every task of it may go.
async fn purgeable_tree(
    conn: &mut AnyConnection,
    root: &PurgeCursor,
    finished_before: i64,
) -> Result<Option<Vec<String>>> {
    let rows =
        sqlx::query(TREE).bind(&root.namespace).bind(&root.id).bind(finished_before).fetch_all(&mut *conn).await?;
    let mut tree = Vec::with_capacity(rows.len());
    for row in &rows {
        if row.try_get::<i64, _>("done")? == 0 {
            return Ok(None);
        }
        tree.push(row.try_get("id")?);
    }
    Ok(Some(tree))
}

/// Deletes the tasks and all that belongs to them; how many tasks.
async fn delete_tasks(conn: &mut AnyConnection, namespace: &str, ids: &[String]) -> Result<u64> {
    let mut deleted = 0;
    for chunk in ids.chunks(IDS_PER_DELETE) {
        for table in OWNED {
            delete(conn, table, "task_id", namespace, chunk).await?;
        }
        deleted += delete(conn, "taskstore_tasks", "id", namespace, chunk).await?;
    }
    Ok(deleted)
}

/// Deletes the rows of `table` whose `column` is one of `ids`; how many.
async fn delete(conn: &mut AnyConnection, table: &str, column: &str, namespace: &str, ids: &[String]) -> Result<u64> {
    let placeholders: Vec<String> = (2..ids.len() + 2).map(|n| format!("${n}")).collect();
    let sql = format!("DELETE FROM {table} WHERE namespace = $1 AND {column} IN ({})", placeholders.join(", "));
    let statement = ids.iter().fold(sqlx::query(AssertSqlSafe(sql)).bind(namespace), |query, id| query.bind(id));
    Ok(statement.execute(&mut *conn).await?.rows_affected())
}
