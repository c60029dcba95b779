//! The task store's changes reach the event bus: `chorus dev` publishes
//! every change of a task once, and a handler can trigger on them.

use chorus_proto::eventbus::{
    AckRequest, ReadEventsRequest, RegisterHandlerRequest, SubscribeRequest, event_bus_client::EventBusClient,
};
use chorus_tests::{DEADLINE, Sandbox, tasks::create_task, test_worker};
use tokio_stream::StreamExt as _;

const NS: &str = "outbox";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_task_triggers_a_handler_and_every_change_is_logged_once() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut bus = EventBusClient::new(server.channel().await);
    bus.register_handler(RegisterHandlerRequest {
        namespace: NS.into(),
        name: "on-completed".into(),
        event_types: vec!["task.completed".into()],
        ..Default::default()
    })
    .await
    .expect("register a handler");
    let mut deliveries = bus
        .subscribe(SubscribeRequest {
            namespace: NS.into(),
            handler: "on-completed".into(),
            consumer_id: "test".into(),
            ..Default::default()
        })
        .await
        .expect("subscribe")
        .into_inner();

    let _worker = test_worker!(sandbox, server.url()).agent("reverser").namespace(NS).start().await;
    let mut tasks = server.task_store().await;
    let task = create_task(&mut tasks, NS, "reverser", "hello bus").await;

    let delivery = tokio::time::timeout(DEADLINE, deliveries.next())
        .await
        .expect("the completion reached the handler in time")
        .expect("the stream is open")
        .expect("a delivery");
    let event = delivery.event.clone().expect("the delivery carries its event");
    assert_eq!((event.r#type.as_str(), event.subject.as_str()), ("task.completed", task.id.as_str()));
    let payload: serde_json::Value = serde_json::from_slice(&event.payload).expect("a JSON payload");
    assert_eq!(payload["status"]["state"], "completed");
    bus.ack(AckRequest { namespace: NS.into(), delivery_ids: vec![delivery.id] }).await.expect("ack");

    let log = bus
        .read_events(ReadEventsRequest { namespace: NS.into(), page_size: 100, ..Default::default() })
        .await
        .expect("read the log")
        .into_inner();
    let types: Vec<&str> = log.events.iter().map(|event| event.r#type.as_str()).collect();
    assert_eq!(
        types,
        ["task.created", "task.status_changed", "task.artifact_updated", "task.status_changed", "task.completed"],
        "each change once, in order"
    );
    assert!(log.events.iter().all(|event| event.subject == task.id && event.source == "taskstore"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_too_large_for_the_bus_goes_without_its_content_and_holds_up_nothing() {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    let mut bus = EventBusClient::new(server.channel().await);
    let mut tasks = server.task_store().await;
    // Larger than the bus takes (1 MiB), smaller than a request (4 MiB).
    let big = create_task(&mut tasks, NS, "archive", &"b".repeat(1_200_000)).await;
    let small = create_task(&mut tasks, NS, "archive", "after it").await;

    let deadline = tokio::time::Instant::now() + DEADLINE;
    let log = loop {
        let request = ReadEventsRequest { namespace: NS.into(), page_size: 100, ..Default::default() };
        let log = bus.read_events(request).await.expect("read the log").into_inner();
        if log.events.len() >= 2 || tokio::time::Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let subjects: Vec<&str> = log.events.iter().map(|event| event.subject.as_str()).collect();
    assert_eq!(subjects, [big.id.as_str(), small.id.as_str()], "both changes, in order");
    let payload: serde_json::Value = serde_json::from_slice(&log.events[0].payload).expect("a JSON payload");
    assert_eq!(
        (&payload["content_omitted"], &payload["message"]),
        (&serde_json::json!(true), &serde_json::Value::Null)
    );
    let payload: serde_json::Value = serde_json::from_slice(&log.events[1].payload).expect("a JSON payload");
    assert_eq!(payload["message"]["parts"][0]["content"]["text"], "after it", "a change that fits is whole");
}
