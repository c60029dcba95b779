//! Disabled workflows: no start, trigger or schedule makes a run of one, not
//! even once it is enabled again; runs already started go on; the record
//! stands through new versions and repeated disables; namespaces are apart.

use std::time::Duration;

use chorus_proto::eventbus::{NewEvent, PublishRequest, event_bus_client::EventBusClient};
use chorus_workflow::{
    domain::{Decision, OriginKind, RunFilter, RunState},
    error::WorkflowError,
};
use serde_json::json;

use crate::{
    harness::{Harness, NS, conformance, definition},
    hitl_gates::gate,
    runs::GATED,
};

conformance!(
    a_disabled_workflow_starts_no_run_and_its_started_runs_go_on,
    the_first_disable_stands_through_new_versions_until_enabled,
    disabling_names_a_workflow_of_its_namespace,
    events_and_schedule_times_of_a_disabled_workflow_start_nothing_then_or_later,
    a_disabled_workflows_queue_is_held_until_it_is_enabled,
);

async fn a_disabled_workflow_starts_no_run_and_its_started_runs_go_on(h: Harness) {
    h.put(GATED).await;
    let started = h.run("gated", json!({})).await;
    h.waiting(&started.id).await;
    let disabled = h.workflows.disable(NS, "gated", "ana", "incident 42").await.expect("disable");
    let record = disabled.disabled.expect("disabled");
    assert_eq!((record.by.as_str(), record.reason.as_str()), ("ana", "incident 42"));
    let refused = h.workflows.start_run(start("gated")).await.expect_err("disabled");
    assert!(matches!(&refused, WorkflowError::Disabled { workflow, .. } if workflow == "gated"), "{refused}");
    assert_eq!(refused.to_string(), "workflow gated is disabled by ana (incident 42); enable it to start runs");
    let pinned = chorus_workflow::service::StartCall { version: Some(1), ..start("gated") };
    h.workflows.start_run(pinned).await.expect_err("a pinned version is disabled too");
    assert_eq!(runs(&h, "gated").await, 1, "the refused starts made nothing");
    let tried = chorus_workflow::service::StartCall { while_disabled: true, ..start("gated") };
    let tried = h.workflows.start_run(tried).await.expect("an operator's try of a fix starts");
    h.workflows.cancel_run(NS, &tried.id, "tried", "ana").await.expect("cancel the try");
    assert_eq!(runs(&h, "gated").await, 2);
    h.workflows.decide_gate(NS, &started.id, gate("signoff", Decision::Approve, "ben", "")).await.expect("approve");
    assert_eq!(h.finished(&started.id).await.state, RunState::Completed, "a started run goes on");
    h.workflows.enable(NS, "gated", "ana").await.expect("enable");
    h.run("gated", json!({})).await;
    assert_eq!(runs(&h, "gated").await, 3);
}

async fn the_first_disable_stands_through_new_versions_until_enabled(h: Harness) {
    h.put(&definition("deploy", "one")).await;
    let first = h.workflows.disable(NS, "deploy", "ana", "freeze").await.expect("disable").disabled;
    let again = h.workflows.disable(NS, "deploy", "bob", "other").await.expect("disable again").disabled;
    assert_eq!(again, first, "disabling a disabled workflow changes nothing");
    let put = h.workflows.put(NS, &definition("deploy", "two"), "deploy.yaml", "cid").await.expect("put v2");
    assert_eq!((put.put.definition.version, put.put.definition.disabled), (2, first.clone()));
    h.workflows.start_run(start("deploy")).await.expect_err("the new version is disabled too");
    let older = h.workflows.get(NS, "deploy", Some(1)).await.expect("v1");
    assert_eq!(older.disabled, first, "every version says so");
    let listed = h.workflows.list(NS, None, false, None, 10).await.expect("list").definitions;
    assert_eq!(listed[0].disabled, first);
    let enabled = h.workflows.enable(NS, "deploy", "ana").await.expect("enable");
    assert_eq!((enabled.version, enabled.disabled), (2, None));
    let again = h.workflows.enable(NS, "deploy", "ana").await.expect("enabling an enabled workflow");
    assert_eq!(again.disabled, None);
    let run = h.run("deploy", json!({})).await;
    assert_eq!(run.version, 2);
}

async fn disabling_names_a_workflow_of_its_namespace(h: Harness) {
    for namespace in [NS, "team-b"] {
        h.workflows.put(namespace, &definition("deploy", "one"), "deploy.yaml", "ana").await.expect("put");
    }
    h.workflows.disable(NS, "deploy", "ana", "").await.expect("disable");
    let elsewhere = h.workflows.head("team-b", "deploy").await.expect("team-b's");
    assert_eq!(elsewhere.disabled, None);
    let call = chorus_workflow::service::StartCall { namespace: "team-b".into(), ..start("deploy") };
    h.workflows.start_run(call).await.expect("team-b's workflow starts");
    for unknown in [(NS, "nope"), ("team-c", "deploy")] {
        let error = h.workflows.disable(unknown.0, unknown.1, "ana", "").await.expect_err("unknown");
        assert!(matches!(error, WorkflowError::NotFound(_)), "{error}");
        let error = h.workflows.enable(unknown.0, unknown.1, "ana").await.expect_err("unknown");
        assert!(matches!(error, WorkflowError::NotFound(_)), "{error}");
    }
    let table: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM workflow_disabled")
        .fetch_one(&mut *h.db.acquire().await.expect("a connection"))
        .await
        .expect("count");
    assert_eq!(table, 1, "unknown workflows were not recorded");
}

/// An event of a disabled workflow's time and the schedule times then pass
/// without a run, and enabling it does not start runs for them: the reader
/// judged them as they came. What comes after the enable starts runs.
async fn events_and_schedule_times_of_a_disabled_workflow_start_nothing_then_or_later(h: Harness) {
    let listens = |name: &str| {
        format!("name: {name}\ntrigger: {{event: pr.merged}}\nsteps:\n- id: note\n  condition: \"true\"\n")
    };
    h.put(&listens("deploy")).await;
    h.put(&listens("audit")).await;
    h.put("name: ticking\ntrigger: {cron: \"* * * * * *\"}\nsteps:\n- id: tick\n  condition: \"true\"\n").await;
    for name in ["deploy", "ticking"] {
        h.workflows.disable(NS, name, "ana", "").await.expect("disable");
    }
    let passed = publish(&h).await;
    // `audit`, enabled, takes the same event: once its run is there, the
    // reader has judged the event for `deploy` too.
    started(&h, "audit", 1).await;
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(runs(&h, "ticking").await, 0, "two schedule times passed while disabled");
    assert_eq!(runs(&h, "deploy").await, 0);
    let enabled_at = chrono::Utc::now();
    for name in ["deploy", "ticking"] {
        h.workflows.enable(NS, name, "ana").await.expect("enable");
    }
    let next = publish(&h).await;
    let deploys = started(&h, "deploy", 1).await;
    assert_eq!(deploys[0].body.origin.event_sequence, Some(next), "not event {passed}, of the disabled time");
    let ticks = started(&h, "ticking", 1).await;
    assert!(ticks.iter().all(|run| run.body.origin.kind == OriginKind::Cron));
    for tick in ticks {
        let at = tick.body.trigger["scheduled_at"].as_str().expect("a time");
        let at = chrono::DateTime::parse_from_rfc3339(at).expect("rfc 3339");
        assert!(at >= enabled_at - chrono::Duration::seconds(1), "{at} is of the disabled time ({enabled_at})");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runs(&h, "deploy").await, 1, "one event after the enable, one run");
}

/// Runs queued behind a concurrency limit do not start while the workflow is
/// disabled, though a slot frees: a flood's backlog stays queued.
async fn a_disabled_workflows_queue_is_held_until_it_is_enabled(h: Harness) {
    h.put(&GATED.replace("name: gated\n", "name: gated\nconcurrency: {max: 1}\n")).await;
    let first = h.run("gated", json!({})).await;
    h.waiting(&first.id).await;
    let queued = h.run("gated", json!({})).await;
    assert_eq!(queued.state, RunState::Pending);
    h.workflows.disable(NS, "gated", "ana", "flood").await.expect("disable");
    h.workflows.cancel_run(NS, &first.id, "flood", "ana").await.expect("cancel");
    let held = h.until(&queued.id, "the queued run to say why", |run| run.body.pending_reason.is_some()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = h.workflows.get_run(NS, &held.id).await.expect("the run");
    assert_eq!(held.state, RunState::Pending, "a slot is free, but the workflow is disabled: {held:#?}");
    assert_eq!(held.body.pending_reason.as_deref(), Some("held: `gated` is disabled"));
    h.workflows.enable(NS, "gated", "ana").await.expect("enable");
    let started = h.waiting(&queued.id).await;
    assert_eq!(started.body.pending_reason, None);
}

fn start(workflow: &str) -> chorus_workflow::service::StartCall {
    chorus_workflow::service::StartCall {
        namespace: NS.into(),
        workflow: workflow.into(),
        ..chorus_workflow::service::StartCall::default()
    }
}

async fn runs(h: &Harness, workflow: &str) -> usize {
    let filter = RunFilter { workflow: Some(workflow.into()), ..RunFilter::default() };
    h.workflows.list_runs(NS, &filter, None, 100).await.expect("list").runs.len()
}

/// The runs of `workflow`, once there are at least `count` (at most 20 s).
async fn started(h: &Harness, workflow: &str, count: usize) -> Vec<chorus_workflow::domain::Run> {
    let filter = RunFilter { workflow: Some(workflow.into()), ..RunFilter::default() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let runs = h.workflows.list_runs(NS, &filter, None, 100).await.expect("list").runs;
        if runs.len() >= count {
            return runs;
        }
        assert!(tokio::time::Instant::now() < deadline, "{workflow} started no run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn publish(h: &Harness) -> u64 {
    let mut bus = EventBusClient::connect(h.url()).await.expect("bus");
    let event =
        NewEvent { r#type: "pr.merged".into(), source: "test".into(), payload: b"{}".to_vec(), ..Default::default() };
    let published = bus.publish(PublishRequest { namespace: NS.into(), event: Some(event) }).await.expect("publish");
    published.into_inner().sequence
}
