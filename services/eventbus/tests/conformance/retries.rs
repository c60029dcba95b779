//! At-least-once: leases, retries, dead letters, replays.

use std::time::Duration;

use chorus_eventbus::{
    domain::{DeliveryQuery, DeliveryState, FailurePolicy, Nack},
    error::EventBusError,
};

use crate::harness::{Harness, NS, conformance, id, retry, spec};

conformance!(
    an_unacked_delivery_comes_back_after_its_lease,
    a_consumer_whose_lease_ran_out_cannot_fail_or_extend_the_next_attempt,
    the_reaper_dead_letters_when_no_consumer_returns,
    max_attempts_dead_letter_and_replay,
    a_retry_holds_back_later_events_of_its_handler,
    acks_are_all_or_nothing_and_idempotent,
    nacks_and_extensions_need_a_lease,
    replay_from_a_sequence_includes_events_before_registration,
    stats_count_what_is_open,
    deregistering_discards_deliveries_and_frees_dependents,
);

fn nack(error: &str) -> Nack {
    Nack { error: error.into(), retry_delay: None, dead_letter: false, attempt: None }
}

async fn an_unacked_delivery_comes_back_after_its_lease(h: Harness) {
    let mut short = spec("worker", &[], FailurePolicy::Fail);
    short.retry = retry(5, Duration::from_millis(200));
    h.bus.register_handler(short).await.unwrap();
    let sequence = h.publish("task.created").await;
    let first = h.claim_as("worker", "crashed", 10).await;
    assert_eq!((first[0].id.sequence, first[0].attempt), (sequence, 1));
    assert!(h.claim_as("worker", "other", 10).await.is_empty(), "a leased delivery was handed out twice");
    // The consumer dies without acking; after the lease and the backoff the
    // delivery goes to whoever asks.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let again = loop {
        let again = h.claim_as("worker", "other", 10).await;
        if !again.is_empty() {
            break again;
        }
        assert!(tokio::time::Instant::now() < deadline, "never redelivered");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!((again[0].id.sequence, again[0].attempt), (sequence, 2));
    assert_eq!(again[0].last_error.as_deref(), Some("lease expired"));
    assert_eq!(again[0].consumer_id.as_deref(), Some("other"));
}

async fn a_consumer_whose_lease_ran_out_cannot_fail_or_extend_the_next_attempt(h: Harness) {
    let mut short = spec("worker", &[], FailurePolicy::Fail);
    short.retry = retry(5, Duration::from_millis(200));
    h.bus.register_handler(short).await.unwrap();
    h.publish("task.created").await;
    let stale = h.claim_as("worker", "slow", 10).await.remove(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let current = loop {
        if let Some(current) = h.claim_as("worker", "other", 10).await.pop() {
            break current;
        }
        assert!(tokio::time::Instant::now() < deadline, "never redelivered");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!((stale.attempt, current.attempt), (1, 2));
    // The slow consumer comes back with its verdict on attempt 1.
    let late = Nack { dead_letter: true, attempt: Some(stale.attempt), ..nack("gave up") };
    let error = h.bus.nack(NS, &stale.id, late).await.unwrap_err();
    assert!(matches!(error, EventBusError::AttemptOver { attempt: 1, current: 2, .. }), "{error:?}");
    let error = h.bus.extend(NS, &stale.id, None, Some(stale.attempt)).await.unwrap_err();
    assert!(matches!(error, EventBusError::AttemptOver { .. }), "{error:?}");
    let error = h.bus.extend(NS, &stale.id, None, Some(7)).await.unwrap_err();
    assert!(
        matches!(&error, EventBusError::InvalidArgument(violation) if violation.field == "attempt"),
        "an attempt never made is the caller's mistake: {error:?}"
    );
    let unchanged = h.bus.get_delivery(NS, &current.id).await.unwrap();
    assert_eq!((unchanged.state, unchanged.attempt), (DeliveryState::InFlight, 2), "attempt 2 is untouched");
    h.bus.extend(NS, &current.id, None, Some(2)).await.expect("the holder extends its own attempt");
    h.bus.ack(NS, std::slice::from_ref(&current.id)).await.expect("the holder acks");
}

async fn the_reaper_dead_letters_when_no_consumer_returns(h: Harness) {
    let mut once = spec("worker", &[], FailurePolicy::Fail);
    once.retry = retry(1, Duration::from_millis(100));
    h.bus.register_handler(once).await.unwrap();
    h.handler("after", &["worker"], FailurePolicy::Fail).await;
    let sequence = h.publish("task.created").await;
    assert_eq!(h.claimed("worker").await, [sequence]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let delivery = h.bus.get_delivery(NS, &id("worker", sequence)).await.unwrap();
        if delivery.state == DeliveryState::DeadLettered {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the reaper never expired the lease: {delivery:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let dependent = h.bus.get_delivery(NS, &id("after", sequence)).await.unwrap();
    assert_eq!(dependent.state, DeliveryState::Skipped);
}

async fn max_attempts_dead_letter_and_replay(h: Harness) {
    let mut handler = spec("worker", &[], FailurePolicy::Fail);
    handler.retry.initial_backoff = Duration::from_millis(1);
    handler.retry.max_backoff = Duration::from_millis(1);
    h.bus.register_handler(handler).await.unwrap();
    let sequence = h.publish("task.created").await;
    for attempt in 1..=3 {
        let claimed = loop {
            let claimed = h.claim("worker", 1).await;
            if !claimed.is_empty() {
                break claimed;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(claimed[0].attempt, attempt);
        let state = h.bus.nack(NS, &id("worker", sequence), nack(&format!("try {attempt}"))).await.unwrap().state;
        let expected = if attempt < 3 { DeliveryState::Failed } else { DeliveryState::DeadLettered };
        assert_eq!(state, expected);
    }
    let dead = h
        .bus
        .list_deliveries(&DeliveryQuery {
            namespace: NS.into(),
            handler: None,
            sequence: None,
            states: vec![DeliveryState::DeadLettered],
            include_events: true,
            after: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(dead.deliveries.len(), 1);
    assert_eq!(dead.deliveries[0].last_error.as_deref(), Some("try 3"));
    assert_eq!(dead.deliveries[0].event.as_ref().unwrap().event_type, "task.created");
    assert_eq!(dead.deliveries[0].finished_at, Some(dead.deliveries[0].updated_at), "dead-lettered when last updated");
    assert!(h.claimed("worker").await.is_empty(), "a dead letter was delivered");

    let wrong = h.bus.replay_dead_letters(NS, "worker", &[id("worker", sequence + 1)], false).await.unwrap_err();
    assert!(matches!(wrong, EventBusError::DeliveryNotFound(_)), "{wrong}");
    let replayed = h.bus.replay_dead_letters(NS, "worker", &[id("worker", sequence)], false).await.unwrap();
    assert_eq!(replayed.replayed, 1);
    let claimed = h.claim("worker", 1).await;
    assert_eq!((claimed[0].attempt, claimed[0].finished_at), (1, None), "a replay resets the attempts");
    h.ack("worker", sequence).await;
    assert_eq!(h.bus.get_delivery(NS, &id("worker", sequence)).await.unwrap().state, DeliveryState::Acked);
}

async fn a_retry_holds_back_later_events_of_its_handler(h: Harness) {
    let mut handler = spec("ordered", &[], FailurePolicy::Fail);
    handler.retry.initial_backoff = Duration::from_millis(300);
    handler.retry.max_backoff = Duration::from_millis(300);
    h.bus.register_handler(handler).await.unwrap();
    let first = h.publish("x").await;
    assert_eq!(h.claimed("ordered").await, [first]);
    let second = h.publish("x").await;
    h.bus.nack(NS, &id("ordered", first), nack("later")).await.unwrap();
    assert!(h.claimed("ordered").await.is_empty(), "a later event overtook a retry");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(h.claimed("ordered").await, [first, second]);
}

async fn acks_are_all_or_nothing_and_idempotent(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    let one = h.publish("x").await;
    let two = h.publish("x").await;
    assert_eq!(h.claimed("a").await, [one, two]);
    h.bus
        .nack(NS, &id("a", two), Nack { error: "no".into(), retry_delay: None, dead_letter: true, attempt: None })
        .await
        .unwrap();
    let error = h.bus.ack(NS, &[id("a", one), id("a", two)]).await.unwrap_err();
    assert!(matches!(error, EventBusError::DeliveryFinished { state: DeliveryState::DeadLettered, .. }), "{error}");
    assert_eq!(h.bus.get_delivery(NS, &id("a", one)).await.unwrap().state, DeliveryState::InFlight);
    let missing = h.bus.ack(NS, &[id("a", one), id("a", 99)]).await.unwrap_err();
    assert!(matches!(missing, EventBusError::DeliveryNotFound(_)), "{missing}");
    assert_eq!(h.bus.get_delivery(NS, &id("a", one)).await.unwrap().state, DeliveryState::InFlight);
    h.ack("a", one).await;
    h.ack("a", one).await;
    assert_eq!(h.bus.get_delivery(NS, &id("a", one)).await.unwrap().state, DeliveryState::Acked);
}

async fn nacks_and_extensions_need_a_lease(h: Harness) {
    h.handler("a", &["b"], FailurePolicy::Fail).await;
    h.handler("b", &[], FailurePolicy::Fail).await;
    let sequence = h.publish("x").await;
    let error = h.bus.nack(NS, &id("a", sequence), nack("x")).await.unwrap_err();
    assert!(matches!(error, EventBusError::NotInFlight { state: DeliveryState::Pending, .. }), "{error}");
    let error = h.bus.extend(NS, &id("a", sequence), None, None).await.unwrap_err();
    assert!(matches!(error, EventBusError::NotInFlight { .. }), "{error}");
    let claimed = h.claim("b", 1).await;
    let before = claimed[0].visible_until.unwrap();
    let after = h.bus.extend(NS, &id("b", sequence), Some(Duration::from_secs(60)), None).await.unwrap();
    assert!(after > before + 50_000_000, "lease not extended: {before} -> {after}");
    h.ack("b", sequence).await;
    let error = h.bus.nack(NS, &id("b", sequence), nack("late")).await.unwrap_err();
    assert!(matches!(error, EventBusError::DeliveryFinished { state: DeliveryState::Acked, .. }), "{error}");
}

async fn replay_from_a_sequence_includes_events_before_registration(h: Harness) {
    let one = h.publish("task.created").await;
    let two = h.publish("tool.called").await;
    let three = h.publish("task.completed").await;
    let mut tasks = spec("tasks", &[], FailurePolicy::Fail);
    tasks.event_types = vec![chorus_eventbus::domain::Pattern::parse("t", "task.*").unwrap()];
    tasks.start_after = None;
    h.bus.register_handler(tasks).await.unwrap();
    assert!(h.claimed("tasks").await.is_empty(), "a new handler took events from before it registered");
    let four = h.publish("task.failed").await;
    assert_eq!(h.claimed("tasks").await, [four]);
    h.ack("tasks", four).await;
    assert_eq!(h.bus.replay(NS, "tasks", two, None).await.unwrap(), 2, "three and four, not the tool event");
    assert_eq!(h.claimed("tasks").await, [three, four]);
    assert_eq!(h.bus.replay(NS, "tasks", one, Some(one)).await.unwrap(), 1);
    let error = h.bus.replay(NS, "ghost", 1, None).await.unwrap_err();
    assert!(matches!(error, EventBusError::HandlerNotFound(_)), "{error}");
}

async fn stats_count_what_is_open(h: Harness) {
    assert_eq!(h.repository.backlog().await.unwrap(), (0, None));
    h.handler("a", &[], FailurePolicy::Fail).await;
    for _ in 0..4 {
        h.publish("x").await;
    }
    assert_eq!(h.claimed("a").await.len(), 4);
    h.ack("a", 1).await;
    h.ack("a", 2).await;
    h.bus
        .nack(NS, &id("a", 3), Nack { error: "x".into(), retry_delay: None, dead_letter: true, attempt: None })
        .await
        .unwrap();
    let stats = h.bus.get_handler(NS, "a").await.unwrap().stats;
    assert_eq!((stats.in_flight, stats.dead_lettered, stats.pending), (1, 1, 0));
    assert_eq!((stats.finished_through, stats.lag), (3, 1));
    h.publish("x").await;
    let (open, oldest) = h.repository.backlog().await.unwrap();
    assert_eq!(open, 2, "one in flight, one waiting; no dead letter, nothing acked");
    assert!(oldest.is_some_and(|created| created <= chorus_runtime::time::now_micros()), "{oldest:?}");
}

async fn deregistering_discards_deliveries_and_frees_dependents(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    let sequence = h.publish("x").await;
    assert!(h.claimed("b").await.is_empty());
    h.bus.deregister_handler(NS, "a").await.unwrap();
    assert_eq!(h.claimed("b").await, [sequence]);
    let error = h.bus.get_delivery(NS, &id("a", sequence)).await.unwrap_err();
    assert!(matches!(error, EventBusError::DeliveryNotFound(_)), "{error}");
    let error = h.bus.deregister_handler(NS, "a").await.unwrap_err();
    assert!(matches!(error, EventBusError::HandlerNotFound(_)), "{error}");
}
