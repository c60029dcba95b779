//! The SQL definition repository: one implementation for PostgreSQL and SQLite.

use async_trait::async_trait;
use chorus_runtime::storage::{Db, DbErrorKind, ServiceMigrations, Tx, classify};
use sqlx::{AssertSqlSafe, Row as _, any::AnyRow};

use super::DefinitionRepository;
use crate::{
    domain::{Definition, DefinitionPage, Disabled, Head, NewDefinition, PageToken, Put},
    error::{Result, WorkflowError},
};

/// The workflow service's embedded migrations.
pub const MIGRATIONS: ServiceMigrations = chorus_runtime::service_migrations!(
    "workflow",
    [
        (1, "workflow definitions", "0001_workflow.sql"),
        (2, "workflow runs", "0002_runs.sql"),
        (3, "workflow run revisions", "0003_run_revisions.sql"),
        (4, "lz4 run bodies", "0004_lz4_bodies.sql"),
        (5, "room for run updates", "0005_run_fillfactor.sql"),
        (6, "runs by state", "0006_runs_by_state.sql"),
        (7, "events keyed by run", "0007_events_by_run.sql"),
        (8, "trigger cursor time", "0008_trigger_cursor_time.sql"),
        (9, "unfinished runs", "0009_unfinished_runs.sql"),
        (10, "disabled workflows", "0010_disabled_workflows.sql"),
    ]
);

const COLUMNS: &str =
    "namespace, name, version, description, triggers, source, file, source_sha256, created_by, created_at";
/// [`COLUMNS`] as read from [`DEFINITIONS`], with whether the workflow is disabled.
const SELECTED: &str = "d.namespace, d.name, d.version, d.description, d.triggers, d.source, d.file, \
     d.source_sha256, d.created_by, d.created_at, x.disabled_by, x.disabled_reason, x.disabled_at";
/// [`SELECTED`] but the source.
const LISTED: &str = "d.namespace, d.name, d.version, d.description, d.triggers, d.file, d.source_sha256, \
     d.created_by, d.created_at, x.disabled_by, x.disabled_reason, x.disabled_at";
/// Versions (`d`), each beside its workflow's disabled record (`x`), if any.
const DEFINITIONS: &str =
    "workflow_definitions d LEFT JOIN workflow_disabled x ON x.namespace = d.namespace AND x.name = d.name";

/// Definition storage on a [`Db`].
#[derive(Debug, Clone)]
pub struct SqlDefinitionRepository {
    db: Db,
}

impl SqlDefinitionRepository {
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

fn decode(row: &AnyRow, include_source: bool) -> Result<Definition> {
    let version: i64 = row.try_get("version")?;
    let triggers: String = row.try_get("triggers")?;
    Ok(Definition {
        namespace: row.try_get("namespace")?,
        name: row.try_get("name")?,
        version: stored_version(version)?,
        description: row.try_get("description")?,
        triggers: serde_json::from_str(&triggers).map_err(|error| WorkflowError::Corrupt(error.to_string()))?,
        source: if include_source { row.try_get("source")? } else { String::new() },
        file: row.try_get("file")?,
        source_sha256: row.try_get("source_sha256")?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        disabled: disabled(row)?,
    })
}

/// The disabled record a row of [`DEFINITIONS`] carries, if any.
fn disabled(row: &AnyRow) -> Result<Option<Disabled>> {
    let by: Option<String> = row.try_get("disabled_by")?;
    let Some(by) = by else { return Ok(None) };
    Ok(Some(Disabled { by, reason: row.try_get("disabled_reason")?, at: row.try_get("disabled_at")? }))
}

/// A version number as stored.
fn stored_version(version: i64) -> Result<u32> {
    u32::try_from(version).map_err(|_| WorkflowError::Corrupt(format!("version {version}")))
}

/// Whether some version of `definition`'s name has its text.
async fn stored_text(tx: &mut Tx, definition: &NewDefinition) -> Result<bool> {
    let stored = sqlx::query(
        "SELECT version FROM workflow_definitions WHERE namespace = $1 AND name = $2 AND source_sha256 = $3 LIMIT 1",
    )
    .bind(&definition.namespace)
    .bind(&definition.name)
    .bind(&definition.source_sha256)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(stored.is_some())
}

#[async_trait]
impl DefinitionRepository for SqlDefinitionRepository {
    async fn put(&self, definition: NewDefinition, now: i64) -> Result<Put> {
        let mut tx = self.db.begin().await?;
        let latest = sqlx::query(AssertSqlSafe(format!(
            "SELECT {SELECTED} FROM {DEFINITIONS} WHERE d.namespace = $1 AND d.name = $2 ORDER BY d.version DESC LIMIT 1"
        )))
        .bind(&definition.namespace)
        .bind(&definition.name)
        .fetch_optional(&mut *tx)
        .await?;
        let latest = latest.as_ref().map(|row| decode(row, true)).transpose()?;
        // The latest's text changes nothing; with `keep_if_stored`, nor does
        // any version's.
        if let Some(latest) = &latest
            && (latest.source_sha256 == definition.source_sha256
                || (definition.keep_if_stored && stored_text(&mut tx, &definition).await?))
        {
            tx.commit().await?;
            return Ok(Put { definition: latest.clone(), unchanged: true, replaced: None });
        }
        let version = latest.as_ref().map_or(1, |latest| latest.version + 1);
        let disabled = latest.as_ref().and_then(|latest| latest.disabled.clone());
        let triggers =
            serde_json::to_string(&definition.triggers).map_err(|error| WorkflowError::Corrupt(error.to_string()))?;
        let inserted = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO workflow_definitions ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        )))
        .bind(&definition.namespace)
        .bind(&definition.name)
        .bind(i64::from(version))
        .bind(&definition.description)
        .bind(&triggers)
        .bind(&definition.source)
        .bind(&definition.file)
        .bind(&definition.source_sha256)
        .bind(&definition.created_by)
        .bind(now)
        .execute(&mut *tx)
        .await;
        if let Err(error) = inserted {
            // Two puts of one name raced for the same version.
            return Err(match classify(&error) {
                DbErrorKind::UniqueViolation => WorkflowError::Conflict(definition.name),
                DbErrorKind::Unavailable | DbErrorKind::ForeignKeyViolation | DbErrorKind::Other => error.into(),
            });
        }
        tx.commit().await?;
        let NewDefinition {
            namespace,
            name,
            description,
            triggers,
            source,
            file,
            source_sha256,
            created_by,
            keep_if_stored: _,
        } = definition;
        let definition = Definition {
            namespace,
            name,
            version,
            description,
            triggers,
            source,
            file,
            source_sha256,
            created_by,
            created_at: now,
            disabled,
        };
        Ok(Put { definition, unchanged: false, replaced: latest })
    }

    async fn get(&self, namespace: &str, name: &str, version: Option<u32>) -> Result<Option<Definition>> {
        let row = match version {
            Some(version) => {
                sqlx::query(AssertSqlSafe(format!(
                    "SELECT {SELECTED} FROM {DEFINITIONS} WHERE d.namespace = $1 AND d.name = $2 AND d.version = $3"
                )))
                .bind(namespace)
                .bind(name)
                .bind(i64::from(version))
                .fetch_optional(&mut *self.db.read().await?)
                .await?
            }
            None => {
                sqlx::query(AssertSqlSafe(format!(
                    "SELECT {SELECTED} FROM {DEFINITIONS} WHERE d.namespace = $1 AND d.name = $2 \
                     ORDER BY d.version DESC LIMIT 1"
                )))
                .bind(namespace)
                .bind(name)
                .fetch_optional(&mut *self.db.read().await?)
                .await?
            }
        };
        row.as_ref().map(|row| decode(row, true)).transpose()
    }

    async fn head(&self, namespace: &str, name: &str) -> Result<Option<Head>> {
        let row = sqlx::query(
            "SELECT (SELECT MAX(version) FROM workflow_definitions WHERE namespace = $1 AND name = $2) AS latest, \
             x.disabled_by, x.disabled_reason, x.disabled_at FROM (SELECT 1 AS one) o \
             LEFT JOIN workflow_disabled x ON x.namespace = $1 AND x.name = $2",
        )
        .bind(namespace)
        .bind(name)
        .fetch_one(&mut *self.db.read().await?)
        .await?;
        let latest: Option<i64> = row.try_get("latest")?;
        let Some(latest) = latest else { return Ok(None) };
        Ok(Some(Head { latest: stored_version(latest)?, disabled: disabled(&row)? }))
    }

    async fn disable(&self, namespace: &str, name: &str, disabled: Disabled) -> Result<()> {
        sqlx::query(
            "INSERT INTO workflow_disabled (namespace, name, disabled_by, disabled_reason, disabled_at) \
             SELECT $1, $2, $3, $4, $5 WHERE EXISTS \
             (SELECT 1 FROM workflow_definitions WHERE namespace = $1 AND name = $2) \
             ON CONFLICT (namespace, name) DO NOTHING",
        )
        .bind(namespace)
        .bind(name)
        .bind(&disabled.by)
        .bind(&disabled.reason)
        .bind(disabled.at)
        .execute(&mut *self.db.acquire().await?)
        .await?;
        Ok(())
    }

    async fn enable(&self, namespace: &str, name: &str, now: i64) -> Result<()> {
        let mut tx = self.db.begin().await?;
        sqlx::query("DELETE FROM workflow_disabled WHERE namespace = $1 AND name = $2")
            .bind(namespace)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        // The runs the disable held back in the queue are due: each starts
        // as its concurrency limit allows.
        sqlx::query(
            "UPDATE workflow_runs SET due_at = $3, revision = revision + 1 \
             WHERE namespace = $1 AND workflow = $2 AND state = 'pending' AND due_at IS NULL",
        )
        .bind(namespace)
        .bind(name)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list(
        &self,
        namespace: &str,
        name: Option<&str>,
        include_source: bool,
        after: Option<PageToken>,
        limit: u32,
    ) -> Result<DefinitionPage> {
        let fetch = i64::from(limit) + 1;
        let rows = match name {
            Some(name) => {
                let below = match after {
                    Some(PageToken::BelowVersion(version)) => i64::from(version),
                    Some(PageToken::AfterName(_)) | None => i64::MAX,
                };
                sqlx::query(AssertSqlSafe(format!(
                    "SELECT {SELECTED} FROM {DEFINITIONS} WHERE d.namespace = $1 AND d.name = $2 AND d.version < $3 \
                     ORDER BY d.version DESC LIMIT $4"
                )))
                .bind(namespace)
                .bind(name)
                .bind(below)
                .bind(fetch)
                .fetch_all(&mut *self.db.read().await?)
                .await?
            }
            None => {
                let after_name = match after {
                    Some(PageToken::AfterName(name)) => name,
                    Some(PageToken::BelowVersion(_)) | None => String::new(),
                };
                sqlx::query(AssertSqlSafe(format!(
                    "SELECT {SELECTED} FROM {DEFINITIONS} WHERE d.namespace = $1 AND d.name > $2 \
                     AND d.version = (SELECT MAX(version) FROM workflow_definitions l \
                                      WHERE l.namespace = d.namespace AND l.name = d.name) \
                     ORDER BY d.name LIMIT $3"
                )))
                .bind(namespace)
                .bind(after_name)
                .bind(fetch)
                .fetch_all(&mut *self.db.read().await?)
                .await?
            }
        };
        let mut definitions = rows.iter().map(|row| decode(row, include_source)).collect::<Result<Vec<_>>>()?;
        let more = definitions.len() > usize::try_from(limit).unwrap_or(usize::MAX);
        definitions.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let next = match (more, definitions.last(), name) {
            (true, Some(last), Some(_)) => Some(PageToken::BelowVersion(last.version)),
            (true, Some(last), None) => Some(PageToken::AfterName(last.name.clone())),
            _ => None,
        };
        Ok(DefinitionPage { definitions, next })
    }

    async fn latest_everywhere(&self) -> Result<Vec<Definition>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {SELECTED} FROM {DEFINITIONS} WHERE d.version = (SELECT MAX(version) FROM workflow_definitions l \
             WHERE l.namespace = d.namespace AND l.name = d.name) ORDER BY d.namespace, d.name"
        )))
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        rows.iter().map(|row| decode(row, true)).collect()
    }

    async fn versions(&self, namespace: &str) -> Result<Vec<Definition>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {LISTED} FROM {DEFINITIONS} WHERE d.namespace = $1 ORDER BY d.name, d.version"
        )))
        .bind(namespace)
        .fetch_all(&mut *self.db.read().await?)
        .await?;
        rows.iter().map(|row| decode(row, false)).collect()
    }

    async fn version_count(&self, namespace: &str) -> Result<u64> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM workflow_definitions WHERE namespace = $1")
            .bind(namespace)
            .fetch_one(&mut *self.db.read().await?)
            .await?;
        Ok(u64::try_from(count).unwrap_or_default())
    }
}

#[cfg(test)]
chorus_runtime::every_migration_is_registered!(MIGRATIONS);
