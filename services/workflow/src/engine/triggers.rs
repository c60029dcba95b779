//! What starts runs besides an explicit start: cron schedules, and event-bus
//! events matching a trigger's type, filter and condition. Each start carries
//! an idempotency key (`cron:<workflow>:<time>`, `event:<sequence>:<workflow>`),
//! so engines sharing a database, or a restart, never start one twice.

use std::{
    collections::{BTreeSet, HashMap},
    str::FromStr as _,
    sync::Arc,
    time::Duration,
};

use chorus_proto::eventbus::{self as bus, event_bus_client::EventBusClient};
use chorus_runtime::transport::Transport;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::render::Scope;
use crate::{
    domain::{OriginKind, RunOrigin, Trigger, WorkflowSpec},
    service::{StartCall, Workflows},
};

/// Where event triggers read events from.
#[derive(Debug, Clone)]
pub struct TriggerSource {
    pub bus: EventBusClient<Transport>,
}

const TICK: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_secs(1);

/// A workflow's latest version with an event trigger. It takes the events
/// published since that version was put.
#[derive(Debug, Clone)]
struct Listener {
    workflow: String,
    spec: Arc<WorkflowSpec>,
    since: i64,
}

pub(super) fn spawn(workflows: Workflows, source: TriggerSource, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut since = chrono::Utc::now();
        let mut readers: HashMap<String, (Vec<String>, JoinHandle<()>)> = HashMap::new();
        while !shutdown.is_cancelled() {
            let now = chrono::Utc::now();
            match index(&workflows).await {
                Ok((crons, listeners)) => {
                    for (namespace, workflow, schedule) in crons {
                        fire_cron(&workflows, &namespace, &workflow, &schedule, since, now).await;
                    }
                    refresh_readers(&workflows, &source, &mut readers, listeners, &shutdown);
                }
                Err(error) => tracing::warn!(%error, "cannot read workflow triggers"),
            }
            since = now;
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = shutdown.cancelled() => break,
            }
        }
        for (_, (_, reader)) in readers {
            reader.abort();
        }
    });
}

type Index = (Vec<(String, String, String)>, HashMap<String, Vec<Listener>>);

/// Cron schedules and event listeners of every namespace's latest versions.
async fn index(workflows: &Workflows) -> crate::error::Result<Index> {
    let mut crons = Vec::new();
    let mut listeners: HashMap<String, Vec<Listener>> = HashMap::new();
    for definition in workflows.latest_everywhere().await? {
        let spec = workflows.spec(&definition.namespace, &definition.name, definition.version).await?;
        match &spec.trigger {
            Trigger::Cron { schedule } => crons.push((definition.namespace, definition.name, schedule.clone())),
            Trigger::Event { .. } => listeners.entry(definition.namespace).or_default().push(Listener {
                workflow: definition.name,
                spec: Arc::clone(&spec),
                since: definition.created_at,
            }),
            Trigger::Manual => {}
        }
    }
    Ok((crons, listeners))
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

/// One event reader per namespace with event triggers, restarted when the
/// namespace's triggers change.
fn refresh_readers(
    workflows: &Workflows,
    source: &TriggerSource,
    readers: &mut HashMap<String, (Vec<String>, JoinHandle<()>)>,
    listeners: HashMap<String, Vec<Listener>>,
    shutdown: &CancellationToken,
) {
    readers.retain(|namespace, (_, reader)| {
        let keep = listeners.contains_key(namespace);
        if !keep {
            reader.abort();
        }
        keep
    });
    for (namespace, listeners) in listeners {
        let mut signature: Vec<String> = listeners.iter().map(|l| format!("{}@{}", l.workflow, l.since)).collect();
        signature.extend(listeners.iter().map(|l| format!("{:?}", l.spec.trigger)));
        signature.sort();
        if readers.get(&namespace).is_some_and(|(current, reader)| *current == signature && !reader.is_finished()) {
            continue;
        }
        if let Some((_, old)) = readers.remove(&namespace) {
            old.abort();
        }
        let reader = tokio::spawn(read_events(
            workflows.clone(),
            source.bus.clone(),
            namespace.clone(),
            listeners,
            shutdown.clone(),
        ));
        readers.insert(namespace, (signature, reader));
    }
}

async fn read_events(
    workflows: Workflows,
    mut bus: EventBusClient<Transport>,
    namespace: String,
    listeners: Vec<Listener>,
    shutdown: CancellationToken,
) {
    let types: BTreeSet<String> = listeners
        .iter()
        .filter_map(|l| match &l.spec.trigger {
            Trigger::Event { event_type, .. } => Some(event_type.clone()),
            Trigger::Manual | Trigger::Cron { .. } => None,
        })
        .collect();
    while !shutdown.is_cancelled() {
        let after = match workflows.runs.trigger_cursor(&namespace).await {
            Ok(after) => after,
            Err(error) => {
                tracing::warn!(%namespace, %error, "cannot read the trigger cursor");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        // Without a cursor, from the log's start: each trigger skips what was
        // published before its version was put.
        let request = bus::StreamEventsRequest {
            namespace: namespace.clone(),
            after_sequence: Some(after.unwrap_or(0)),
            event_types: types.iter().cloned().collect(),
        };
        match bus.stream_events(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                while let Ok(Some(event)) = stream.message().await {
                    on_event(&workflows, &namespace, &listeners, &event).await;
                    if let Err(error) = workflows.runs.set_trigger_cursor(&namespace, event.sequence).await {
                        tracing::warn!(%namespace, %error, "cannot save the trigger cursor");
                    }
                }
            }
            Err(status) => tracing::debug!(%namespace, %status, "cannot read events for triggers"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn on_event(workflows: &Workflows, namespace: &str, listeners: &[Listener], event: &bus::Event) {
    let payload: Value = serde_json::from_slice(&event.payload).unwrap_or(Value::Null);
    let published = chorus_runtime::time::timestamp_micros("published_at", event.published_at).ok().flatten();
    for listener in listeners {
        let after_put = published.is_some_and(|at| at >= listener.since);
        if !after_put || !matches(&listener.spec.trigger, &event.r#type, &payload) {
            continue;
        }
        let call = StartCall {
            namespace: namespace.to_owned(),
            workflow: listener.workflow.clone(),
            idempotency_key: Some(format!("event:{}:{}", event.sequence, listener.workflow)),
            origin: RunOrigin {
                kind: OriginKind::Event,
                started_by: event.source.clone(),
                event_sequence: Some(event.sequence),
                event_type: Some(event.r#type.clone()),
                task_id: None,
            },
            trigger: payload.clone(),
            ..StartCall::default()
        };
        match workflows.start_run(call).await {
            Ok(run) => {
                tracing::info!(run_id = %run.id, workflow = %listener.workflow, sequence = event.sequence, "event started a run")
            }
            Err(error) => {
                tracing::warn!(workflow = %listener.workflow, %error, "an event matched but the run did not start")
            }
        }
    }
}

/// Whether an event of `event_type` with `payload` starts a run of `trigger`.
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
            Scope::from_json(serde_json::json!({ "event": payload })).condition(condition).unwrap_or(false)
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
        assert!(matches(&trigger("tool:called", json!({}), None), "tool:called", &Value::Null));
        assert!(!matches(&Trigger::Manual, "tool:called", &Value::Null));
    }
}
