//! The owner's inbox: reads (peeked, consumed, or held until acknowledged)
//! that stay under a reply's size, acknowledgements, and the completions a
//! blocking spawn keeps for its own answer.

use chorus_runtime::{
    storage::{Backend, placeholders},
    time::micros,
};
use sqlx::AssertSqlSafe;

use super::{SqlTaskRepository, rows};
use crate::{
    domain::{INBOX_READ_BYTES, InboxMessage, InboxRead, Owner, now_micros},
    error::Result,
};

/// The inbox columns [`rows::decode_inbox`] reads.
macro_rules! inbox_columns {
    () => {
        "id, namespace, owner_kind, owner_id, task_id, parent_task_id, kind, message, task_state, created_at"
    };
}
pub(super) use inbox_columns;

/// Whether inbox row `i` may be read at $5 (now): unread, held by no reader,
/// and not a completion a blocking spawn waits to answer with.
const READABLE: &str = "i.namespace = $1 AND i.owner_kind = $2 AND i.owner_id = $3 AND i.read_at IS NULL \
     AND (i.invisible_until IS NULL OR i.invisible_until <= $5) AND (i.kind <> 'completion' OR NOT EXISTS \
     (SELECT 1 FROM taskstore_tasks w WHERE w.namespace = i.namespace AND w.id = i.task_id AND w.awaited_until > $5))";

/// The statement of a read: up to $4 readable messages, oldest first, and of
/// those as many as fit in $6 bytes together (the first, whatever its size).
fn read_statement(backend: Backend, read: InboxRead) -> String {
    let (size, lock) = match backend {
        Backend::Postgres => ("octet_length(i.message)", " FOR UPDATE SKIP LOCKED"),
        Backend::Sqlite => ("length(CAST(i.message AS BLOB))", ""),
    };
    let lock = if read == InboxRead::Peek { "" } else { lock };
    let picked = format!(
        "WITH candidates AS (SELECT i.id, COALESCE({size}, 0) AS size FROM taskstore_inbox i WHERE {READABLE} \
         ORDER BY i.id LIMIT $4{lock}), picked AS (SELECT id FROM (SELECT id, size, SUM(size) OVER (ORDER BY id) \
         AS total FROM candidates) s WHERE total <= $6 OR total = size)"
    );
    let columns = inbox_columns!();
    match read {
        InboxRead::Peek => {
            format!("{picked} SELECT {columns} FROM taskstore_inbox WHERE id IN (SELECT id FROM picked) ORDER BY id")
        }
        InboxRead::Consume => format!(
            "{picked} UPDATE taskstore_inbox SET read_at = $5 WHERE id IN (SELECT id FROM picked) \
             RETURNING {columns}"
        ),
        InboxRead::Hold { .. } => format!(
            "{picked} UPDATE taskstore_inbox SET invisible_until = $7 WHERE id IN (SELECT id FROM picked) \
             RETURNING {columns}"
        ),
    }
}

impl SqlTaskRepository {
    pub(super) async fn read_inbox_of(
        &self,
        namespace: &str,
        owner: &Owner,
        max: u32,
        read: InboxRead,
    ) -> Result<Vec<InboxMessage>> {
        let mut conn = self.db.acquire().await?;
        let now = now_micros();
        let sql = read_statement(self.backend(), read);
        let statement = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(owner.kind.as_str())
            .bind(&owner.id)
            .bind(i64::from(max))
            .bind(now)
            .bind(INBOX_READ_BYTES);
        let statement = match read {
            InboxRead::Hold { deadline } => statement.bind(now.saturating_add(micros(deadline))),
            InboxRead::Peek | InboxRead::Consume => statement,
        };
        let rows = statement.fetch_all(&mut *conn).await?;
        let mut messages = rows.iter().map(rows::decode_inbox).collect::<Result<Vec<_>>>()?;
        messages.sort_by_key(|message| message.id.parse::<i64>().unwrap_or(i64::MAX));
        Ok(messages)
    }

    /// Marks the owner's messages `ids` read; how many were unread.
    pub(super) async fn ack(&self, namespace: &str, owner: &Owner, ids: &[i64]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let sql = format!(
            "UPDATE taskstore_inbox SET read_at = $4 WHERE namespace = $1 AND owner_kind = $2 AND owner_id = $3 \
             AND read_at IS NULL AND id IN ({})",
            placeholders(5, ids.len())
        );
        let mut statement = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(owner.kind.as_str())
            .bind(&owner.id)
            .bind(now_micros());
        for id in ids {
            statement = statement.bind(*id);
        }
        Ok(statement.execute(&mut *self.db.acquire().await?).await?.rows_affected())
    }

    /// Consumes the completions of these finished children that no blocking
    /// spawn keeps and no reader holds; the ids whose completion it consumed.
    pub(super) async fn take(&self, namespace: &str, task_ids: &[String]) -> Result<Vec<String>> {
        let mut tx = self.begin().await?;
        let now = now_micros();
        let mut taken = Vec::new();
        for task_id in task_ids {
            let marked = sqlx::query(
                "UPDATE taskstore_inbox SET read_at = $3 WHERE namespace = $1 AND task_id = $2 \
                 AND kind = 'completion' AND read_at IS NULL AND (invisible_until IS NULL OR invisible_until <= $3) \
                 AND NOT EXISTS (SELECT 1 FROM taskstore_tasks w WHERE w.namespace = $1 AND w.id = $2 \
                 AND w.awaited_until > $3)",
            )
            .bind(namespace)
            .bind(task_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            if marked.rows_affected() > 0 {
                taken.push(task_id.clone());
            }
        }
        tx.commit().await?;
        Ok(taken)
    }

    /// Ends a blocking spawn's wait on `child_id`: its completion is consumed
    /// when `taken` (the spawn answers with it), else left to the inbox.
    pub(super) async fn end_wait(&self, namespace: &str, child_id: &str, taken: bool) -> Result<()> {
        let mut tx = self.begin().await?;
        if taken {
            sqlx::query(
                "UPDATE taskstore_inbox SET read_at = $3 WHERE namespace = $1 AND task_id = $2 \
                 AND kind = 'completion' AND read_at IS NULL",
            )
            .bind(namespace)
            .bind(child_id)
            .bind(now_micros())
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("UPDATE taskstore_tasks SET awaited_until = NULL WHERE namespace = $1 AND id = $2")
            .bind(namespace)
            .bind(child_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Keeps the completion of `child_id`, which a blocking spawn waits for,
/// for that spawn until `until`.
pub(super) async fn await_child(
    conn: &mut sqlx::AnyConnection,
    namespace: &str,
    child_id: &str,
    until: i64,
) -> Result<()> {
    sqlx::query("UPDATE taskstore_tasks SET awaited_until = $3 WHERE namespace = $1 AND id = $2")
        .bind(namespace)
        .bind(child_id)
        .bind(until)
        .execute(conn)
        .await?;
    Ok(())
}

/// Marks the questions task `task_id` asked its owner read: they are
/// answered (by `AnswerQuestion`, or a user's message), and an answer to
/// one now would find no question.
pub(super) async fn questions_answered(conn: &mut sqlx::AnyConnection, namespace: &str, task_id: &str) -> Result<()> {
    sqlx::query(
        "UPDATE taskstore_inbox SET read_at = $3 WHERE namespace = $1 AND task_id = $2 AND kind = 'question' \
         AND read_at IS NULL",
    )
    .bind(namespace)
    .bind(task_id)
    .bind(now_micros())
    .execute(conn)
    .await?;
    Ok(())
}
