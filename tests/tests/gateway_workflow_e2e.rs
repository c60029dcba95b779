//! A workflow exposed as an A2A agent, over JSON-RPC on the real `chorus
//! dev`: a message starts a run, a HITL gate shows as `input-required`, the
//! replies reject (the phase runs again) and approve it, the run's output
//! comes back as an artifact; a malformed reply changes nothing; canceling
//! the task cancels the run; a gate decided or a run canceled through the
//! workflow API moves the task on with no further message.

use chorus_proto::workflow::{DisableWorkflowRequest, ListRunsRequest, RunState, workflow_client::WorkflowClient};
use chorus_tests::{
    Sandbox,
    a2a::{A2a, assert_rpc_error, message, state, text, unique, write_chorus_toml},
};
use serde_json::{Value, json};

const GATED: &str = "name: gated\ninputs:\n  topic: {type: string, default: none}\nsteps:\n\
                     - id: draft\n  wait: {duration: 50ms}\n\
                     - id: signoff\n  gate: {mode: HITL, reviewers: editors, artifacts: {topic: \"{{ inputs.topic }}\"}}\n\
                     - id: done\n  condition: \"true\"\n";

const CATALOG: &str = r#"
[gateway]
default_agent = "gated"

[[gateway.agents]]
id = "gated"
name = "Gated workflow"
description = "Drafts, then waits for an editor's decision."
kind = "workflow"
"#;

fn reply(task: &Value, words: &str) -> Value {
    let mut reply = message(&unique("reply"), words);
    reply["taskId"] = task["id"].clone();
    reply["contextId"] = task["contextId"].clone();
    reply
}

fn status_text(task: &Value) -> &str {
    text(&task["status"]["message"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_agent_runs_asks_at_its_gate_and_answers_with_the_output() {
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("dir");
    std::fs::write(sandbox.path().join("workflows/gated.yaml"), GATED).expect("write");
    write_chorus_toml(sandbox.path(), CATALOG);
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);

    let mut start = message(&unique("start"), "please review");
    start["parts"] = json!([{"text": "please review"}, {"data": {"topic": "pricing"}}]);
    let task = a2a.send("gated", start).await;
    assert_eq!(state(&task), "TASK_STATE_INPUT_REQUIRED", "{task:#}");
    assert!(status_text(&task).contains("Gate `signoff` (round 1) waits for a decision by editors"), "{task:#}");
    assert!(status_text(&task).ends_with("\n\ntopic: pricing"), "what is decided on is shown: {task:#}");
    let link = &task["status"]["message"]["metadata"]["chorus.workflow"];
    assert_eq!(link["artifacts"]["topic"], "pricing", "the gate's artifacts reach the caller: {task:#}");

    let unclear = a2a.send("gated", reply(&task, "maybe later")).await;
    assert_eq!(state(&unclear), "TASK_STATE_INPUT_REQUIRED");
    assert!(status_text(&unclear).contains("Reply `approve`"), "{unclear:#}");

    let rejected = a2a.send("gated", reply(&task, "reject: shorter please")).await;
    assert_eq!(state(&rejected), "TASK_STATE_INPUT_REQUIRED", "{rejected:#}");
    assert!(status_text(&rejected).contains("(round 2)"), "the phase ran again: {rejected:#}");

    let done = a2a.send("gated", reply(&task, "approve")).await;
    assert_eq!(state(&done), "TASK_STATE_COMPLETED", "{done:#}");
    let artifact = done["artifacts"].as_array().and_then(|a| a.iter().find(|a| a["name"] == "output")).cloned();
    let artifact = artifact.unwrap_or_else(|| panic!("an output artifact: {done:#}"));
    assert_eq!(artifact["parts"][0]["data"]["done"]["passed"], true, "{artifact:#}");

    let other = a2a.send("gated", message(&unique("start"), "again")).await;
    assert_eq!(state(&other), "TASK_STATE_INPUT_REQUIRED");
    // Only the gateway's own status messages link a task to a run: a message
    // naming another task's run (to decide or cancel its gate) is refused.
    for key in ["chorus.workflow", "chorus.remote"] {
        let mut forged = message(&unique("forged"), "approve");
        forged["metadata"] = json!({ key: other["status"]["message"]["metadata"]["chorus.workflow"] });
        let error = a2a.call_error("gated", "SendMessage", json!({ "message": forged })).await;
        assert_rpc_error(&error, -32602, "INVALID_PARAMS");
        assert!(error["message"].as_str().is_some_and(|m| m.contains(key)), "{error:#}");
    }
    let still = a2a.call("gated", "GetTask", json!({ "id": other["id"] })).await;
    assert_eq!(state(&still), "TASK_STATE_INPUT_REQUIRED", "the gate is still undecided: {still:#}");
    a2a.call("gated", "CancelTask", json!({ "id": other["id"] })).await;
    let mut workflows = WorkflowClient::new(server.channel().await);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let request = ListRunsRequest { namespace: "default".into(), ..Default::default() };
        let runs = workflows.list_runs(request).await.expect("list").into_inner().runs;
        let states: Vec<RunState> = runs.iter().map(|run| run.state()).collect();
        if states.contains(&RunState::Canceled) {
            assert_eq!(states.len(), 2, "one run per task: {states:?}");
            assert!(states.contains(&RunState::Completed));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the run was not canceled: {states:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The run a workflow agent's task waits on.
fn run_of(task: &Value) -> String {
    let run = &task["status"]["message"]["metadata"]["chorus.workflow"]["runId"];
    run.as_str().expect("a run").to_owned()
}

/// Approves the gate `task` waits on with the API, as `chorus gate approve` does.
async fn approve_with_the_api(workflows: &mut WorkflowClient<tonic::transport::Channel>, task: &Value) {
    use chorus_proto::workflow::{DecideGateRequest, Decision};
    let decide = DecideGateRequest {
        namespace: "default".into(),
        run_id: run_of(task),
        step_id: "signoff".into(),
        decision: Decision::Approve.into(),
        decided_by: "ana".into(),
        ..Default::default()
    };
    workflows.decide_gate(decide).await.expect("decided with the API");
}

/// The task once it has ended, read until then.
async fn ended(a2a: &A2a, task: &Value) -> Value {
    let finished =
        |read: &Value| ["TASK_STATE_COMPLETED", "TASK_STATE_CANCELED", "TASK_STATE_FAILED"].contains(&state(read));
    until(a2a, "gated", task, "following its run", finished).await
}

/// The task, read until `done` says it is where it should be.
async fn until(a2a: &A2a, agent: &str, task: &Value, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + chorus_tests::DEADLINE;
    loop {
        let read = a2a.call(agent, "GetTask", json!({ "id": task["id"] })).await;
        if done(&read) {
            return read;
        }
        assert!(tokio::time::Instant::now() < deadline, "the task is not {what}: {read:#}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_gate_was_decided_elsewhere_catches_up_with_its_run() {
    use chorus_proto::workflow::CancelRunRequest;
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("dir");
    std::fs::write(sandbox.path().join("workflows/gated.yaml"), GATED).expect("write");
    write_chorus_toml(sandbox.path(), CATALOG);
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let mut workflows = WorkflowClient::new(server.channel().await);

    // Approved with the API (as `chorus gate approve` does): the task follows
    // the run to its end with no further message.
    let approved = a2a.send("gated", message(&unique("start"), "review")).await;
    assert_eq!(state(&approved), "TASK_STATE_INPUT_REQUIRED", "{approved:#}");
    approve_with_the_api(&mut workflows, &approved).await;
    let done = ended(&a2a, &approved).await;
    assert_eq!(state(&done), "TASK_STATE_COMPLETED", "{done:#}");
    assert_eq!(done["artifacts"][0]["name"], "output", "the run's output: {done:#}");
    let history: Vec<&str> = done["history"].as_array().into_iter().flatten().map(text).collect();
    assert!(history.contains(&"Gate `signoff` was decided outside this conversation."), "{history:#?}");
    let late = a2a.call_error("gated", "SendMessage", json!({ "message": reply(&approved, "approve") })).await;
    assert_rpc_error(&late, -32004, "UNSUPPORTED_OPERATION");

    // A run canceled with the API: the task ends canceled.
    let canceled = a2a.send("gated", message(&unique("start"), "review")).await;
    let cancel = CancelRunRequest {
        namespace: "default".into(),
        run_id: run_of(&canceled),
        reason: "not needed".into(),
        canceled_by: "ana".into(),
    };
    workflows.cancel_run(cancel).await.expect("canceled with the API");
    assert_eq!(state(&ended(&a2a, &canceled).await), "TASK_STATE_CANCELED");

    // A reply that decides the gate itself leaves nothing for the watch to do.
    let replied = a2a.send("gated", message(&unique("start"), "review")).await;
    let done = a2a.send("gated", reply(&replied, "approve")).await;
    assert_eq!(state(&done), "TASK_STATE_COMPLETED", "{done:#}");
    let history: Vec<&str> = done["history"].as_array().into_iter().flatten().map(text).collect();
    assert!(!history.iter().any(|text| text.contains("outside this conversation")), "{history:#?}");
}

const PACED: &str = "name: paced\nsteps:\n- id: draft\n  wait: {duration: 1500ms}\n\
                     - id: signoff\n  gate: {mode: HITL, reviewers: editors}\n";

/// A gateway killed while it ran workflow agents' turns, and started again
/// under its name (its address), takes them up at once: a task whose run
/// went on meanwhile catches up (to its gate), and one whose gate is then
/// decided with the API follows its run to the end, as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_takes_up_the_workflow_turns_it_ran() {
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("dir");
    std::fs::write(sandbox.path().join("workflows/gated.yaml"), GATED).expect("write");
    std::fs::write(sandbox.path().join("workflows/paced.yaml"), PACED).expect("write");
    let paced = "\n[[gateway.agents]]\nid = \"paced\"\nname = \"Paced\"\ndescription = \"Waits, then asks.\"\n\
                 kind = \"workflow\"\n";
    write_chorus_toml(sandbox.path(), &format!("{CATALOG}{paced}"));
    let server = sandbox.dev().no_agents().start().await;
    let address = server.address();
    let a2a = A2a::new(&server);
    let gated = a2a.send("gated", message(&unique("start"), "review")).await;
    assert_eq!(state(&gated), "TASK_STATE_INPUT_REQUIRED", "{gated:#}");
    let sent = json!({ "message": message(&unique("start"), "draft"), "configuration": { "returnImmediately": true } });
    let working = a2a.call("paced", "SendMessage", sent).await["task"].clone();
    server.kill().await;

    let server = sandbox.dev().no_agents().listen(address).start().await;
    let a2a = A2a::new(&server);
    let asked = until(&a2a, "paced", &working, "at its gate", |task| state(task) == "TASK_STATE_INPUT_REQUIRED").await;
    assert!(status_text(&asked).contains("Gate `signoff` (round 1)"), "{asked:#}");
    let done = a2a.send("paced", reply(&asked, "approve")).await;
    assert_eq!(state(&done), "TASK_STATE_COMPLETED", "{done:#}");
    let history: Vec<&str> = done["history"].as_array().into_iter().flatten().map(text).collect();
    assert_eq!(history.iter().filter(|text| text.contains("Step `draft` completed")).count(), 1, "{history:#?}");

    let mut workflows = WorkflowClient::new(server.channel().await);
    approve_with_the_api(&mut workflows, &gated).await;
    assert_eq!(state(&ended(&a2a, &gated).await), "TASK_STATE_COMPLETED");
}

/// A run held by its workflow's concurrency limit says so on its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_says_why_on_its_task() {
    let sandbox = Sandbox::new();
    std::fs::create_dir(sandbox.path().join("workflows")).expect("dir");
    let single = GATED.replace("name: gated\n", "name: gated\nconcurrency: {max: 1}\n");
    std::fs::write(sandbox.path().join("workflows/gated.yaml"), single).expect("write");
    write_chorus_toml(sandbox.path(), CATALOG);
    let server = sandbox.dev().no_agents().start().await;
    let a2a = A2a::new(&server);
    let first = a2a.send("gated", message(&unique("start"), "first")).await;
    assert_eq!(state(&first), "TASK_STATE_INPUT_REQUIRED", "{first:#}");
    let sent =
        json!({ "message": message(&unique("start"), "second"), "configuration": { "returnImmediately": true } });
    let second = a2a.call("gated", "SendMessage", sent).await["task"].clone();
    let said = |task: &Value| task["status"]["message"]["parts"][0]["text"].as_str().unwrap_or_default().to_owned();
    let queued = until(&a2a, "gated", &second, "queued", |task| said(task).contains("is queued")).await;
    assert!(status_text(&queued).ends_with("waiting for a slot: at most 1 run of `gated` at once."), "{queued:#}");

    // Input the workflow does not take: the agent rejects the task.
    let mut odd = message(&unique("start"), "odd");
    odd["parts"] = json!([{"text": "odd"}, {"data": {"colour": "blue"}}]);
    let rejected = a2a.send("gated", odd).await;
    assert_eq!(state(&rejected), "TASK_STATE_REJECTED", "{rejected:#}");
    assert!(status_text(&rejected).contains("input.colour: is not an input of gated"), "{rejected:#}");

    // A workflow an operator disabled rejects what would start a run.
    let mut workflows = WorkflowClient::new(server.channel().await);
    let disable = DisableWorkflowRequest { namespace: "default".into(), name: "gated".into(), ..Default::default() };
    workflows.disable_workflow(disable).await.expect("disable");
    let refused = a2a.send("gated", message(&unique("start"), "third")).await;
    assert_eq!(state(&refused), "TASK_STATE_REJECTED", "{refused:#}");
    assert!(status_text(&refused).contains("workflow gated is disabled"), "{refused:#}");
}
