//! Steps that talk to the world, and what starts and follows runs: hub
//! messages and webhooks (with their idempotency keys, and the address
//! guard), watches that resume from a cursor, event and cron triggers.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use chorus_proto::eventbus::{NewEvent, PublishRequest, event_bus_client::EventBusClient};
use chorus_workflow::domain::{OriginKind, RunChange, RunFilter, RunState, StepState};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::harness::{Harness, NS, conformance, test_config};

conformance!(
    messages_reach_hub_topics_and_webhooks_once_with_their_keys,
    failed_deliveries_take_the_retry_policy_and_name_their_cause,
    a_watch_sees_every_change_and_resumes_after_a_cursor,
    a_watch_sees_a_parallel_step_finish_after_its_branches,
    matching_events_start_one_run_each,
    cron_schedules_start_runs,
    a_spawn_past_its_timeout_fails_and_cancels_its_task_saying_why,
    a_spawn_no_worker_claimed_says_so_when_it_times_out,
    webhook_steps_share_one_connection,
    an_agent_a_template_names_empty_fails_its_step_saying_so,
);

/// A webhook receiver on loopback: what it was sent, with the idempotency keys.
pub(crate) async fn receiver() -> (String, Arc<Mutex<Vec<(String, Value)>>>) {
    receiver_answering(StatusCode::OK).await
}

/// A webhook receiver that answers `status`.
async fn receiver_answering(status: StatusCode) -> (String, Arc<Mutex<Vec<(String, Value)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::clone(&seen);
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: axum::Json<Value>| {
            let store = Arc::clone(&store);
            async move {
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                store.lock().expect("seen").push((key, body.0));
                (status, "ok")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn messages_reach_hub_topics_and_webhooks_once_with_their_keys(h: Harness) {
    let mut watcher = h.watcher("news").await;
    let (url, seen) = receiver().await;
    h.put(&format!(
        "name: tell\ninputs:\n  who: {{type: string}}\nsteps:\n\
         - id: post\n  message: {{topic: news, text: \"hello {{{{ inputs.who }}}}\", type: greeting}}\n\
         - id: hook\n  message: {{webhook: \"{url}\", text: \"posted {{{{ post.output.message_id }}}}\"}}\n\
         - id: direct\n  message: {{to: watcher, text: direct}}\n"
    ))
    .await;
    let run = h.run("tell", json!({"who": "ann"})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let texts = watcher.texts().await;
    assert_eq!(texts, ["hello ann", "direct"]);
    let seen = seen.lock().expect("seen").clone();
    let [(key, body)] = seen.as_slice() else { panic!("one webhook call expected: {seen:?}") };
    assert_eq!(key, &format!("workflow:{}:hook:1", run.id));
    let message_id = run.body.steps[0].output.as_ref().expect("output")["message_id"].as_str().expect("id").to_owned();
    assert_eq!(body["text"], json!(format!("posted {message_id}")));
    assert_eq!(body["run_id"], json!(run.id));
}

async fn failed_deliveries_take_the_retry_policy_and_name_their_cause(h: Harness) {
    let (failing, calls) = receiver_answering(StatusCode::SERVICE_UNAVAILABLE).await;
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("address");
    h.put(&format!(
        r#"name: deliveries
steps:
- id: fan
  parallel:
    mode: all_settled
    branches:
    - name: remote
      steps:
      - id: ask
        delegate: {{agent: "http://{closed}", input: hi, timeout: 5s, retry: {{max_attempts: 2, backoff: 10ms}}}}
    - name: busy
      steps:
      - id: hook
        message: {{webhook: "{failing}", text: hi, retry: {{max_attempts: 2, backoff: 500ms}}}}
    - name: down
      steps:
      - id: gone
        message: {{webhook: "http://{closed}/hook", text: hi}}
"#
    ))
    .await;
    let run = h.run("deliveries", json!({})).await;
    let retrying = h
        .until(&run.id, "the webhook's second attempt to wait", |run| {
            run.body.steps.iter().any(|s| s.step_id == "hook" && s.attempt == 2 && s.state == StepState::Waiting)
        })
        .await;
    let first = retrying.body.steps.iter().find(|s| s.step_id == "hook").expect("first attempt");
    assert_eq!(first.state, StepState::Failed);
    assert!(first.error.as_deref().unwrap_or_default().contains("answered 503"), "{first:?}");
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed);
    let attempts = |step_id: &str| -> Vec<(u32, StepState, String)> {
        let records = run.body.steps.iter().filter(|s| s.step_id == step_id);
        records.map(|s| (s.attempt, s.state, s.error.clone().unwrap_or_default())).collect()
    };
    let refused = format!("delegate: cannot reach http://{closed}: connection refused");
    assert_eq!(attempts("ask"), [(1, StepState::Failed, refused.clone()), (2, StepState::Failed, refused.clone())]);
    let busy = format!("webhook {failing} answered 503 Service Unavailable");
    assert_eq!(attempts("hook"), [(1, StepState::Failed, busy.clone()), (2, StepState::Failed, busy.clone())]);
    let keys: Vec<String> = calls.lock().expect("calls").iter().map(|(key, _)| key.clone()).collect();
    assert_eq!(keys, [format!("workflow:{}:hook:1", run.id), format!("workflow:{}:hook:1", run.id)], "one message");
    let gone = attempts("gone");
    let refused_there = |error: &str| error.contains(&format!("http://{closed}/hook")) && error.contains("refused");
    assert!(matches!(gone.as_slice(), [(1, StepState::Failed, error)] if refused_there(error)), "{gone:?}");
    let error = run.body.error.as_deref().unwrap_or_default();
    assert!(error.contains(&refused) && error.contains(&busy), "the run names each cause: {error}");
}

async fn a_watch_sees_a_parallel_step_finish_after_its_branches(h: Harness) {
    h.put(
        r#"name: fanned
steps:
- id: fan
  parallel:
    branches:
    - name: a
      steps:
      - id: left
        spawn: {agent: coder, input: l}
    - name: b
      steps:
      - id: inner
        parallel:
          branches:
          - name: c
            steps:
            - id: right
              spawn: {agent: coder, input: r}
          - name: d
            steps:
            - id: far
              spawn: {agent: coder, input: f}
"#,
    )
    .await;
    let run = h.run("fanned", json!({})).await;
    h.finished(&run.id).await;
    let events = h.workflows.watch_run(NS, &run.id, 0).await.expect("replay").collect::<Vec<_>>().await;
    let finished: Vec<String> = events
        .into_iter()
        .map(|event| event.expect("event").change)
        .filter_map(|change| match change {
            RunChange::StepUpdated { step } if step.state.is_finished() => Some(step.step_id.clone()),
            _ => None,
        })
        .collect();
    let at = |step_id: &str| finished.iter().position(|id| id == step_id).unwrap_or_else(|| panic!("{finished:?}"));
    let (inner, fan) = (at("inner"), at("fan"));
    assert!(at("right") < inner && at("far") < inner && inner < fan && at("left") < fan, "{finished:?}");
}

async fn a_watch_sees_every_change_and_resumes_after_a_cursor(h: Harness) {
    h.put("name: watched\nsteps:\n- id: hold\n  wait: {signal: go}\n- id: work\n  spawn: {agent: coder, input: x}\n")
        .await;
    let run = h.run("watched", json!({})).await;
    let watch = h.workflows.watch_run(NS, &run.id, 0).await.expect("watch");
    let waiter = tokio::spawn(async move { watch.collect::<Vec<_>>().await });
    h.waiting(&run.id).await;
    let call = chorus_workflow::service::SignalCall {
        name: "go".into(),
        payload: Default::default(),
        signal_id: "s".into(),
        sent_by: "t".into(),
    };
    // Sent through another service on the database (another process, as far
    // as this one's watches know): the watch learns of it from the database.
    h.with_config(test_config()).signal_run(NS, &run.id, call).await.expect("signal");
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the watch ends with the run")
        .expect("join")
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("no error");
    let first = events.first().expect("events");
    assert_eq!((&first.change, first.state), (&RunChange::RunStateChanged, RunState::Pending), "created pending");
    assert!(
        matches!(&events[1].change, RunChange::StepUpdated { step } if step.step_id == "hold"),
        "then its first step starts: {:?}",
        events[1]
    );
    let last = events.last().expect("events");
    assert_eq!((&last.change, last.state), (&RunChange::RunStateChanged, RunState::Completed));
    let signaled = events.iter().position(|e| matches!(e.change, RunChange::SignalReceived { .. })).expect("signal");
    // Cause before effect: the signal ends the wait, the run runs again, then its next step starts.
    let resumed: Vec<String> = events[signaled + 1..signaled + 4]
        .iter()
        .map(|event| match &event.change {
            RunChange::StepUpdated { step } => format!("{} {:?}", step.step_id, step.state),
            change => format!("{change:?} {:?}", event.state),
        })
        .collect();
    assert_eq!(resumed, ["hold Completed", "RunStateChanged Running", "work Running"], "{events:?}");
    let cursors: Vec<i64> = events.iter().map(|e| e.cursor).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "in commit order: {cursors:?}");
    let replay = h.workflows.watch_run(NS, &run.id, 0).await.expect("replay").collect::<Vec<_>>().await;
    let replay: Vec<_> = replay.into_iter().collect::<Result<_, _>>().expect("no error");
    assert_eq!(replay, events, "what the watch followed live is what was stored");
    let middle = events[events.len() / 2].cursor;
    let rest = h.workflows.watch_run(NS, &run.id, middle).await.expect("resume").collect::<Vec<_>>().await;
    let rest: Vec<i64> = rest.into_iter().map(|e| e.expect("event").cursor).collect();
    assert_eq!(rest, cursors.iter().copied().filter(|c| *c > middle).collect::<Vec<_>>());
}

async fn matching_events_start_one_run_each(h: Harness) {
    h.put(
        "name: on-merge\ntrigger:\n  event: pr.merged\n  filter: {repo: chorus}\n  condition: \"event.size > 1\"\n\
         steps:\n- id: note\n  condition: \"{{ trigger.repo }} == 'chorus'\"\n",
    )
    .await;
    // Another engine reads the same events: still one run per event.
    let (_engine, _stop) = h.spawn_engine(test_config());
    let mut bus = EventBusClient::connect(h.url()).await.expect("bus");
    for (repo, size) in [("chorus", 3), ("other", 3), ("chorus", 1), ("chorus", 5)] {
        let event = NewEvent {
            r#type: "pr.merged".into(),
            source: "git".into(),
            payload: json!({"repo": repo, "size": size}).to_string().into_bytes(),
            ..Default::default()
        };
        bus.publish(PublishRequest { namespace: NS.into(), event: Some(event) }).await.expect("publish");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let runs = loop {
        let page = h.workflows.list_runs(NS, &RunFilter::default(), None, 50).await.expect("list");
        let done = page.runs.iter().filter(|r| r.state == RunState::Completed).count();
        if done >= 2 {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            break h.workflows.list_runs(NS, &RunFilter::default(), None, 50).await.expect("list").runs;
        }
        assert!(tokio::time::Instant::now() < deadline, "the events started no runs: {page:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(runs.len(), 2, "the first and last events match, once each: {runs:#?}");
    let mut sequences: Vec<u64> = runs.iter().filter_map(|r| r.body.origin.event_sequence).collect();
    sequences.sort_unstable();
    assert_eq!(sequences, [1, 4]);
    assert!(runs.iter().all(|r| r.body.origin.kind == OriginKind::Event));
}

async fn cron_schedules_start_runs(h: Harness) {
    h.put("name: ticking\ntrigger: {cron: \"* * * * * *\"}\nsteps:\n- id: tick\n  condition: \"true\"\n").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = h.workflows.list_runs(NS, &RunFilter::default(), None, 50).await.expect("list");
        if page.runs.len() >= 2 {
            assert!(page.runs.iter().all(|r| r.body.origin.kind == OriginKind::Cron));
            let keys: std::collections::BTreeSet<_> = page.runs.iter().map(|r| r.idempotency_key.clone()).collect();
            assert_eq!(keys.len(), page.runs.len(), "one run per scheduled second");
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "no scheduled runs started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn a_spawn_no_worker_claimed_says_so_when_it_times_out(h: Harness) {
    h.put("name: lonely\nsteps:\n- id: work\n  spawn: {agent: ghost, input: hello, timeout: 300ms}\n").await;
    let run = h.run("lonely", json!({})).await;
    let run = h.finished(&run.id).await;
    let step = &run.body.steps[0];
    let task_id = step.external_id.clone().expect("the step made a task");
    let said =
        format!("task {task_id} did not finish within 300ms: no worker of agent `ghost` claimed it (is one running?)");
    assert_eq!((run.state, step.error.as_deref()), (RunState::Failed, Some(said.as_str())));
}

async fn a_spawn_past_its_timeout_fails_and_cancels_its_task_saying_why(h: Harness) {
    // The worker of `coder` claims the task and waits until the step gives up.
    h.put("name: slow\nsteps:\n- id: work\n  spawn: {agent: coder, input: slow, timeout: 300ms}\n").await;
    let run = h.run("slow", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed);
    let step = &run.body.steps[0];
    let task_id = step.external_id.clone().expect("the step made a task");
    assert_eq!(step.error.as_deref(), Some(format!("task {task_id} did not finish within 300ms").as_str()));
    let mut tasks =
        chorus_proto::taskstore::task_store_client::TaskStoreClient::connect(h.url()).await.expect("client");
    let request =
        chorus_proto::taskstore::GetTaskRequest { namespace: NS.into(), id: task_id, history_length: Some(0) };
    let status = tasks.get_task(request).await.expect("task").into_inner().status.expect("status");
    assert_eq!(status.state(), chorus_proto::taskstore::TaskState::Canceled, "canceled as the step failed");
    let said: Vec<&str> = status
        .message
        .iter()
        .flat_map(|message| &message.parts)
        .filter_map(|part| match &part.content {
            Some(chorus_proto::taskstore::part::Content::Text(text)) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(said.concat().contains("its workflow step's timeout (300ms) passed"), "{said:?}");
}

async fn webhook_steps_share_one_connection(h: Harness) {
    let receiver = chorus_runtime::testing::StreamingReceiver::start().await;
    let url = &receiver.url;
    let steps: String =
        (1..=4).map(|n| format!("- id: s{n}\n  message: {{webhook: \"{url}\", text: \"step {n}\"}}\n")).collect();
    h.put(&format!("name: hooks\nsteps:\n{steps}")).await;
    let run = h.run("hooks", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    assert_eq!(receiver.connections(), 1, "each answer is read to its end, so its connection serves the next call");
}

/// A `to:` or spawn `agent:` template that renders empty (a `config` value
/// not set) fails its step naming the field, not in the hub's words.
async fn an_agent_a_template_names_empty_fails_its_step_saying_so(h: Harness) {
    h.put("name: unnamed\nsteps:\n- id: tell\n  message: {to: \"{{ config.notify }}\", text: hi}\n").await;
    let run = h.run("unnamed", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed, "{run:#?}");
    let error = run.body.steps[0].error.as_deref().unwrap_or_default();
    assert!(error.contains("`to` `{{ config.notify }}` names no agent: it rendered empty"), "{error}");
}
