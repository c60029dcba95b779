//! Event triggers as definitions change: an event is judged by the versions
//! put before it was published, however late its reader gets to it. Each
//! test starts its engine on a service of its own, as another replica's: a
//! put here does not wake it.

use std::time::Duration;

use chorus_proto::eventbus::{NewEvent, PublishRequest, event_bus_client::EventBusClient};
use chorus_workflow::domain::RunFilter;
use serde_json::json;

use crate::harness::{Harness, NS, test_config};

chorus_runtime::backend_suite!(crate::harness::Harness::bare;
    an_event_is_judged_by_the_versions_put_before_it_was_published,
    events_read_late_are_judged_by_the_versions_of_their_time,
    an_event_only_a_new_version_listens_to_is_not_passed_over,
    a_bus_log_that_started_over_is_judged_from_its_start,
    a_bus_log_that_started_over_and_grew_past_the_cursor_while_no_engine_read_is_judged_from_its_start,
    an_event_a_message_step_publishes_starts_the_workflow_it_triggers_once,
);

/// A workflow started by `event_type` events of `team`.
fn listening(name: &str, event_type: &str, team: &str) -> String {
    format!(
        "name: {name}\ntrigger: {{event: {event_type}, filter: {{team: {team}}}}}\nsteps:\n- id: note\n  condition: \"true\"\n"
    )
}

/// Publishes an event of `team`; its sequence.
async fn publish(h: &Harness, event_type: &str, team: &str) -> u64 {
    let mut bus = EventBusClient::connect(h.url()).await.expect("bus");
    let event = NewEvent {
        r#type: event_type.into(),
        source: "test".into(),
        payload: json!({ "team": team }).to_string().into_bytes(),
        ..Default::default()
    };
    let published = bus.publish(PublishRequest { namespace: NS.into(), event: Some(event) }).await.expect("publish");
    published.into_inner().sequence
}

/// (event, workflow, version) of every run, once runs were started by each
/// of `events`: a reader judges events in order, so those before were judged.
async fn started_by(h: &Harness, events: &[u64]) -> Vec<(u64, String, u32)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let page = h.workflows.list_runs(NS, &RunFilter::default(), None, 50).await.expect("list");
        let mut runs: Vec<(u64, String, u32)> = page
            .runs
            .into_iter()
            .map(|run| (run.body.origin.event_sequence.expect("started by an event"), run.workflow, run.version))
            .collect();
        runs.sort();
        if events.iter().all(|event| runs.iter().any(|(sequence, ..)| sequence == event)) {
            return runs;
        }
        assert!(tokio::time::Instant::now() < deadline, "events {events:?} started no run: {runs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn an_event_is_judged_by_the_versions_put_before_it_was_published(h: Harness) {
    let (_engine, _stop) = h.spawn_engine(test_config());
    h.put(&listening("deploy", "pr.merged", "a")).await;
    let first = publish(&h, "pr.merged", "a").await;
    started_by(&h, &[first]).await;
    h.put(&listening("deploy", "pr.merged", "b")).await;
    let forbidden = publish(&h, "pr.merged", "a").await;
    let allowed = publish(&h, "pr.merged", "b").await;
    let runs = started_by(&h, &[first, allowed]).await;
    assert_eq!(
        runs,
        [(first, "deploy".to_owned(), 1), (allowed, "deploy".to_owned(), 2)],
        "event {forbidden} matches only the version put after it"
    );
}

async fn events_read_late_are_judged_by_the_versions_of_their_time(h: Harness) {
    h.put(&listening("deploy", "pr.merged", "a")).await;
    let early = publish(&h, "pr.merged", "a").await;
    h.put(&listening("deploy", "pr.merged", "b")).await;
    let late = publish(&h, "pr.merged", "a").await;
    let allowed = publish(&h, "pr.merged", "b").await;
    // The engine starts after both puts and reads every event then.
    let (_engine, _stop) = h.spawn_engine(test_config());
    let runs = started_by(&h, &[early, allowed]).await;
    assert_eq!(
        runs,
        [(early, "deploy".to_owned(), 1), (allowed, "deploy".to_owned(), 2)],
        "event {late} came after version 2, which it does not match"
    );
}

async fn an_event_only_a_new_version_listens_to_is_not_passed_over(h: Harness) {
    let (_engine, _stop) = h.spawn_engine(test_config());
    h.put(&listening("deploy", "pr.merged", "a")).await;
    let first = publish(&h, "pr.merged", "a").await;
    started_by(&h, &[first]).await;
    h.put(&listening("release", "tag.pushed", "a")).await;
    let tagged = publish(&h, "tag.pushed", "a").await;
    let merged = publish(&h, "pr.merged", "a").await;
    let runs = started_by(&h, &[first, tagged, merged]).await;
    assert_eq!(
        runs,
        [(first, "deploy".to_owned(), 1), (tagged, "release".to_owned(), 1), (merged, "deploy".to_owned(), 1)]
    );
}

/// The bus's database was reset under the engine: its log starts over at 1,
/// before the engine's trigger cursor. The engine judges the new log from
/// its start, and its events start runs, though the old log's events of the
/// same sequences started runs too.
async fn a_bus_log_that_started_over_is_judged_from_its_start(h: Harness) {
    let (_engine, _stop) = h.spawn_engine(test_config());
    let old = three_runs(&h).await;
    start_over(&h).await;
    let new = publish(&h, "pr.merged", "a").await;
    assert_eq!(new, 1, "the log started over");
    let runs = runs_of(&h, &old, 4).await;
    assert_eq!(runs.iter().filter(|(sequence, ..)| *sequence == 1).count(), 2, "{runs:?}");
}

/// Puts a workflow started by `pr.merged` events and publishes three; their
/// sequences, once they started runs.
async fn three_runs(h: &Harness) -> Vec<u64> {
    h.put(&listening("deploy", "pr.merged", "a")).await;
    let mut old = Vec::new();
    for _ in 0..3 {
        old.push(publish(h, "pr.merged", "a").await);
    }
    started_by(h, &old).await;
    old
}

/// The runs, once `events` started theirs and there are `count` in all.
async fn runs_of(h: &Harness, events: &[u64], count: usize) -> Vec<(u64, String, u32)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let runs = started_by(h, events).await;
        if runs.len() == count {
            return runs;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new log's events started no runs: {runs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Deletes the bus's events and head, as a reset of its database does.
async fn start_over(h: &Harness) {
    let mut tx = h.db.begin().await.expect("a transaction");
    for table in ["eventbus_events", "eventbus_heads"] {
        let delete = format!("DELETE FROM {table} WHERE namespace = $1");
        sqlx::query(sqlx::AssertSqlSafe(delete)).bind(NS).execute(&mut *tx).await.expect("the bus starts over");
    }
    tx.commit().await.expect("the bus started over");
}

/// The bus's database was reset while no engine read it, and by the time one
/// does its new log holds more events than the old one did: the event at
/// the engine's cursor is another than the one it judged there.
async fn a_bus_log_that_started_over_and_grew_past_the_cursor_while_no_engine_read_is_judged_from_its_start(
    h: Harness,
) {
    let (engine, stop) = h.spawn_engine(test_config());
    three_runs(&h).await;
    stop.cancel();
    drop(engine);
    start_over(&h).await;
    let mut new = Vec::new();
    for _ in 0..5 {
        new.push(publish(&h, "pr.merged", "a").await);
    }
    assert_eq!(new, [1, 2, 3, 4, 5], "the new log is past the engine's cursor (3)");
    let (_engine, _stop) = h.spawn_engine(test_config());
    runs_of(&h, &new, 8).await;
}

/// One workflow's `message: {event: …}` step starts another's run, with the
/// step's data as its trigger.
async fn an_event_a_message_step_publishes_starts_the_workflow_it_triggers_once(h: Harness) {
    let (_engine, _stop) = h.spawn_engine(test_config());
    h.put("name: deploy\ntrigger: {event: build.finished, filter: {workflow: build}}\nsteps:\n- id: note\n  condition: \"true\"\n")
        .await;
    h.put(
        "name: build\ninputs:\n  version: {type: string}\nsteps:\n- id: done\n  message:\n    event: build.finished\n\
         \x20   text: built\n    data: {version: \"{{ inputs.version }}\", ok: true}\n",
    )
    .await;
    let build = h.run("build", json!({ "version": "1.2" })).await;
    let build = h.finished(&build.id).await;
    assert_eq!(build.state, chorus_workflow::domain::RunState::Completed, "{build:#?}");
    let sequence = build.body.steps[0].output.as_ref().expect("an output")["sequence"].as_u64().expect("a sequence");
    let filter = RunFilter { workflow: Some("deploy".into()), ..RunFilter::default() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut deploys = loop {
        let runs = h.workflows.list_runs(NS, &filter, None, 10).await.expect("list").runs;
        if !runs.is_empty() {
            break runs;
        }
        assert!(tokio::time::Instant::now() < deadline, "event {sequence} started no deploy run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    deploys.extend(h.workflows.list_runs(NS, &filter, None, 10).await.expect("list").runs.into_iter().skip(1));
    assert_eq!(deploys.len(), 1, "one event, one run: {deploys:#?}");
    let deploy = deploys.remove(0);
    assert_eq!(deploy.body.origin.event_sequence, Some(sequence));
    let trigger = &deploy.body.trigger;
    assert_eq!((&trigger["data"], &trigger["text"]), (&json!({ "version": "1.2", "ok": true }), &json!("built")));
    assert_eq!((&trigger["run_id"], &trigger["step_id"]), (&json!(build.id), &json!("done")));
}
