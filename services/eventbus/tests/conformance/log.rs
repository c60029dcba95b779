//! The log: sequences, idempotency, reads, namespaces.

use chorus_eventbus::{
    domain::{EventQuery, FailurePolicy, Pattern},
    error::EventBusError,
};

use crate::harness::{Harness, NS, conformance, event, id};

conformance!(
    sequences_are_per_namespace_and_batches_are_ordered,
    idempotency_keys_publish_once,
    every_field_and_byte_comes_back_as_published,
    a_large_batch_is_one_ordered_append,
    reads_page_and_filter_by_pattern,
    namespaces_are_isolated,
);

async fn sequences_are_per_namespace_and_batches_are_ordered(h: Harness) {
    assert_eq!(h.publish("a.one").await, 1);
    assert_eq!(h.publish_in("other", "a.one").await, 1);
    let batch = h.bus.publish(NS, vec![event("b.one"), event("b.two"), event("b.three")]).await.unwrap();
    let sequences: Vec<i64> = batch.iter().map(|p| p.sequence).collect();
    assert_eq!(sequences, [2, 3, 4]);
    let page =
        h.bus.read_events(&EventQuery { namespace: NS.into(), after: 0, types: vec![], limit: 10 }).await.unwrap();
    let types: Vec<&str> = page.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(types, ["a.one", "b.one", "b.two", "b.three"]);
    assert_eq!(page.events[1].payload, br#"{"n":1}"#);
    assert_eq!((page.head, page.next_after), (4, 4));
}

async fn idempotency_keys_publish_once(h: Harness) {
    let keyed = |key: &str| {
        let mut event = event("task.completed");
        event.idempotency_key = Some(key.into());
        event
    };
    let first = h.bus.publish(NS, vec![keyed("k1")]).await.unwrap()[0];
    assert!(!first.duplicate);
    let again = h.bus.publish(NS, vec![keyed("k2"), keyed("k1"), keyed("k2")]).await.unwrap();
    assert_eq!(again[0].sequence, 2);
    assert!(!again[0].duplicate);
    assert_eq!((again[1].sequence, again[1].duplicate), (first.sequence, true));
    assert_eq!((again[2].sequence, again[2].duplicate), (2, true));
    // Another namespace has its own keys.
    assert!(!h.bus.publish("other", vec![keyed("k1")]).await.unwrap()[0].duplicate);
    let page =
        h.bus.read_events(&EventQuery { namespace: NS.into(), after: 0, types: vec![], limit: 10 }).await.unwrap();
    assert_eq!(page.events.len(), 2, "duplicates append nothing");
}

async fn every_field_and_byte_comes_back_as_published(h: Harness) {
    let mut published = event("tool.called");
    published.subject = "task/42 \"quoted\" \u{1e} é".into();
    published.payload = (0..=255).collect();
    published.content_type = "application/octet-stream".into();
    published.attributes =
        [("traceparent".to_owned(), "00-ab-cd-01".to_owned()), ("k".to_owned(), "{\"v\":[1]}".to_owned())]
            .into_iter()
            .collect();
    published.idempotency_key = Some("key \\ with \"escapes\"".into());
    published.time = Some(1_234_567);
    let sequence = h.bus.publish(NS, vec![published.clone()]).await.unwrap()[0].sequence;
    let page =
        h.bus.read_events(&EventQuery { namespace: NS.into(), after: 0, types: vec![], limit: 10 }).await.unwrap();
    let [logged] = page.events.as_slice() else { panic!("one event expected, got {:?}", page.events) };
    assert_eq!(logged.sequence, sequence);
    assert_eq!(logged.event_type, "tool.called");
    assert_eq!(logged.source, published.source);
    assert_eq!(logged.subject, published.subject);
    assert_eq!(logged.payload, published.payload);
    assert_eq!(logged.content_type, published.content_type);
    assert_eq!(logged.attributes, published.attributes);
    assert_eq!(logged.idempotency_key, published.idempotency_key);
    assert_eq!(logged.time, 1_234_567);
}

/// More events than any one statement used to carry, in one call.
async fn a_large_batch_is_one_ordered_append(h: Harness) {
    let events: Vec<_> = (0..1_500)
        .map(|n| {
            let mut event = event("batch.item");
            event.payload = format!("{{\"n\":{n}}}").into_bytes();
            event.idempotency_key = (n % 2 == 0).then(|| format!("k{n}"));
            event
        })
        .collect();
    let published = h.bus.publish(NS, events.clone()).await.unwrap();
    assert!(published.iter().map(|p| p.sequence).eq(1..=1_500));
    let again = h.bus.publish(NS, events[..10].to_vec()).await.unwrap();
    let duplicates: Vec<bool> = again.iter().map(|p| p.duplicate).collect();
    assert_eq!(duplicates, (0..10).map(|n| n % 2 == 0).collect::<Vec<_>>(), "keyed events publish once");
    let page =
        h.bus.read_events(&EventQuery { namespace: NS.into(), after: 0, types: vec![], limit: 2_000 }).await.unwrap();
    assert_eq!(page.events.len(), 1_505);
    for (n, logged) in page.events.iter().take(1_500).enumerate() {
        assert_eq!((logged.sequence, logged.payload.clone()), (n as i64 + 1, format!("{{\"n\":{n}}}").into_bytes()));
    }
}

async fn reads_page_and_filter_by_pattern(h: Harness) {
    for event_type in ["task.created", "tool.called", "task.completed", "turn_after", "task.failed"] {
        h.publish(event_type).await;
    }
    let query = |after, types: &[&str], limit| EventQuery {
        namespace: NS.into(),
        after,
        types: types.iter().map(|t| Pattern::parse("t", t).unwrap()).collect(),
        limit,
    };
    let page = h.bus.read_events(&query(0, &[], 2)).await.unwrap();
    assert_eq!(page.events.len(), 2);
    assert_eq!(page.next_after, 2);
    let page = h.bus.read_events(&query(page.next_after, &[], 10)).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [3, 4, 5]);

    let page = h.bus.read_events(&query(0, &["task.*"], 10)).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [1, 3, 5]);
    assert_eq!(page.next_after, 5);
    let page = h.bus.read_events(&query(0, &["*.failed", "tool.called"], 10)).await.unwrap();
    assert_eq!(page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(), [2, 5]);
    // `_` is literal, not a SQL wildcard.
    let page = h.bus.read_events(&query(0, &["turn_after"], 10)).await.unwrap();
    assert_eq!(page.events.len(), 1);
    let page = h.bus.read_events(&query(0, &["turnXafter"], 10)).await.unwrap();
    assert!(page.events.is_empty());
}

async fn namespaces_are_isolated(h: Harness) {
    h.handler("audit", &[], FailurePolicy::Fail).await;
    h.publish_in("other", "task.created").await;
    assert!(h.claimed("audit").await.is_empty(), "another namespace's event reached the handler");
    let sequence = h.publish("task.created").await;
    assert_eq!(h.claimed("audit").await, [sequence]);
    let foreign = h.bus.ack("other", &[id("audit", sequence)]).await.unwrap_err();
    assert!(matches!(foreign, EventBusError::DeliveryNotFound(_)), "{foreign}");
    let foreign = h.bus.get_handler("other", "audit").await.unwrap_err();
    assert!(matches!(foreign, EventBusError::HandlerNotFound(_)), "{foreign}");
    assert!(h.bus.list_handlers("other").await.unwrap().is_empty());
    let page =
        h.bus.read_events(&EventQuery { namespace: "other".into(), after: 0, types: vec![], limit: 10 }).await.unwrap();
    assert_eq!(page.events.len(), 1);
}
