//! Request/response: correlation, wrong-id replies, timeout policies.

use std::time::Duration;

use chorus_hub::{
    domain::{Content, InboxFilter, MessageKind},
    error::HubError,
    service::{Delegation, TimeoutPolicy},
};

use crate::harness::{Harness, NS, conformance, content};

conformance!(
    a_delegation_returns_the_reply_with_its_correlation_id,
    a_reply_to_another_call_reaches_its_own_waiter_only,
    timeout_policies_raise_retry_and_fall_back,
    only_the_recipient_may_reply_and_only_while_the_call_waits,
    a_call_its_caller_abandons_is_closed,
    a_call_to_a_recipient_deregistered_meanwhile_ends_at_once,
);

fn delegation(recipient: &str, timeout: Duration, on_timeout: TimeoutPolicy) -> Delegation {
    Delegation {
        namespace: NS.into(),
        sender: "boss".into(),
        recipient: recipient.into(),
        content: content("review.request"),
        timeout,
        on_timeout,
    }
}

/// Waits for the next request in `agent`'s inbox; returns its correlation id.
async fn next_request(h: &Harness, agent: &str) -> String {
    let filter = InboxFilter { kinds: vec![MessageKind::Request], ..InboxFilter::default() };
    let got = h.receive(agent, filter, false, Duration::from_secs(5)).await;
    let request = got.messages.into_iter().next().expect("a request arrived");
    h.hub.ack(NS, agent, std::slice::from_ref(&request.id)).await.unwrap();
    request.correlation_id.expect("a request carries its correlation id")
}

fn answer(text: &str) -> Content {
    Content {
        message_type: "review.result".into(),
        payload: text.as_bytes().to_vec(),
        content_type: "text/plain".into(),
    }
}

async fn a_delegation_returns_the_reply_with_its_correlation_id(h: Harness) {
    h.agent("boss", "coordinator").await;
    h.agent("w1", "worker").await;
    let hub = h.hub.clone();
    let call =
        tokio::spawn(async move { hub.delegate(delegation("w1", Duration::from_secs(5), TimeoutPolicy::Raise)).await });
    let correlation_id = next_request(&h, "w1").await;
    h.hub.reply(NS, "w1", &correlation_id, answer("lgtm")).await.unwrap();
    let delegated = call.await.unwrap().unwrap();
    assert_eq!(delegated.correlation_id, correlation_id);
    let reply = delegated.reply.expect("a reply");
    assert_eq!(
        (reply.kind, reply.sender.as_str(), reply.content.payload.as_slice()),
        (MessageKind::Reply, "w1", &b"lgtm"[..])
    );
    assert_eq!(delegated.attempts, 1);
}

async fn a_reply_to_another_call_reaches_its_own_waiter_only(h: Harness) {
    h.agent("boss", "coordinator").await;
    h.agent("w1", "worker").await;
    let (hub_a, hub_b) = (h.hub.clone(), h.hub.clone());
    let call_a =
        tokio::spawn(
            async move { hub_a.delegate(delegation("w1", Duration::from_secs(5), TimeoutPolicy::Raise)).await },
        );
    let first = next_request(&h, "w1").await;
    let call_b =
        tokio::spawn(
            async move { hub_b.delegate(delegation("w1", Duration::from_secs(5), TimeoutPolicy::Raise)).await },
        );
    let second = next_request(&h, "w1").await;
    // Answer the second call first: the first keeps waiting for its own.
    h.hub.reply(NS, "w1", &second, answer("for b")).await.unwrap();
    let b = call_b.await.unwrap().unwrap();
    assert_eq!(b.reply.unwrap().content.payload, b"for b");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!call_a.is_finished(), "a reply with another correlation id ended the first call");
    h.hub.reply(NS, "w1", &first, answer("for a")).await.unwrap();
    let a = call_a.await.unwrap().unwrap();
    assert_eq!(
        (a.correlation_id.as_str(), a.reply.unwrap().content.payload.as_slice()),
        (first.as_str(), &b"for a"[..])
    );
}

async fn timeout_policies_raise_retry_and_fall_back(h: Harness) {
    h.agent("boss", "coordinator").await;
    h.agent("silent", "worker").await;
    let short = Duration::from_millis(100);
    let error = h.hub.delegate(delegation("silent", short, TimeoutPolicy::Raise)).await.unwrap_err();
    assert!(matches!(error, HubError::DelegationTimedOut { attempts: 1, .. }), "{error}");
    let fallback = h.hub.delegate(delegation("silent", short, TimeoutPolicy::Fallback)).await.unwrap();
    assert!(fallback.reply.is_none());
    let error = h.hub.delegate(delegation("silent", short, TimeoutPolicy::Retry { max_retries: 2 })).await.unwrap_err();
    assert!(matches!(error, HubError::DelegationTimedOut { attempts: 3, .. }), "{error}");
    // Every request of the ended calls was withdrawn from the inbox.
    assert!(h.drain("silent").await.is_empty());

    // A retry that gets its answer on the second attempt.
    let hub = h.hub.clone();
    let call = tokio::spawn(async move {
        hub.delegate(delegation("silent", Duration::from_millis(300), TimeoutPolicy::Retry { max_retries: 3 })).await
    });
    let filter = InboxFilter { kinds: vec![MessageKind::Request], ..InboxFilter::default() };
    let first = h.receive("silent", filter.clone(), false, Duration::from_secs(5)).await.messages;
    tokio::time::sleep(Duration::from_millis(350)).await;
    let correlation_id = first[0].correlation_id.clone().unwrap();
    h.hub.reply(NS, "silent", &correlation_id, answer("late but fine")).await.unwrap();
    let delegated = call.await.unwrap().unwrap();
    assert!(delegated.attempts >= 2, "{delegated:?}");
    assert_eq!(delegated.correlation_id, correlation_id, "retries keep the correlation id");
}

async fn only_the_recipient_may_reply_and_only_while_the_call_waits(h: Harness) {
    h.agent("boss", "coordinator").await;
    h.agent("w1", "worker").await;
    h.agent("w2", "worker").await;
    let hub = h.hub.clone();
    let call =
        tokio::spawn(async move { hub.delegate(delegation("w1", Duration::from_secs(5), TimeoutPolicy::Raise)).await });
    let correlation_id = next_request(&h, "w1").await;
    let error = h.hub.reply(NS, "w2", &correlation_id, answer("impostor")).await.unwrap_err();
    assert!(matches!(error, HubError::NotTheRecipient { .. }), "{error}");
    h.hub.reply(NS, "w1", &correlation_id, answer("real")).await.unwrap();
    assert_eq!(call.await.unwrap().unwrap().reply.unwrap().content.payload, b"real");
    let error = h.hub.reply(NS, "w1", &correlation_id, answer("twice")).await.unwrap_err();
    assert!(matches!(error, HubError::NoPendingRequest(_)), "{error}");
    let error = h.hub.reply(NS, "w1", "no-such-call", answer("x")).await.unwrap_err();
    assert!(matches!(error, HubError::NoPendingRequest(_)), "{error}");
    let error = h.hub.delegate(delegation("ghost", Duration::from_secs(1), TimeoutPolicy::Raise)).await.unwrap_err();
    assert!(matches!(error, HubError::AgentNotFound(_)), "{error}");
}

async fn a_call_its_caller_abandons_is_closed(h: Harness) {
    h.agent("boss", "coordinator").await;
    h.agent("w1", "worker").await;
    let hub = h.hub.clone();
    let call =
        tokio::spawn(
            async move { hub.delegate(delegation("w1", Duration::from_secs(60), TimeoutPolicy::Raise)).await },
        );
    let correlation_id = next_request(&h, "w1").await;
    // The caller hangs up (a gRPC client cancels, or its deadline passes):
    // the call's future is dropped mid-wait, and the call is closed for it.
    // A reply would land while the call is open, so it is tried once, after
    // the close (spawned as the call is dropped) has had ample time.
    call.abort();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let late = h.hub.reply(NS, "w1", &correlation_id, answer("too late")).await;
    assert!(matches!(late, Err(HubError::NoPendingRequest(_))), "the abandoned call is still open: {late:?}");
}

/// Deregistering drops the recipient's inbox, the request with it: the
/// call ends, whatever its policy, rather than waiting out its timeout.
async fn a_call_to_a_recipient_deregistered_meanwhile_ends_at_once(h: Harness) {
    h.agent("boss", "coordinator").await;
    h.agent("w1", "worker").await;
    let hub = h.hub.clone();
    let retry = TimeoutPolicy::Retry { max_retries: 3 };
    let call = tokio::spawn(async move { hub.delegate(delegation("w1", Duration::from_secs(60), retry)).await });
    next_request(&h, "w1").await;
    h.hub.deregister_agent(NS, "w1").await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), call).await.expect("the call ends soon").unwrap();
    assert!(matches!(&ended, Err(HubError::AgentNotFound(agent)) if agent == "w1"), "{ended:?}");
}
