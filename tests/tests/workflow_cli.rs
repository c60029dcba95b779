//! The workflow CLI against a real `chorus dev`: validate, apply, start,
//! list and decide gates, watch a run to its end, and the exit codes and
//! messages a person sees when something is wrong.

use std::{path::Path, process::Output};

use chorus_tests::{Sandbox, Server, server::chorus_bin};

const GATED: &str = "name: gated\nsteps:\n- id: nap\n  wait: {duration: 50ms}\n\
                     - id: signoff\n  gate: {mode: HITL, reviewers: ops, artifacts: {build: green}}\n\
                     - id: done\n  condition: \"true\"\n";
const COUNTED: &str = "name: counted\ninputs:\n  count: {type: integer, required: true}\n\
                       steps:\n- id: hold\n  wait: {signal: go}\n";

/// The CLI with `args`, pointed at `server`, run in `dir` as user ana.
fn command(server: &str, dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(chorus_bin());
    command.args(args).env("CHORUS_SERVER", server).env("USER", "ana").current_dir(dir);
    command
}

async fn chorus(server: &str, dir: &Path, args: &[&str]) -> Output {
    command(server, dir, args).output().await.expect("run the CLI")
}

/// The CLI with `args`, its output piped for the test to read (or not).
fn spawn(server: &str, dir: &Path, args: &[&str]) -> tokio::process::Child {
    let mut command = command(server, dir, args);
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    command.spawn().expect("run the CLI")
}

/// `chorus dev` without agents, and its address and folder, with `files` written there.
async fn stack(files: &[(&str, &str)]) -> (Sandbox, Server, String) {
    let sandbox = Sandbox::new();
    let server = sandbox.dev().no_agents().start().await;
    for (name, text) in files {
        std::fs::write(sandbox.path().join(name), text).expect("write");
    }
    let url = server.url().to_owned();
    (sandbox, server, url)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// What a `--json` command printed.
fn json(output: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(output))
        .unwrap_or_else(|error| panic!("{error}: {}{}", stdout(output), stderr(output)))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_applies_starts_decides_and_watches_a_workflow() {
    let bad = "name: bad\nsteps:\n- id: a\n  spawn: {agent: x}\n";
    let (sandbox, _server, url) = stack(&[("gated.yaml", GATED), ("bad.yaml", bad)]).await;
    let dir = sandbox.path();

    // Checking needs no server (nothing listens on port 1), unless the
    // server is asked; both answer alike.
    let offline = chorus("http://127.0.0.1:1", dir, &["workflow", "validate", "bad.yaml"]).await;
    let bad = chorus(&url, dir, &["workflow", "validate", "--remote", "bad.yaml"]).await;
    for bad in [&offline, &bad] {
        assert_eq!(bad.status.code(), Some(1), "{}", stderr(bad));
        assert!(
            stdout(bad).contains("bad.yaml:4:10: error in `steps[0].spawn.input` [missing_field]"),
            "{}",
            stdout(bad)
        );
    }
    assert_eq!(stdout(&offline), stdout(&bad));
    let unreachable = chorus("http://127.0.0.1:1", dir, &["workflow", "validate", "--remote", "bad.yaml"]).await;
    assert_eq!(unreachable.status.code(), Some(2), "asking a server that is not there fails the call");
    assert!(stderr(&unreachable).contains("refused"), "the cause is named: {}", stderr(&unreachable));
    let elsewhere = chorus(&url, dir, &["workflow", "list", "--namespace", "team-typo"]).await;
    assert_eq!(stderr(&elsewhere).trim(), "(namespace `team-typo` holds no workflows)");
    let bare = chorus("127.0.0.1:1", dir, &["workflow", "list"]).await;
    assert_eq!(bare.status.code(), Some(2));
    assert!(stderr(&bare).contains("expected a URL such as http://127.0.0.1:1"), "{}", stderr(&bare));
    let applied = chorus(&url, dir, &["workflow", "apply", "gated.yaml"]).await;
    assert_eq!(stdout(&applied).trim(), "gated v1", "{}", stderr(&applied));
    let again = chorus(&url, dir, &["workflow", "apply", "gated.yaml"]).await;
    assert_eq!(stdout(&again).trim(), "gated v1 (unchanged)");
    std::fs::write(
        dir.join("yearly.yaml"),
        "name: yearly\ntrigger: {cron: \"0 0 1 1 *\"}\nsteps:\n- id: a\n  condition: \"true\"\n",
    )
    .expect("write");
    let applied = chorus(&url, dir, &["workflow", "apply", "yearly.yaml"]).await;
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    let listed = stdout(&chorus(&url, dir, &["workflow", "list"]).await);
    assert!(listed.lines().any(|line| line.starts_with("gated") && line.contains(" 1 ")), "{listed}");
    assert!(listed.lines().any(|line| line.starts_with("yearly") && line.contains("cron 0 0 1 1 *")), "{listed}");
    let listed = json(&chorus(&url, dir, &["workflow", "list", "--json"]).await);
    let yearly = listed.as_array().and_then(|all| all.iter().find(|d| d["name"] == "yearly")).expect("yearly");
    assert_eq!((&yearly["version"], &yearly["triggers"][0]["cron"]), (&1.into(), &"0 0 1 1 *".into()), "{listed}");
    assert!(yearly["disabled"].is_null(), "{listed}");

    let disabled = chorus(&url, dir, &["workflow", "disable", "yearly", "--reason", "not this year"]).await;
    assert!(stdout(&disabled).starts_with("yearly disabled by "), "{}", stderr(&disabled));
    let listed = stdout(&chorus(&url, dir, &["workflow", "list"]).await);
    assert!(listed.lines().any(|line| line.starts_with("yearly") && line.contains(" disabled ")), "{listed}");
    assert!(listed.lines().any(|line| line.starts_with("gated") && line.contains(" enabled ")), "{listed}");
    let listed = json(&chorus(&url, dir, &["workflow", "list", "--json"]).await);
    let yearly = listed.as_array().and_then(|all| all.iter().find(|d| d["name"] == "yearly")).expect("yearly");
    assert_eq!(yearly["disabled"]["reason"], "not this year", "{listed}");
    let refused = chorus(&url, dir, &["run", "start", "yearly"]).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    assert!(stderr(&refused).contains("yearly is disabled by ") && stderr(&refused).contains("(not this year)"));
    let tried = chorus(&url, dir, &["run", "start", "yearly", "--while-disabled", "--watch"]).await;
    assert_eq!(tried.status.code(), Some(0), "an operator's try runs: {}", stderr(&tried));
    let source = chorus(&url, dir, &["workflow", "source", "yearly", "--version", "1"]).await;
    assert_eq!(stdout(&source), std::fs::read_to_string(dir.join("yearly.yaml")).expect("read"), "as applied");
    let missing = chorus(&url, dir, &["workflow", "source", "yearly", "--version", "9"]).await;
    assert!(stderr(&missing).contains("workflow yearly has no version 9"), "{}", stderr(&missing));
    let enabled = chorus(&url, dir, &["workflow", "enable", "yearly"]).await;
    assert_eq!(stdout(&enabled).trim(), "yearly enabled (v1)", "{}", stderr(&enabled));
    let unknown = chorus(&url, dir, &["workflow", "disable", "nope"]).await;
    assert_eq!(unknown.status.code(), Some(2));
    assert!(stderr(&unknown).contains("workflow nope is not defined"), "{}", stderr(&unknown));

    let started = chorus(&url, dir, &["run", "start", "gated"]).await;
    let run_id = stdout(&started).trim().to_owned();
    assert!(!run_id.is_empty(), "{}", stderr(&started));
    let gates = loop {
        let gates = stdout(&chorus(&url, dir, &["gate", "list"]).await);
        if gates.contains("signoff") {
            break gates;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        gates.lines().any(|line| line.contains(&run_id) && line.contains("signoff") && line.contains("ops")),
        "{gates}"
    );
    assert!(gates.contains(&format!("{run_id} signoff#1:\n  build: green\n")), "what is decided on: {gates}");
    assert!(gates.lines().next().is_some_and(|header| header.contains("WAITING SINCE")), "{gates}");
    let gates = json(&chorus(&url, dir, &["gate", "list", "--json"]).await);
    let gate = &gates[0];
    assert!(gate["waiting_since"].as_str().is_some_and(|at| at.ends_with('Z')), "{gate}");
    assert_eq!(
        (&gate["run_id"], &gate["step_id"], &gate["iteration"]),
        (&run_id.clone().into(), &"signoff".into(), &1.into())
    );
    assert_eq!(
        (&gate["input"]["reviewers"], &gate["input"]["artifacts"]["build"]),
        (&"ops".into(), &"green".into()),
        "{gates}"
    );
    let shown = stdout(&chorus(&url, dir, &["run", "get", &run_id]).await);
    assert!(shown.contains("gate signoff#1 decides on:\n  build: green\n"), "{shown}");

    // A decision on a round the gate is not at (the reviewer looked at another) changes nothing.
    let stale = ["gate", "approve", &run_id, "signoff", "--iteration", "2"];
    let stale = chorus(&url, dir, &stale).await;
    assert_eq!(stale.status.code(), Some(2), "{}{}", stdout(&stale), stderr(&stale));
    assert!(stderr(&stale).contains("iteration"), "{}", stderr(&stale));
    let rejected = ["gate", "reject", &run_id, "signoff", "--feedback", "needs numbers", "--iteration", "1"];
    let rejected = chorus(&url, dir, &rejected).await;
    assert!(stdout(&rejected).contains("signoff#1: rerun"), "{}{}", stdout(&rejected), stderr(&rejected));
    let watch = tokio::spawn({
        let (url, dir) = (url.clone(), dir.to_owned());
        let run_id = run_id.clone();
        async move { chorus(&url, &dir, &["run", "watch", &run_id]).await }
    });
    let waited = tokio::spawn({
        let (url, dir) = (url.clone(), dir.to_owned());
        let run_id = run_id.clone();
        async move { chorus(&url, &dir, &["run", "get", &run_id, "--wait", "--json"]).await }
    });
    loop {
        let approved = chorus(&url, dir, &["gate", "approve", &run_id, "signoff"]).await;
        if approved.status.success() {
            assert!(stdout(&approved).contains("signoff#2: continued"), "{}", stdout(&approved));
            break;
        }
        assert!(stderr(&approved).contains("not waiting"), "{}", stderr(&approved));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let watched = watch.await.expect("watch");
    assert_eq!(watched.status.code(), Some(0), "{}", stderr(&watched));
    let lines = stdout(&watched);
    assert!(lines.contains("gate signoff#1: reject by ana → rerun: needs numbers"), "{lines}");
    assert!(lines.contains("gate signoff#2: approve by ana → continued"), "{lines}");
    assert!(lines.trim_end().ends_with("run completed"), "{lines}");
    for waiting in ["signoff #1.1 waiting", "signoff #2.1 waiting"] {
        assert_eq!(lines.matches(waiting).count(), 1, "announced, the gate is still shown once: {lines}");
    }

    let waited = waited.await.expect("get --wait");
    let waited: serde_json::Value = serde_json::from_str(&stdout(&waited)).expect("the run as JSON");
    assert_eq!(waited["state"], "RUN_STATE_COMPLETED", "{waited}");
    let times = ["created_at", "started_at", "finished_at"].map(|at| waited["steps"][0][at].as_str().unwrap_or("-"));
    assert!(times.iter().all(|at| at.ends_with('Z')) && times[0] <= times[2], "each step's times: {waited}");
    assert!(waited["gate_decisions"][1]["decided_at"].is_string(), "{waited}");
    let shown = stdout(&chorus(&url, dir, &["run", "get", &run_id]).await);
    assert!(shown.contains("completed") && shown.contains("nap") && shown.contains("done"), "{shown}");
    let canceled = chorus(&url, dir, &["run", "cancel", &run_id]).await;
    assert_eq!(canceled.status.code(), Some(1), "the answer is no: {}", stderr(&canceled));
    assert!(stderr(&canceled).contains("already completed"), "{}", stderr(&canceled));
    let missing = chorus(&url, dir, &["run", "start", "gated", "--input", "x=1"]).await;
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("input.x"), "{}", stderr(&missing));

    // Every unfinished run of a workflow at once; a list that stops short says so.
    for _ in 0..3 {
        assert_eq!(chorus(&url, dir, &["run", "start", "gated"]).await.status.code(), Some(0));
    }
    let short = chorus(&url, dir, &["run", "list", "--limit", "2"]).await;
    assert_eq!(stdout(&short).lines().count(), 3, "a header and two runs: {}", stdout(&short));
    assert!(stderr(&short).contains("more runs than the 2 listed"), "{}", stderr(&short));
    let all = chorus(&url, dir, &["run", "list", "--limit", "50"]).await;
    assert!(stderr(&all).is_empty(), "{}", stderr(&all));
    let canceled = chorus(&url, dir, &["run", "cancel", "--workflow", "gated", "--reason", "incident"]).await;
    assert_eq!(canceled.status.code(), Some(0), "{}", stderr(&canceled));
    assert_eq!(stdout(&canceled).lines().filter(|line| line.ends_with(" canceled")).count(), 3);
    assert!(stderr(&canceled).starts_with("canceled 3 runs of gated"), "{}", stderr(&canceled));
    let left = json(&chorus(&url, dir, &["run", "list", "--workflow", "gated", "--state", "waiting", "--json"]).await);
    assert_eq!(left.as_array().map(Vec::len), Some(0), "{left}");
    let unknown = chorus(&url, dir, &["run", "cancel", "--workflow", "nope"]).await;
    assert_eq!(unknown.status.code(), Some(2));
    let neither = chorus(&url, dir, &["run", "cancel"]).await;
    assert_eq!(neither.status.code(), Some(2));
    assert!(stderr(&neither).contains("name the runs to cancel"), "{}", stderr(&neither));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_is_told_why_a_call_was_refused() {
    let forever = GATED.replace("50ms", "99999999d");
    let files = [("gated.yaml", GATED), ("counted.yaml", COUNTED), ("forever.yaml", forever.as_str())];
    let (sandbox, _server, url) = stack(&files).await;
    let dir = sandbox.path();
    std::fs::create_dir(dir.join("empty")).expect("mkdir");

    for (namespace, says) in [("", "error: namespace: is required"), ("BAD", "error: namespace: must be 1-63")] {
        let refused = chorus(&url, dir, &["workflow", "apply", "--namespace", namespace, "gated.yaml"]).await;
        assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
        assert!(stderr(&refused).starts_with(says), "{}", stderr(&refused));
    }
    std::fs::write(dir.join("broken.toml"), "bogus_key = 1\n").expect("write");
    let misconfigured = chorus(&url, dir, &["run", "list", "--config", "broken.toml"]).await;
    assert_eq!(misconfigured.status.code(), Some(2), "the command could not run: {}", stderr(&misconfigured));
    assert!(stderr(&misconfigured).starts_with("error: invalid configuration"), "{}", stderr(&misconfigured));
    let empty = chorus(&url, dir, &["workflow", "apply", "gated.yaml", "empty"]).await;
    assert_eq!(empty.status.code(), Some(2));
    assert_eq!(stderr(&empty).trim(), "error: empty has no *.yaml or *.yml files");
    assert_eq!(stdout(&empty), "", "nothing was applied");
    let forever = chorus(&url, dir, &["workflow", "validate", "forever.yaml"]).await;
    assert_eq!(forever.status.code(), Some(1));
    assert!(
        stdout(&forever).contains("forever.yaml:4:20: error in `steps[0].wait.duration` [out_of_range]"),
        "{}",
        stdout(&forever)
    );

    // An empty file is an invalid definition like any other: named, the
    // files after it still checked, and, as one file is invalid, nothing
    // applied.
    std::fs::create_dir(dir.join("mixed")).expect("mkdir");
    std::fs::write(dir.join("mixed/1-blank.yaml"), "").expect("write");
    std::fs::write(dir.join("mixed/2-held.yaml"), COUNTED.replace("name: counted", "name: held")).expect("write");
    let mixed = chorus(&url, dir, &["workflow", "validate", "mixed"]).await;
    assert_eq!(mixed.status.code(), Some(1), "{}", stderr(&mixed));
    let out = stdout(&mixed);
    assert!(out.starts_with("mixed/1-blank.yaml:1:1: error [document_count]: expected exactly one"), "{out}");
    assert!(out.ends_with("mixed/2-held.yaml: ok (held)\n"), "{out}");
    let mixed = chorus(&url, dir, &["workflow", "apply", "mixed"]).await;
    assert_eq!(mixed.status.code(), Some(1), "{}", stderr(&mixed));
    assert!(stdout(&mixed).starts_with("mixed/1-blank.yaml:1:1: error [document_count]"), "{}", stdout(&mixed));
    assert!(!stdout(&mixed).contains("held v1"), "{}", stdout(&mixed));
    assert_eq!(stderr(&mixed).trim(), "nothing applied");
    // Two files that define one workflow: the second is named, nothing applied.
    std::fs::create_dir(dir.join("twice")).expect("mkdir");
    std::fs::write(dir.join("twice/a.yaml"), GATED).expect("write");
    std::fs::write(dir.join("twice/b.yaml"), GATED.replace("50ms", "60ms")).expect("write");
    let twice = chorus(&url, dir, &["workflow", "apply", "twice"]).await;
    assert_eq!(twice.status.code(), Some(1), "{}", stderr(&twice));
    assert_eq!(
        stdout(&twice).trim(),
        "twice/b.yaml:1:1: error in `name` [duplicate_name]: workflow `gated` is also defined in twice/a.yaml"
    );
    let listed = stdout(&chorus(&url, dir, &["workflow", "list"]).await);
    assert!(!listed.contains("held") && !listed.contains("gated"), "nothing was applied: {listed}");
    let unknown_names: [&[&str]; 3] = [
        &["workflow", "list", "--name", "nosuch"],
        &["run", "list", "--workflow", "nosuch"],
        &["gate", "list", "--workflow", "nosuch"],
    ];
    for args in unknown_names {
        let unknown = chorus(&url, dir, args).await;
        assert_eq!(unknown.status.code(), Some(2), "{args:?}: {}", stdout(&unknown));
        assert!(stderr(&unknown).contains("no workflow `nosuch` in namespace default"), "{}", stderr(&unknown));
    }
    let checked = chorus(&url, dir, &["workflow", "validate", "twice"]).await;
    assert_eq!(checked.status.code(), Some(1), "{}", stderr(&checked));
    let said = stdout(&checked);
    assert!(said.contains("twice/a.yaml: ok (gated)") && !said.contains("twice/b.yaml: ok"), "{said}");

    let applied = chorus(&url, dir, &["workflow", "apply", "gated.yaml", "counted.yaml"]).await;
    assert_eq!(stdout(&applied), "gated v1\ncounted v1\n", "{}", stderr(&applied));
    let start = ["run", "start", "counted", "--input", "count=5", "--idempotency-key", "k1"];
    let started = chorus(&url, dir, &start).await;
    assert_eq!(started.status.code(), Some(0), "an integer input: {}", stderr(&started));
    let run_id = stdout(&started).trim().to_owned();
    let again = chorus(&url, dir, &start).await;
    assert_eq!(stdout(&again).trim(), run_id, "a retry answers the run it started");
    let other = chorus(&url, dir, &["run", "start", "gated", "--idempotency-key", "k1"]).await;
    assert_eq!(other.status.code(), Some(2), "{}", stdout(&other));
    let expected = format!(
        "error: idempotency key `k1` is already used by run {run_id} of counted v1, which is not a run of gated"
    );
    assert!(stderr(&other).starts_with(&expected), "{}", stderr(&other));
    let signal = ["run", "signal", &run_id, "go", "--payload", r#"{"by": "ana"}"#, "--id", "go-1"];
    let signaled = chorus(&url, dir, &signal).await;
    assert_eq!(signaled.status.code(), Some(0), "{}", stderr(&signaled));
    assert_eq!(stdout(&signaled).trim(), "go-1");
    let retried = chorus(&url, dir, &signal).await;
    assert_eq!(stdout(&retried).trim(), "go-1 (duplicate)", "a retry is kept once: {}", stderr(&retried));
    let shown = chorus(&url, dir, &["run", "get", &run_id, "--wait", "--json"]).await;
    let shown: serde_json::Value = serde_json::from_str(&stdout(&shown)).expect("the run as JSON");
    assert_eq!(shown["input"], serde_json::json!({"count": 5}), "{shown}");
    assert_eq!(shown["signals"].as_array().map(Vec::len), Some(1), "{shown}");
    let signal = &shown["signals"][0];
    assert_eq!((&signal["name"], &signal["payload"]["by"]), (&serde_json::json!("go"), &serde_json::json!("ana")));
    assert_eq!(signal["consumed_by_step_id"], "hold", "{shown}");
    let listed = stdout(&chorus(&url, dir, &["run", "list"]).await);
    assert_eq!(listed.lines().count(), 2, "a header and the one run: {listed}");
    let listed = json(&chorus(&url, dir, &["run", "list", "--json"]).await);
    assert_eq!((&listed[0]["id"], &listed[0]["input"]), (&run_id.clone().into(), &shown["input"]), "{listed}");
    assert!(listed[0].get("steps").is_none(), "a listing carries no steps: {listed}");
    let none = chorus(&url, dir, &["run", "list", "--limit", "0"]).await;
    assert_eq!(none.status.code(), Some(2), "{}", stdout(&none));
    assert!(stderr(&none).contains("--limit"), "{}", stderr(&none));

    // What reads as JSON is text for an input the workflow declares a string.
    let tagged = "name: tagged\ninputs:\n  version: {type: string}\n  n: {type: number}\nsteps:\n\
                  - id: hold\n  wait: {signal: go}\n";
    std::fs::write(dir.join("tagged.yaml"), tagged).expect("write");
    chorus(&url, dir, &["workflow", "apply", "tagged.yaml"]).await;
    let unquoted = chorus(&url, dir, &["run", "start", "tagged", "--input", "version=1.2", "--input", "n=1.2"]).await;
    assert_eq!(unquoted.status.code(), Some(0), "{}", stderr(&unquoted));
    let tagged_run = stdout(&unquoted).trim().to_owned();
    let shown = chorus(&url, dir, &["run", "get", &tagged_run, "--json"]).await;
    let shown: serde_json::Value = serde_json::from_str(&stdout(&shown)).expect("the run as JSON");
    assert_eq!(
        (&shown["input"]["version"], &shown["input"]["n"]),
        (&serde_json::json!("1.2"), &serde_json::json!(1.2))
    );

    // A reader that stops reading (`| head`) ends the command quietly.
    let mut piped = spawn(&url, dir, &["run", "get", &run_id, "--json"]);
    drop(piped.stdout.take());
    let ended = piped.wait_with_output().await.expect("the CLI ends");
    assert_eq!(ended.status.code(), Some(0), "{}", stderr(&ended));
    assert!(!stderr(&ended).contains("panicked"), "{}", stderr(&ended));

    // A watch of a run that waits is stopped by SIGTERM (or Ctrl-C) at once.
    let started = chorus(&url, dir, &["run", "start", "counted", "--input", "count=1"]).await;
    let waiting = stdout(&started).trim().to_owned();
    let mut watch = spawn(&url, dir, &["run", "watch", &waiting]);
    // Once it prints, it is watching (and handles its signals).
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().expect("stdout")));
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "the watch printed the run's first event: {first:?}");
    let pid = watch.id().expect("a pid").to_string();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill");
    assert!(killed.success());
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(10), watch.wait_with_output())
        .await
        .expect("the watch stops on SIGTERM")
        .expect("the CLI ends");
    assert_eq!(stopped.status.code(), Some(130), "{}", stderr(&stopped));
    assert!(
        !stderr(&stopped).contains("shutdown signal received"),
        "a person's terminal is no log: {}",
        stderr(&stopped)
    );

    // A run that ended otherwise than completed says why, in watch and in get.
    let canceled = chorus(&url, dir, &["run", "cancel", &waiting, "--reason", "no longer needed"]).await;
    assert_eq!(canceled.status.code(), Some(0), "{}", stderr(&canceled));
    // A script's retry of a cancel whose answer it lost gets what it asked for.
    let again = chorus(&url, dir, &["run", "cancel", &waiting]).await;
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stdout(&again).trim_end().ends_with("canceled (already)"), "{}", stdout(&again));
    let watched = chorus(&url, dir, &["run", "watch", &waiting]).await;
    assert_eq!(watched.status.code(), Some(1), "not completed: {}", stderr(&watched));
    let last = stdout(&watched).lines().last().unwrap_or_default().to_owned();
    assert!(last.ends_with("run canceled: no longer needed (canceled by ana)"), "{}", stdout(&watched));
    let shown = chorus(&url, dir, &["run", "get", &waiting, "--json"]).await;
    let shown: serde_json::Value = serde_json::from_str(&stdout(&shown)).expect("the run as JSON");
    assert_eq!(shown["cancel_reason"], "no longer needed (canceled by ana)", "{shown}");
    assert_eq!(shown["origin"]["started_by"], "ana", "{shown}");
    assert!(shown["created_at"].as_str().is_some_and(|at| at.ends_with('Z')), "{shown}");
    assert!(shown["finished_at"].is_string(), "{shown}");
}

/// A watch outlives a restart of its server: it picks the run up again after
/// the last event it printed, and ends with the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_goes_on_across_a_server_restart() {
    let (sandbox, server, url) = stack(&[("counted.yaml", COUNTED)]).await;
    let dir = sandbox.path();
    let applied = chorus(&url, dir, &["workflow", "apply", "counted.yaml"]).await;
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    let started = chorus(&url, dir, &["run", "start", "counted", "--input", "count=1"]).await;
    let run_id = stdout(&started).trim().to_owned();
    let mut watch = spawn(&url, dir, &["run", "watch", &run_id]);
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().expect("stdout")));
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "the watch printed the run's first event: {first:?}");

    let address = server.address();
    server.kill().await;
    let server = sandbox.dev().no_agents().listen(address).start().await;
    let signaled = chorus(server.url(), dir, &["run", "signal", &run_id, "go"]).await;
    assert_eq!(signaled.status.code(), Some(0), "{}", stderr(&signaled));

    let mut rest = Vec::new();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(chorus_tests::DEADLINE, lines.next_line()).await {
        rest.push(line);
    }
    let ended = tokio::time::timeout(chorus_tests::DEADLINE, watch.wait()).await.expect("the watch ends");
    assert_eq!(ended.expect("exit status").code(), Some(0), "the run completed: {rest:#?}");
    assert!(rest.last().is_some_and(|line| line.contains("completed")), "{rest:#?}");
}

/// `run get --wait` waits for the run however long it takes: a server
/// answers a waiting call when its request timeout passes, and the CLI asks
/// again rather than failing with "Timeout expired".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_run_outlasts_the_server_s_request_timeout() {
    let sandbox = Sandbox::new();
    let slow = "name: slow\nsteps:\n- id: nap\n  wait: {duration: 1500ms}\n";
    std::fs::write(sandbox.path().join("slow.yaml"), slow).expect("write");
    let server = sandbox
        .dev()
        .no_agents()
        .env("CHORUS_SERVER__REQUEST_TIMEOUT_MS", "300")
        .env("CHORUS_GATEWAY__BLOCKING_TIMEOUT_MS", "200")
        .start()
        .await;
    let (url, dir) = (server.url(), sandbox.path());
    let applied = chorus(url, dir, &["workflow", "apply", "slow.yaml"]).await;
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    let started = chorus(url, dir, &["run", "start", "slow"]).await;
    let run_id = stdout(&started).trim().to_owned();
    let shown = chorus(url, dir, &["run", "get", &run_id, "--wait", "--json"]).await;
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let run: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("json");
    assert_eq!(run["state"], "RUN_STATE_COMPLETED", "{run:#}");
}

/// Without `--server` (or `CHORUS_SERVER`), the CLI goes where a `chorus
/// dev` of the same configuration file listens, a wildcard address read as
/// this machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_goes_where_its_configuration_listens() {
    let (sandbox, server, _url) = stack(&[]).await;
    let port = server.address().port();
    for listen in [format!("127.0.0.1:{port}"), format!("0.0.0.0:{port}")] {
        let dir = sandbox.path().join(format!("cli-{}", listen.replace([':', '.'], "-")));
        std::fs::create_dir(&dir).expect("dir");
        std::fs::write(dir.join("chorus.toml"), format!("listen = \"{listen}\"\n")).expect("write");
        let mut command = tokio::process::Command::new(chorus_bin());
        command.args(["run", "list"]).env_remove("CHORUS_SERVER").current_dir(&dir);
        let output = command.output().await.expect("run the CLI");
        assert!(output.status.success(), "listen = {listen}: {}", stderr(&output));
    }
}
