//! Chorus's own services out of reach: a step that calls one waits until it
//! answers again, rather than failing its run. A workflow service that stops
//! ends its watches at once, saying so.

use std::time::Duration;

use chorus_workflow::{
    domain::{RunState, StepState},
    error::WorkflowError,
    service::StartCall,
};
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::harness::{Harness, NS, test_config};

chorus_runtime::backend_suite!(crate::harness::Harness::bare;
    a_message_step_waits_out_a_hub_that_does_not_answer_yet,
    a_stopping_service_ends_its_watches_at_once,
);

async fn a_message_step_waits_out_a_hub_that_does_not_answer_yet(h: Harness) {
    let mut watcher = h.watcher("news").await;
    let reserved = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hub_at = reserved.local_addr().expect("address");
    drop(reserved);
    let workflows = h.spawn_engine_with_hub(hub_at);
    let source = "name: tell\nsteps:\n- id: post\n  message: {topic: news, text: hello}\n";
    workflows.put(NS, source, "tell.yaml", "test").await.expect("a valid definition");
    let call = StartCall { namespace: NS.into(), workflow: "tell".into(), ..StartCall::default() };
    let run = workflows.start_run(call).await.expect("the run starts");

    tokio::time::sleep(Duration::from_millis(700)).await;
    let waiting = workflows.get_run(NS, &run.id).await.expect("the run");
    assert_eq!(waiting.state, RunState::Running, "the hub's outage is waited out: {waiting:#?}");
    assert_eq!(waiting.body.steps[0].state, StepState::Running, "{waiting:#?}");
    h.serve_hub(tokio::net::TcpListener::bind(hub_at).await.expect("the hub's address is free again"));
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    assert_eq!(watcher.texts().await, ["hello"], "sent once");
}

async fn a_stopping_service_ends_its_watches_at_once(h: Harness) {
    let shutdown = CancellationToken::new();
    let workflows = h.with_config(test_config()).with_shutdown(shutdown.clone());
    h.put("name: later\nsteps:\n- id: nap\n  wait: {duration: 1h}\n").await;
    let run = h.run("later", serde_json::json!({})).await;
    let mut watch = Box::pin(workflows.watch_run(NS, &run.id, 0).await.expect("watch"));
    watch.next().await.expect("the run's first event").expect("an event");
    shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        let mut last = None;
        while let Some(item) = watch.next().await {
            last = Some(item);
        }
        last
    });
    let last = ended.await.expect("the watch ends at once, not with the process's grace period");
    assert!(matches!(last, Some(Err(WorkflowError::ShuttingDown))), "it says why: {last:?}");
}
