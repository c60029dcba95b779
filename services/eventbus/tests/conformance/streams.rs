//! Subscribe streams, log streams and in-process handlers.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use chorus_eventbus::{
    domain::{Claim, ClaimRequest, DeliveryState, Event, FailurePolicy},
    error::EventBusError,
    service::{EventHandler, HandlerFailure, Subscription},
};
use chorus_runtime::time::now_micros;
use futures_util::StreamExt as _;

use crate::harness::{Harness, NS, conformance, event, id, spec};

conformance!(
    a_subscription_receives_in_order_and_waits_for_more,
    a_reconnecting_consumer_gets_its_leases_again,
    a_new_stream_of_a_consumer_replaces_its_previous_one,
    a_claim_that_waited_for_a_new_stream_sees_it,
    deregistering_ends_open_subscriptions,
    the_log_streams_from_a_sequence_then_live,
    a_stream_after_the_log_s_end_is_refused,
    in_process_handlers_run_in_dependency_order_with_retries,
    streams_cut_short_by_shutdown_end_unavailable,
);

fn subscription(handler: &str, consumer: &str, after: Option<i64>) -> Subscription {
    Subscription {
        namespace: NS.into(),
        handler: handler.into(),
        consumer_id: consumer.into(),
        max_in_flight: 3,
        after,
    }
}

const WAIT: Duration = Duration::from_secs(5);

async fn a_subscription_receives_in_order_and_waits_for_more(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    let mut stream = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    h.bus.publish(NS, (0..5).map(|_| event("x")).collect()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let delivery = tokio::time::timeout(WAIT, stream.next()).await.expect("delivery").unwrap().unwrap();
        assert_eq!(delivery.state, DeliveryState::InFlight);
        assert!(delivery.event.is_some());
        seen.push(delivery.id.sequence);
        // At most three unacked: ack as we go so the rest can come.
        h.ack("a", delivery.id.sequence).await;
    }
    assert_eq!(seen, [1, 2, 3, 4, 5]);
    let unknown = h.bus.subscribe(subscription("ghost", "c1", None)).await.unwrap_err();
    assert!(matches!(unknown, EventBusError::HandlerNotFound(_)), "{unknown}");
}

async fn a_reconnecting_consumer_gets_its_leases_again(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    h.bus.publish(NS, (0..3).map(|_| event("x")).collect()).await.unwrap();
    let mut stream = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    for expected in 1..=3 {
        let delivery = tokio::time::timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(delivery.id.sequence, expected);
    }
    drop(stream);
    // It had received up to 2 before it went away: 3 comes again at once.
    let mut stream = h.bus.subscribe(subscription("a", "c1", Some(2))).await.unwrap();
    let again = tokio::time::timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((again.id.sequence, again.attempt), (3, 1));
    drop(stream);
    // Without a cursor, everything leased to it comes again.
    let mut stream = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    let mut again = Vec::new();
    for _ in 0..3 {
        again.push(tokio::time::timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap().id.sequence);
    }
    assert_eq!(again, [1, 2, 3]);
}

/// A stream a crashed consumer left behind (its server side not yet aware
/// the client went away) must lease nothing after the consumer's new stream
/// took back its leases: nobody would get those deliveries until their
/// leases ran out, after the newer events.
async fn a_new_stream_of_a_consumer_replaces_its_previous_one(h: Harness) {
    // Through the service: the first subscription ends at its next claim (a
    // publish wakes it) without a delivery, and the second gets them in order.
    h.handler("a", &[], FailurePolicy::Fail).await;
    let mut first = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    let mut second = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    h.bus.publish(NS, (0..4).map(|_| event("x")).collect()).await.unwrap();
    let mut received = Vec::new();
    while received.len() < 3 {
        received.push(tokio::time::timeout(WAIT, second.next()).await.unwrap().unwrap().unwrap().id.sequence);
    }
    assert_eq!(received, [1, 2, 3]);
    let end = tokio::time::timeout(WAIT, first.next()).await.expect("the first stream ends");
    assert!(matches!(end, Some(Err(EventBusError::StreamSuperseded(_)))), "{end:?}");
    assert!(tokio::time::timeout(WAIT, first.next()).await.unwrap().is_none());
    // When the second ends too, no stream of c1 is left to protect: its row
    // goes, and a claim under any number may lease again.
    drop(second);
    let deadline = tokio::time::Instant::now() + WAIT;
    while let Err(error) = h.repository.claim(&claim_of_c1("a", 42, 10)).await {
        assert!(matches!(error, EventBusError::StreamSuperseded(_)), "{error}");
        assert!(tokio::time::Instant::now() < deadline, "the ended stream's row stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The repository: a claim on a replaced stream fails and leases nothing.
    h.handler("b", &[], FailurePolicy::Fail).await;
    let open = |consumer: &'static str| h.repository.open_stream(NS, "b", consumer, None, now_micros());
    let old = open("c1").await.unwrap();
    let new = open("c1").await.unwrap();
    assert_ne!(new.stream, old.stream);
    let claim = |stream: i64| claim_of_c1("b", stream, 2);
    let sequences = |claim: Claim| claim.deliveries.iter().map(|delivery| delivery.id.sequence).collect::<Vec<_>>();
    let refused = h.repository.claim(&claim(old.stream)).await.unwrap_err();
    assert!(matches!(&refused, EventBusError::StreamSuperseded(consumer) if consumer == "c1"), "{refused}");
    assert_eq!(sequences(h.repository.claim(&claim(new.stream)).await.unwrap()), [1, 2]);
    // Another consumer's new stream replaces none of c1's.
    open("c2").await.unwrap();
    assert_eq!(sequences(h.repository.claim(&claim(new.stream)).await.unwrap()), Vec::<i64>::new(), "c1 holds two");
    // Closing a replaced stream changes nothing; closing the open one
    // forgets it.
    h.repository.close_stream(NS, "b", "c1", old.stream).await.unwrap();
    assert!(h.repository.claim(&claim(old.stream)).await.is_err(), "the newer stream still fences the old one");
    h.repository.close_stream(NS, "b", "c1", new.stream).await.unwrap();
    assert!(h.repository.claim(&claim(old.stream)).await.is_ok(), "no open stream of c1 is left to fence");
}

/// A claim that waited for the handler's lock while c1's next stream was
/// being opened must see that stream once it has the lock, and lease nothing.
async fn a_claim_that_waited_for_a_new_stream_sees_it(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    let old = h.repository.open_stream(NS, "a", "c1", None, now_micros()).await.unwrap();
    h.publish("x").await;
    // An opening of c1's next stream, caught holding the handler's lock.
    let mut opening = h.db.begin().await.unwrap();
    let lock = format!(
        "SELECT name FROM eventbus_handlers WHERE namespace = $1 AND name = $2{}",
        h.db.on_postgres(" FOR UPDATE")
    );
    sqlx::query(sqlx::AssertSqlSafe(lock)).bind(NS).bind("a").execute(&mut *opening).await.unwrap();
    let waiting = {
        let repository = Arc::clone(&h.repository);
        tokio::spawn(async move { repository.claim(&claim_of_c1("a", old.stream, 2)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    sqlx::query("UPDATE eventbus_consumers SET stream = $1 WHERE namespace = $2 AND handler = $3 AND consumer_id = $4")
        .bind(old.stream.wrapping_add(1))
        .bind(NS)
        .bind("a")
        .bind("c1")
        .execute(&mut *opening)
        .await
        .unwrap();
    opening.commit().await.unwrap();
    let claimed = waiting.await.unwrap();
    assert!(matches!(claimed, Err(EventBusError::StreamSuperseded(_))), "{claimed:?}");
}

/// A claim of consumer c1 on `handler`, by its stream numbered `stream`.
fn claim_of_c1(handler: &str, stream: i64, max_in_flight: u32) -> ClaimRequest {
    ClaimRequest {
        namespace: NS.into(),
        handler: handler.into(),
        consumer_id: "c1".into(),
        stream,
        max_in_flight,
        now: now_micros(),
    }
}

async fn deregistering_ends_open_subscriptions(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    let mut stream = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.bus.get_handler(NS, "a").await.unwrap().stats.consumers, 1);
    h.bus.deregister_handler(NS, "a").await.unwrap();
    let end = tokio::time::timeout(WAIT, stream.next()).await.expect("the stream ended").unwrap();
    assert!(matches!(end, Err(EventBusError::HandlerNotFound(_))), "{end:?}");
    assert!(tokio::time::timeout(WAIT, stream.next()).await.unwrap().is_none());
}

async fn the_log_streams_from_a_sequence_then_live(h: Harness) {
    h.publish("old.one").await;
    h.publish("old.two").await;
    let mut from_start = h.bus.stream_events(NS, Some(1), vec![]).await.unwrap();
    let mut live = h.bus.stream_events(NS, None, vec![]).await.unwrap();
    h.publish("new.one").await;
    assert_eq!(next_type(&mut from_start).await, "old.two");
    assert_eq!(next_type(&mut from_start).await, "new.one");
    assert_eq!(next_type(&mut live).await, "new.one");
}

/// A log that ends before the sequence a reader asks for was reset or
/// restored: the reader is told, rather than miss the events to come.
async fn a_stream_after_the_log_s_end_is_refused(h: Harness) {
    h.publish("only.one").await;
    let mut past = h.bus.stream_events(NS, Some(5), vec![]).await.unwrap();
    let refused = tokio::time::timeout(WAIT, past.next()).await.expect("an answer").expect("an error");
    let Err(EventBusError::InvalidArgument(violation)) = refused else { panic!("{refused:?}") };
    assert_eq!(violation.field, "after_sequence");
    assert!(violation.reason.contains("past the last event of the log (1)"), "{violation:?}");
    assert!(tokio::time::timeout(WAIT, past.next()).await.unwrap().is_none(), "the stream ends");
    let mut at_end = h.bus.stream_events(NS, Some(1), vec![]).await.unwrap();
    h.publish("next.one").await;
    assert_eq!(next_type(&mut at_end).await, "next.one", "from the last event is fine");
}

async fn next_type(
    stream: &mut tokio_stream::wrappers::ReceiverStream<chorus_eventbus::error::Result<Event>>,
) -> String {
    tokio::time::timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap().event_type
}

/// Records what it handled; fails `failures` times first.
struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<(String, i64)>>>,
    failures: Mutex<u32>,
}

#[async_trait]
impl EventHandler for Recorder {
    async fn handle(&self, event: &Event) -> Result<(), HandlerFailure> {
        {
            let mut failures = self.failures.lock().unwrap();
            if *failures > 0 {
                *failures -= 1;
                return Err(HandlerFailure::retry("not yet"));
            }
        }
        self.log.lock().unwrap().push((self.name.to_owned(), event.sequence));
        Ok(())
    }
}

async fn in_process_handlers_run_in_dependency_order_with_retries(h: Harness) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let recorder = |name, failures| Arc::new(Recorder { name, log: Arc::clone(&log), failures: Mutex::new(failures) });
    let mut flaky = spec("first", &[], FailurePolicy::Fail);
    flaky.retry.initial_backoff = Duration::from_millis(10);
    flaky.retry.max_backoff = Duration::from_millis(10);
    let second = h.bus.run_handler(spec("second", &["first"], FailurePolicy::Fail), "p1", recorder("second", 0));
    let second = second.await.unwrap();
    let first = h.bus.run_handler(flaky, "p1", recorder("first", 2)).await.unwrap();
    h.bus.publish(NS, vec![event("x"), event("x")]).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while log.lock().unwrap().len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "handlers did not finish: {:?}", log.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = log.lock().unwrap().clone();
    let position = |name: &str, sequence| log.iter().position(|entry| entry == &(name.to_owned(), sequence)).unwrap();
    for sequence in [1, 2] {
        assert!(position("first", sequence) < position("second", sequence), "{log:?}");
    }
    assert!(position("first", 1) < position("first", 2), "{log:?}");
    // Two failed attempts, then success: four attempts over the two events.
    let mut attempts = 0;
    for sequence in [1, 2] {
        let delivery = h.bus.get_delivery(NS, &id("first", sequence)).await.unwrap();
        assert_eq!(delivery.state, DeliveryState::Acked);
        attempts += delivery.attempt;
    }
    assert_eq!(attempts, 4);
    first.abort();
    second.abort();
}

/// A subscription or a log stream that a shutdown ends says so
/// (UNAVAILABLE): its client opens it again rather than take the end for
/// the last of it.
async fn streams_cut_short_by_shutdown_end_unavailable(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    let subscribed = h.bus.subscribe(subscription("a", "c1", None)).await.unwrap();
    let logged = h.bus.stream_events(NS, None, vec![]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.shutdown.cancel();
    let subscribed: Vec<_> = tokio::time::timeout(WAIT, subscribed.collect()).await.expect("ended");
    assert!(matches!(subscribed.as_slice(), [Err(EventBusError::ShuttingDown)]), "{subscribed:?}");
    let logged: Vec<_> = tokio::time::timeout(WAIT, logged.collect()).await.expect("ended");
    assert!(matches!(logged.as_slice(), [Err(EventBusError::ShuttingDown)]), "{logged:?}");
}
