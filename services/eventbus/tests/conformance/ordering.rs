//! Dependency order: diamonds, failure policies, cycles, late registration.

use chorus_eventbus::{
    domain::{DeliveryState, FailurePolicy, HandlerSpec, Nack},
    error::EventBusError,
};

use crate::harness::{Harness, NS, conformance, id, spec};

conformance!(
    a_diamond_runs_in_dependency_order,
    fail_skips_dependents_and_records_why,
    ignore_lets_dependents_proceed,
    cycles_of_length_one_to_four_are_rejected_with_their_path,
    a_dependency_registered_late_holds_nothing_until_it_registers,
    handlers_list_in_delivery_order,
    a_handler_cannot_start_past_the_end_of_the_log,
);

async fn a_diamond_runs_in_dependency_order(h: Harness) {
    // Registered in an order that is not the dependency order.
    h.handler("d", &["b", "c"], FailurePolicy::Fail).await;
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    h.handler("c", &["a"], FailurePolicy::Fail).await;
    h.handler("a", &[], FailurePolicy::Fail).await;
    let sequence = h.publish("task.completed").await;

    for waiting in ["b", "c", "d"] {
        assert!(h.claimed(waiting).await.is_empty(), "{waiting} ran before a");
    }
    assert_eq!(h.claimed("a").await, [sequence]);
    assert!(h.claimed("b").await.is_empty(), "b ran before a acked");
    h.ack("a", sequence).await;
    // b and c have no order between them: both go at once.
    assert_eq!(h.claimed("b").await, [sequence]);
    assert_eq!(h.claimed("c").await, [sequence]);
    h.ack("b", sequence).await;
    assert!(h.claimed("d").await.is_empty(), "d ran before c acked");
    h.ack("c", sequence).await;
    assert_eq!(h.claimed("d").await, [sequence]);
}

async fn dead_letter(h: &Harness, handler: &str, sequence: i64) {
    assert_eq!(h.claimed(handler).await, [sequence]);
    let nack = Nack { error: "boom".into(), retry_delay: None, dead_letter: true, attempt: None };
    let delivery = h.bus.nack(NS, &id(handler, sequence), nack).await.unwrap();
    assert_eq!(delivery.state, DeliveryState::DeadLettered);
}

async fn fail_skips_dependents_and_records_why(h: Harness) {
    h.handler("a", &[], FailurePolicy::Fail).await;
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    h.handler("c", &["b"], FailurePolicy::Fail).await;
    let sequence = h.publish("task.completed").await;
    dead_letter(&h, "a", sequence).await;

    for skipped in ["b", "c"] {
        let delivery = h.bus.get_delivery(NS, &id(skipped, sequence)).await.unwrap();
        assert_eq!(delivery.state, DeliveryState::Skipped, "{skipped}");
        assert!(delivery.finished_at.is_some());
        assert!(h.claimed(skipped).await.is_empty());
    }
    let reason = h.bus.get_delivery(NS, &id("b", sequence)).await.unwrap().skip_reason.unwrap();
    assert_eq!((reason.handler.as_str(), reason.message.as_str()), ("a", "boom"));
    let reason = h.bus.get_delivery(NS, &id("c", sequence)).await.unwrap().skip_reason.unwrap();
    assert_eq!(reason.handler, "b");
    // The next event is not held back by the skipped one.
    let next = h.publish("task.completed").await;
    assert_eq!(h.claimed("a").await, [next]);

    // Replaying the dead letter re-arms the skipped dependents.
    let replayed = h.bus.replay_dead_letters(NS, "a", &[], true).await.unwrap();
    assert_eq!((replayed.replayed, replayed.rearmed), (1, 2));
    h.ack("a", next).await;
    assert_eq!(h.claimed("a").await, [sequence]);
    h.ack("a", sequence).await;
    assert_eq!(h.claimed("b").await, [sequence, next]);
}

async fn ignore_lets_dependents_proceed(h: Harness) {
    h.handler("a", &[], FailurePolicy::Ignore).await;
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    let sequence = h.publish("task.completed").await;
    dead_letter(&h, "a", sequence).await;
    assert_eq!(h.claimed("b").await, [sequence]);
}

async fn cycles_of_length_one_to_four_are_rejected_with_their_path(h: Harness) {
    let expect_cycle = |error: EventBusError, path: &[&str]| match error {
        EventBusError::Cycle { path: found, .. } => assert_eq!(found, path),
        other => panic!("expected a cycle, got {other}"),
    };
    expect_cycle(h.bus.register_handler(spec("a", &["a"], FailurePolicy::Fail)).await.unwrap_err(), &["a", "a"]);
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    expect_cycle(h.bus.register_handler(spec("a", &["b"], FailurePolicy::Fail)).await.unwrap_err(), &["a", "b", "a"]);
    h.handler("c", &["b"], FailurePolicy::Fail).await;
    let error = h.bus.register_handler(spec("a", &["c"], FailurePolicy::Fail)).await.unwrap_err();
    assert_eq!(error.to_string(), "handler a would close a cycle: a -> c -> b -> a");
    h.handler("d", &["c"], FailurePolicy::Fail).await;
    expect_cycle(
        h.bus.register_handler(spec("a", &["d"], FailurePolicy::Fail)).await.unwrap_err(),
        &["a", "d", "c", "b", "a"],
    );
    // Nothing changed: `a` is still unregistered, and a valid graph registers.
    assert!(matches!(h.bus.get_handler(NS, "a").await.unwrap_err(), EventBusError::HandlerNotFound(_)));
    h.handler("a", &[], FailurePolicy::Fail).await;
    // Redefining an existing handler into a cycle is rejected too, keeping the old definition.
    expect_cycle(
        h.bus.register_handler(spec("b", &["d"], FailurePolicy::Fail)).await.unwrap_err(),
        &["b", "d", "c", "b"],
    );
    assert_eq!(h.bus.get_handler(NS, "b").await.unwrap().handler.after, ["a"]);
}

async fn a_dependency_registered_late_holds_nothing_until_it_registers(h: Harness) {
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    let view = h.bus.get_handler(NS, "b").await.unwrap();
    assert_eq!(view.unresolved_after, ["a"]);
    let early = h.publish("task.completed").await;
    assert_eq!(h.claimed("b").await, [early], "an unregistered dependency held the event");
    h.ack("b", early).await;

    let mut late = spec("a", &[], FailurePolicy::Fail);
    late.start_after = None;
    h.bus.register_handler(late).await.unwrap();
    assert!(h.bus.get_handler(NS, "b").await.unwrap().unresolved_after.is_empty());
    let next = h.publish("task.completed").await;
    assert!(h.claimed("b").await.is_empty(), "b ran before its now-registered dependency");
    assert_eq!(h.claimed("a").await, [next]);
    h.ack("a", next).await;
    assert_eq!(h.claimed("b").await, [next]);
}

async fn handlers_list_in_delivery_order(h: Harness) {
    h.handler("zeta", &[], FailurePolicy::Fail).await;
    h.handler("d", &["b", "c"], FailurePolicy::Fail).await;
    h.handler("c", &["a"], FailurePolicy::Fail).await;
    h.handler("b", &["a"], FailurePolicy::Fail).await;
    h.handler("a", &[], FailurePolicy::Fail).await;
    let names: Vec<String> = h.bus.list_handlers(NS).await.unwrap().into_iter().map(|v| v.handler.name).collect();
    assert_eq!(names, ["a", "b", "c", "d", "zeta"]);
}

/// A new handler starts after an event the log holds: one past the last
/// would report a start it does not keep, as the next event is delivered.
async fn a_handler_cannot_start_past_the_end_of_the_log(h: Harness) {
    let last = h.publish("task.completed").await;
    let ahead = HandlerSpec { start_after: Some(last + 1), ..spec("ahead", &[], FailurePolicy::Fail) };
    let error = h.bus.register_handler(ahead).await.expect_err("past the log's end");
    assert!(matches!(&error, EventBusError::InvalidArgument(v) if v.field == "start_after_sequence"), "{error}");
    assert!(error.to_string().contains(&format!("({last})")), "names the last event: {error}");
    let missing = h.bus.get_handler(NS, "ahead").await.expect_err("not registered");
    assert!(matches!(missing, EventBusError::HandlerNotFound(_)), "{missing}");

    let at_end = HandlerSpec { start_after: Some(last), ..spec("at-end", &[], FailurePolicy::Fail) };
    assert_eq!(h.bus.register_handler(at_end).await.unwrap().start_sequence, last + 1);
    let next = h.publish("task.completed").await;
    assert_eq!(h.claimed("at-end").await, [next]);
    // Registered again, it keeps its start, whatever the request says.
    let again = HandlerSpec { start_after: Some(next + 10), ..spec("at-end", &[], FailurePolicy::Fail) };
    assert_eq!(h.bus.register_handler(again).await.unwrap().start_sequence, last + 1);
}
