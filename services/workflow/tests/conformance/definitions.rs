//! Put, get, list and validate: versions, idempotence, paging, namespaces,
//! and bad input that changes nothing.

use chorus_workflow::{
    domain::{PageToken, Severity},
    error::WorkflowError,
};

use crate::harness::{Harness, NS, conformance, definition};

conformance!(
    put_adds_a_version_only_when_the_source_changes,
    get_returns_the_latest_or_a_given_version,
    list_pages_latest_versions_by_name_and_versions_newest_first,
    namespaces_are_isolated,
    invalid_definitions_are_rejected_whole_and_store_nothing,
    validate_reports_problems_and_stores_nothing,
    unknown_filters_and_tests_are_reported_where_they_are_applied,
    triggers_are_stored_with_their_filter_or_schedule,
);

async fn put_adds_a_version_only_when_the_source_changes(h: Harness) {
    let first = h.workflows.put(NS, &definition("deploy", "v1"), "deploy.yaml", "ana").await.expect("put");
    assert_eq!((first.put.definition.version, first.put.unchanged), (1, false));
    assert_eq!(first.put.definition.created_by, "ana");
    let again = h.workflows.put(NS, &definition("deploy", "v1"), "deploy.yaml", "bob").await.expect("put again");
    assert_eq!((again.put.definition.version, again.put.unchanged), (1, true));
    assert_eq!(again.put.definition.created_by, "ana", "the stored version is returned as it was");
    let changed = h.workflows.put(NS, &definition("deploy", "v2"), "deploy.yaml", "bob").await.expect("put v2");
    assert_eq!((changed.put.definition.version, changed.put.unchanged), (2, false));
    let back = h.workflows.put(NS, &definition("deploy", "v1"), "deploy.yaml", "ana").await.expect("put v1 again");
    assert_eq!(back.put.definition.version, 3, "a source equal to an older version is a new version");
    assert_eq!(h.stored_rows().await, 3);
}

async fn get_returns_the_latest_or_a_given_version(h: Harness) {
    for text in ["one", "two"] {
        h.workflows.put(NS, &definition("deploy", text), "deploy.yaml", "ana").await.expect("put");
    }
    let latest = h.workflows.get(NS, "deploy", None).await.expect("latest");
    assert_eq!(latest.version, 2);
    assert!(latest.source.contains("two"));
    assert_eq!(latest.source_sha256, chorus_workflow::service::hex_sha256(&latest.source));
    let first = h.workflows.get(NS, "deploy", Some(1)).await.expect("v1");
    assert!(first.source.contains("one"));
    let missing = h.workflows.get(NS, "deploy", Some(9)).await.expect_err("no v9");
    assert!(matches!(missing, WorkflowError::VersionNotFound { version: 9, .. }), "{missing}");
    let unknown = h.workflows.get(NS, "nope", None).await.expect_err("unknown");
    assert!(matches!(unknown, WorkflowError::NotFound(_)), "{unknown}");
    assert_eq!(h.workflows.head(NS, "deploy").await.expect("latest version").latest, 2);
    let unknown = h.workflows.head(NS, "nope").await.expect_err("unknown");
    assert!(matches!(unknown, WorkflowError::NotFound(_)), "{unknown}");
    let elsewhere = h.workflows.head("team-b", "deploy").await.expect_err("another namespace");
    assert!(matches!(elsewhere, WorkflowError::NotFound(_)), "{elsewhere}");
}

async fn list_pages_latest_versions_by_name_and_versions_newest_first(h: Harness) {
    for name in ["c", "a", "b"] {
        h.workflows.put(NS, &definition(name, "one"), "f.yaml", "ana").await.expect("put");
    }
    h.workflows.put(NS, &definition("a", "two"), "f.yaml", "ana").await.expect("put a v2");
    let first = h.workflows.list(NS, None, false, None, 2).await.expect("page 1");
    let names: Vec<(&str, u32)> = first.definitions.iter().map(|d| (d.name.as_str(), d.version)).collect();
    assert_eq!(names, [("a", 2), ("b", 1)]);
    assert!(first.definitions.iter().all(|d| d.source.is_empty()), "no source unless asked");
    let second = h.workflows.list(NS, None, true, first.next.clone(), 2).await.expect("page 2");
    assert_eq!(second.definitions.len(), 1);
    assert_eq!(second.definitions[0].name, "c");
    assert!(!second.definitions[0].source.is_empty());
    assert_eq!(second.next, None);
    let versions = h.workflows.list(NS, Some("a"), false, None, 1).await.expect("versions");
    assert_eq!(versions.definitions[0].version, 2);
    assert_eq!(versions.next, Some(PageToken::BelowVersion(2)));
    let older = h.workflows.list(NS, Some("a"), false, versions.next, 1).await.expect("older");
    assert_eq!(older.definitions[0].version, 1);
    assert_eq!(older.next, None);
}

async fn namespaces_are_isolated(h: Harness) {
    h.workflows.put(NS, &definition("deploy", "one"), "f.yaml", "ana").await.expect("put");
    let other = h.workflows.put("team-b", &definition("deploy", "other"), "f.yaml", "bob").await.expect("put b");
    assert_eq!(other.put.definition.version, 1, "versions count per namespace");
    assert!(h.workflows.get("team-c", "deploy", None).await.is_err());
    let listed = h.workflows.list("team-b", None, true, None, 10).await.expect("list");
    assert_eq!(listed.definitions.len(), 1);
    assert!(listed.definitions[0].source.contains("other"));
}

async fn invalid_definitions_are_rejected_whole_and_store_nothing(h: Harness) {
    let sources = [
        ("malformed.yaml", "name: x\nsteps: [\n".to_owned(), "yaml_syntax"),
        ("kind.yaml", "name: x\nsteps:\n  - id: a\n    deploy: {}\n".to_owned(), "unknown_step_kind"),
        ("template.yaml", definition("x", "{{ oops"), "bad_expression"),
        ("dupes.yaml", "name: x\nsteps:\n  - {id: a, wait: {duration: 1s}}\n  - {id: a, wait: {duration: 1s}}\n".to_owned(), "duplicate_step_id"),
        ("forward.yaml", "name: x\nsteps:\n  - {id: a, spawn: {role: r, input: \"{{ b.output }}\"}}\n  - {id: b, wait: {duration: 1s}}\n".to_owned(), "forward_reference"),
    ];
    for (file, source, code) in sources {
        let error = h.workflows.put(NS, &source, file, "ana").await.expect_err(file);
        let WorkflowError::InvalidDefinition { problems, .. } = &error else { panic!("{file}: {error}") };
        let problem = problems.iter().find(|p| p.code == code).unwrap_or_else(|| panic!("{file}: {problems:?}"));
        assert_eq!(problem.file, file);
        assert!(problem.line > 0, "{problem}");
        let status = tonic::Status::from(error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
    assert_eq!(h.stored_rows().await, 0);
}

async fn validate_reports_problems_and_stores_nothing(h: Harness) {
    let good = h.workflows.validate(&definition("x", "hello {{ run.id }}"), "x.yaml");
    assert!(good.problems.is_empty() && good.spec.is_some(), "{:?}", good.problems);
    assert_eq!(good.name.as_deref(), Some("x"));
    let bad = h.workflows.validate("name: x\nsteps:\n  - id: a\n    wait: {duration: soon}\n", "x.yaml");
    assert!(bad.spec.is_none());
    let problem = &bad.problems[0];
    assert_eq!(
        (problem.severity, problem.code.as_str(), problem.field.as_str(), problem.line),
        (Severity::Error, "bad_duration", "steps[0].wait.duration", 4)
    );
    assert_eq!(h.stored_rows().await, 0);
}

async fn unknown_filters_and_tests_are_reported_where_they_are_applied(h: Harness) {
    let source = "name: x\ninputs:\n  x: {type: string}\nsteps:\n\
                  - id: a\n  condition: \"{{ inputs.x is nosuchtest }}\"\n\
                  \x20 message: {topic: t, text: \"{{ inputs.x | nosuchfilter }} {{ inputs.x | upper }}\"}\n\
                  - id: b\n  condition: \"{{ inputs.x is odd }}\"\n  spawn: {role: r, input: {n: \"{{ inputs.x | nosuchfilter(1) }}\"}}\n";
    let validated = h.workflows.validate(source, "x.yaml");
    let found: Vec<(&str, &str, u32)> =
        validated.problems.iter().map(|p| (p.code.as_str(), p.field.as_str(), p.line)).collect();
    assert_eq!(
        found,
        [
            ("unknown_test", "steps[0].condition", 6),
            ("unknown_filter", "steps[0].message.text", 7),
            ("unknown_filter", "steps[1].spawn.input.n", 10)
        ],
        "{:?}",
        validated.problems
    );
    assert!(validated.problems[1].message.contains("`nosuchfilter`"), "{}", validated.problems[1]);
    let error = h.workflows.put(NS, source, "x.yaml", "ana").await.expect_err("rejected");
    let WorkflowError::InvalidDefinition { problems, .. } = &error else { panic!("{error}") };
    assert_eq!(problems, &validated.problems);
    assert_eq!(h.stored_rows().await, 0);
}

async fn triggers_are_stored_with_their_filter_or_schedule(h: Harness) {
    let source = include_str!("../../../../workflows/pr-review.yaml");
    let put = h.workflows.put(NS, source, "workflows/pr-review.yaml", "chorus").await.expect("put");
    let stored = h.workflows.get(NS, "pr-review", Some(put.put.definition.version)).await.expect("get");
    assert_eq!(stored.triggers.len(), 1);
    assert_eq!(stored.triggers[0].event_type, "tool:called");
    assert_eq!(stored.triggers[0].filter.get("role").and_then(|v| v.as_str()), Some("coder"));
    assert_eq!(stored.file, "workflows/pr-review.yaml");
    assert!(stored.triggers[0].listens() && stored.triggers[0].cron.is_none());

    // A schedule is listed too (the contract's triggers are what starts runs
    // by itself), and starts nothing on the bus.
    let scheduled = "name: ticking\ntrigger: {cron: \"0 9 * * 1-5\"}\nsteps:\n- id: tick\n  condition: \"true\"\n";
    let put = h.workflows.put(NS, scheduled, "ticking.yaml", "chorus").await.expect("put");
    let [trigger] = put.put.definition.triggers.as_slice() else { panic!("{:?}", put.put.definition.triggers) };
    assert_eq!((trigger.cron.as_deref(), trigger.listens()), (Some("0 9 * * 1-5"), false));
    let stored = h.workflows.get(NS, "ticking", None).await.expect("get");
    assert_eq!(stored.triggers, put.put.definition.triggers, "as stored");
}
