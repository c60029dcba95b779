//! The outbox relay: every recorded change goes to the event bus, once.
//!
//! One relay at a time works for a database: it holds the lease on its row
//! in `taskstore_outbox`, which also keeps its cursor. A round renews the
//! lease, reads the events after the cursor, publishes them with one
//! `PublishBatch` per namespace, then saves the cursor. No transaction stays
//! open across the publish. Each bus event's idempotency key names its task
//! event, so a round repeated after a crash between publish and save appends
//! nothing: the bus drops the keys it already has.

use std::{collections::HashMap, time::Duration};

use chorus_proto::eventbus::{NewEvent, PublishBatchRequest, event_bus_client::EventBusClient};
use chorus_runtime::{grpc::fitting, time::timestamp, transport::Transport};
use serde::Serialize;
use tokio::{task::JoinHandle, time::Instant};

use super::{TaskStore, keys, streams::HELD_BACK_RETRY};
use crate::{
    domain::{Artifact, Cursor, EventKind, Message, TaskEvent, TaskState, TaskStatus, now_micros},
    error::{Result, TaskStoreError},
};

/// The relay's row in `taskstore_outbox`.
const RELAY: &str = "eventbus";

/// The `source` of every event the relay publishes.
const SOURCE: &str = "taskstore";

/// Most events one `PublishBatch` takes.
const MAX_PUBLISH: usize = 1_000;
/// The most bytes of events one publish carries (one event larger goes
/// alone): under the 4 MiB a gRPC server takes by default, whatever the
/// number of events. A batch of large changes in one call would be refused
/// whole, round after round, and hold up every event after it.
const MAX_PUBLISH_BYTES: usize = 3 << 20;

/// The wait after a failed round, doubled per failure up to the ceiling.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl TaskStore {
    /// Publishes every change the store records to the event bus behind
    /// `client`, until shutdown; on first use from the start of the log.
    /// Every replica may run one: the one holding the relay's lease
    /// publishes, the others stand by to take over. `owner` names this
    /// replica in the lease, unique among live replicas and the same across
    /// its restarts (a restarted replica then takes its lease back at once
    /// instead of waiting for it to run out).
    pub fn spawn_outbox_relay(&self, client: EventBusClient<Transport>, owner: String) -> JoinHandle<()> {
        let mut relay = Relay { store: self.clone(), client, owner, leader: false, held: None };
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = relay.run() => {}
            }
            relay.release().await;
        })
    }
}

/// What a round found, which decides when the next one starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Another replica holds the lease.
    Standby,
    /// It published a whole batch: more may wait.
    More,
    /// Committed events wait behind an older transaction (PostgreSQL).
    HeldBack,
    /// It published everything there was.
    CaughtUp,
}

/// A delay that doubles each time it is taken, up to a ceiling, until reset.
#[derive(Debug)]
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Self {
        Self { first, max, next: first }
    }

    fn take(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}

struct Relay {
    store: TaskStore,
    client: EventBusClient<Transport>,
    /// This relay's name in the lease.
    owner: String,
    /// Whether the last round held the lease.
    leader: bool,
    /// The cursor as this relay last saved or read it, and when its lease
    /// was last renewed (before the renewing call), while it leads.
    held: Option<(Cursor, Instant)>,
}

impl Relay {
    /// How often the lease is renewed: idle, well before it runs out.
    fn renew(&self) -> Duration {
        self.store.config.poll_interval().min(self.store.config.outbox_lease() / 3)
    }

    async fn run(&mut self) {
        let renew = self.renew();
        let mut failures = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut held_back = Backoff::new(HELD_BACK_RETRY, renew);
        let mut bus_down_since = None;
        loop {
            // Created before the read, so a change committed meanwhile wakes it.
            let mut waiter = self.store.wakeups.waiter(keys::OUTBOX);
            let round = match self.round().await {
                Ok(round) => round,
                Err(error) => {
                    if matches!(error, TaskStoreError::EventBus(_)) {
                        let since = *bus_down_since.get_or_insert_with(Instant::now);
                        if self.leader && since.elapsed() >= self.store.config.outbox_lease() / 2 {
                            self.step_down(&error).await;
                            bus_down_since = None;
                            continue;
                        }
                    }
                    let delay = failures.take();
                    tracing::warn!(%error, retry_in_ms = delay.as_millis(), "outbox relay round failed");
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            bus_down_since = None;
            failures.reset();
            if round != Round::HeldBack {
                held_back.reset();
            }
            match round {
                Round::Standby => tokio::time::sleep(renew).await,
                Round::More => {}
                Round::HeldBack => tokio::time::sleep(held_back.take()).await,
                Round::CaughtUp => waiter.wait(renew).await,
            }
        }
    }

    /// Renews the lease unless a save renewed it lately, then publishes the
    /// events after the cursor and saves the cursor past them, which renews
    /// the lease too: under steady changes a round writes once.
    async fn round(&mut self) -> Result<Round> {
        let lease = self.store.config.outbox_lease();
        let cursor = match self.held {
            Some((cursor, renewed)) if self.leader && renewed.elapsed() < self.renew() => cursor,
            _ => {
                let renewing = Instant::now();
                let cursor =
                    self.store.repository.acquire_outbox_lease(RELAY, &self.owner, now_micros(), lease).await?;
                self.note_leadership(cursor);
                let Some(cursor) = cursor else {
                    return Ok(Round::Standby);
                };
                self.held = Some((cursor, renewing));
                cursor
            }
        };
        let limit = self.store.config.outbox_batch_size();
        let batch = self.store.repository.read_outbox(cursor, limit).await?;
        let next = match (batch.events.len() >= limit as usize, batch.held_back) {
            (true, _) => Round::More,
            (false, true) => Round::HeldBack,
            (false, false) => Round::CaughtUp,
        };
        let Some(last) = batch.events.last().map(|event| event.cursor) else {
            return Ok(next);
        };
        for (namespace, events) in by_namespace(&batch.events, self.store.config.outbox_max_payload_bytes)? {
            self.publish(namespace, events, lease).await?;
        }
        let renewing = Instant::now();
        let saved = self.store.repository.save_outbox_cursor(RELAY, &self.owner, last, now_micros(), lease).await;
        if let Err(error) = saved {
            self.held = None;
            return Err(error);
        }
        self.held = Some((last, renewing));
        tracing::debug!(events = batch.events.len(), cursor = %last, "outbox relayed");
        Ok(next)
    }

    /// Hands the lease back on shutdown, so that another replica (or this
    /// one restarted elsewhere) takes over at once rather than after it
    /// runs out. Best effort: a lease not handed back still runs out.
    async fn release(&self) {
        if !self.leader {
            return;
        }
        let expire = self.store.repository.acquire_outbox_lease(RELAY, &self.owner, now_micros(), Duration::ZERO);
        match tokio::time::timeout(Duration::from_secs(1), expire).await {
            Ok(Ok(_)) => tracing::debug!(owner = %self.owner, "outbox relay handed its lease back"),
            Ok(Err(error)) => tracing::debug!(%error, "the outbox relay could not hand its lease back"),
            Err(_) => tracing::debug!("the outbox relay could not hand its lease back in time"),
        }
    }

    /// Hands the lease back after publishing has failed for half a lease,
    /// and stands by for a whole one: a replica that reaches its bus takes
    /// over meanwhile. Alone, this one takes the lease back after that.
    async fn step_down(&mut self, error: &TaskStoreError) {
        tracing::warn!(%error, owner = %self.owner, "the outbox relay cannot publish; it hands its lease to another replica");
        self.release().await;
        self.leader = false;
        self.held = None;
        tokio::time::sleep(self.store.config.outbox_lease()).await;
    }

    fn note_leadership(&mut self, cursor: Option<Cursor>) {
        let leader = cursor.is_some();
        if leader != self.leader {
            match cursor {
                Some(cursor) => tracing::info!(owner = %self.owner, %cursor, "outbox relay took the lease"),
                None => tracing::info!(owner = %self.owner, "outbox relay lost the lease to another replica"),
            }
        }
        self.leader = leader;
    }

    /// Publishes one namespace's events in order, at most [`MAX_PUBLISH`]
    /// and [`MAX_PUBLISH_BYTES`] per call. A call that outlasts the lease is
    /// given up.
    async fn publish(&mut self, namespace: String, mut events: Vec<NewEvent>, timeout: Duration) -> Result<()> {
        while !events.is_empty() {
            let rest = events.split_off(chunk_len(&events));
            let chunk = std::mem::replace(&mut events, rest);
            let mut request = tonic::Request::new(PublishBatchRequest { namespace: namespace.clone(), events: chunk });
            request.set_timeout(timeout);
            let response = tokio::time::timeout(timeout, self.client.publish_batch(request))
                .await
                .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("the publish outlasted the relay's lease")))
                .map_err(|status| TaskStoreError::EventBus(Box::new(status)))?;
            let duplicates = response.get_ref().results.iter().filter(|result| result.duplicate).count();
            if duplicates > 0 {
                tracing::debug!(%namespace, duplicates, "the event bus already had events of a repeated round");
            }
            // A repeated round's events were counted when first published.
            let relayed = response.get_ref().results.len() - duplicates;
            self.store.metrics.outbox_events_relayed.get().inc_by(relayed as u64);
        }
        Ok(())
    }
}

/// How many of `events`, from the first, one publish carries: at least one,
/// at most [`MAX_PUBLISH`], and no more than [`MAX_PUBLISH_BYTES`] together.
fn chunk_len(events: &[NewEvent]) -> usize {
    fitting(events.iter().take(MAX_PUBLISH).map(prost::Message::encoded_len), MAX_PUBLISH_BYTES)
}

/// The bus events of `events`, by namespace (in order of first appearance),
/// each namespace's in commit order.
fn by_namespace(events: &[TaskEvent], max_payload: usize) -> Result<Vec<(String, Vec<NewEvent>)>> {
    let mut groups: Vec<(String, Vec<NewEvent>)> = Vec::new();
    for event in events {
        let published = bus_events(event, max_payload)?;
        match groups.iter_mut().find(|(namespace, _)| *namespace == event.namespace) {
            Some((_, group)) => group.extend(published),
            None => groups.push((event.namespace.clone(), published)),
        }
    }
    Ok(groups)
}

/// The JSON payload of a bus event: the stored event's, plus the task's ids.
#[derive(Serialize)]
struct Payload<'a> {
    task_id: &'a str,
    context_id: &'a str,
    agent_id: &'a str,
    status: &'a TaskStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    artifact: Option<&'a Artifact>,
    append: bool,
    last_chunk: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a Message>,
    /// The change's message and artifact (and the status message) were left
    /// out: with them, the event was larger than the bus takes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    content_omitted: bool,
}

/// One task event as bus events: `task.<kind>`, and for a move into a final
/// state also `task.<state>` under its own idempotency key. A payload larger
/// than `max_payload` goes without the change's content (`content_omitted`;
/// the task has it): the bus would refuse it, and the relay would offer it
/// again and again, holding up every event after it.
fn bus_events(event: &TaskEvent, max_payload: usize) -> Result<Vec<NewEvent>> {
    let encode = |payload: &Payload<'_>| {
        serde_json::to_vec(payload)
            .map_err(|error| TaskStoreError::Corrupt(format!("cannot encode event {}: {error}", event.cursor)))
    };
    let whole = Payload {
        task_id: &event.task_id,
        context_id: &event.context_id,
        agent_id: &event.agent_id,
        status: &event.status,
        artifact: event.artifact.as_ref(),
        append: event.append,
        last_chunk: event.last_chunk,
        message: event.message.as_ref(),
        content_omitted: false,
    };
    let mut payload = encode(&whole)?;
    if payload.len() > max_payload {
        let status = TaskStatus { message: None, ..event.status.clone() };
        let bare = Payload { status: &status, artifact: None, message: None, content_omitted: true, ..whole };
        payload = encode(&bare)?;
        tracing::debug!(cursor = %event.cursor, "a task event too large for the event bus goes without its content");
    }
    let attributes = HashMap::from([
        ("task_id".to_owned(), event.task_id.clone()),
        ("context_id".to_owned(), event.context_id.clone()),
        ("agent_id".to_owned(), event.agent_id.clone()),
    ]);
    let key = format!("{SOURCE}/{}", event.cursor.id);
    let change = NewEvent {
        r#type: change_type(event.kind).to_owned(),
        source: SOURCE.to_owned(),
        subject: event.task_id.clone(),
        payload,
        content_type: "application/json".to_owned(),
        attributes,
        idempotency_key: key.clone(),
        time: Some(timestamp(event.created_at)),
    };
    let ending = match event.kind {
        EventKind::StatusChanged => final_type(event.status.state),
        EventKind::Created | EventKind::ArtifactUpdated | EventKind::MessageAdded => None,
    };
    let Some(ending) = ending else {
        return Ok(vec![change]);
    };
    let ended = NewEvent { r#type: ending.to_owned(), idempotency_key: format!("{key}/final"), ..change.clone() };
    Ok(vec![change, ended])
}

fn change_type(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "task.created",
        EventKind::StatusChanged => "task.status_changed",
        EventKind::ArtifactUpdated => "task.artifact_updated",
        EventKind::MessageAdded => "task.message_added",
    }
}

/// The type of the event that announces a task ended in `state`.
fn final_type(state: TaskState) -> Option<&'static str> {
    match state {
        TaskState::Completed => Some("task.completed"),
        TaskState::Failed => Some("task.failed"),
        TaskState::Canceled => Some("task.canceled"),
        TaskState::Rejected => Some("task.rejected"),
        TaskState::Submitted | TaskState::Working | TaskState::InputRequired | TaskState::AuthRequired => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Role;

    fn event(id: i64, namespace: &str, kind: EventKind, state: TaskState) -> TaskEvent {
        TaskEvent {
            cursor: Cursor { tx: 3, id },
            kind,
            namespace: namespace.to_owned(),
            task_id: format!("task-{id}"),
            context_id: "ctx".to_owned(),
            agent_id: "echo".to_owned(),
            status: TaskStatus { state, message: None, timestamp: 1_000_000 },
            artifact: None,
            append: false,
            last_chunk: false,
            message: None,
            created_at: 1_500_000,
        }
    }

    /// The bus's default payload limit.
    const LIMIT: usize = 1 << 20;

    #[test]
    fn an_event_too_large_for_the_bus_goes_without_its_content() {
        let mut added = event(9, "ns", EventKind::MessageAdded, TaskState::Working);
        added.message = Some(Message::text("m9", Role::User, "x".repeat(LIMIT)));
        added.status.message = Some(Message::text("s9", Role::Agent, "working on it"));
        let published = bus_events(&added, LIMIT).unwrap();
        let bus = &published[0];
        assert!(bus.payload.len() <= LIMIT, "{} bytes", bus.payload.len());
        let payload: serde_json::Value = serde_json::from_slice(&bus.payload).unwrap();
        assert_eq!(payload["content_omitted"], true);
        assert!(payload["message"].is_null() && payload["status"]["message"].is_null(), "{payload}");
        assert_eq!(
            (payload["task_id"].as_str(), payload["status"]["state"].as_str()),
            (Some("task-9"), Some("working"))
        );
        assert_eq!(bus.idempotency_key, "taskstore/9", "still the change's event, once");

        added.message = Some(Message::text("m9", Role::User, "small"));
        let payload: serde_json::Value =
            serde_json::from_slice(&bus_events(&added, LIMIT).unwrap()[0].payload).unwrap();
        assert_eq!(payload.get("content_omitted"), None, "a payload that fits is whole: {payload}");
        assert_eq!(payload["message"]["parts"][0]["content"]["text"], "small");
    }

    #[test]
    fn a_publish_carries_at_most_its_bytes_and_count_and_at_least_one_event() {
        let sized = |bytes: usize| NewEvent { payload: vec![b'x'; bytes], ..NewEvent::default() };
        let large: Vec<NewEvent> = (0..8).map(|_| sized(900_000)).collect();
        assert_eq!(chunk_len(&large), 3, "three fit in 3 MiB, a fourth does not");
        assert_eq!(chunk_len(&[sized(5 << 20)]), 1, "an event larger than a publish goes alone");
        let small: Vec<NewEvent> = (0..1_500).map(|_| sized(10)).collect();
        assert_eq!(chunk_len(&small), MAX_PUBLISH);
        assert_eq!(chunk_len(&small[..7]), 7);
    }

    #[test]
    fn backoff_doubles_up_to_its_ceiling_until_reset() {
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let delays: Vec<u128> = (0..8).map(|_| backoff.take().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]);
        backoff.reset();
        assert_eq!(backoff.take(), FIRST_BACKOFF);
    }

    #[test]
    fn a_change_is_one_event_about_its_task() {
        let mut created = event(7, "ns", EventKind::Created, TaskState::Submitted);
        created.message = Some(Message::text("m1", Role::User, "hello"));
        let published = bus_events(&created, LIMIT).unwrap();
        assert_eq!(published.len(), 1);
        let bus = &published[0];
        assert_eq!(bus.r#type, "task.created");
        assert_eq!(bus.source, "taskstore");
        assert_eq!(bus.subject, "task-7");
        assert_eq!(bus.idempotency_key, "taskstore/7");
        assert_eq!(bus.content_type, "application/json");
        assert_eq!(bus.attributes["task_id"], "task-7");
        assert_eq!(bus.attributes["context_id"], "ctx");
        assert_eq!(bus.attributes["agent_id"], "echo");
        assert_eq!(bus.time, Some(prost_types::Timestamp { seconds: 1, nanos: 500_000_000 }));
        let payload: serde_json::Value = serde_json::from_slice(&bus.payload).unwrap();
        assert_eq!(payload["task_id"], "task-7");
        assert_eq!(payload["context_id"], "ctx");
        assert_eq!(payload["agent_id"], "echo");
        assert_eq!(payload["status"]["state"], "submitted");
        assert_eq!(payload["message"]["parts"][0]["content"]["text"], "hello");
    }

    #[test]
    fn every_kind_has_its_type_and_only_final_states_add_an_event() {
        let kinds = [
            (EventKind::Created, "task.created"),
            (EventKind::StatusChanged, "task.status_changed"),
            (EventKind::ArtifactUpdated, "task.artifact_updated"),
            (EventKind::MessageAdded, "task.message_added"),
        ];
        for (kind, name) in kinds {
            let published = bus_events(&event(1, "ns", kind, TaskState::Working), LIMIT).unwrap();
            assert_eq!(published.iter().map(|bus| bus.r#type.as_str()).collect::<Vec<_>>(), [name]);
        }
        // An artifact written to a finished task's event carries the final
        // status too, but only the status change announces the ending.
        let late = bus_events(&event(1, "ns", EventKind::ArtifactUpdated, TaskState::Completed), LIMIT).unwrap();
        assert_eq!(late.len(), 1);
    }

    #[test]
    fn a_final_status_also_announces_the_ending_under_its_own_key() {
        let endings = [
            (TaskState::Completed, "task.completed"),
            (TaskState::Failed, "task.failed"),
            (TaskState::Canceled, "task.canceled"),
            (TaskState::Rejected, "task.rejected"),
        ];
        for (state, name) in endings {
            let published = bus_events(&event(42, "ns", EventKind::StatusChanged, state), LIMIT).unwrap();
            let types: Vec<&str> = published.iter().map(|bus| bus.r#type.as_str()).collect();
            assert_eq!(types, ["task.status_changed", name]);
            assert_eq!(published[0].idempotency_key, "taskstore/42");
            assert_eq!(published[1].idempotency_key, "taskstore/42/final");
            assert_eq!(published[1].payload, published[0].payload);
            assert_eq!(published[1].subject, "task-42");
        }
    }

    #[test]
    fn namespaces_are_published_apart_each_in_commit_order() {
        let events = [
            event(1, "a", EventKind::Created, TaskState::Submitted),
            event(2, "b", EventKind::Created, TaskState::Submitted),
            event(3, "a", EventKind::StatusChanged, TaskState::Completed),
            event(4, "b", EventKind::StatusChanged, TaskState::Working),
        ];
        let groups = by_namespace(&events, LIMIT).unwrap();
        let keys: Vec<(&str, Vec<&str>)> = groups
            .iter()
            .map(|(namespace, events)| {
                (namespace.as_str(), events.iter().map(|bus| bus.idempotency_key.as_str()).collect())
            })
            .collect();
        assert_eq!(
            keys,
            [("a", vec!["taskstore/1", "taskstore/3", "taskstore/3/final"]), ("b", vec!["taskstore/2", "taskstore/4"])]
        );
    }
}
