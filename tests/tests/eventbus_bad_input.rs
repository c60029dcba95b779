//! Bad input to the event bus of a running `chorus dev`, over gRPC: each
//! request gets a clear error, changes nothing, and the server keeps
//! serving.

use chorus_proto::eventbus::{
    AckRequest, DeregisterHandlerRequest, ExtendDeliveryRequest, GetDeliveryRequest, GetHandlerRequest, Handler,
    HandlerCycle, ListDeliveriesRequest, ListHandlersRequest, NackRequest, NewEvent, PublishBatchRequest,
    PublishRequest, ReadEventsRequest, RegisterHandlerRequest, ReplayRequest, RetryPolicy, SubscribeRequest,
    event_bus_client::EventBusClient,
};
use chorus_tests::{
    Sandbox, Server,
    status::{assert_invalid, assert_reason, detail},
};
use tonic::{Code, Status, transport::Channel};

type Client = EventBusClient<Channel>;

const NS: &str = "e2e";
/// The bus's default `max_payload_bytes`.
const MAX_PAYLOAD_BYTES: usize = 1 << 20;
const BUS: &str = "eventbus.chorus.dev";

async fn dev_server(sandbox: &Sandbox) -> Server {
    sandbox.dev().no_agents().start().await
}

fn event(payload: Vec<u8>) -> NewEvent {
    NewEvent { r#type: "test.event".to_owned(), source: "bad-input".to_owned(), payload, ..NewEvent::default() }
}

/// A JSON string of `len` bytes, quotes included.
fn json_string(len: usize) -> Vec<u8> {
    format!("\"{}\"", "x".repeat(len - 2)).into_bytes()
}

fn registration(name: &str, after: &[&str]) -> RegisterHandlerRequest {
    RegisterHandlerRequest {
        namespace: NS.to_owned(),
        name: name.to_owned(),
        event_types: vec!["*".to_owned()],
        after: after.iter().map(|&name| name.to_owned()).collect(),
        start_after_sequence: Some(0),
        ..RegisterHandlerRequest::default()
    }
}

async fn register(client: &mut Client, name: &str, after: &[&str]) -> Handler {
    client.register_handler(registration(name, after)).await.expect("register a handler").into_inner()
}

async fn get_handler(client: &mut Client, name: &str) -> Result<Handler, Status> {
    let request = GetHandlerRequest { namespace: NS.to_owned(), name: name.to_owned() };
    client.get_handler(request).await.map(tonic::Response::into_inner)
}

/// Every handler of the namespace, as listed.
async fn handlers(client: &mut Client) -> Vec<Handler> {
    let request = ListHandlersRequest { namespace: NS.to_owned(), ..ListHandlersRequest::default() };
    client.list_handlers(request).await.expect("list handlers").into_inner().handlers
}

/// The namespace's latest sequence: 0 while nothing was published.
async fn head(client: &mut Client) -> u64 {
    let request = ReadEventsRequest { namespace: NS.to_owned(), ..ReadEventsRequest::default() };
    client.read_events(request).await.expect("read events").into_inner().head_sequence
}

async fn delivery_count(client: &mut Client) -> usize {
    let request = ListDeliveriesRequest { namespace: NS.to_owned(), ..ListDeliveriesRequest::default() };
    client.list_deliveries(request).await.expect("list deliveries").into_inner().deliveries.len()
}

fn subscription(handler: &str) -> SubscribeRequest {
    SubscribeRequest {
        namespace: NS.to_owned(),
        handler: handler.to_owned(),
        consumer_id: "bad-input".to_owned(),
        ..SubscribeRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_malformed_fields_are_named_and_change_nothing() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.event_bus().await;
    let audit = register(&mut client, "audit", &[]).await;

    let publish = |namespace: &str, payload: Vec<u8>| PublishRequest {
        namespace: namespace.to_owned(),
        event: Some(event(payload)),
    };
    assert_invalid(client.publish(publish("", b"{}".to_vec())).await, "namespace");
    assert_invalid(client.publish(publish("Not A Namespace", b"{}".to_vec())).await, "namespace");
    let no_namespace = RegisterHandlerRequest { namespace: String::new(), ..registration("other", &[]) };
    assert_invalid(client.register_handler(no_namespace).await, "namespace");
    let no_namespace = GetHandlerRequest { namespace: String::new(), name: "audit".to_owned() };
    assert_invalid(client.get_handler(no_namespace).await, "namespace");
    let no_namespace = SubscribeRequest { namespace: String::new(), ..subscription("audit") };
    assert_invalid(client.subscribe(no_namespace).await, "namespace");
    let no_namespace = AckRequest { namespace: String::new(), delivery_ids: vec!["1:audit".to_owned()] };
    assert_invalid(client.ack(no_namespace).await, "namespace");

    let oversize = vec![b'x'; MAX_PAYLOAD_BYTES + 1];
    assert_invalid(client.publish(publish(NS, oversize.clone())).await, "event.payload");
    // A payload labelled JSON (the default) must be JSON.
    assert_invalid(client.publish(publish(NS, b"not json".to_vec())).await, "event.payload");
    let batch = PublishBatchRequest { namespace: NS.to_owned(), events: vec![event(b"1".to_vec()), event(oversize)] };
    assert_invalid(client.publish_batch(batch).await, "events[1].payload");

    let get = |delivery_id: &str| GetDeliveryRequest { namespace: NS.to_owned(), delivery_id: delivery_id.to_owned() };
    for malformed in ["garbage", "7", "0:audit", "-1:audit", "x:audit", "7:", "7:not a handler"] {
        assert_invalid(client.get_delivery(get(malformed)).await, "delivery_id");
    }
    let ack = AckRequest { namespace: NS.to_owned(), delivery_ids: vec!["1:audit".to_owned(), "garbage".to_owned()] };
    assert_invalid(client.ack(ack).await, "delivery_ids[1]");
    let nack = NackRequest { namespace: NS.to_owned(), delivery_id: "garbage".to_owned(), ..NackRequest::default() };
    assert_invalid(client.nack(nack).await, "delivery_id");
    let extend =
        ExtendDeliveryRequest { namespace: NS.to_owned(), delivery_id: "7".to_owned(), extension: None, attempt: 0 };
    assert_invalid(client.extend_delivery(extend).await, "delivery_id");

    // Leases past google.protobuf.Duration's range (10,000 years), and
    // longer than a day (a consumer that needs longer extends).
    let huge = prost_types::Duration { seconds: i64::MAX, nanos: 999_999_999 };
    let day_and_more = prost_types::Duration { seconds: 25 * 3600, nanos: 0 };
    for (name, lease) in [("forever", huge), ("long", day_and_more)] {
        let mut handler = registration(name, &[]);
        handler.retry_policy = Some(RetryPolicy { visibility_timeout: Some(lease), ..RetryPolicy::default() });
        assert_invalid(client.register_handler(handler).await, "retry_policy.visibility_timeout");
        let extend = ExtendDeliveryRequest {
            namespace: NS.to_owned(),
            delivery_id: "1:audit".to_owned(),
            extension: Some(lease),
            attempt: 1,
        };
        assert_invalid(client.extend_delivery(extend).await, "extension");
    }
    // A filter longer than a statement may hold.
    let read = ReadEventsRequest {
        namespace: NS.to_owned(),
        event_types: (0..=256).map(|n| format!("type.{n}")).collect(),
        ..ReadEventsRequest::default()
    };
    assert_invalid(client.read_events(read).await, "event_types");

    let ahead = RegisterHandlerRequest { start_after_sequence: Some(1), ..registration("ahead", &[]) };
    assert_invalid(client.register_handler(ahead).await, "start_after_sequence");

    assert_eq!(head(&mut client).await, 0, "no refused publish appended an event");
    assert_eq!(delivery_count(&mut client).await, 0, "no refused publish created a delivery");
    assert_eq!(handlers(&mut client).await, [audit], "no refused registration changed the handlers");
    // The largest payload allowed is accepted, and takes the first sequence.
    let largest = json_string(MAX_PAYLOAD_BYTES);
    let largest = client.publish(publish(NS, largest)).await.expect("the largest payload");
    assert_eq!(largest.into_inner().sequence, 1);
    server.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_handlers_and_deliveries_are_not_found() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.event_bus().await;

    let status = get_handler(&mut client, "nobody").await.expect_err("an unknown handler");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("nobody"), "the message names the handler: {status:?}");
    assert_eq!(assert_reason(&status, BUS, "HANDLER_NOT_FOUND")["handler"], "nobody");
    let status = client.subscribe(subscription("nobody")).await.expect_err("subscribing to an unknown handler");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let deregister = DeregisterHandlerRequest { namespace: NS.to_owned(), name: "nobody".to_owned() };
    assert_eq!(client.deregister_handler(deregister).await.expect_err("unknown").code(), Code::NotFound);
    let replay = ReplayRequest { namespace: NS.to_owned(), handler: "nobody".to_owned(), ..ReplayRequest::default() };
    assert_eq!(client.replay(replay).await.expect_err("unknown").code(), Code::NotFound);

    let get = GetDeliveryRequest { namespace: NS.to_owned(), delivery_id: "1:nobody".to_owned() };
    let status = client.get_delivery(get).await.expect_err("an unknown delivery");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("1:nobody"), "the message names the delivery: {status:?}");
    assert_eq!(assert_reason(&status, BUS, "DELIVERY_NOT_FOUND")["delivery_id"], "1:nobody");
    let ack = AckRequest { namespace: NS.to_owned(), delivery_ids: vec!["1:nobody".to_owned()] };
    assert_eq!(client.ack(ack).await.expect_err("an unknown delivery").code(), Code::NotFound);

    assert!(handlers(&mut client).await.is_empty(), "no handler appeared");
    server.assert_serving().await;
}

/// Asserts a registration was refused for closing `cycle`, with the path in
/// the message and as a HandlerCycle detail in `grpc-status-details-bin`.
#[track_caller]
fn assert_cycle(outcome: Result<tonic::Response<Handler>, Status>, cycle: &[&str]) {
    let status = outcome.expect_err(&format!("the cycle {cycle:?} must be refused"));
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains(&cycle.join(" -> ")), "the message shows the cycle: {status:?}");
    let detail: HandlerCycle = detail(&status, "chorus.eventbus.v1.HandlerCycle");
    assert_eq!(detail.path, cycle);
    assert_eq!(assert_reason(&status, BUS, "HANDLER_CYCLE")["handler"], cycle[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_is_refused_with_its_path_and_changes_nothing() {
    let sandbox = Sandbox::new();
    let server = dev_server(&sandbox).await;
    let mut client = server.event_bus().await;
    register(&mut client, "a", &[]).await;
    register(&mut client, "b", &["a"]).await;
    let before = handlers(&mut client).await;

    // `a` after `b`, which is after `a`.
    assert_cycle(client.register_handler(registration("a", &["b"])).await, &["a", "b", "a"]);
    // A new handler after itself.
    assert_cycle(client.register_handler(registration("c", &["c"])).await, &["c", "c"]);

    assert_eq!(handlers(&mut client).await, before, "a refused registration changes no handler");
    // A dependency named twice is one dependency.
    let twice = register(&mut client, "d", &["b", "a", "b"]).await;
    assert_eq!(twice.after, ["b", "a"]);
    let status = get_handler(&mut client, "c").await.expect_err("a refused handler is not registered");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    server.assert_serving().await;
}
