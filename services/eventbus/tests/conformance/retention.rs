//! Retention: events past their retention that every handler has finished
//! are deleted with their deliveries and dead letters; an event a handler
//! still has to process stays.

use std::time::Duration;

use chorus_eventbus::{
    EventBusConfig,
    domain::{DeliveryQuery, DeliveryState, EventQuery, FailurePolicy, Nack, Pattern, PurgeCursor},
    error::EventBusError,
};
use chorus_runtime::{testing::TestDatabase, time::now_micros};

use crate::harness::{Harness, NS, conformance, id, spec, test_config};

conformance!(
    an_event_goes_once_every_handler_finished_it,
    a_dead_letter_goes_with_its_event_once_that_old,
    an_event_published_after_the_cutoff_stays,
    a_purge_goes_past_the_events_still_open_in_batches,
);

/// The reaper's purge, on a bus that keeps events 300 ms.
mod reaper {
    use super::the_reaper_purges_events_past_a_short_retention;

    crate::harness::conformance!(
        start = crate::retention::start_short;
        the_reaper_purges_events_past_a_short_retention,
    );
}

async fn start_short(database: TestDatabase) -> Harness {
    Harness::start_with(database, EventBusConfig { retention_ms: 300, ..test_config() }).await
}

/// Far past every event of a test.
fn later() -> i64 {
    now_micros() + 3_600_000_000
}

/// Deletes every finished event published at or before `published_before`,
/// batch after batch; how many went.
async fn purge(h: &Harness, published_before: i64, limit: u32) -> u64 {
    let mut after: Option<PurgeCursor> = None;
    let mut purged = 0;
    loop {
        let batch = h.repository.purge(published_before, after.as_ref(), limit).await.unwrap();
        purged += batch.events;
        after = batch.next;
        if after.is_none() {
            return purged;
        }
    }
}

/// The sequences of the log.
async fn log(h: &Harness) -> Vec<i64> {
    let query = EventQuery { namespace: NS.into(), after: 0, types: vec![], limit: 100 };
    h.bus.read_events(&query).await.unwrap().events.iter().map(|event| event.sequence).collect()
}

fn deliveries(states: Vec<DeliveryState>) -> DeliveryQuery {
    DeliveryQuery {
        namespace: NS.into(),
        handler: None,
        sequence: None,
        states,
        include_events: false,
        after: None,
        limit: 100,
    }
}

async fn an_event_goes_once_every_handler_finished_it(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    h.handler("b", &[], FailurePolicy::Fail).await;
    let sequence = h.publish("task.created").await;
    h.claim("a", 10).await;
    h.ack("a", sequence).await;

    assert_eq!(purge(&h, later(), 100).await, 0, "handler b has not finished it");
    assert_eq!(log(&h).await, [sequence]);
    h.bus.get_delivery(NS, &id("b", sequence)).await.unwrap();

    h.claim("b", 10).await;
    h.ack("b", sequence).await;
    assert_eq!(purge(&h, later(), 100).await, 1);
    assert!(log(&h).await.is_empty());
    let gone = h.bus.get_delivery(NS, &id("a", sequence)).await.unwrap_err();
    assert!(matches!(gone, EventBusError::DeliveryNotFound(_)), "{gone:?}");
    assert!(h.bus.list_deliveries(&deliveries(vec![])).await.unwrap().deliveries.is_empty());
    assert_eq!(h.bus.replay(NS, "a", sequence, None).await.unwrap(), 0, "a replay of a purged range finds nothing");
    assert_eq!(h.publish("task.created").await, sequence + 1, "sequences go on after a purge");
}

async fn a_dead_letter_goes_with_its_event_once_that_old(h: Harness) {
    h.handler("worker", &[], FailurePolicy::Fail).await;
    let sequence = h.publish("task.created").await;
    h.claim("worker", 10).await;
    let published = now_micros();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let nack = Nack { error: "broken".into(), retry_delay: None, dead_letter: true, attempt: None };
    let dead = h.bus.nack(NS, &id("worker", sequence), nack).await.unwrap();
    assert_eq!(dead.state, DeliveryState::DeadLettered);

    assert_eq!(purge(&h, published, 100).await, 0, "dead-lettered after the cutoff, it may still be replayed");
    assert_eq!(
        h.bus.list_deliveries(&deliveries(vec![DeliveryState::DeadLettered])).await.unwrap().deliveries.len(),
        1
    );
    assert_eq!(purge(&h, later(), 100).await, 1);
    assert!(h.bus.list_deliveries(&deliveries(vec![DeliveryState::DeadLettered])).await.unwrap().deliveries.is_empty());
    assert!(log(&h).await.is_empty());
}

async fn an_event_published_after_the_cutoff_stays(h: Harness) {
    let old = h.publish("task.created").await;
    let cutoff = now_micros();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let young = h.publish("task.created").await;
    assert_eq!(purge(&h, cutoff, 100).await, 1);
    assert_eq!(log(&h).await, [young]);
    assert!(young > old);
}

async fn a_purge_goes_past_the_events_still_open_in_batches(h: Harness) {
    let mut slow = spec("slow", &[], FailurePolicy::Fail);
    slow.event_types = vec![Pattern::parse("event_types", "task.slow").unwrap()];
    h.bus.register_handler(slow).await.unwrap();
    let open = h.publish("task.slow").await;
    let mut sequences = Vec::new();
    for _ in 0..5 {
        sequences.push(h.publish("task.created").await);
    }
    let first = h.repository.purge(later(), None, 2).await.unwrap();
    assert_eq!(first.events, 1, "the first batch examined the open event and one other");
    assert_eq!(first.next.map(|next| next.sequence), Some(sequences[0]));
    assert_eq!(purge(&h, later(), 2).await, 4);
    assert_eq!(log(&h).await, [open], "the event its handler has not finished stays");
}

async fn the_reaper_purges_events_past_a_short_retention(h: Harness) {
    h.handler("worker", &[], FailurePolicy::Fail).await;
    let done = h.publish("task.created").await;
    h.claim("worker", 10).await;
    h.ack("worker", done).await;
    let open = h.publish("task.created").await;
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while log(&h).await.contains(&done) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    gone.await.expect("the finished event is purged soon after its retention");
    assert_eq!(log(&h).await, [open], "an event its handler has not finished stays");
}
