//! What starts runs besides an explicit start: cron schedules, and event-bus
//! events matching a trigger's type, filter and condition. Each start carries
//! an idempotency key (`cron:<workflow>:<time>`,
//! `event:<sequence>:<published_at>:<workflow>`), so engines sharing a
//! database, or a restart, never start one twice.
//!
//! An event is judged by the versions that were the latest when it was
//! published, and starts a run on the version whose trigger it matched.
//! Before it judges an event, a namespace's reader reads the versions put
//! since it last looked (a put also wakes it), so an event published after a
//! put returned is judged by that put's version; a version listening to a
//! type the reader's stream does not carry makes it read again from its
//! cursor, which has not passed the event.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    convert::Infallible,
    str::FromStr as _,
    time::Duration,
};

use chorus_proto::eventbus::{self as bus, event_bus_client::EventBusClient};
use chorus_runtime::transport::Transport;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::render::Scope;
use crate::{
    domain::{Definition, OriginKind, RunOrigin, Trigger},
    error::WorkflowError,
    repository::TriggerCursor,
    service::{StartCall, TRIGGERS_KEY, Workflows},
};

/// Where event triggers read events from.
#[derive(Debug, Clone)]
pub struct TriggerSource {
    pub bus: EventBusClient<Transport>,
}

/// How often triggers look at the definitions (schedules, new versions)
/// without a wake-up.
const TICK: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_secs(1);

pub(super) fn spawn(workflows: Workflows, source: TriggerSource, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut since = chrono::Utc::now();
        let mut readers: HashMap<String, JoinHandle<()>> = HashMap::new();
        while !shutdown.is_cancelled() {
            let mut puts = workflows.wakeups.waiter(TRIGGERS_KEY);
            let now = chrono::Utc::now();
            match index(&workflows).await {
                Ok((crons, listening)) => {
                    for (namespace, workflow, schedule) in crons {
                        fire_cron(&workflows, &namespace, &workflow, &schedule, since, now).await;
                    }
                    keep_readers(&workflows, &source, &mut readers, &listening);
                }
                Err(error) => tracing::warn!(%error, "cannot read workflow triggers"),
            }
            since = now;
            tokio::select! {
                () = puts.wait(TICK) => {}
                () = shutdown.cancelled() => break,
            }
        }
        for reader in readers.into_values() {
            reader.abort();
        }
    });
}

type Index = (Vec<(String, String, String)>, BTreeSet<String>);

/// Cron schedules of every namespace's latest versions (but disabled
/// workflows': their times pass without a run, and are not made up for when
/// they are enabled), and the namespaces where a latest version listens to
/// events (disabled or not: a reader judges the events of a disabled
/// workflow's time as they come, starting nothing, so enabling it later does
/// not start runs for them).
async fn index(workflows: &Workflows) -> crate::error::Result<Index> {
    let mut crons = Vec::new();
    let mut listening = BTreeSet::new();
    for definition in workflows.latest_everywhere().await? {
        let spec = workflows.spec(&definition.namespace, &definition.name, definition.version).await?;
        match &spec.trigger {
            Trigger::Cron { schedule } if definition.disabled.is_none() => {
                crons.push((definition.namespace, definition.name, schedule.clone()));
            }
            Trigger::Cron { .. } => {}
            Trigger::Event { .. } => {
                listening.insert(definition.namespace);
            }
            Trigger::Manual => {}
        }
    }
    Ok((crons, listening))
}

async fn fire_cron(
    workflows: &Workflows,
    namespace: &str,
    workflow: &str,
    schedule: &str,
    since: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) {
    let Ok(cron) = croner::Cron::from_str(schedule) else { return };
    let mut after = since;
    while let Ok(next) = cron.find_next_occurrence(&after, false) {
        if next > now {
            break;
        }
        after = next;
        let call = StartCall {
            namespace: namespace.to_owned(),
            workflow: workflow.to_owned(),
            idempotency_key: Some(format!("cron:{workflow}:{}", next.timestamp())),
            origin: RunOrigin { kind: OriginKind::Cron, started_by: "cron".into(), ..RunOrigin::default() },
            trigger: serde_json::json!({ "scheduled_at": next.to_rfc3339() }),
            ..StartCall::default()
        };
        if let Err(error) = workflows.start_run(call).await {
            tracing::warn!(workflow, %error, "cannot start a scheduled run");
        }
    }
}

/// One event reader per namespace with event triggers.
fn keep_readers(
    workflows: &Workflows,
    source: &TriggerSource,
    readers: &mut HashMap<String, JoinHandle<()>>,
    listening: &BTreeSet<String>,
) {
    readers.retain(|namespace, reader| {
        let keep = listening.contains(namespace) && !reader.is_finished();
        if !keep {
            reader.abort();
        }
        keep
    });
    for namespace in listening {
        readers
            .entry(namespace.clone())
            .or_insert_with(|| tokio::spawn(read_events(workflows.clone(), source.bus.clone(), namespace.clone())));
    }
}

/// Why a reader stopped following its stream.
#[derive(Debug)]
enum Stop {
    /// A version put since listens to a type the stream does not carry.
    NewTypes,
    /// The bus ended the stream.
    Ended,
    /// The bus's log started over (its database was reset or restored): how
    /// that showed.
    StartedOver(String),
    Bus(tonic::Status),
    Storage(WorkflowError),
}

impl From<tonic::Status> for Stop {
    fn from(status: tonic::Status) -> Self {
        if past_the_log(&status) { Self::StartedOver(status.message().to_owned()) } else { Self::Bus(status) }
    }
}

impl From<WorkflowError> for Stop {
    fn from(error: WorkflowError) -> Self {
        Self::Storage(error)
    }
}

/// Judges a namespace's events, from its trigger cursor on, for good.
async fn read_events(workflows: Workflows, mut bus: EventBusClient<Transport>, namespace: String) {
    loop {
        let Err(stop) = follow(&workflows, &mut bus, &namespace).await;
        match stop {
            Stop::NewTypes => continue,
            Stop::Ended => tracing::debug!(%namespace, "the event stream for triggers ended"),
            // Refused credentials (workflow.token) will not heal by waiting.
            Stop::Bus(status)
                if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) =>
            {
                tracing::warn!(%namespace, error = %status.message(), "the event bus refuses the engine: event triggers cannot fire (check workflow.token)");
            }
            // The bus's database was reset or restored. Its events are judged
            // from the start; those judged before start no second run (a
            // run's key names its event's sequence and publication time).
            Stop::StartedOver(error) => {
                tracing::warn!(%namespace, %error, "the bus log started over: judging its events from the start");
                match workflows.runs.set_trigger_cursor(&namespace, &TriggerCursor::default()).await {
                    Ok(()) => continue,
                    Err(error) => tracing::warn!(%namespace, %error, "cannot save the trigger cursor"),
                }
            }
            Stop::Bus(status) => tracing::debug!(%namespace, %status, "cannot read events for triggers"),
            Stop::Storage(error) => tracing::warn!(%namespace, %error, "event triggers cannot go on; retrying"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Whether the bus refused a stream because its log ends before the cursor.
fn past_the_log(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt as _;
    let violations = status.get_details_bad_request().map(|request| request.field_violations).unwrap_or_default();
    status.code() == tonic::Code::InvalidArgument && violations.iter().any(|v| v.field == "after_sequence")
}

/// Streams the namespace's events after its cursor and judges each, moving
/// the cursor past it, until something stops it.
async fn follow(
    workflows: &Workflows,
    bus: &mut EventBusClient<Transport>,
    namespace: &str,
) -> Result<Infallible, Stop> {
    let mut puts = workflows.wakeups.waiter(TRIGGERS_KEY);
    let mut versions = Versions::read(workflows, namespace).await?;
    let streamed = versions.types();
    // Without a cursor, from the log's start: a version judges only what
    // was published after it was put.
    let cursor = workflows.runs.trigger_cursor(namespace).await?.unwrap_or_default();
    same_log(bus, namespace, &cursor).await?;
    let request = bus::StreamEventsRequest {
        namespace: namespace.to_owned(),
        after_sequence: Some(cursor.after_sequence),
        event_types: streamed.iter().cloned().collect(),
    };
    let mut stream = bus.stream_events(request).await?.into_inner();
    loop {
        tokio::select! {
            message = stream.message() => {
                let event = message?.ok_or(Stop::Ended)?;
                versions.catch_up(workflows, namespace, &streamed).await?;
                judge(workflows, namespace, &versions, &event).await?;
                let judged = TriggerCursor { after_sequence: event.sequence, published_at: published_micros(&event) };
                if let Err(error) = workflows.runs.set_trigger_cursor(namespace, &judged).await {
                    tracing::warn!(%namespace, %error, "cannot save the trigger cursor");
                }
            }
            () = puts.wait(TICK) => versions.catch_up(workflows, namespace, &streamed).await?,
        }
    }
}

/// Fails when the bus holds another event at the cursor's sequence than the
/// one judged there: its log started over and grew past the cursor again.
/// (An event its retention deleted cannot be compared, and is not.)
async fn same_log(bus: &mut EventBusClient<Transport>, namespace: &str, cursor: &TriggerCursor) -> Result<(), Stop> {
    let (Some(judged), Some(before)) = (cursor.published_at, cursor.after_sequence.checked_sub(1)) else {
        return Ok(());
    };
    let request = bus::ReadEventsRequest {
        namespace: namespace.to_owned(),
        after_sequence: before,
        event_types: Vec::new(),
        page_size: 1,
    };
    let page = bus.read_events(request).await?.into_inner();
    match page.events.first() {
        Some(event) if event.sequence == cursor.after_sequence && published_micros(event) != Some(judged) => {
            Err(Stop::StartedOver(format!(
                "the event at sequence {} is not the one judged there (published at {judged} µs)",
                cursor.after_sequence
            )))
        }
        _ => Ok(()),
    }
}

/// When an event was published, in µs.
fn published_micros(event: &bus::Event) -> Option<i64> {
    chorus_runtime::time::timestamp_micros("published_at", event.published_at).ok().flatten()
}

/// Every version of one namespace's workflows, without sources.
struct Versions {
    /// Each workflow's versions, oldest first.
    by_workflow: BTreeMap<String, Vec<Definition>>,
    /// How many versions the namespace held when they were read.
    count: u64,
}

impl Versions {
    async fn read(workflows: &Workflows, namespace: &str) -> crate::error::Result<Self> {
        let versions = workflows.versions(namespace).await?;
        let count = u64::try_from(versions.len()).unwrap_or(u64::MAX);
        let mut by_workflow: BTreeMap<String, Vec<Definition>> = BTreeMap::new();
        for definition in versions {
            by_workflow.entry(definition.name.clone()).or_default().push(definition);
        }
        Ok(Self { by_workflow, count })
    }

    /// Reads the versions put since these were read. One that listens to a
    /// type not `streamed` stops the reader, to read again from its cursor.
    async fn catch_up(
        &mut self,
        workflows: &Workflows,
        namespace: &str,
        streamed: &BTreeSet<String>,
    ) -> Result<(), Stop> {
        if workflows.version_count(namespace).await? == self.count {
            return Ok(());
        }
        *self = Self::read(workflows, namespace).await?;
        if self.types().is_subset(streamed) { Ok(()) } else { Err(Stop::NewTypes) }
    }

    /// The event types (or patterns) any version listens to.
    fn types(&self) -> BTreeSet<String> {
        let triggers = self.by_workflow.values().flatten().flat_map(|definition| &definition.triggers);
        triggers.filter(|trigger| trigger.listens()).map(|trigger| trigger.event_type.clone()).collect()
    }

    /// The version of each workflow that was the latest at `time`.
    fn as_of(&self, time: i64) -> impl Iterator<Item = &Definition> {
        self.by_workflow.values().filter_map(move |versions| versions.iter().rev().find(|v| v.created_at <= time))
    }
}

/// Starts a run of each workflow whose version as of the event's publication
/// matches it, on that version. Fails only when storage is unavailable: the
/// event is judged again (the runs it started are found by their keys).
async fn judge(
    workflows: &Workflows,
    namespace: &str,
    versions: &Versions,
    event: &bus::Event,
) -> crate::error::Result<()> {
    let Some(published) = published_micros(event) else { return Ok(()) };
    let payload: Value = serde_json::from_slice(&event.payload).unwrap_or(Value::Null);
    for definition in versions.as_of(published).filter(|definition| definition.triggers.iter().any(|t| t.listens())) {
        let (workflow, version) = (&definition.name, definition.version);
        let started = match workflows.spec(namespace, workflow, version).await {
            Ok(spec) if !matches(&spec.trigger, &event.r#type, &payload) => continue,
            Ok(_) => workflows.start_run(start_call(namespace, definition, event, published, &payload)).await,
            Err(error) => Err(error),
        };
        match started {
            Ok(run) => {
                tracing::info!(run_id = %run.id, workflow, version, sequence = event.sequence, "event started a run")
            }
            Err(error @ WorkflowError::Unavailable(_)) => return Err(error),
            // Events of the time a workflow is disabled start nothing, then or later.
            Err(WorkflowError::Disabled { .. }) => {
                tracing::debug!(workflow, sequence = event.sequence, "an event matched a disabled workflow")
            }
            Err(error) => tracing::warn!(workflow, version, %error, "an event matched but the run did not start"),
        }
    }
    Ok(())
}

/// The start of a run of `definition` by `event`.
fn start_call(
    namespace: &str,
    definition: &Definition,
    event: &bus::Event,
    published: i64,
    payload: &Value,
) -> StartCall {
    StartCall {
        namespace: namespace.to_owned(),
        workflow: definition.name.clone(),
        version: Some(definition.version),
        // The publication time tells apart two events of one sequence: one of
        // a log that was reset since, and one of the log before it.
        idempotency_key: Some(format!("event:{}:{published}:{}", event.sequence, definition.name)),
        origin: RunOrigin {
            kind: OriginKind::Event,
            started_by: event.source.clone(),
            event_sequence: Some(event.sequence),
            event_type: Some(event.r#type.clone()),
            task_id: None,
        },
        trigger: payload.clone(),
        ..StartCall::default()
    }
}

/// Whether an event of `event_type` with `payload` starts a run of `trigger`.
/// Its condition sees the payload as `trigger`, the name the run's steps
/// see it by, and as `event`.
fn matches(trigger: &Trigger, event_type: &str, payload: &Value) -> bool {
    let Trigger::Event { event_type: wanted, filter, condition } = trigger else { return false };
    if !chorus_runtime::glob::matches(wanted, event_type)
        || !filter.iter().all(|(key, value)| payload.get(key) == Some(value))
    {
        return false;
    }
    match condition {
        None => true,
        Some(condition) => {
            let scope = Scope::from_json(serde_json::json!({ "event": payload, "trigger": payload }));
            scope.condition(condition).unwrap_or(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn trigger(event_type: &str, filter: Value, condition: Option<&str>) -> Trigger {
        Trigger::Event {
            event_type: event_type.into(),
            filter: filter.as_object().cloned().unwrap_or_default(),
            condition: condition.map(str::to_owned),
        }
    }

    #[test]
    fn types_filters_and_conditions_decide() {
        let any_failure = trigger("*.failed", json!({"team": "a"}), Some("event.attempts > 2"));
        assert!(matches(&any_failure, "task.failed", &json!({"team": "a", "attempts": 3})));
        assert!(!matches(&any_failure, "task.failed", &json!({"team": "b", "attempts": 3})), "filter");
        assert!(!matches(&any_failure, "task.failed", &json!({"team": "a", "attempts": 1})), "condition");
        assert!(!matches(&any_failure, "task.completed", &json!({"team": "a", "attempts": 3})), "type");
        let as_steps_see_it = trigger("order.placed", json!({}), Some("{{ trigger.amount }} > 100"));
        assert!(matches(&as_steps_see_it, "order.placed", &json!({"amount": 500})), "the steps' name");
        assert!(!matches(&as_steps_see_it, "order.placed", &json!({"amount": 50})));
        assert!(matches(&trigger("tool:called", json!({}), None), "tool:called", &Value::Null));
        assert!(!matches(&Trigger::Manual, "tool:called", &Value::Null));
    }
}
