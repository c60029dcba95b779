//! The outbox relay against the real event bus: each change is logged once,
//! per namespace in commit order, and as soon as it commits. The poll
//! interval and lease are far longer than the deadlines here, so only a
//! wake-up can pass these tests.

use std::{collections::HashSet, sync::Arc, time::Duration};

use chorus_proto::eventbus::event_bus_client::EventBusClient;
use chorus_runtime::{
    metrics::Metrics, storage::Backend, testing::TestDatabase, time::now_micros, transport::Transport, wakeup::Wakeups,
};
use chorus_taskstore::{
    TaskStore, TaskStoreConfig,
    domain::{ArtifactChunk, StatusUpdate, TaskState},
    repository::sql::SqlTaskRepository,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::{
    bus::Bus,
    harness::{Harness, agent_message, conformance, test_config, text_artifact},
};

conformance!(
    start = crate::relay::start;
    each_change_reaches_the_bus_once_per_namespace_in_order,
    a_publish_whose_answer_is_lost_is_repeated_and_logged_once,
    a_relay_restarted_under_its_name_takes_its_lease_back_at_once,
    a_relay_shut_down_hands_its_lease_to_another_at_once,
    a_round_of_changes_larger_than_one_publish_takes_goes_out_in_several,
    a_relay_that_cannot_reach_its_bus_hands_its_lease_to_one_that_can,
    a_store_started_over_on_a_new_database_is_not_taken_for_a_retry_of_its_old_life,
    the_relay_s_lag_shows_while_its_bus_is_out_of_reach,
);

pub(crate) fn slow_config() -> TaskStoreConfig {
    TaskStoreConfig { poll_interval_ms: 60_000, outbox_lease_ms: 600_000, ..test_config() }
}

async fn each_change_reaches_the_bus_once_per_namespace_in_order(h: Harness) {
    let (bus, client) = Bus::start().await;
    // Two replicas' relays: one holds the lease, the other stands by.
    h.store.spawn_outbox_relay(client.clone(), "replica-1".to_owned());
    h.store.spawn_outbox_relay(client, "replica-2".to_owned());
    let task = h.own_task("a", "echo", "one").await;
    bus.wait_for("a", 1).await;

    let other = h.own_task("b", "echo", "two").await;
    let working = StatusUpdate { state: TaskState::Working, message: None, lease_id: None };
    h.store.update_status("a", &task.id, working).await.unwrap();
    let artifact = text_artifact("report", "done");
    let chunk = ArtifactChunk { artifact, append: false, last_chunk: true, lease_id: None };
    h.store.append_artifact("a", &task.id, chunk).await.unwrap();
    let done = StatusUpdate { state: TaskState::Completed, message: Some(agent_message("ok")), lease_id: None };
    h.store.update_status("a", &task.id, done).await.unwrap();

    let log_a = bus.wait_for("a", 5).await;
    let log_b = bus.wait_for("b", 1).await;
    let types: Vec<&str> = log_a.iter().map(|event| event.event_type.as_str()).collect();
    assert_eq!(
        types,
        ["task.created", "task.status_changed", "task.artifact_updated", "task.status_changed", "task.completed"]
    );
    assert_eq!(log_b.len(), 1);
    assert_eq!(log_b[0].event_type, "task.created");
    let keys: HashSet<&str> = log_a.iter().filter_map(|event| event.idempotency_key.as_deref()).collect();
    assert_eq!(keys.len(), log_a.len(), "every event carries its own key: {log_a:?}");
    for event in log_a.iter().chain(&log_b) {
        let task_id = if event.namespace == "a" { &task.id } else { &other.id };
        assert_eq!(&event.subject, task_id);
        assert_eq!(&event.attributes["task_id"], task_id);
        assert_eq!(event.source, "taskstore");
        let payload: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
        assert_eq!(&payload["task_id"], task_id.as_str());
    }
    let completed = log_a.iter().find(|event| event.event_type == "task.completed").unwrap();
    let payload: serde_json::Value = serde_json::from_slice(&completed.payload).unwrap();
    assert_eq!(payload["status"]["state"], "completed");
    assert_eq!(payload["status"]["message"]["parts"][0]["content"]["text"], "ok");
}

async fn a_publish_whose_answer_is_lost_is_repeated_and_logged_once(h: Harness) {
    let (bus, client) = Bus::start().await;
    bus.lose_answers(2);
    let first = h.own_task("ns", "echo", "one").await;
    h.store.spawn_outbox_relay(client, "replica-1".to_owned());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while bus.calls() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "the relay did not repeat the publish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let log = bus.wait_for("ns", 1).await;
    assert_eq!(log.len(), 1, "the bus logged the event once: {log:?}");
    assert_eq!(log[0].subject, first.id);

    let second = h.own_task("ns", "echo", "two").await;
    let log = bus.wait_for("ns", 2).await;
    assert_eq!(log[1].subject, second.id);
    assert_eq!(bus.calls(), 4, "once answered, the first event is not sent again");
}

async fn start(database: chorus_runtime::testing::TestDatabase) -> Harness {
    Harness::start_with(database, slow_config()).await
}

async fn a_relay_restarted_under_its_name_takes_its_lease_back_at_once(h: Harness) {
    let (bus, client) = Bus::start().await;
    let relay = h.store.spawn_outbox_relay(client.clone(), "replica-1".to_owned());
    h.own_task("ns", "echo", "one").await;
    bus.wait_for("ns", 1).await;
    // Stopped while it holds a lease that runs ten minutes (slow_config).
    relay.abort();
    let _ = relay.await;
    h.store.spawn_outbox_relay(client, "replica-1".to_owned());
    h.own_task("ns", "echo", "two").await;
    bus.wait_for("ns", 2).await;
}

async fn a_relay_shut_down_hands_its_lease_to_another_at_once(h: Harness) {
    let (bus, client) = Bus::start().await;
    let stopping = CancellationToken::new();
    let repository = Arc::new(SqlTaskRepository::new(h.db.clone()));
    let elsewhere = TaskStore::new(repository, Wakeups::new(), slow_config(), stopping.clone());
    // Written before the relay starts: its first round finds it.
    h.own_task("ns", "echo", "one").await;
    let relay = elsewhere.spawn_outbox_relay(client.clone(), "replica-1".to_owned());
    bus.wait_for("ns", 1).await;
    // Shut down while it holds a lease that runs ten minutes (slow_config).
    stopping.cancel();
    relay.await.unwrap();
    h.store.spawn_outbox_relay(client, "replica-2".to_owned());
    h.own_task("ns", "echo", "two").await;
    bus.wait_for("ns", 2).await;
}

/// Eight changes of about 900 kB each, each within the bus's payload limit
/// but over 7 MB together, relayed in one round: they go in publishes the
/// bus's 4 MiB request limit takes, and what follows them goes too.
async fn a_round_of_changes_larger_than_one_publish_takes_goes_out_in_several(h: Harness) {
    let (bus, client) = Bus::start().await;
    let large = "x".repeat(900_000);
    for _ in 0..8 {
        h.own_task("ns", "echo", &large).await;
    }
    h.store.spawn_outbox_relay(client, "replica-1".to_owned());
    let small = h.own_task("ns", "echo", "after them").await;
    let log = bus.wait_for("ns", 9).await;
    let created: Vec<bool> = log.iter().map(|event| event.event_type == "task.created").collect();
    assert_eq!(created, [true; 9]);
    assert_eq!(log[8].subject, small.id, "the small change is last, in commit order");
    assert!(log[..8].iter().all(|event| event.payload.len() > 900_000), "the large changes keep their content");
}

/// A relay whose bus is unreachable steps down after failing for half a
/// lease, and one that reaches its bus takes over. Without that, the
/// failing relay renews its lease between retries (at most 5 s apart,
/// shorter than the lease here) for as long as its bus is down.
async fn a_relay_that_cannot_reach_its_bus_hands_its_lease_to_one_that_can(h: Harness) {
    let (bus, client) = Bus::start().await;
    let unreachable = Channel::from_static("http://127.0.0.1:1").connect_lazy();
    let stopping = CancellationToken::new();
    let replica = || {
        let config = TaskStoreConfig { outbox_lease_ms: 6_000, ..slow_config() };
        TaskStore::new(Arc::new(SqlTaskRepository::new(h.db.clone())), Wakeups::new(), config, stopping.clone())
    };
    let task = h.own_task("ns", "echo", "one").await;
    let failing = replica().spawn_outbox_relay(EventBusClient::new(Transport::remote(unreachable)), "replica-1".into());
    // Once the failing relay holds the lease, no one else can take it.
    while h.repository.acquire_outbox_lease("eventbus", "probe", now_micros(), Duration::ZERO).await.unwrap().is_some()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    replica().spawn_outbox_relay(client, "replica-2".into());
    let log = bus.wait_for("ns", 1).await;
    assert_eq!(log[0].subject, task.id);
    stopping.cancel();
    failing.await.unwrap();
}

/// A task store started over on an empty database (a restore, a new
/// environment) beside the same bus counts its changes from the start
/// again: its events are new events, not retries of the old store's.
async fn a_store_started_over_on_a_new_database_is_not_taken_for_a_retry_of_its_old_life(h: Harness) {
    let (bus, client) = Bus::start().await;
    h.store.spawn_outbox_relay(client.clone(), "replica-1".to_owned());
    h.own_task("ns", "echo", "before").await;
    h.own_task("ns", "echo", "before").await;
    bus.wait_for("ns", 2).await;
    let database = match h.db.backend() {
        Backend::Sqlite => TestDatabase::sqlite(),
        Backend::Postgres => TestDatabase::postgres().await.expect("the suite's PostgreSQL"),
    };
    let again = Harness::start_with(database, slow_config()).await;
    again.store.spawn_outbox_relay(client, "replica-1".to_owned());
    let first = again.own_task("ns", "echo", "after").await;
    let second = again.own_task("ns", "echo", "after").await;
    let log = bus.wait_for("ns", 4).await;
    let subjects: Vec<&str> = log[2..].iter().map(|event| event.subject.as_str()).collect();
    assert_eq!(subjects, [first.id.as_str(), second.id.as_str()]);
}

/// `chorus_outbox_lag_seconds` grows while the relay cannot publish, and is
/// 0 again once a relay caught up.
async fn the_relay_s_lag_shows_while_its_bus_is_out_of_reach(h: Harness) {
    let metrics = Metrics::default();
    let lag = || metrics.outbox_lag.get().get();
    let relay = |stopping: &CancellationToken| {
        let repository = Arc::new(SqlTaskRepository::new(h.db.clone()));
        TaskStore::new(repository, Wakeups::new(), slow_config(), stopping.clone()).with_metrics(metrics.clone())
    };
    h.own_task("ns", "echo", "one").await;
    let stopping = CancellationToken::new();
    let unreachable = EventBusClient::new(Transport::remote(Channel::from_static("http://127.0.0.1:1").connect_lazy()));
    let failing = relay(&stopping).spawn_outbox_relay(unreachable, "replica-1".into());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lag() < 1 {
        assert!(tokio::time::Instant::now() < deadline, "the lag never showed: {}", lag());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stopping.cancel();
    failing.await.unwrap();

    let (bus, client) = Bus::start().await;
    relay(&CancellationToken::new()).spawn_outbox_relay(client, "replica-1".into());
    bus.wait_for("ns", 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lag() != 0 {
        assert!(tokio::time::Instant::now() < deadline, "the lag stayed: {}", lag());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
