//! Topics and broadcast: who gets a copy, queued delivery, TTLs, limits.

use std::time::Duration;

use chorus_hub::{
    domain::{Audience, InboxFilter, MessageKind, Outgoing},
    error::HubError,
};
use chorus_runtime::{storage::Backend, testing::until_waiting_for_locks};
use tokio::task::JoinHandle;

use crate::harness::{Harness, NS, conformance, outgoing, types_of};

conformance!(
    a_publish_reaches_every_other_subscriber_once,
    late_subscribers_see_only_what_follows_and_unsubscribing_drops_the_queue,
    messages_expire_with_their_ttl,
    broadcast_reaches_every_agent_but_the_sender_optionally_by_type,
    a_full_inbox_refuses_the_whole_send,
    idempotent_sends_queue_once,
    a_used_key_names_its_recipients,
    concurrent_sends_keep_keys_and_limits,
    topics_and_broadcasts_stay_in_their_namespace,
    a_send_in_flight_is_dropped_by_the_unsubscribe_that_follows,
    a_send_in_flight_is_dropped_by_the_deregistration_that_follows,
);

fn publish(sender: &str, topic: &str, message_type: &str) -> chorus_hub::domain::Outgoing {
    outgoing(sender, Audience::Topic(topic.into()), MessageKind::Topic, message_type)
}

async fn a_publish_reaches_every_other_subscriber_once(h: Harness) {
    for agent in ["pub", "a", "b"] {
        h.agent(agent, "worker").await;
        h.hub.subscribe(NS, agent, "code-review").await.unwrap();
    }
    let sent = h.hub.send(publish("pub", "code-review", "review.ready")).await.unwrap();
    assert_eq!(sent.recipients, 2, "never back to the publisher");
    assert!(h.drain("pub").await.is_empty());
    for agent in ["a", "b"] {
        let messages = h.drain(agent).await;
        assert_eq!(types_of(&messages), ["review.ready"]);
        assert_eq!((messages[0].kind, messages[0].topic.as_deref()), (MessageKind::Topic, Some("code-review")));
        assert_eq!(messages[0].id, sent.message_id, "one message, a copy per inbox");
        assert!(h.drain(agent).await.is_empty(), "acked messages never come back");
    }
}

async fn late_subscribers_see_only_what_follows_and_unsubscribing_drops_the_queue(h: Harness) {
    h.agent("pub", "worker").await;
    h.agent("late", "worker").await;
    h.hub.send(publish("pub", "news", "before")).await.unwrap();
    h.hub.subscribe(NS, "late", "news").await.unwrap();
    h.hub.send(publish("pub", "news", "after")).await.unwrap();
    // Offline meanwhile: the message waited in the inbox.
    assert_eq!(types_of(&h.drain("late").await), ["after"]);
    h.hub.send(publish("pub", "news", "dropped")).await.unwrap();
    h.hub.unsubscribe(NS, "late", "news").await.unwrap();
    h.hub.send(publish("pub", "news", "unseen")).await.unwrap();
    assert!(h.drain("late").await.is_empty());
    assert!(h.hub.subscriptions(NS, Some("late"), None).await.unwrap().is_empty());
}

async fn messages_expire_with_their_ttl(h: Harness) {
    h.agent("pub", "worker").await;
    h.agent("sub", "worker").await;
    h.hub.subscribe(NS, "sub", "t").await.unwrap();
    let mut short = publish("pub", "t", "short");
    short.ttl = Duration::from_millis(100);
    h.hub.send(short).await.unwrap();
    h.hub.send(publish("pub", "t", "long")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(types_of(&h.drain("sub").await), ["long"]);
}

async fn broadcast_reaches_every_agent_but_the_sender_optionally_by_type(h: Harness) {
    h.agent("boss", "coordinator").await;
    for worker in ["w1", "w2"] {
        h.agent(worker, "worker").await;
    }
    h.agent("auditor", "auditor").await;
    let all = h
        .hub
        .send(outgoing("boss", Audience::Everyone { agent_type: None }, MessageKind::Broadcast, "hello"))
        .await
        .unwrap();
    assert_eq!(all.recipients, 3);
    let workers = Audience::Everyone { agent_type: Some("worker".into()) };
    let some = h.hub.send(outgoing("boss", workers, MessageKind::Broadcast, "work")).await.unwrap();
    assert_eq!(some.recipients, 2);
    assert!(h.drain("boss").await.is_empty());
    assert_eq!(types_of(&h.drain("w1").await), ["hello", "work"]);
    assert_eq!(types_of(&h.drain("w2").await), ["hello", "work"]);
    assert_eq!(types_of(&h.drain("auditor").await), ["hello"]);
}

async fn a_full_inbox_refuses_the_whole_send(h: Harness) {
    h.agent("pub", "worker").await;
    for agent in ["roomy", "full"] {
        h.agent(agent, "worker").await;
        h.hub.subscribe(NS, agent, "t").await.unwrap();
    }
    for _ in 0..5 {
        h.direct("pub", "full", "filler").await;
    }
    let error = h.hub.send(publish("pub", "t", "too much")).await.unwrap_err();
    assert!(matches!(&error, HubError::QueueFull { recipient, depth: 5 } if recipient == "full"), "{error}");
    assert!(h.drain("roomy").await.is_empty(), "nothing was queued for anyone");
    assert_eq!(h.drain("full").await.len(), 5);
    h.hub.send(publish("pub", "t", "fits now")).await.unwrap();
}

async fn idempotent_sends_queue_once(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let mut send = outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, "once");
    send.idempotency_key = Some("k1".into());
    let first = h.hub.send(send.clone()).await.unwrap();
    let again = h.hub.send(send.clone()).await.unwrap();
    assert!(again.duplicate);
    assert_eq!((again.message_id.as_str(), again.sequence), (first.message_id.as_str(), first.sequence));
    // Another message under the same key is refused, not dropped as a retry.
    let mut other = send;
    other.content.payload = b"twice?".to_vec();
    let error = h.hub.send(other).await.unwrap_err();
    let refused = matches!(&error, HubError::IdempotencyKeyInUse { key, message_id, mismatch }
        if key == "k1" && *message_id == first.message_id && mismatch == "has another payload");
    assert!(refused, "{error}");
    assert_eq!(h.drain("b").await.len(), 1);
}

/// The same message to other recipients under a used key is another send:
/// answered as the first one's duplicate, it would reach no one.
async fn a_used_key_names_its_recipients(h: Harness) {
    for agent in ["a", "b", "c"] {
        h.agent(agent, "worker").await;
    }
    h.agent("r", "reviewer").await;
    let keyed = |audience: Audience| {
        let mut send = outgoing("a", audience, MessageKind::Direct, "once");
        send.idempotency_key = Some("k1".into());
        send
    };
    let first = h.hub.send(keyed(Audience::Agent("b".into()))).await.unwrap();
    let other_recipient = |error: &HubError, first: &str| {
        matches!(error, HubError::IdempotencyKeyInUse { message_id, mismatch, .. }
            if message_id == first && mismatch == "went to other recipients")
    };
    let error = h.hub.send(keyed(Audience::Agent("c".into()))).await.unwrap_err();
    assert!(other_recipient(&error, &first.message_id), "{error}");
    let mut broadcast = Outgoing { kind: MessageKind::Broadcast, ..keyed(Audience::Everyone { agent_type: None }) };
    broadcast.idempotency_key = Some("k2".into());
    let everyone = h.hub.send(broadcast.clone()).await.unwrap();
    broadcast.audience = Audience::Everyone { agent_type: Some("reviewer".into()) };
    let error = h.hub.send(broadcast).await.unwrap_err();
    assert!(other_recipient(&error, &everyone.message_id), "{error}");
    assert_eq!(h.drain("c").await.len(), 1, "c has the broadcast only");
    assert_eq!(h.drain("b").await.len(), 2, "b has the first send and the broadcast");
}

async fn concurrent_sends_keep_keys_and_limits(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    h.agent("c", "worker").await;
    let keyed = (0..10).map(|_| {
        let hub = h.hub.clone();
        let mut send = outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, "once");
        send.idempotency_key = Some("same".into());
        tokio::spawn(async move { hub.send(send).await.expect("a keyed send succeeds").message_id })
    });
    let mut ids = Vec::new();
    for send in keyed {
        ids.push(send.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every concurrent send got the one message: {ids:?}");
    assert_eq!(h.drain("b").await.len(), 1);

    // Ten senders race for an inbox with room for five: the limit may be
    // passed by the sends in flight, never more, and nothing is lost.
    let racing = (0..10).map(|_| {
        let hub = h.hub.clone();
        tokio::spawn(
            async move { hub.send(outgoing("a", Audience::Agent("c".into()), MessageKind::Direct, "x")).await },
        )
    });
    let mut queued = 0;
    for send in racing {
        match send.await.unwrap() {
            Ok(_) => queued += 1,
            Err(HubError::QueueFull { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert!((5..=10).contains(&queued), "{queued} queued");
    let error = h.direct_result("a", "c").await.unwrap_err();
    assert!(matches!(error, HubError::QueueFull { .. }), "a full inbox refuses the next send: {error}");
    assert_eq!(h.drain("c").await.len(), queued, "every accepted send is in the inbox");
}

async fn topics_and_broadcasts_stay_in_their_namespace(h: Harness) {
    h.agent("pub", "worker").await;
    h.agent_in("other", "spy", "worker", &[]).await;
    h.hub.subscribe("other", "spy", "t").await.unwrap();
    let sent = h.hub.send(publish("pub", "t", "secret")).await.unwrap();
    assert_eq!(sent.recipients, 0);
    let all = h
        .hub
        .send(outgoing("pub", Audience::Everyone { agent_type: None }, MessageKind::Broadcast, "x"))
        .await
        .unwrap();
    assert_eq!(all.recipients, 0);
    let inbox = h
        .hub
        .receive(chorus_hub::service::Receive {
            namespace: "other".into(),
            agent_id: "spy".into(),
            filter: InboxFilter::default(),
            require_all: false,
            max: 10,
            max_bytes: usize::MAX,
            timeout: Duration::ZERO,
            ack_timeout: Duration::from_secs(1),
        })
        .await
        .unwrap();
    assert!(inbox.messages.is_empty());
    let error = h.hub.subscribe("other", "pub", "t").await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(_)), "{error}");
}

/// A publish that has read its recipients but not committed as one of them
/// unsubscribes lands first, and the unsubscribe drops it.
async fn a_send_in_flight_is_dropped_by_the_unsubscribe_that_follows(h: Harness) {
    h.agent("pub", "worker").await;
    h.agent("sub", "worker").await;
    h.hub.subscribe(NS, "sub", "t").await.unwrap();
    let hub = h.hub.clone();
    let leave = move || tokio::spawn(async move { hub.unsubscribe(NS, "sub", "t").await });
    send_while_leaving(&h, publish("pub", "t", "in flight"), leave).await;
    assert!(h.drain("sub").await.is_empty(), "nothing of the topic outlives the unsubscribe");
}

/// The same for a direct message and its recipient's deregistration: the
/// agent registered again gets nothing its first registration was sent.
async fn a_send_in_flight_is_dropped_by_the_deregistration_that_follows(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let hub = h.hub.clone();
    let leave = move || tokio::spawn(async move { hub.deregister_agent(NS, "b").await });
    send_while_leaving(&h, outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, "in flight"), leave).await;
    h.agent("b", "worker").await;
    assert!(h.drain("b").await.is_empty(), "nothing sent to the old registration");
}

/// Runs `send` and, while it is between reading its recipients and
/// committing, `leave`; returns once both are done.
async fn send_while_leaving(
    h: &Harness,
    mut send: Outgoing,
    leave: impl FnOnce() -> JoinHandle<chorus_hub::error::Result<()>>,
) {
    if h.db.backend() == Backend::Sqlite {
        // One writer: no send is in flight while an agent leaves.
        return;
    }
    // An open transaction holds a message under the send's idempotency key,
    // so the send, having read its recipients, waits at its insert.
    send.idempotency_key = Some("held".into());
    let mut holder = h.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO hub_messages (namespace, id, sequence, kind, sender, type, payload, content_type, sent_at, \
         expires_at, idempotency_key, recipients) VALUES ($1, 'holder', 0, 'direct', '', '', '', '', 0, 0, 'held', 0)",
    )
    .bind(NS)
    .execute(&mut *holder)
    .await
    .unwrap();
    let hub = h.hub.clone();
    let sending = tokio::spawn(async move { hub.send(send).await });
    until_waiting_for_locks(&h.db, 1, || false).await;
    let leaving = leave();
    until_waiting_for_locks(&h.db, 2, || leaving.is_finished()).await;
    holder.rollback().await.unwrap();
    sending.await.unwrap().expect("the send went first");
    leaving.await.unwrap().unwrap();
}
