//! Parallel steps: how many branches run at once, and what a step after the
//! join sees of every branch.

use chorus_workflow::domain::{Run, RunState, StepState};
use serde_json::json;

use crate::{
    harness::{Harness, conformance},
    runs::signal,
};

conformance!(
    max_concurrency_starts_waiting_branches_in_order_as_others_end,
    a_fail_fast_step_never_starts_the_branches_its_limit_held_back,
    a_step_after_the_join_reaches_every_branch_by_name,
);

/// The ids of the run's records that have not ended, in the order they started.
fn active(run: &Run) -> Vec<&str> {
    let records = run.body.steps.iter().filter(|s| s.step_id != "fan" && !s.state.is_finished());
    records.map(|s| s.step_id.as_str()).collect()
}

async fn max_concurrency_starts_waiting_branches_in_order_as_others_end(h: Harness) {
    let branches: String = ["a", "b", "c", "d"]
        .iter()
        .map(|name| {
            format!("    - name: {name}\n      steps:\n      - id: wait_{name}\n        wait: {{signal: {name}}}\n")
        })
        .collect();
    h.put(&format!("name: limited\nsteps:\n- id: fan\n  parallel:\n    max_concurrency: 2\n    branches:\n{branches}"))
        .await;
    let run = h.run("limited", json!({})).await;
    let run = h.waiting(&run.id).await;
    assert_eq!(active(&run), ["wait_a", "wait_b"], "two branches at once, the first two declared");
    let fan = run.body.steps.iter().find(|s| s.step_id == "fan").expect("the parallel step");
    assert_eq!(fan.input["max_concurrency"], json!(2), "{:?}", fan.input);
    signal(&h, &run.id, "b", "s-b").await;
    let run = h.until(&run.id, "the third branch to start", |run| active(run).contains(&"wait_c")).await;
    assert_eq!(active(&run), ["wait_a", "wait_c"], "the next declared branch takes the freed slot");
    signal(&h, &run.id, "a", "s-a").await;
    let run = h.until(&run.id, "the last branch to start", |run| active(run).contains(&"wait_d")).await;
    assert_eq!(active(&run), ["wait_c", "wait_d"]);
    signal(&h, &run.id, "c", "s-c").await;
    signal(&h, &run.id, "d", "s-d").await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let fan = run.body.steps.iter().find(|s| s.step_id == "fan").expect("the parallel step");
    let all = json!({"a": "completed", "b": "completed", "c": "completed", "d": "completed"});
    assert_eq!(fan.output.as_ref(), Some(&all));
}

async fn a_fail_fast_step_never_starts_the_branches_its_limit_held_back(h: Harness) {
    h.put(
        r#"name: held
steps:
- id: fan
  parallel:
    max_concurrency: 1
    branches:
    - name: bad
      steps:
      - id: boom
        spawn: {agent: coder, input: please fail}
    - name: later
      steps:
      - id: never
        spawn: {agent: coder, input: ok}
"#,
    )
    .await;
    let run = h.run("held", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Failed);
    assert!(run.body.steps.iter().all(|s| s.step_id != "never"), "the held-back branch never started: {run:#?}");
    let fan = run.body.steps.iter().find(|s| s.step_id == "fan").expect("the parallel step");
    assert_eq!(fan.output.as_ref(), Some(&json!({"bad": "failed", "later": "canceled"})));
}

async fn a_step_after_the_join_reaches_every_branch_by_name(h: Harness) {
    h.put(
        r#"name: joined
steps:
- id: fan
  parallel:
    mode: all_settled
    branches:
    - name: left
      steps:
      - id: first
        spawn: {agent: coder, input: one}
      - id: tail
        condition: "false"
        spawn: {agent: coder, input: never}
    - name: right
      steps:
      - id: second
        spawn: {agent: coder, input: two}
- id: join
  spawn:
    agent: coder
    input:
      all: "{{ fan.branches }}"
      text: "{% for name, branch in fan.branches | items %}{{ name }}={{ branch.output.summary }};{% endfor %}"
"#,
    )
    .await;
    let run = h.run("joined", json!({})).await;
    let run = h.finished(&run.id).await;
    assert_eq!(run.state, RunState::Completed, "{run:#?}");
    let join = run.body.steps.iter().find(|s| s.step_id == "join").expect("the join ran");
    assert_eq!(join.state, StepState::Completed);
    let all = &join.input["input"]["all"];
    let seen: Vec<(&str, &serde_json::Value, &serde_json::Value)> =
        ["left", "right"].iter().map(|name| (*name, &all[name]["state"], &all[name]["output"]["summary"])).collect();
    let (completed, one, two) = (json!("completed"), json!("did: one"), json!("did: two"));
    assert_eq!(
        seen,
        [("left", &completed, &one), ("right", &completed, &two)],
        "a skipped last step passes over to the one before it: {all}"
    );
    assert_eq!(join.input["input"]["text"], json!("left=did: one;right=did: two;"));
}
