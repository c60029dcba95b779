//! Direct messages: receive filters, require_all, timeouts, acks,
//! redelivery, confirmation, streams.

use std::time::Duration;

use chorus_hub::{
    domain::{Audience, InboxFilter, MessageKind},
    error::HubError,
    repository::{HubRepository as _, sql::SqlHubRepository},
    service::{Inbox, Receive},
};
use futures_util::StreamExt as _;

use crate::harness::{Harness, NS, conformance, outgoing, senders, types_of};

conformance!(
    an_unknown_recipient_is_an_error_not_a_drop,
    receive_filters_by_sender_and_type_and_a_timeout_consumes_nothing,
    require_all_waits_for_every_sender_and_loses_nothing_on_timeout,
    an_unacked_message_is_handed_out_again,
    an_ack_of_a_message_that_expired_says_it_was_not_there,
    large_messages_come_in_several_receives_none_left_hidden,
    delivery_confirmation_waits_for_the_ack,
    an_inbox_stream_resumes_from_its_cursor,
    direct_messages_stay_in_their_namespace,
    a_receive_cut_short_by_shutdown_says_so_rather_than_timed_out,
    an_inbox_stream_cut_short_by_shutdown_ends_unavailable,
    the_inbox_depth_counts_what_waits_unacked_and_unexpired,
);

async fn an_unknown_recipient_is_an_error_not_a_drop(h: Harness) {
    h.agent("a", "worker").await;
    let error = h.hub.send(outgoing("a", Audience::Agent("ghost".into()), MessageKind::Direct, "x")).await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(ref id) if id == "ghost"), "{error}");
}

async fn receive_filters_by_sender_and_type_and_a_timeout_consumes_nothing(h: Harness) {
    for agent in ["me", "alice", "bob"] {
        h.agent(agent, "worker").await;
    }
    h.direct("alice", "me", "note").await;
    h.direct("bob", "me", "note").await;
    h.direct("alice", "me", "report").await;
    let typed = InboxFilter { types: vec!["report".into()], ..InboxFilter::default() };
    let got = h.receive("me", typed, false, Duration::ZERO).await;
    assert_eq!(types_of(&got.messages), ["report"]);
    let from_bob = h.receive("me", senders(&["bob"]), false, Duration::ZERO).await;
    assert_eq!(from_bob.messages[0].sender, "bob");
    // Nothing from carol: the wait times out and takes nothing.
    let nothing = h.receive("me", senders(&["carol"]), false, Duration::from_millis(100)).await;
    assert!(nothing.timed_out && nothing.messages.is_empty());
    let rest = h.drain("me").await;
    assert_eq!(rest.len(), 1, "alice's note is still there: {rest:?}");
    assert_eq!((rest[0].sender.as_str(), rest[0].content.message_type.as_str()), ("alice", "note"));
}

async fn require_all_waits_for_every_sender_and_loses_nothing_on_timeout(h: Harness) {
    for agent in ["boss", "w1", "w2", "w3"] {
        h.agent(agent, "worker").await;
    }
    h.direct("w1", "boss", "result").await;
    h.direct("w2", "boss", "result").await;
    let partial = h.receive("boss", senders(&["w1", "w2", "w3"]), true, Duration::from_millis(150)).await;
    assert!(partial.timed_out);
    assert!(partial.messages.is_empty(), "require_all returns nothing until everyone sent");
    assert_eq!(partial.missing_senders, ["w3"]);

    // w3 sends while a receive waits: it returns with one from each.
    let hub = h.hub.clone();
    let waiting = tokio::spawn(async move {
        hub.receive(Receive {
            namespace: NS.into(),
            agent_id: "boss".into(),
            filter: senders(&["w1", "w2", "w3"]),
            require_all: true,
            max: 100,
            max_bytes: usize::MAX,
            timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(5),
        })
        .await
        .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.direct("w3", "boss", "result").await;
    let all = waiting.await.unwrap();
    assert!(!all.timed_out);
    let mut from: Vec<&str> = all.messages.iter().map(|m| m.sender.as_str()).collect();
    from.sort_unstable();
    assert_eq!(from, ["w1", "w2", "w3"]);
}

/// A receive takes no more than one answer can carry: the rest stay queued
/// for the next receive rather than leased to an answer that drops them.
async fn large_messages_come_in_several_receives_none_left_hidden(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    for n in 0..5 {
        let mut message = outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, &format!("big-{n}"));
        message.content.payload = vec![b'x'; 300_000];
        h.hub.send(message).await.unwrap();
    }
    let receive = |max_bytes| Receive {
        namespace: NS.into(),
        agent_id: "b".into(),
        filter: InboxFilter::default(),
        require_all: false,
        max: 100,
        max_bytes,
        timeout: Duration::ZERO,
        ack_timeout: Duration::from_secs(60),
    };
    let first = h.hub.receive(receive(1_000_000)).await.unwrap();
    assert_eq!(types_of(&first.messages), ["big-0", "big-1", "big-2"]);
    let second = h.hub.receive(receive(1_000_000)).await.unwrap();
    assert_eq!(types_of(&second.messages), ["big-3", "big-4"], "the rest were left for this receive");
    assert!(h.hub.receive(receive(1)).await.unwrap().messages.is_empty(), "all five are leased");
}

async fn an_unacked_message_is_handed_out_again(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    h.direct("a", "b", "job").await;
    let first = h
        .hub
        .receive(Receive {
            namespace: NS.into(),
            agent_id: "b".into(),
            filter: InboxFilter::default(),
            require_all: false,
            max: 10,
            max_bytes: usize::MAX,
            timeout: Duration::ZERO,
            ack_timeout: Duration::from_millis(100),
        })
        .await
        .unwrap();
    assert_eq!(first.messages[0].attempt, 1);
    assert!(h.receive("b", InboxFilter::default(), false, Duration::ZERO).await.messages.is_empty(), "leased");
    let again = h.receive("b", InboxFilter::default(), false, Duration::from_secs(3)).await;
    assert_eq!((again.messages[0].id.as_str(), again.messages[0].attempt), (first.messages[0].id.as_str(), 2));
    let unknown = h.hub.ack(NS, "b", &[again.messages[0].id.clone(), "nope".into()]).await.unwrap();
    assert_eq!(unknown, ["nope"]);
    assert!(h.drain("b").await.is_empty());
}

async fn delivery_confirmation_waits_for_the_ack(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let send = outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, "ping");
    let (_, confirmed) = h.hub.send_confirmed(send.clone(), Duration::from_millis(100)).await.unwrap();
    assert!(!confirmed, "nobody acked");
    let hub = h.hub.clone();
    let confirming = tokio::spawn(async move { hub.send_confirmed(send, Duration::from_secs(5)).await.unwrap() });
    let messages = loop {
        let got = h.receive("b", InboxFilter::default(), false, Duration::from_secs(1)).await.messages;
        if got.len() == 2 {
            break got;
        }
    };
    h.hub.ack(NS, "b", &messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>()).await.unwrap();
    let (_, confirmed) = confirming.await.unwrap();
    assert!(confirmed);
}

async fn an_inbox_stream_resumes_from_its_cursor(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    let inbox = |after| Inbox {
        namespace: NS.into(),
        agent_id: "b".into(),
        consumer_id: "b-1".into(),
        filter: InboxFilter::default(),
        ack_timeout: Duration::from_secs(30),
        max_in_flight: 10,
        after,
    };
    let mut stream = h.hub.stream_inbox(inbox(None)).await.unwrap();
    for n in 0..3 {
        h.direct("a", "b", &format!("m{n}")).await;
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap());
    }
    assert_eq!(types_of(&seen), ["m0", "m1", "m2"]);
    h.hub.ack(NS, "b", &[seen[0].id.clone()]).await.unwrap();
    drop(stream);
    // It had received up to m1: m2 comes again at once, m0 (acked) never.
    let mut stream = h.hub.stream_inbox(inbox(Some(seen[1].sequence))).await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(again.content.message_type, "m2");
    let error = h.hub.stream_inbox(Inbox { agent_id: "ghost".into(), ..inbox(None) }).await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(_)), "{error}");
}

async fn direct_messages_stay_in_their_namespace(h: Harness) {
    h.agent("a", "worker").await;
    h.agent_in("other", "b", "worker", &[]).await;
    let error = h.hub.send(outgoing("a", Audience::Agent("b".into()), MessageKind::Direct, "x")).await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(_)), "{error}");
    h.agent("b", "worker").await;
    let sent = h.direct("a", "b", "x").await;
    let unknown = h.hub.ack("other", "b", std::slice::from_ref(&sent.message_id)).await.unwrap();
    assert_eq!(unknown, [sent.message_id], "another namespace cannot ack it");
    assert_eq!(h.drain("b").await.len(), 1);
}

/// A wait the hub's shutdown ends is UNAVAILABLE (call again), not a
/// `timed_out` answer claiming the timeout passed.
async fn a_receive_cut_short_by_shutdown_says_so_rather_than_timed_out(h: Harness) {
    h.agent("me", "worker").await;
    let hub = h.hub.clone();
    let receive = Receive {
        namespace: NS.into(),
        agent_id: "me".into(),
        filter: InboxFilter::default(),
        require_all: false,
        max: 10,
        max_bytes: usize::MAX,
        timeout: Duration::from_secs(30),
        ack_timeout: Duration::from_secs(2),
    };
    let waiting = tokio::spawn(async move { hub.receive(receive).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.shutdown.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("ended by the shutdown").unwrap();
    assert!(matches!(outcome, Err(HubError::ShuttingDown)), "{outcome:?}");
}

/// An inbox stream that the hub's shutdown ends says so (UNAVAILABLE): its
/// consumer opens it again rather than take the end for the last of it.
async fn an_inbox_stream_cut_short_by_shutdown_ends_unavailable(h: Harness) {
    h.agent("me", "worker").await;
    let inbox = Inbox {
        namespace: NS.into(),
        agent_id: "me".into(),
        consumer_id: "me-1".into(),
        filter: InboxFilter::default(),
        ack_timeout: Duration::from_secs(30),
        max_in_flight: 10,
        after: None,
    };
    let stream = h.hub.stream_inbox(inbox).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.shutdown.cancel();
    let ended: Vec<_> = tokio::time::timeout(Duration::from_secs(10), stream.collect()).await.expect("ended");
    assert!(matches!(ended.as_slice(), [Err(HubError::ShuttingDown)]), "{ended:?}");
}

/// A message past its TTL is no longer in the inbox, reaped yet or not: an
/// ack of it reports it unknown (and it goes).
async fn an_ack_of_a_message_that_expired_says_it_was_not_there(h: Harness) {
    h.agent("a", "worker").await;
    h.agent("b", "worker").await;
    h.direct("a", "b", "job").await;
    let received = h.receive("b", InboxFilter::default(), false, Duration::ZERO).await;
    let id = received.messages[0].id.clone();
    let repository = SqlHubRepository::new(h.db.clone());
    let after_its_ttl = received.messages[0].expires_at + 1;
    let unknown = repository.ack(NS, "b", std::slice::from_ref(&id), after_its_ttl).await.unwrap();
    assert_eq!(unknown, std::slice::from_ref(&id));
    assert_eq!(h.hub.ack(NS, "b", std::slice::from_ref(&id)).await.unwrap(), [id], "and it went");
}

async fn the_inbox_depth_counts_what_waits_unacked_and_unexpired(h: Harness) {
    for agent in ["a", "b", "c"] {
        h.agent(agent, "worker").await;
    }
    let repository = SqlHubRepository::new(h.db.clone());
    let now = chorus_runtime::time::now_micros();
    assert_eq!(repository.inbox_depth(now).await.unwrap(), 0);
    h.direct("a", "b", "job").await;
    h.direct("a", "c", "job").await;
    h.direct("a", "c", "job").await;
    assert_eq!(repository.inbox_depth(now).await.unwrap(), 3, "every inbox counts");
    h.drain("c").await;
    assert_eq!(repository.inbox_depth(now).await.unwrap(), 1, "acked messages do not");
    let expiry = h.receive("b", InboxFilter::default(), false, Duration::ZERO).await.messages[0].expires_at;
    assert_eq!(repository.inbox_depth(now).await.unwrap(), 1, "one handed out and not acked yet counts");
    assert_eq!(repository.inbox_depth(expiry + 1).await.unwrap(), 0, "an expired one does not");
}
