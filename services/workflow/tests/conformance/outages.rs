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
    a_spawned_task_the_task_store_lost_is_made_again,
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

/// The task store's database was restored from before a step's task was
/// made: the engine that takes the run up again finds no such task, and
/// makes it again instead of failing the step.
async fn a_spawned_task_the_task_store_lost_is_made_again(h: Harness) {
    let (engine, stop) = h.spawn_engine(test_config());
    // No worker serves `nobody`: the task stays queued.
    let source = "name: lost\nsteps:\n- id: work\n  spawn: {agent: nobody, input: x}\n";
    engine.put(NS, source, "lost.yaml", "test").await.expect("a valid definition");
    let run = h.run("lost", serde_json::json!({})).await;
    let task_of = |run: &chorus_workflow::domain::Run| run.body.steps.first().and_then(|s| s.external_id.clone());
    let made = h.until(&run.id, "the step's task", |run| task_of(run).is_some()).await;
    let lost = task_of(&made).expect("a task");
    stop.cancel();
    drop(engine);
    let mut tx = h.db.begin().await.expect("a transaction");
    for table in ["taskstore_tasks", "taskstore_history", "taskstore_events"] {
        let column = if table == "taskstore_tasks" { "id" } else { "task_id" };
        let delete = format!("DELETE FROM {table} WHERE {column} = $1");
        sqlx::query(sqlx::AssertSqlSafe(delete)).bind(&lost).execute(&mut *tx).await.expect("the task is lost");
    }
    tx.commit().await.expect("the task store forgot the task");
    let (_engine, _stop) = h.spawn_engine(test_config());
    let again =
        h.until(&run.id, "the task to be made again", |run| task_of(run).is_some_and(|task| task != lost)).await;
    assert_eq!(again.state, RunState::Running, "{again:#?}");
    let step = &again.body.steps[0];
    assert_eq!((step.state, step.attempt, again.body.steps.len()), (StepState::Running, 1, 1), "the same attempt");
}
