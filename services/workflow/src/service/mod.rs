//! The workflow service: definitions and their versions ([`Workflows::put`]
//! and friends), and runs ([`runs`]).

mod feed;
mod operate;
mod runs;
mod watch;

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex, OnceLock},
};

use chorus_runtime::time::now_micros;
use sha2::{Digest as _, Sha256};

use chorus_runtime::{egress::EgressGuard, metrics::Metrics, wakeup::Wakeups};
use tokio_util::sync::CancellationToken;

pub(crate) use self::runs::drive_key;
pub use self::runs::{GateCall, SignalCall, StartCall};
use crate::{
    config::WorkflowConfig,
    domain::{
        Definition, DefinitionPage, Disabled, Head, NewDefinition, PageToken, Problem, Put, Severity, StoredTrigger,
        Trigger, WorkflowSpec,
    },
    effects::Effects,
    engine::LocalEngine,
    error::{Result, WorkflowError},
    parse::{Parsed, parse, parse_for},
    repository::{DefinitionRepository, RunRepository},
};

/// The wake-up key engines wait on for runs that became due.
pub(crate) const ENGINE_KEY: &str = "engine";
/// The wake-up key triggers wait on for new versions.
pub(crate) const TRIGGERS_KEY: &str = "triggers";

/// The workflow service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Workflows {
    repository: Arc<dyn DefinitionRepository>,
    pub(crate) runs: Arc<dyn RunRepository>,
    pub(crate) effects: Arc<dyn Effects>,
    pub(crate) wakeups: Wakeups,
    config: Arc<WorkflowConfig>,
    /// `config.vars` as templates see them.
    pub(crate) vars: Arc<serde_json::Value>,
    /// Parsed definition versions: a stored version never changes.
    specs: Arc<Mutex<SpecCache>>,
    /// This process's writes of runs, for its watches.
    feed: self::feed::RunFeed,
    /// The engine spawned on this service, which takes the runs started here.
    engine: Arc<OnceLock<LocalEngine>>,
    /// Where runs started and finished and steps completed are counted.
    pub(crate) metrics: Metrics,
    /// Cancelled when the process stops: watches end then.
    shutdown: CancellationToken,
}

/// Parsed specs by (namespace, name, version).
type SpecCache = HashMap<(String, String, u32), Arc<WorkflowSpec>>;

/// A stored put, with the warnings the definition raised.
#[derive(Debug, Clone)]
pub struct PutOutcome {
    pub put: Put,
    pub warnings: Vec<Problem>,
}

impl Workflows {
    pub fn new(
        repository: Arc<dyn DefinitionRepository>,
        runs: Arc<dyn RunRepository>,
        effects: Arc<dyn Effects>,
        wakeups: Wakeups,
        config: WorkflowConfig,
    ) -> Self {
        let vars = serde_json::to_value(&config.vars).unwrap_or_default();
        Self {
            repository,
            runs,
            effects,
            wakeups,
            config: Arc::new(config),
            vars: Arc::new(vars),
            specs: Arc::default(),
            feed: self::feed::RunFeed::default(),
            engine: Arc::default(),
            metrics: Metrics::default(),
            shutdown: CancellationToken::new(),
        }
    }

    /// Ends the watches of runs when `shutdown` is cancelled, rather than
    /// hold the process's stop for its grace period.
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Counts into `metrics` (the server's) instead of a set of its own.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Runs started here go to `engine` from now on (to the first engine attached).
    pub(crate) fn attach_engine(&self, engine: LocalEngine) {
        if self.engine.set(engine).is_err() {
            tracing::debug!("another engine already takes the runs started through this service");
        }
    }

    /// The parsed spec of a stored version.
    pub(crate) async fn spec(&self, namespace: &str, name: &str, version: u32) -> Result<Arc<WorkflowSpec>> {
        let key = (namespace.to_owned(), name.to_owned(), version);
        if let Some(spec) = self.specs.lock().expect("spec cache poisoned").get(&key) {
            return Ok(Arc::clone(spec));
        }
        let definition = self.get(namespace, name, Some(version)).await?;
        let spec = Arc::new(self.spec_of(&definition)?);
        self.specs.lock().expect("spec cache poisoned").insert(key, Arc::clone(&spec));
        Ok(spec)
    }

    /// Parses a stored definition, which was valid when it was stored.
    pub(crate) fn spec_of(&self, definition: &Definition) -> Result<WorkflowSpec> {
        let parsed = parse(&definition.source, &definition.file);
        parsed.spec.ok_or_else(|| {
            WorkflowError::Corrupt(format!(
                "stored workflow {} v{} no longer parses",
                definition.name, definition.version
            ))
        })
    }

    /// The latest version of every workflow in every namespace.
    pub(crate) async fn latest_everywhere(&self) -> Result<Vec<Definition>> {
        self.repository.latest_everywhere().await
    }

    /// Every version in `namespace`, without sources.
    pub(crate) async fn versions(&self, namespace: &str) -> Result<Vec<Definition>> {
        self.repository.versions(namespace).await
    }

    /// How many versions `namespace` holds.
    pub(crate) async fn version_count(&self, namespace: &str) -> Result<u64> {
        self.repository.version_count(namespace).await
    }

    pub fn config(&self) -> &WorkflowConfig {
        &self.config
    }

    /// Parses and checks `source`; stores nothing.
    pub fn validate(&self, source: &str, file: &str) -> Parsed {
        parse_for(source, file, Some(&self.webhook_guard()))
    }

    /// What the engine's webhooks go through, for the warnings of a put.
    fn webhook_guard(&self) -> EgressGuard {
        EgressGuard::new(self.config.allow_private_webhooks, &[], crate::effects::WEBHOOK_REMEDY)
    }

    /// Stores `source` as the next version of the workflow it names, or
    /// rejects it whole with every problem found.
    pub async fn put(&self, namespace: &str, source: &str, file: &str, created_by: &str) -> Result<PutOutcome> {
        self.store(namespace, source, file, created_by, false).await
    }

    /// Puts `source`; with `keep_if_stored`, a text any version has already
    /// changes nothing (see [`NewDefinition::keep_if_stored`]).
    async fn store(
        &self,
        namespace: &str,
        source: &str,
        file: &str,
        created_by: &str,
        keep_if_stored: bool,
    ) -> Result<PutOutcome> {
        let parsed = parse_for(source, file, Some(&self.webhook_guard()));
        let Some(spec) = parsed.spec else {
            return Err(WorkflowError::InvalidDefinition { file: file.to_owned(), problems: parsed.problems });
        };
        let triggers = match spec.trigger {
            Trigger::Event { event_type, filter, .. } => vec![StoredTrigger { event_type, filter, cron: None }],
            Trigger::Cron { schedule } => {
                vec![StoredTrigger { event_type: String::new(), filter: serde_json::Map::new(), cron: Some(schedule) }]
            }
            Trigger::Manual => Vec::new(),
        };
        let definition = NewDefinition {
            namespace: namespace.to_owned(),
            name: spec.name,
            description: spec.description,
            triggers,
            source: source.to_owned(),
            file: file.to_owned(),
            source_sha256: hex_sha256(source),
            created_by: created_by.to_owned(),
            keep_if_stored,
        };
        let put = self.repository.put(definition, now_micros()).await?;
        if !put.unchanged {
            self.wakeups.notify(TRIGGERS_KEY);
        }
        let warnings = parsed.problems.into_iter().filter(|p| p.severity == Severity::Warning).collect();
        Ok(PutOutcome { put, warnings })
    }

    /// One version (`None`: the latest).
    pub async fn get(&self, namespace: &str, name: &str, version: Option<u32>) -> Result<Definition> {
        match self.repository.get(namespace, name, version).await? {
            Some(definition) => Ok(definition),
            None => Err(match version {
                Some(version) => WorkflowError::VersionNotFound { name: name.to_owned(), version },
                None => WorkflowError::NotFound(name.to_owned()),
            }),
        }
    }

    /// The latest version of `name`, and whether the workflow is disabled.
    pub async fn head(&self, namespace: &str, name: &str) -> Result<Head> {
        self.repository.head(namespace, name).await?.ok_or_else(|| WorkflowError::NotFound(name.to_owned()))
    }

    /// Disables `name`: no trigger, schedule or start makes a run of it until
    /// it is enabled; runs already started go on. A workflow disabled already
    /// keeps its first record. Its latest version, as it is now.
    pub async fn disable(&self, namespace: &str, name: &str, by: &str, reason: &str) -> Result<Definition> {
        let disabled = Disabled { by: by.to_owned(), reason: reason.to_owned(), at: now_micros() };
        self.repository.disable(namespace, name, disabled).await?;
        // NotFound for a name with no version, for which nothing was recorded.
        let definition = self.get(namespace, name, None).await?;
        tracing::info!(namespace, workflow = name, by, reason, "workflow disabled");
        Ok(definition)
    }

    /// Lets `name` start runs again. Its latest version, as it is now.
    pub async fn enable(&self, namespace: &str, name: &str, by: &str) -> Result<Definition> {
        self.repository.enable(namespace, name, now_micros()).await?;
        let definition = self.get(namespace, name, None).await?;
        self.wakeups.notify(ENGINE_KEY);
        tracing::info!(namespace, workflow = name, by, "workflow enabled");
        Ok(definition)
    }

    pub async fn list(
        &self,
        namespace: &str,
        name: Option<&str>,
        include_source: bool,
        after: Option<PageToken>,
        limit: u32,
    ) -> Result<DefinitionPage> {
        self.repository.list(namespace, name, include_source, after, limit).await
    }

    /// Puts every `*.yaml` / `*.yml` file of the configured folder into the
    /// configured namespace, in name order. Any invalid file fails the whole
    /// load with every problem of every file, unless the configuration
    /// skips invalid files (then each problem is logged); a missing folder
    /// loads nothing.
    pub async fn load_definitions_dir(&self) -> Result<Vec<PutOutcome>> {
        let dir = Path::new(&self.config.definitions_dir);
        if !dir.is_dir() {
            tracing::info!(dir = %dir.display(), "no workflow definitions folder");
            return Ok(Vec::new());
        }
        let mut sources = read_folder(dir)?;
        let mut problems = Vec::new();
        sources.retain(|(file, source)| {
            let errors: Vec<Problem> =
                parse(source, file).problems.into_iter().filter(|p| p.severity == Severity::Error).collect();
            let valid = errors.is_empty();
            problems.extend(errors);
            valid
        });
        if !problems.is_empty() && !self.config.skip_invalid_definitions {
            return Err(WorkflowError::InvalidDefinition { file: dir.display().to_string(), problems });
        }
        for problem in &problems {
            tracing::error!(%problem, "invalid workflow definition passed over: its workflow stays at its latest stored version");
        }
        let mut outcomes = Vec::with_capacity(sources.len());
        for (file, source) in &sources {
            let outcome = self.put_at_startup(source, file).await?;
            let definition = &outcome.put.definition;
            if let Some(replaced) = applied_elsewhere(&outcome.put, file) {
                tracing::warn!(
                    file,
                    workflow = %definition.name,
                    version = definition.version,
                    replaced = replaced.version,
                    applied_from = %replaced.file,
                    applied_by = %replaced.created_by,
                    "the file's new text is the latest version now, in place of a version applied since from \
                     elsewhere (a fix?): check that the file holds its changes"
                );
            }
            tracing::info!(file, workflow = %definition.name, version = definition.version, unchanged = outcome.put.unchanged, "workflow definition loaded");
            if let Some(disabled) = &definition.disabled {
                tracing::warn!(
                    file,
                    workflow = %definition.name,
                    disabled_by = %disabled.by,
                    reason = %disabled.reason,
                    "workflow disabled: it starts no run until `chorus workflow enable`"
                );
            }
            if definition.source_sha256 != hex_sha256(source) {
                tracing::warn!(
                    file,
                    workflow = %definition.name,
                    version = definition.version,
                    applied_from = %definition.file,
                    "the file holds an earlier version's text: the latest version, applied since, stays in use; \
                     edit the file to make it the latest again"
                );
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }
}

impl Workflows {
    /// Puts a file of the folder, unless some version already has its text.
    /// Replicas starting together put the same
    /// files at the same moment: the one that loses the race puts again and
    /// finds the other's version.
    async fn put_at_startup(&self, source: &str, file: &str) -> Result<PutOutcome> {
        let mut attempts = 0;
        loop {
            match self.store(&self.config.namespace, source, file, "chorus", true).await {
                Err(WorkflowError::Conflict(name)) if attempts < STARTUP_PUT_ATTEMPTS => {
                    attempts += 1;
                    tracing::debug!(file, workflow = %name, "workflow definition put concurrently; putting again");
                }
                outcome => return outcome,
            }
        }
    }
}

/// The latest version before a folder's file was put, when the put made a
/// new version over one that came from elsewhere (`chorus workflow apply`
/// of another file): the file may lack that version's changes.
fn applied_elsewhere<'p>(put: &'p Put, file: &str) -> Option<&'p Definition> {
    put.replaced.as_ref().filter(|replaced| replaced.file != file)
}

/// How many times a startup put is repeated after losing a race.
const STARTUP_PUT_ATTEMPTS: u32 = 5;

fn read_folder(dir: &Path) -> Result<Vec<(String, String)>> {
    let folder_error = |source| WorkflowError::Folder { path: dir.display().to_string(), source };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(folder_error)? {
        let path = entry.map_err(folder_error)?.path();
        let yaml = path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml");
        if yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let source = std::fs::read_to_string(&path)
                .map_err(|source| WorkflowError::Folder { path: path.display().to_string(), source })?;
            Ok((path.display().to_string(), source))
        })
        .collect()
}

/// Hex SHA-256 of `source`.
pub fn hex_sha256(source: &str) -> String {
    Sha256::digest(source.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(version: u32, file: &str) -> Definition {
        Definition {
            namespace: "default".into(),
            name: "sync".into(),
            version,
            description: String::new(),
            triggers: Vec::new(),
            source: String::new(),
            file: file.into(),
            source_sha256: String::new(),
            created_by: "ana".into(),
            created_at: 0,
            disabled: None,
        }
    }

    #[test]
    fn a_file_put_over_a_version_applied_from_elsewhere_is_told() {
        let fix = version(3, "../fixes/sync.yaml");
        let put = |unchanged, replaced: Option<&Definition>| Put {
            definition: version(4, "workflows/sync.yaml"),
            unchanged,
            replaced: replaced.cloned(),
        };
        let added = put(false, Some(&fix));
        let replaced = applied_elsewhere(&added, "workflows/sync.yaml");
        assert_eq!(replaced.map(|d| d.version), Some(3));
        assert!(applied_elsewhere(&put(true, None), "workflows/sync.yaml").is_none(), "nothing was put");
        let own = version(3, "workflows/sync.yaml");
        assert!(applied_elsewhere(&put(false, Some(&own)), "workflows/sync.yaml").is_none(), "the file's own");
        assert!(applied_elsewhere(&put(false, None), "workflows/sync.yaml").is_none(), "a new workflow");
    }
}
