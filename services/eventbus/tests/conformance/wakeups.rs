//! A dependent's stream is woken by what its next delivery waits for: the
//! poll here is a minute away, so only a wake-up passes these tests.

use std::time::Duration;

use chorus_eventbus::{
    domain::{Delivery, FailurePolicy, HandlerSpec, Nack, Pattern},
    service::Subscription,
};
use chorus_runtime::testing::TestDatabase;
use futures_util::{Stream, StreamExt as _};

use crate::harness::{Harness, NS, conformance, id, spec, test_config};

conformance!(
    start = crate::wakeups::start;
    a_dependent_is_woken_by_the_ack_it_waits_for_even_through_a_handler_not_taking_the_event,
    a_dependent_is_woken_when_a_dead_letter_skips_what_it_waits_for,
);

async fn start(database: TestDatabase) -> Harness {
    let config = chorus_eventbus::EventBusConfig { poll_interval_ms: 60_000, ..test_config() };
    Harness::start_with(database, config).await
}

const WAIT: Duration = Duration::from_secs(5);

async fn next(
    stream: &mut (impl Stream<Item = Result<Delivery, chorus_eventbus::error::EventBusError>> + Unpin),
) -> i64 {
    let delivery = tokio::time::timeout(WAIT, stream.next()).await.expect("woken in time").unwrap().unwrap();
    delivery.id.sequence
}

fn subscription(handler: &str) -> Subscription {
    Subscription {
        namespace: NS.into(),
        handler: handler.into(),
        consumer_id: "c1".into(),
        max_in_flight: 10,
        after: None,
    }
}

/// `c` is after `b`, which takes no `t.x` event, and `b` is after `a`: `c`
/// waits for `a` itself, and `d` for `c`.
async fn a_dependent_is_woken_by_the_ack_it_waits_for_even_through_a_handler_not_taking_the_event(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    let other = vec![Pattern::parse("event_types", "other.*").unwrap()];
    h.bus.register_handler(HandlerSpec { event_types: other, ..spec("b", &["a"], FailurePolicy::Fail) }).await.unwrap();
    h.handler("c", &["b"], FailurePolicy::Fail).await;
    h.handler("d", &["c"], FailurePolicy::Fail).await;
    let mut c = h.bus.subscribe(subscription("c")).await.unwrap();
    let mut d = h.bus.subscribe(subscription("d")).await.unwrap();
    let sequence = h.publish("t.x").await;
    assert_eq!(h.claimed("a").await, [sequence]);
    // Both streams have looked and wait: neither delivery is ready.
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.ack("a", sequence).await;
    assert_eq!(next(&mut c).await, sequence);
    h.ack("c", sequence).await;
    assert_eq!(next(&mut d).await, sequence);
}

/// `a` dead-letters the event, so `c` (after `a`, which fails dependents)
/// is skipped, and `d`, after `c`, which lets dependents go on, is ready.
async fn a_dependent_is_woken_when_a_dead_letter_skips_what_it_waits_for(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    h.handler("c", &["a"], FailurePolicy::Ignore).await;
    h.handler("d", &["c"], FailurePolicy::Fail).await;
    let mut d = h.bus.subscribe(subscription("d")).await.unwrap();
    let sequence = h.publish("t.x").await;
    assert_eq!(h.claimed("a").await, [sequence]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let nack = Nack { error: "boom".into(), retry_delay: None, dead_letter: true, attempt: None };
    h.bus.nack(NS, &id("a", sequence), nack).await.unwrap();
    assert_eq!(next(&mut d).await, sequence);
    let skipped = h.bus.get_delivery(NS, &id("c", sequence)).await.unwrap();
    assert_eq!(skipped.skip_reason.map(|reason| reason.handler).as_deref(), Some("a"));
}
