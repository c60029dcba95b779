//! Parsing and validation: what a user sees for good and bad definitions.

use super::parse;
use crate::domain::{Action, JoinMode, MessageTarget, Severity, Trigger};

const PR_REVIEW: &str = include_str!("../../../../workflows/pr-review.yaml");

fn codes(source: &str) -> Vec<(String, u32, String)> {
    parse(source, "wf.yaml").problems.into_iter().map(|p| (p.code, p.line, p.field)).collect()
}

#[test]
fn the_shipped_pr_review_example_is_valid() {
    let parsed = parse(PR_REVIEW, "workflows/pr-review.yaml");
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    let spec = parsed.spec.expect("valid");
    assert_eq!(spec.name, "pr-review");
    assert!(matches!(spec.trigger, Trigger::Event { ref event_type, .. } if event_type == "tool:called"));
    assert_eq!(spec.steps.len(), 3);
    assert!(spec.steps[1].condition.is_some());
}

#[test]
fn malformed_yaml_names_file_line_and_column() {
    let parsed = parse("name: x\nsteps: [\n  - id: a\n", "bad.yaml");
    assert!(parsed.spec.is_none());
    let problem = &parsed.problems[0];
    assert_eq!((problem.file.as_str(), problem.code.as_str()), ("bad.yaml", "yaml_syntax"));
    assert!(problem.line >= 2 && problem.column >= 1, "{problem}");
}

#[test]
fn unknown_step_kind_and_missing_fields_are_all_reported() {
    let source = "name: x\nsteps:\n  - id: a\n    deploy: {}\n  - id: b\n    spawn:\n      input: hi\n  - spawn:\n      role: r\n      input: hi\n";
    let found = codes(source);
    assert!(found.contains(&("unknown_step_kind".into(), 4, "steps[0].deploy".into())), "{found:?}");
    assert!(found.contains(&("missing_field".into(), 7, "steps[1].spawn".into())), "{found:?}");
    assert!(found.contains(&("missing_field".into(), 8, "steps[2].id".into())), "{found:?}");
}

#[test]
fn template_syntax_errors_point_at_the_field() {
    let source = "name: x\nsteps:\n  - id: a\n    message:\n      topic: t\n      text: \"{{ oops \"\n";
    let parsed = parse(source, "wf.yaml");
    assert!(parsed.spec.is_none());
    let problem = parsed.problems.iter().find(|p| p.code == "bad_expression").expect("bad expression");
    assert_eq!((problem.line, problem.field.as_str()), (6, "steps[0].message.text"));
}

#[test]
fn forward_and_unknown_references_are_rejected() {
    let source = "name: x\nsteps:\n  - id: a\n    spawn: {role: r, input: \"{{ b.output }}\"}\n  - id: b\n    condition: \"{{ nope.x }} > 1\"\n    spawn: {role: r, input: \"{{ a.output }}\"}\n";
    let found = codes(source);
    assert!(found.contains(&("forward_reference".into(), 4, "steps[0].spawn.input".into())), "{found:?}");
    assert!(found.contains(&("unknown_reference".into(), 6, "steps[1].condition".into())), "{found:?}");
}

#[test]
fn the_event_is_named_event_only_in_the_trigger_condition() {
    let source = "name: x\ntrigger:\n  event: order.placed\n  condition: \"{{ event.amount }} > {{ trigger.min }}\"\n\
                  steps:\n  - id: a\n    spawn: {role: r, input: \"{{ event.id }} {{ trigger.id }}\"}\n";
    let parsed = parse(source, "wf.yaml");
    let [problem] = parsed.problems.as_slice() else { panic!("one problem expected: {:?}", parsed.problems) };
    assert_eq!(
        (problem.code.as_str(), problem.line, problem.field.as_str()),
        ("unknown_reference", 7, "steps[0].spawn.input")
    );
    assert!(problem.message.contains("steps see its payload as `trigger`"), "{problem}");
}

#[test]
fn a_step_with_an_error_can_still_be_named_by_later_steps() {
    let source = concat!(
        "name: x\nsteps:\n  - id: notify\n    message: {webhook: \"hooks.example.com/x\", text: hi}\n",
        "  - id: report\n    spawn: {role: r, input: \"{{ notify.output.status }}\"}\n",
    );
    let codes: Vec<String> = codes(source).into_iter().map(|(code, _, _)| code).collect();
    assert_eq!(codes, ["bad_url"], "only the bad step's own problem");
}

#[test]
fn a_gate_reports_every_bad_field_at_once() {
    let source = concat!(
        "name: x\nsteps:\n  - id: g\n",
        "    gate: {mode: manual, reviewers: ops, max_rejections: -1, on_exhausted: never, expires_after: forever}\n",
    );
    let fields: Vec<String> = codes(source).into_iter().map(|(_, _, field)| field).collect();
    assert_eq!(
        fields,
        [
            "steps[0].gate.mode",
            "steps[0].gate.max_rejections",
            "steps[0].gate.on_exhausted",
            "steps[0].gate.expires_after"
        ]
    );
}

#[test]
fn a_parallel_step_takes_a_positive_max_concurrency() {
    let source = |max: &str| {
        format!(
            "name: x\nsteps:\n  - id: fan\n    parallel:\n      max_concurrency: {max}\n      branches:\n\
             \x20       - {{name: a, steps: [{{id: s1, wait: {{duration: 1s}}}}]}}\n\
             \x20       - {{name: b, steps: [{{id: s2, wait: {{duration: 1s}}}}]}}\n"
        )
    };
    assert!(codes(&source("2")).is_empty(), "{:?}", codes(&source("2")));
    for bad in ["0", "-1", "many", "1.5"] {
        let found = codes(&source(bad));
        let fields: Vec<(&str, u32, &str)> = found.iter().map(|(c, l, f)| (c.as_str(), *l, f.as_str())).collect();
        let code = if bad == "0" || bad == "-1" { "out_of_range" } else { "wrong_type" };
        assert_eq!(fields, [(code, 5, "steps[0].parallel.max_concurrency")], "max_concurrency: {bad}");
    }
}

#[test]
fn a_parallel_step_takes_at_most_a_thousand_branches() {
    let source = |count: usize| {
        let branches: String = (0..count)
            .map(|n| format!("      - {{name: b{n}, steps: [{{id: s{n}, wait: {{duration: 1s}}}}]}}\n"))
            .collect();
        format!("name: x\nsteps:\n  - id: fan\n    parallel:\n      branches:\n{branches}")
    };
    assert!(codes(&source(1_000)).is_empty());
    let found = codes(&source(1_001));
    let found: Vec<(&str, u32, &str)> = found.iter().map(|(c, l, f)| (c.as_str(), *l, f.as_str())).collect();
    assert_eq!(found, [("too_many_branches", 6, "steps[0].parallel.branches")]);
}

#[test]
fn a_triggered_workflow_is_warned_of_an_input_its_runs_cannot_have() {
    let source = concat!(
        "name: x\ntrigger: {event: order.shipped}\ninputs:\n  id: {type: string, required: true}\n",
        "  note: {type: string}\nsteps:\n  - id: a\n    spawn: {role: r, input: \"{{ inputs.id }}\"}\n",
    );
    let parsed = parse(source, "wf.yaml");
    assert!(parsed.spec.is_some(), "a warning: the workflow may still be started by hand");
    let found: Vec<_> = parsed.problems.iter().map(|p| (p.severity, p.code.as_str(), p.field.as_str())).collect();
    assert_eq!(found, [(Severity::Warning, "untriggerable_input", "inputs.id")]);
    assert!(codes(&source.replace("trigger: {event: order.shipped}\n", "")).is_empty(), "manual: nothing to say");
}

#[test]
fn a_duration_without_its_unit_is_told_what_is_expected() {
    let source = concat!(
        "name: x\nsteps:\n  - id: a\n    spawn: {role: r, input: go, timeout: 10}\n",
        "  - id: b\n    wait: {duration: 0s}\n",
    );
    let parsed = parse(source, "wf.yaml");
    let found: Vec<_> = parsed.problems.iter().map(|p| (p.code.as_str(), p.message.as_str())).collect();
    assert_eq!(
        found,
        [
            ("bad_duration", "expected a duration with its unit, such as 30s or 5m, found an integer"),
            ("bad_duration", "expected a positive duration such as 30s, 5m, 24h or 7d, found `0s`"),
        ]
    );
}

#[test]
fn duplicate_ids_are_rejected_even_inside_branches() {
    let source = "name: x\nsteps:\n  - id: a\n    wait: {duration: 1s}\n  - id: p\n    parallel:\n      branches:\n        - name: one\n          steps: [{id: a, wait: {duration: 1s}}]\n        - name: two\n          steps: [{id: c, wait: {signal: go}}]\n";
    let found = codes(source);
    assert!(
        found.contains(&("duplicate_step_id".into(), 9, "steps[1].parallel.branches[0].steps[0].id".into())),
        "{found:?}"
    );
    let parsed = parse(source, "wf.yaml");
    let duplicate = parsed.problems.iter().find(|p| p.code == "duplicate_step_id").expect("the duplicate");
    assert!(duplicate.message.contains("already used, on line 3"), "where the id was first used: {duplicate:?}");
}

#[test]
fn sibling_branches_cannot_see_each_other_but_later_steps_see_both() {
    let source = "name: x\nsteps:\n  - id: p\n    parallel:\n      mode: all_settled\n      branches:\n        - name: one\n          steps: [{id: b1, wait: {duration: 1s}}]\n        - name: two\n          steps: [{id: b2, spawn: {role: r, input: \"{{ b1.output }}\"}}]\n  - id: after\n    spawn: {role: r, input: \"{{ b1.output }} {{ b2.output }}\"}\n";
    let parsed = parse(source, "wf.yaml");
    let codes: Vec<&str> = parsed.problems.iter().map(|p| p.code.as_str()).collect();
    assert_eq!(codes, ["forward_reference"], "{:?}", parsed.problems);
    let fixed = source.replace("{{ b1.output }}\"}}]", "hi\"}}]");
    let spec = parse(&fixed, "wf.yaml").spec.expect("valid");
    let Action::Parallel(parallel) = &spec.steps[0].action else { panic!("not parallel") };
    assert_eq!(parallel.mode, JoinMode::AllSettled);
}

#[test]
fn gates_cron_and_inputs_are_checked() {
    let source = "name: x\ntrigger: {cron: \"not a cron\"}\ninputs:\n  repo: {type: text}\nsteps:\n  - id: build\n    spawn: {role: r, input: go}\n  - id: release\n    gate: {mode: HITL, on_exhausted: escalate, rerun_from: later}\n";
    let found = codes(source);
    for expected in ["bad_cron", "bad_value", "missing_field", "bad_reference"] {
        assert!(found.iter().any(|(code, ..)| code == expected), "{expected} not in {found:?}");
    }
}

#[test]
fn a_valid_gate_and_warnings_do_not_block() {
    let source = "name: x\ntrigger: manual\ninputs: {task: {}, repo: {}}\nsteps:\n  - id: build\n    spawn: {agent: coder, input: {task: \"{{ inputs.task }}\"}}\n  - id: release\n    gate:\n      mode: HITL\n      reviewers: release-managers\n      rerun_from: build\n      max_rejections: 2\n      on_exhausted: escalate\n      escalate_to: cto\n      expires_after: 2d\nstate: {persistence: sqlite, retention: 7d}\nconcurrency: {max: 2, key: \"{{ inputs.repo }}\"}\n";
    let parsed = parse(source, "wf.yaml");
    assert!(parsed.spec.is_some(), "{:?}", parsed.problems);
    assert_eq!(parsed.problems.len(), 1);
    assert_eq!(parsed.problems[0].code, "persistence_backend");
}

#[test]
fn a_step_knows_the_names_its_templates_and_condition_use() {
    let source = "name: x\ninputs: {who: {}}\nsteps:\n  - id: a\n    message: {topic: t, text: hi}\n  - id: b\n    condition: \"{{ a.output.ok }}\"\n    message: {to: \"{{ inputs.who }}\", text: \"{{ run.id }} {{ a.error | default('') }}\"}\n";
    let parsed = parse(source, "wf.yaml");
    assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
    let steps = parsed.spec.expect("valid").steps;
    assert!(steps[0].roots.is_empty(), "{:?}", steps[0].roots);
    assert_eq!(steps[1].roots.iter().map(String::as_str).collect::<Vec<_>>(), ["a", "inputs", "run"]);
}

#[test]
fn a_gate_in_a_branch_reruns_only_steps_before_it_in_its_branch() {
    let source = |target: &str| {
        format!(
            "name: x\nsteps:\n  - id: build\n    spawn: {{role: r, input: go}}\n  - id: fan\n    parallel:\n      branches:\n        - name: one\n          steps:\n            - id: work\n              spawn: {{role: r, input: go}}\n            - id: check\n              gate: {{mode: HITL, reviewers: ops, rerun_from: {target}}}\n        - name: two\n          steps: [{{id: other, wait: {{duration: 1s}}}}]\n  - id: release\n    gate: {{mode: HITL, reviewers: ops, rerun_from: work}}\n"
        )
    };
    let parsed = parse(&source("build"), "wf.yaml");
    let errors: Vec<_> = parsed.problems.iter().filter(|p| p.severity == Severity::Error).collect();
    let [problem] = errors.as_slice() else { panic!("one error expected: {:?}", parsed.problems) };
    assert_eq!(
        (problem.code.as_str(), problem.line, problem.field.as_str()),
        ("bad_reference", 13, "steps[1].parallel.branches[0].steps[1].gate.rerun_from")
    );
    assert!(problem.message.contains("`build` is outside this gate's parallel branch"), "{problem}");
    let sibling = codes(&source("other"));
    assert_eq!(
        sibling,
        [
            ("bad_reference".into(), 13, "steps[1].parallel.branches[0].steps[1].gate.rerun_from".into()),
            ("reruns_parallel".into(), 17, "steps[2].gate.rerun_from".into()),
        ]
    );
    let within = parse(&source("work"), "wf.yaml");
    assert!(within.spec.is_some(), "a step of its own branch, and for a top-level gate a step in an earlier parallel");
    let [warning] = within.problems.as_slice() else { panic!("one warning expected: {:?}", within.problems) };
    assert_eq!(
        (warning.severity, warning.code.as_str(), warning.field.as_str()),
        (Severity::Warning, "reruns_parallel", "steps[2].gate.rerun_from"),
        "the top-level gate is told it reruns the whole parallel step: {warning}"
    );
    assert!(warning.message.contains("reruns all of `fan`"), "{warning}");
    let from_an_earlier_branch = concat!(
        "name: x\nsteps:\n  - id: fan\n    parallel:\n      branches:\n        - name: one\n",
        "          steps: [{id: work, wait: {duration: 1s}}]\n        - name: two\n          steps:\n",
        "            - id: check\n              gate: {mode: HITL, reviewers: ops, rerun_from: work}\n",
    );
    let parsed = parse(from_an_earlier_branch, "wf.yaml");
    let problem = parsed.problems.iter().find(|p| p.code == "bad_reference").expect("refused");
    assert!(problem.message.contains("`work` (line 7) is in another branch of a parallel step"), "{problem}");
}

#[test]
fn durations_past_a_century_are_rejected() {
    let source = |duration: &str| {
        format!(
            "name: x\nsteps:\n  - id: nap\n    wait: {{duration: {duration}}}\n  - id: ok\n    gate: {{mode: HITL, reviewers: ops, expires_after: {duration}}}\n"
        )
    };
    let parsed = parse(&source("99999999d"), "wf.yaml");
    let found: Vec<(&str, u32, &str)> =
        parsed.problems.iter().map(|p| (p.code.as_str(), p.line, p.field.as_str())).collect();
    assert_eq!(
        found,
        [("out_of_range", 4, "steps[0].wait.duration"), ("out_of_range", 6, "steps[1].gate.expires_after")]
    );
    assert!(
        parsed.problems[0].message.contains("at most 100 years (36500d), found `99999999d`"),
        "{}",
        parsed.problems[0]
    );
    assert!(parse(&source("36500d"), "wf.yaml").problems.is_empty());
    assert_eq!(codes(&source("36501d")).len(), 2);
}

#[test]
fn an_input_the_workflow_does_not_declare_is_rejected() {
    let source = "name: x\ninputs:\n  environment: {type: string}\nsteps:\n  - id: a\n    spawn: {role: r, input: \"to {{ inputs.enviroment }}\"}\n  - id: b\n    condition: \"inputs.environment == 'prod' and inputs.region.name\"\n    spawn: {role: r, input: \"{{ inputs.environment | upper }}\"}\n";
    let parsed = parse(source, "wf.yaml");
    let unknown: Vec<_> = parsed.problems.iter().filter(|p| p.code == "unknown_input").collect();
    let found: Vec<_> = unknown.iter().map(|p| (p.line, p.field.as_str())).collect();
    assert_eq!(found, [(6, "steps[0].spawn.input"), (8, "steps[1].condition")], "{:?}", parsed.problems);
    assert!(unknown[0].message.contains("`inputs.enviroment`") && unknown[0].message.contains("environment"));
    let none = "name: x\nsteps:\n  - id: a\n    spawn: {role: r, input: \"{{ inputs.anything }}\"}\n";
    assert_eq!(codes(none), [("unknown_input".to_owned(), 4, "steps[0].spawn.input".to_owned())]);
}

#[test]
fn fields_used_as_written_refuse_template_syntax() {
    let source = concat!(
        "name: x\nsteps:\n",
        "  - id: a\n    message: {webhook: \"http://h/{{ run.id }}\", text: hi}\n",
        "  - id: b\n    message: {topic: \"t-{% if true %}x{% endif %}\", type: \"{{ run.id }}\", text: hi}\n",
        "  - id: c\n    spawn: {role: \"{{ run.id }}\", input: hi}\n",
        "  - id: d\n    delegate: {agent: \"{{ run.id }}\", input: hi}\n",
        "  - id: e\n    gate: {mode: HITL, reviewers: \"{{ run.id }}\"}\n",
        "  - id: f\n    wait: {signal: \"{{ inputs.x }}\"}\n",
    );
    let found: Vec<_> =
        codes(source).into_iter().filter(|(code, ..)| code == "not_a_template").map(|(_, _, field)| field).collect();
    assert_eq!(
        found,
        [
            "steps[0].message.webhook",
            "steps[1].message.topic",
            "steps[1].message.type",
            "steps[2].spawn.role",
            "steps[3].delegate.agent",
            "steps[4].gate.reviewers",
            "steps[5].wait.signal",
        ]
    );
    let agent = "name: x\nsteps:\n  - id: a\n    spawn: {agent: \"{{ run.id }}\", input: \"{{ run.id }}\"}\n";
    assert!(codes(agent).is_empty(), "a spawn's agent and input are templates");
}

#[test]
fn an_input_name_templates_cannot_use_is_rejected() {
    let source = "name: x\ninputs:\n  bad name: {type: string}\n  good_name: {type: string}\nsteps:\n  - id: a\n    spawn: {role: r, input: \"{{ inputs.good_name }}\"}\n";
    assert_eq!(codes(source), [("bad_input_name".to_owned(), 3, "inputs.bad name".to_owned())]);
}

#[test]
fn gate_fields_its_mode_ignores_are_warned_about() {
    let gate = |fields: &str| {
        let source = format!(
            "name: x\nsteps:\n  - id: build\n    spawn: {{role: r, input: go}}\n  - id: check\n    gate: {{{fields}}}\n"
        );
        let parsed = parse(&source, "wf.yaml");
        assert!(parsed.spec.is_some(), "a warning must not block: {:?}", parsed.problems);
        let mut unused: Vec<String> =
            parsed.problems.into_iter().filter(|p| p.code == "unused_field").map(|p| p.field).collect();
        unused.sort();
        unused
    };
    let auto = "mode: AUTO, approve_when: \"{{ build.output.ok }}\"";
    assert_eq!(
        gate(&format!("{auto}, reviewers: qa, expires_after: 1h, escalate_to: cto")),
        ["steps[1].gate.escalate_to", "steps[1].gate.expires_after", "steps[1].gate.reviewers"]
    );
    assert_eq!(
        gate(&format!("{auto}, on_exhausted: escalate, escalate_to: cto, expires_after: 1h")),
        Vec::<String>::new(),
        "an escalated AUTO gate waits for `escalate_to` and may expire"
    );
    assert_eq!(
        gate("mode: HITL, reviewers: qa, approve_when: \"{{ build.output.ok }}\", expires_after: 1h"),
        ["steps[1].gate.approve_when"]
    );
}

#[test]
fn one_pass_reports_every_problem_and_none_that_follows_from_another() {
    let source = "name: x\ninputs:\n  n: {type: integr}\nsteps:\n  - id: a\n    spawn: {agent: \"{{ inputs.n }}\", input: go}\n\
                  state: {persistence: sometimes, ttl: forever}\nconcurrency: {max: 0, key: \"{{ inputs.nope }}\"}\n";
    let found = codes(source);
    let fields: Vec<&str> = found.iter().map(|(_, _, field)| field.as_str()).collect();
    for expected in ["inputs.n.type", "state.persistence", "state.ttl", "concurrency.max", "concurrency.key"] {
        assert!(fields.contains(&expected), "{expected} not in {found:?}");
    }
    assert!(!fields.contains(&"steps[0].spawn.agent"), "a declared input with a bad type is still declared: {found:?}");
    let wrong = "name: x\nsteps:\n  - id: ok\n    gate: {mode: HITL, reviewers: [ops]}\n  - id: auto\n    gate: {mode: AUTO, approve_when: [true]}\n";
    let codes: Vec<String> = codes(wrong).into_iter().map(|(code, ..)| code).collect();
    // (The AUTO gate's default rerun is the gate before it, which is worth a warning of its own.)
    assert_eq!(codes, ["wrong_type", "wrong_type", "reruns_gate"], "a field given wrong is not also missing");
}

#[test]
fn a_broken_placeholder_in_a_condition_is_told_of_as_written() {
    let source = "name: x\nsteps:\n  - id: a\n    wait: {duration: 1s}\n  - id: b\n    condition: \"{{ a.output.n > }}\"\n    wait: {duration: 1s}\n";
    let parsed = parse(source, "wf.yaml");
    let message = &parsed.problems.first().expect("a problem").message;
    assert!(!message.contains("unexpected `)`"), "no parenthesis is in the source: {message}");
}

/// (severity, code, field) of every problem of `source`.
fn judged(source: &str) -> Vec<(Severity, String, String)> {
    parse(source, "wf.yaml").problems.into_iter().map(|p| (p.severity, p.code, p.field)).collect()
}

#[test]
fn a_message_step_publishes_a_bus_event_with_templated_data() {
    let source = "name: build\ninputs:\n  version: {type: string}\nsteps:\n\
                  - id: done\n  message:\n    event: build.finished\n    type: ignored\n\
                  \x20   data: {version: \"{{ inputs.version }}\", ok: true}\n";
    let parsed = parse(source, "wf.yaml");
    let found: Vec<_> = parsed.problems.iter().map(|p| (p.severity, p.code.as_str(), p.field.as_str())).collect();
    assert_eq!(found, [(Severity::Warning, "unused_field", "steps[0].message.type")]);
    let spec = parsed.spec.expect("valid");
    let Action::Message(message) = &spec.steps[0].action else { panic!("a message step") };
    assert_eq!(message.to, MessageTarget::Event("build.finished".into()));
    assert_eq!((message.text.as_deref(), &message.data["ok"]), (None, &serde_json::json!(true)));
}

#[test]
fn a_message_event_is_a_valid_type_that_does_not_start_its_own_workflow() {
    let step = |event: &str| format!("steps:\n- id: done\n  message: {{event: \"{event}\", text: hi}}\n");
    let bad = judged(&format!("name: x\n{}", step("build finished")));
    assert_eq!(bad, [(Severity::Error, "bad_event_type".into(), "steps[0].message.event".into())]);
    let looping = judged(&format!("name: x\ntrigger: {{event: \"build.*\"}}\n{}", step("build.finished")));
    assert_eq!(looping, [(Severity::Error, "self_trigger".into(), "steps[0].message.event".into())]);
    let filtered =
        format!("name: x\ntrigger: {{event: \"build.*\", filter: {{workflow: other}}}}\n{}", step("build.x"));
    assert_eq!(judged(&filtered), [(Severity::Warning, "self_trigger".into(), "steps[0].message.event".into())]);
    let elsewhere = format!("name: x\ntrigger: {{event: deploy.done}}\n{}", step("build.finished"));
    assert_eq!(judged(&elsewhere), []);
    let bad_trigger = judged(&format!("name: x\ntrigger: {{event: \"deploy done\"}}\n{}", step("build.x")));
    assert_eq!(bad_trigger, [(Severity::Error, "bad_event_type".into(), "trigger.event".into())]);
    let silent = judged("name: x\nsteps:\n- id: done\n  message: {event: build.finished}\n");
    assert_eq!(silent, [(Severity::Error, "missing_field".into(), "steps[0].message.text".into())]);
}

#[test]
fn a_gate_that_would_rerun_no_work_and_a_cron_with_seconds_are_warned_of() {
    let gates = "name: x\nsteps:\n- id: check\n  gate: {mode: AUTO, approve_when: \"true\"}\n\
                 - id: build\n  spawn: {role: builder, input: go}\n- id: sign\n  gate: {mode: HITL, reviewers: ops}\n\
                 - id: judge\n  gate: {mode: AUTO, approve_when: \"{{ sign.output.decision == 'approve' }}\"}\n\
                 - id: named\n  gate: {mode: AUTO, approve_when: \"true\", rerun_from: build}\n";
    let warned = [
        (Severity::Warning, "nothing_to_rerun".into(), "steps[0].gate".into()),
        (Severity::Warning, "reruns_gate".into(), "steps[3].gate".into()),
    ];
    assert_eq!(judged(gates), warned);
    let cron = |schedule: &str| {
        judged(&format!("name: x\ntrigger: {{cron: \"{schedule}\"}}\nsteps:\n- id: a\n  condition: \"true\"\n"))
    };
    assert_eq!(cron("*/5 * * * * *"), [(Severity::Warning, "cron_seconds".into(), "trigger.cron".into())]);
    assert_eq!(cron("*/5 * * * *"), []);
}

#[test]
fn a_webhook_the_server_would_refuse_is_warned_of_where_it_is_written() {
    use chorus_runtime::egress::EgressGuard;
    let hook = |url: &str| format!("name: x\nsteps:\n- id: tell\n  message: {{webhook: \"{url}\", text: hi}}\n");
    let strict = EgressGuard::new(false, &[], "set workflow.allow_private_webhooks to allow it");
    for url in ["http://127.0.0.1:9/hook", "http://localhost:8080/hook", "http://[::1]/hook", "http://10.0.0.7/x"] {
        let parsed = super::parse_for(&hook(url), "wf.yaml", Some(&strict));
        assert!(parsed.spec.is_some(), "a warning: {url}");
        let found: Vec<_> =
            parsed.problems.iter().map(|p| (p.severity, p.code.as_str(), p.field.as_str(), p.line)).collect();
        assert_eq!(found, [(Severity::Warning, "webhook_refused", "steps[0].message.webhook", 4)], "{url}");
        assert!(parsed.problems[0].message.contains("allow_private_webhooks"), "{}", parsed.problems[0].message);
    }
    let named = super::parse_for(&hook("http://localhost:8080/hook"), "wf.yaml", Some(&strict));
    assert!(named.problems[0].message.contains("localhost"), "{}", named.problems[0].message);
    assert!(super::parse_for(&hook("https://hooks.example.com/x"), "wf.yaml", Some(&strict)).problems.is_empty());
    let open = EgressGuard::new(true, &[], "");
    assert!(super::parse_for(&hook("http://127.0.0.1:9/hook"), "wf.yaml", Some(&open)).problems.is_empty());
    assert!(codes(&hook("http://127.0.0.1:9/hook")).is_empty(), "no server, no check");
}
