//! Bad input to the hub of a running `chorus dev`, over gRPC: each request
//! gets a clear error, changes nothing, and the server keeps serving.

use std::time::Duration;

use chorus_proto::hub::{
    AckRequest, Agent, BroadcastRequest, Content, DelegateRequest, DeleteStateRequest, DiscoverRequest,
    GetAgentRequest, GetStateRequest, HeartbeatRequest, ListStateRequest, Message, PublishRequest, ReceiveRequest,
    RegisterAgentRequest, ReplyRequest, SendDirectRequest, SetStateRequest, StateConflict, StateEntry,
    StreamInboxRequest, SubscribeRequest, WatchStateRequest, hub_client::HubClient, message::Kind,
};
use chorus_tests::{
    DEADLINE, Sandbox, Server,
    status::{assert_invalid, assert_reason, detail},
};
use tonic::{Code, Status, transport::Channel};

type Client = HubClient<Channel>;

const NS: &str = "e2e";
const TOPIC: &str = "jobs";
/// The hub's default `max_payload_bytes`.
const MAX_PAYLOAD_BYTES: usize = 1 << 20;
const HUB: &str = "hub.chorus.dev";

async fn dev_server(sandbox: &Sandbox) -> Server {
    sandbox.dev().no_agents().start().await
}

fn content(payload: Vec<u8>) -> Option<Content> {
    Some(Content { r#type: "job".to_owned(), payload, content_type: "text/plain".to_owned() })
}

fn duration(duration: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration::try_from(duration).expect("a duration in range"))
}

fn registration(agent_id: &str) -> RegisterAgentRequest {
    RegisterAgentRequest {
        namespace: NS.to_owned(),
        agent_id: agent_id.to_owned(),
        agent_type: "worker".to_owned(),
        ..RegisterAgentRequest::default()
    }
}

async fn register(client: &mut Client, agent_id: &str) -> Agent {
    client.register_agent(registration(agent_id)).await.expect("register an agent").into_inner()
}

async fn subscribe(client: &mut Client, agent_id: &str) {
    let request = SubscribeRequest { namespace: NS.to_owned(), agent_id: agent_id.to_owned(), topic: TOPIC.to_owned() };
    client.subscribe(request).await.expect("subscribe");
}

fn direct(sender: &str, recipient: &str, payload: Vec<u8>) -> SendDirectRequest {
    SendDirectRequest {
        namespace: NS.to_owned(),
        sender: sender.to_owned(),
        recipient: recipient.to_owned(),
        content: content(payload),
        ..SendDirectRequest::default()
    }
}

fn publish(sender: &str, payload: Vec<u8>) -> PublishRequest {
    PublishRequest {
        namespace: NS.to_owned(),
        topic: TOPIC.to_owned(),
        sender: sender.to_owned(),
        content: content(payload),
        ..PublishRequest::default()
    }
}

fn broadcast(sender: &str) -> BroadcastRequest {
    BroadcastRequest {
        namespace: NS.to_owned(),
        sender: sender.to_owned(),
        content: content(b"all".to_vec()),
        ..BroadcastRequest::default()
    }
}

fn set_state(key: &str, value: &[u8], expected_version: Option<u64>) -> SetStateRequest {
    SetStateRequest {
        namespace: NS.to_owned(),
        key: key.to_owned(),
        value: value.to_vec(),
        expected_version,
        ..SetStateRequest::default()
    }
}

async fn get_state(client: &mut Client, key: &str) -> Result<StateEntry, Status> {
    let request = GetStateRequest { namespace: NS.to_owned(), key: key.to_owned() };
    client.get_state(request).await.map(tonic::Response::into_inner)
}

/// The ids of the namespace's registered agents.
async fn agent_ids(client: &mut Client) -> Vec<String> {
    let request = DiscoverRequest { namespace: NS.to_owned(), ..DiscoverRequest::default() };
    let agents = client.discover(request).await.expect("discover").into_inner().agents;
    agents.into_iter().map(|agent| agent.id).collect()
}

/// The namespace's live state keys.
async fn state_keys(client: &mut Client) -> Vec<String> {
    let request = ListStateRequest { namespace: NS.to_owned(), ..ListStateRequest::default() };
    let entries = client.list_state(request).await.expect("list state").into_inner().entries;
    entries.into_iter().map(|entry| entry.key).collect()
}

/// What `agent_id`'s inbox holds now (leased to this call).
async fn inbox(client: &mut Client, agent_id: &str) -> Vec<Message> {
    let request =
        ReceiveRequest { namespace: NS.to_owned(), agent_id: agent_id.to_owned(), ..ReceiveRequest::default() };
    client.receive(request).await.expect("receive").into_inner().messages
}

/// Asserts `outcome` failed with `code`, its message naming `named`.
#[track_caller]
fn assert_code<T: std::fmt::Debug>(outcome: Result<T, Status>, code: Code, named: &str) {
    let status = outcome.expect_err(&format!("must fail with {code:?}"));
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(named), "the message names {named}: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_malformed_fields_are_named_and_change_nothing() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.hub().await;
    register(&mut client, "coordinator").await;
    register(&mut client, "worker").await;
    subscribe(&mut client, "worker").await;

    let no_namespace = RegisterAgentRequest { namespace: String::new(), ..registration("other") };
    assert_invalid(client.register_agent(no_namespace).await, "namespace");
    let bad_namespace = RegisterAgentRequest { namespace: "Not A Namespace".to_owned(), ..registration("other") };
    assert_invalid(client.register_agent(bad_namespace).await, "namespace");
    let no_namespace = HeartbeatRequest { namespace: String::new(), agent_id: "worker".to_owned() };
    assert_invalid(client.heartbeat(no_namespace).await, "namespace");
    let no_namespace = SendDirectRequest { namespace: String::new(), ..direct("coordinator", "worker", b"1".into()) };
    assert_invalid(client.send_direct(no_namespace).await, "namespace");
    let no_namespace = PublishRequest { namespace: String::new(), ..publish("coordinator", b"1".into()) };
    assert_invalid(client.publish(no_namespace).await, "namespace");
    let no_namespace = BroadcastRequest { namespace: String::new(), ..broadcast("coordinator") };
    assert_invalid(client.broadcast(no_namespace).await, "namespace");
    let no_namespace = ReceiveRequest { agent_id: "worker".to_owned(), ..ReceiveRequest::default() };
    assert_invalid(client.receive(no_namespace).await, "namespace");
    let no_namespace = StreamInboxRequest {
        agent_id: "worker".to_owned(),
        consumer_id: "bad-input".to_owned(),
        ..StreamInboxRequest::default()
    };
    assert_invalid(client.stream_inbox(no_namespace).await, "namespace");
    let no_namespace =
        AckRequest { namespace: String::new(), agent_id: "worker".to_owned(), message_ids: vec!["m".to_owned()] };
    assert_invalid(client.ack(no_namespace).await, "namespace");
    let no_namespace = SetStateRequest { namespace: String::new(), ..set_state("config", b"{}", None) };
    assert_invalid(client.set_state(no_namespace).await, "namespace");
    assert_invalid(client.discover(DiscoverRequest::default()).await, "namespace");

    // Payloads over the limit, wherever they come.
    let oversize = vec![b'x'; MAX_PAYLOAD_BYTES + 1];
    assert_invalid(client.send_direct(direct("coordinator", "worker", oversize.clone())).await, "content.payload");
    assert_invalid(client.publish(publish("coordinator", oversize.clone())).await, "content.payload");
    let oversize_value = SetStateRequest { content_type: "text/plain".to_owned(), ..set_state("big", &oversize, None) };
    assert_invalid(client.set_state(oversize_value).await, "value");
    let huge = |key: &str| SetStateRequest { expected_version: Some(u64::MAX), ..set_state(key, b"{}", None) };
    assert_invalid(client.set_state(huge("config")).await, "expected_version");
    let watch = WatchStateRequest { namespace: NS.to_owned(), key: "config".to_owned(), after_version: u64::MAX };
    assert_invalid(client.watch_state(watch).await, "after_version");
    let unnamed = SetStateRequest { updated_by: "a\u{0}b".to_owned(), ..set_state("config", b"{}", None) };
    assert_invalid(client.set_state(unnamed).await, "updated_by");
    let retries = DelegateRequest {
        namespace: NS.to_owned(),
        sender: "coordinator".to_owned(),
        recipient: "worker".to_owned(),
        content: Some(Content { r#type: "job".to_owned(), ..Content::default() }),
        max_retries: 101,
        ..DelegateRequest::default()
    };
    assert_invalid(client.delegate(retries).await, "max_retries");

    // A payload labelled JSON (as one with no content type is) must be JSON.
    let json =
        |payload: &[u8]| Some(Content { r#type: "job".to_owned(), payload: payload.to_vec(), ..Content::default() });
    let not_json = SendDirectRequest { content: json(b"not json"), ..direct("coordinator", "worker", Vec::new()) };
    assert_invalid(client.send_direct(not_json).await, "content.payload");
    let not_json = PublishRequest { content: json(b"{"), ..publish("coordinator", Vec::new()) };
    assert_invalid(client.publish(not_json).await, "content.payload");

    // Durations past google.protobuf.Duration's range (10,000 years).
    let huge = Some(prost_types::Duration { seconds: i64::MAX, nanos: 999_999_999 });
    let confirmed = SendDirectRequest { confirm_timeout: huge, ..direct("coordinator", "worker", b"1".into()) };
    assert_invalid(client.send_direct(confirmed).await, "confirm_timeout");
    let receive = ReceiveRequest {
        namespace: NS.to_owned(),
        agent_id: "worker".to_owned(),
        timeout: huge,
        ..ReceiveRequest::default()
    };
    assert_invalid(client.receive(receive).await, "timeout");
    // A lease longer than a message may live (hub.max_ttl_ms, 7 days by default).
    let receive = ReceiveRequest {
        namespace: NS.to_owned(),
        agent_id: "worker".to_owned(),
        ack_timeout: duration(Duration::from_secs(8 * 24 * 3600)),
        ..ReceiveRequest::default()
    };
    assert_invalid(client.receive(receive).await, "ack_timeout");
    // A filter longer than a statement may hold.
    let receive = ReceiveRequest {
        namespace: NS.to_owned(),
        agent_id: "worker".to_owned(),
        senders: (0..=256).map(|n| format!("agent-{n}")).collect(),
        ..ReceiveRequest::default()
    };
    assert_invalid(client.receive(receive).await, "senders");

    // An agent card must be a JSON object; for a new agent and a known one.
    for card in ["[1]", "\"a card\"", "{", "not json"] {
        for agent_id in ["carded", "worker"] {
            let request = RegisterAgentRequest { agent_card_json: card.to_owned(), ..registration(agent_id) };
            assert_invalid(client.register_agent(request).await, "agent_card_json");
        }
    }
    // A value with no content type must be JSON.
    for value in [&b"not json"[..], b"{", b""] {
        assert_invalid(client.set_state(set_state("config", value, None)).await, "value");
    }

    assert_eq!(agent_ids(&mut client).await, ["coordinator", "worker"], "no refused registration added an agent");
    let request = GetAgentRequest { namespace: NS.to_owned(), agent_id: "worker".to_owned(), ..Default::default() };
    let worker = client.get_agent(request).await.expect("the worker").into_inner();
    assert_eq!(worker.agent_card_json, "", "no refused registration changed the worker's card");
    assert!(state_keys(&mut client).await.is_empty(), "no refused write set a key");
    assert!(inbox(&mut client, "worker").await.is_empty(), "no refused send queued a message");
    assert!(inbox(&mut client, "coordinator").await.is_empty(), "no refused send queued a message");

    // The largest payload allowed is accepted, and so is a value that is
    // not JSON under another content type.
    let largest = vec![b'x'; MAX_PAYLOAD_BYTES];
    let sent = client.send_direct(direct("coordinator", "worker", largest)).await.expect("the largest payload");
    assert_eq!(sent.into_inner().recipients, 1);
    let text = SetStateRequest { content_type: "text/plain".to_owned(), ..set_state("config", b"not json", None) };
    client.set_state(text).await.expect("a text value");
    assert_eq!(get_state(&mut client, "config").await.expect("the text value").value, b"not json");
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_agents_and_keys_are_not_found() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.hub().await;
    register(&mut client, "coordinator").await;

    let unknown = client.send_direct(direct("coordinator", "nobody", b"1".into())).await;
    let status = unknown.as_ref().expect_err("an unknown recipient");
    assert_eq!(assert_reason(status, HUB, "AGENT_NOT_FOUND")["agent_id"], "nobody");
    assert_code(unknown, Code::NotFound, "nobody");
    let delegate = DelegateRequest {
        namespace: NS.to_owned(),
        sender: "coordinator".to_owned(),
        recipient: "nobody".to_owned(),
        content: content(b"review".to_vec()),
        ..DelegateRequest::default()
    };
    assert_code(client.delegate(delegate).await, Code::NotFound, "nobody");
    let heartbeat = HeartbeatRequest { namespace: NS.to_owned(), agent_id: "nobody".to_owned() };
    assert_code(client.heartbeat(heartbeat).await, Code::NotFound, "nobody");
    let stream = StreamInboxRequest {
        namespace: NS.to_owned(),
        agent_id: "nobody".to_owned(),
        consumer_id: "bad-input".to_owned(),
        ..StreamInboxRequest::default()
    };
    assert_code(client.stream_inbox(stream).await, Code::NotFound, "nobody");
    let absent = get_state(&mut client, "absent").await;
    assert_eq!(assert_reason(absent.as_ref().expect_err("absent"), HUB, "KEY_NOT_FOUND")["key"], "absent");
    assert_code(absent, Code::NotFound, "absent");

    assert_eq!(agent_ids(&mut client).await, ["coordinator"], "no agent appeared");
    assert!(inbox(&mut client, "coordinator").await.is_empty(), "nothing came back to the sender");
    server.assert_serving().await;
}

/// Asserts a write was refused for a stale version, with a StateConflict
/// detail in `grpc-status-details-bin` giving both versions.
#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(outcome: Result<T, Status>, key: &str, expected: u64, actual: u64) {
    let status = outcome.expect_err(&format!("expecting version {expected} of {key} at {actual} must fail"));
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    let conflict: StateConflict = detail(&status, "chorus.hub.v1.StateConflict");
    let wanted = StateConflict { key: key.to_owned(), expected_version: expected, actual_version: actual };
    assert_eq!(conflict, wanted);
    let about = assert_reason(&status, HUB, "VERSION_CONFLICT");
    assert_eq!((about["key"].as_str(), about["actual_version"].parse::<u64>().unwrap()), (key, actual));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_expected_version_is_aborted_with_a_state_conflict() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.hub().await;

    let first = client.set_state(set_state("plan", b"{\"step\":1}", Some(0))).await.expect("create").into_inner();
    let second =
        client.set_state(set_state("plan", b"{\"step\":2}", Some(first.version))).await.expect("update").into_inner();
    assert!(second.version > first.version, "{first:?} then {second:?}");

    let stale = set_state("plan", b"{\"step\":3}", Some(first.version));
    assert_conflict(client.set_state(stale).await, "plan", first.version, second.version);
    // 0: only if absent.
    assert_conflict(client.set_state(set_state("plan", b"{}", Some(0))).await, "plan", 0, second.version);
    let delete = |expected_version| DeleteStateRequest {
        namespace: NS.to_owned(),
        key: "plan".to_owned(),
        expected_version,
        ..DeleteStateRequest::default()
    };
    assert_conflict(client.delete_state(delete(Some(first.version))).await, "plan", first.version, second.version);
    assert_eq!(get_state(&mut client, "plan").await.expect("the key"), second, "no refused write changed the key");

    // Deleted, the key is absent: its actual version is 0.
    let deleted = client.delete_state(delete(None)).await.expect("delete").into_inner();
    assert!(deleted.version > second.version, "a delete takes the next version: {deleted:?}");
    let stale = set_state("plan", b"{}", Some(second.version));
    assert_conflict(client.set_state(stale).await, "plan", second.version, 0);
    assert_code(get_state(&mut client, "plan").await, Code::NotFound, "plan");
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_from_another_agent_is_permission_denied() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.hub().await;
    for agent_id in ["coordinator", "worker", "intruder"] {
        register(&mut client, agent_id).await;
    }
    let request = DelegateRequest {
        namespace: NS.to_owned(),
        sender: "coordinator".to_owned(),
        recipient: "worker".to_owned(),
        content: content(b"review this".to_vec()),
        timeout: duration(DEADLINE),
        ..DelegateRequest::default()
    };
    let mut delegator = client.clone();
    let delegation = tokio::spawn(async move { delegator.delegate(request).await });

    let wait = ReceiveRequest {
        namespace: NS.to_owned(),
        agent_id: "worker".to_owned(),
        kinds: vec![Kind::Request.into()],
        timeout: duration(DEADLINE),
        ..ReceiveRequest::default()
    };
    let received = client.receive(wait).await.expect("receive the request").into_inner();
    let [request] = received.messages.as_slice() else { panic!("one request expected: {received:?}") };
    let reply = |sender: &str, correlation_id: &str, payload: &[u8]| ReplyRequest {
        namespace: NS.to_owned(),
        sender: sender.to_owned(),
        correlation_id: correlation_id.to_owned(),
        content: content(payload.to_vec()),
    };
    let correlation_id = request.correlation_id.as_str();
    for wrong in ["intruder", "coordinator"] {
        assert_code(client.reply(reply(wrong, correlation_id, b"forged")).await, Code::PermissionDenied, "worker");
    }
    assert_code(client.reply(reply("worker", "no-such-request", b"?")).await, Code::FailedPrecondition, "no-such");

    client.reply(reply("worker", correlation_id, b"reviewed")).await.expect("the worker's reply");
    let delegated = delegation.await.expect("the delegation task").expect("delegate").into_inner();
    let answer = delegated.reply.expect("a reply");
    assert_eq!((answer.sender.as_str(), answer.correlation_id.as_str()), ("worker", correlation_id));
    assert_eq!(answer.content.expect("content").payload, b"reviewed", "the refused replies changed nothing");
    // Answered: nobody waits any more.
    assert_code(
        client.reply(reply("worker", correlation_id, b"again")).await,
        Code::FailedPrecondition,
        correlation_id,
    );
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inbox_refuses_sends_and_queues_nothing() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().env("CHORUS_HUB__MAX_QUEUE_DEPTH", "3").start().await;
    let mut client = server.hub().await;
    for agent_id in ["coordinator", "full", "roomy"] {
        register(&mut client, agent_id).await;
    }
    subscribe(&mut client, "full").await;
    subscribe(&mut client, "roomy").await;
    for n in 1..=3 {
        client.send_direct(direct("coordinator", "full", vec![b'0' + n])).await.expect("room for three");
    }

    assert_code(client.send_direct(direct("coordinator", "full", b"4".into())).await, Code::ResourceExhausted, "full");
    // All or nothing: `roomy` has room, and gets nothing either.
    assert_code(client.publish(publish("coordinator", b"5".into())).await, Code::ResourceExhausted, "full");
    assert_code(client.broadcast(broadcast("coordinator")).await, Code::ResourceExhausted, "full");
    let delegate = DelegateRequest {
        namespace: NS.to_owned(),
        sender: "coordinator".to_owned(),
        recipient: "full".to_owned(),
        content: content(b"6".to_vec()),
        ..DelegateRequest::default()
    };
    assert_code(client.delegate(delegate).await, Code::ResourceExhausted, "full");

    let queued = inbox(&mut client, "full").await;
    let payloads: Vec<&[u8]> =
        queued.iter().map(|message| message.content.as_ref().expect("content").payload.as_slice()).collect();
    assert_eq!(payloads, [b"1", b"2", b"3"], "only the three sends that fit were queued");
    assert!(inbox(&mut client, "roomy").await.is_empty(), "a refused publish queued nothing for anyone");

    // Acked, they make room again.
    let message_ids = queued.into_iter().map(|message| message.id).collect();
    client.ack(AckRequest { namespace: NS.to_owned(), agent_id: "full".to_owned(), message_ids }).await.expect("ack");
    let sent = client.publish(publish("coordinator", b"7".into())).await.expect("room again").into_inner();
    assert_eq!(sent.recipients, 2, "{sent:?}");
    server.assert_serving().await;
}
