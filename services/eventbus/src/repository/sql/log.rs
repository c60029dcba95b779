//! The log: publishing (with fan-out to deliveries) and reading.

use std::{collections::BTreeMap, sync::LazyLock};

use chorus_runtime::storage::placeholders;
use sqlx::AssertSqlSafe;

use super::{SqlEventRepository, Tx, head, rows};
use crate::{
    domain::{EventPage, EventQuery, NewEvent, Published},
    error::Result,
};

/// The events of namespace $1 under the keys of the JSON list $2. The
/// `LIMIT 1` (a key is unique) keeps the planner from flattening the lateral
/// probe into a join that reads the namespace's whole log.
const KNOWN_KEYS_POSTGRES: &str = "SELECT e.idempotency_key, e.sequence, e.published_at \
     FROM json_array_elements_text($2::json) AS k(key) CROSS JOIN LATERAL (SELECT idempotency_key, sequence, \
     published_at FROM eventbus_events WHERE namespace = $1 AND idempotency_key = k.key LIMIT 1) e";

/// The events already logged in namespace $1 under the keys of the JSON
/// list $2, on SQLite.
const KNOWN_KEYS_SQLITE: &str = "SELECT idempotency_key, sequence, published_at FROM eventbus_events \
     WHERE namespace = $1 AND idempotency_key IN (SELECT value FROM json_each($2))";

/// Events per insert on PostgreSQL. A shorter last chunk is padded with
/// rows of NULLs, which the statement skips: every insert is one statement,
/// prepared once per connection. (A VALUES row per event made a new
/// statement for every batch size, parsed and planned anew; a JSON list
/// costs PostgreSQL's JSON parser as much as the insert itself.)
const POSTGRES_CHUNK: usize = 64;
/// Bound per event: sequence, type, source, subject, payload, content type,
/// attributes, idempotency key, time.
const POSTGRES_EVENT_PARAMS: usize = 9;

/// Appends a chunk of events to namespace $1's log, published at $2.
static INSERT_EVENTS_POSTGRES: LazyLock<String> = LazyLock::new(|| {
    let rows: Vec<String> = (0..POSTGRES_CHUNK)
        .map(|n| format!("({})", placeholders(3 + n * POSTGRES_EVENT_PARAMS, POSTGRES_EVENT_PARAMS)))
        .collect();
    format!(
        "INSERT INTO eventbus_events (namespace, sequence, type, source, subject, payload, content_type, \
         attributes, idempotency_key, time, published_at) \
         SELECT $1, e.sequence, e.type, e.source, e.subject, e.payload, e.content_type, e.attributes, \
         e.idempotency_key, e.time, $2 FROM (VALUES {}) AS e(sequence, type, source, subject, payload, \
         content_type, attributes, idempotency_key, time) WHERE e.sequence IS NOT NULL",
        rows.join(", ")
    )
});

/// Appends the events of the JSON list $2 (see [`LoggedEvent`]) to namespace
/// $1's log, published at $3: one statement, whatever the batch's size. (A
/// VALUES row per event makes a statement SQLite prepares and binds in time
/// quadratic in its parameters.) The list is parsed once, into JSONB, whose
/// fields are then read without parsing again: with `json_each` over the
/// text, each of the nine `->>` parsed its event anew, 15 µs an event
/// against 6.
const INSERT_EVENTS_SQLITE: &str = "INSERT INTO eventbus_events (namespace, sequence, type, source, subject, \
     payload, content_type, attributes, idempotency_key, time, published_at) \
     SELECT $1, e.value ->> 'sequence', e.value ->> 'type', e.value ->> 'source', e.value ->> 'subject', \
     unhex(e.value ->> 'payload'), e.value ->> 'content_type', e.value ->> 'attributes', \
     e.value ->> 'idempotency_key', e.value ->> 'time', $3 FROM jsonb_each(jsonb($2)) AS e";

/// One event of an insert's JSON list.
#[derive(serde::Serialize)]
struct LoggedEvent<'a> {
    sequence: i64,
    #[serde(rename = "type")]
    event_type: &'a str,
    source: &'a str,
    subject: &'a str,
    /// Hex: a JSON text holds no raw bytes.
    payload: String,
    content_type: &'a str,
    attributes: String,
    idempotency_key: Option<&'a str>,
    time: i64,
}

impl SqlEventRepository {
    pub(super) async fn publish_events(
        &self,
        namespace: &str,
        events: Vec<NewEvent>,
        now: i64,
    ) -> Result<Vec<Published>> {
        let mut tx = self.begin().await?;
        let head = self.lock_head(&mut tx, namespace).await?;
        let mut known = self.known_keys(&mut tx, namespace, &events).await?;
        let mut results = Vec::with_capacity(events.len());
        let mut fresh = Vec::with_capacity(events.len());
        let mut next = head;
        for event in events {
            if let Some(key) = &event.idempotency_key
                && let Some(first) = known.get(key)
            {
                results.push(Published { duplicate: true, ..*first });
                continue;
            }
            next += 1;
            let published = Published { sequence: next, duplicate: false, published_at: now };
            if let Some(key) = &event.idempotency_key {
                known.insert(key.clone(), published);
            }
            results.push(published);
            fresh.push((next, event));
        }
        if !fresh.is_empty() {
            self.insert_events(&mut tx, namespace, &fresh, now).await?;
            sqlx::query("UPDATE eventbus_heads SET head = $2 WHERE namespace = $1")
                .bind(namespace)
                .bind(next)
                .execute(&mut *tx)
                .await?;
            self.fan_out(&mut tx, namespace, None, head + 1, next, now).await?;
        }
        tx.commit().await?;
        Ok(results)
    }

    /// The events already in the log under the batch's idempotency keys.
    async fn known_keys(
        &self,
        tx: &mut Tx,
        namespace: &str,
        events: &[NewEvent],
    ) -> Result<BTreeMap<String, Published>> {
        let keys: Vec<&String> = events.iter().filter_map(|event| event.idempotency_key.as_ref()).collect();
        let mut known = BTreeMap::new();
        let mut record = |rows: Vec<(String, i64, i64)>| {
            for (key, sequence, published_at) in rows {
                known.insert(key, Published { sequence, duplicate: true, published_at });
            }
        };
        if keys.is_empty() {
            return Ok(known);
        }
        // On PostgreSQL, one probe of the idempotency index per key, whatever
        // the statistics say: with an IN list, a planner that still thinks
        // the log small (a young table, not analyzed since it grew) reads
        // every event of the namespace instead.
        let sql = if self.postgres() { KNOWN_KEYS_POSTGRES } else { KNOWN_KEYS_SQLITE };
        let rows = sqlx::query_as::<_, (String, i64, i64)>(sql)
            .bind(namespace)
            .bind(rows::to_json(&keys))
            .fetch_all(&mut **tx)
            .await?;
        record(rows);
        Ok(known)
    }

    /// Creates pending deliveries of the events `first..=last` for every
    /// handler (or only `handler`) that takes them; existing ones are kept.
    /// Events just published have none yet (their sequences are new under
    /// the head's lock), so their insert skips the conflict check. A
    /// namespace without handlers is seen first, by one probe, and its
    /// events are not read at all.
    pub(super) async fn fan_out(
        &self,
        conn: &mut sqlx::AnyConnection,
        namespace: &str,
        handler: Option<&str>,
        first: i64,
        last: i64,
        now: i64,
    ) -> Result<u64> {
        let sql = format!(
            "INSERT INTO eventbus_deliveries (namespace, sequence, handler, state, attempt, created_at, updated_at) \
             SELECT DISTINCT e.namespace, e.sequence, t.handler, 'pending', 0, $4, $4 \
             FROM eventbus_events e JOIN eventbus_handler_types t ON t.namespace = e.namespace AND {} \
             WHERE e.namespace = $1 AND e.sequence >= $2 AND e.sequence <= $3 AND ($5 = '' OR t.handler = $5) \
             AND EXISTS (SELECT 1 FROM eventbus_handler_types h WHERE h.namespace = $1){}",
            self.type_match("e.type", "t.matcher"),
            if handler.is_some() { " ON CONFLICT (namespace, sequence, handler) DO NOTHING" } else { "" }
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(namespace)
            .bind(first)
            .bind(last)
            .bind(now)
            .bind(handler.unwrap_or_default())
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    pub(super) async fn read_log(&self, query: &EventQuery) -> Result<EventPage> {
        let mut conn = self.db.read().await?;
        let head = head(&mut conn, &query.namespace).await?;
        let filter = if query.types.is_empty() {
            String::new()
        } else {
            let alternatives: Vec<String> =
                (0..query.types.len()).map(|n| self.type_match("type", &format!("${}", n + 5))).collect();
            format!(" AND ({})", alternatives.join(" OR "))
        };
        let sql = format!(
            "SELECT {} FROM eventbus_events WHERE namespace = $1 AND sequence > $2 AND sequence <= $3{filter} \
             ORDER BY sequence LIMIT $4",
            rows::event_columns!("")
        );
        let mut statement = sqlx::query(AssertSqlSafe(sql))
            .bind(&query.namespace)
            .bind(query.after)
            .bind(head)
            .bind(i64::from(query.limit));
        for pattern in &query.types {
            statement = statement.bind(self.matcher(pattern));
        }
        let events =
            statement.fetch_all(&mut *conn).await?.iter().map(rows::decode_event).collect::<Result<Vec<_>>>()?;
        let next_after = match events.last() {
            Some(last) if events.len() >= query.limit as usize => last.sequence,
            _ => head.max(query.after),
        };
        Ok(EventPage { events, next_after, head })
    }
}

impl SqlEventRepository {
    async fn insert_events(&self, tx: &mut Tx, namespace: &str, events: &[(i64, NewEvent)], now: i64) -> Result<()> {
        if !self.postgres() {
            return insert_events_sqlite(tx, namespace, events, now).await;
        }
        for chunk in events.chunks(POSTGRES_CHUNK) {
            let mut query = sqlx::query(AssertSqlSafe(INSERT_EVENTS_POSTGRES.as_str())).bind(namespace).bind(now);
            for (sequence, event) in chunk {
                query = query
                    .bind(*sequence)
                    .bind(event.event_type.as_str())
                    .bind(&event.source)
                    .bind(&event.subject)
                    .bind(&event.payload)
                    .bind(&event.content_type)
                    .bind(rows::to_json(&event.attributes))
                    .bind(event.idempotency_key.as_deref())
                    .bind(event.time.unwrap_or(now));
            }
            for _ in chunk.len()..POSTGRES_CHUNK {
                query = query
                    .bind(None::<i64>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&[u8]>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<i64>);
            }
            query.execute(&mut **tx).await?;
        }
        Ok(())
    }
}

async fn insert_events_sqlite(tx: &mut Tx, namespace: &str, events: &[(i64, NewEvent)], now: i64) -> Result<()> {
    let logged: Vec<LoggedEvent<'_>> = events
        .iter()
        .map(|(sequence, event)| LoggedEvent {
            sequence: *sequence,
            event_type: event.event_type.as_str(),
            source: &event.source,
            subject: &event.subject,
            payload: hex(&event.payload),
            content_type: &event.content_type,
            attributes: rows::to_json(&event.attributes),
            idempotency_key: event.idempotency_key.as_deref(),
            time: event.time.unwrap_or(now),
        })
        .collect();
    sqlx::query(INSERT_EVENTS_SQLITE).bind(namespace).bind(rows::to_json(&logged)).bind(now).execute(&mut **tx).await?;
    Ok(())
}

/// Bytes as lowercase hex: how a payload travels in the JSON list of
/// [`INSERT_EVENTS_SQLITE`], whose `unhex` turns it back into bytes.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::hex;

    #[test]
    fn hex_spells_every_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }
}
