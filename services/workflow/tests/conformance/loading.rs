//! Loading the definitions folder at start-up.

use chorus_workflow::{WorkflowConfig, error::WorkflowError};

use crate::harness::{Harness, conformance, definition};

conformance!(
    a_folder_loads_into_its_namespace_idempotently,
    replicas_loading_the_same_folder_together_all_start,
    an_invalid_file_stops_the_load_and_stores_nothing,
    an_invalid_file_is_passed_over_when_the_configuration_says_so,
    a_restart_keeps_a_version_applied_since_the_folder_was_loaded,
);

fn folder(files: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, source) in files {
        std::fs::write(dir.path().join(name), source).expect("write");
    }
    dir
}

fn config(dir: &tempfile::TempDir) -> WorkflowConfig {
    WorkflowConfig {
        definitions_dir: dir.path().display().to_string(),
        namespace: "default".into(),
        ..WorkflowConfig::default()
    }
}

async fn a_folder_loads_into_its_namespace_idempotently(h: Harness) {
    let dir = folder(&[
        ("a.yaml", definition("alpha", "a")),
        ("b.yml", definition("beta", "b")),
        ("notes.txt", "not a workflow".into()),
    ]);
    let workflows = h.with_config(config(&dir));
    let loaded = workflows.load_definitions_dir().await.expect("load");
    assert_eq!(loaded.len(), 2);
    let again = workflows.load_definitions_dir().await.expect("reload");
    assert!(again.iter().all(|outcome| outcome.put.unchanged), "a restart adds no versions");
    let listed = workflows.list("default", None, false, None, 10).await.expect("list");
    let names: Vec<&str> = listed.definitions.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    let missing = h.with_config(WorkflowConfig { definitions_dir: "/nonexistent/workflows".into(), ..config(&dir) });
    assert!(missing.load_definitions_dir().await.expect("missing folder").is_empty());
}

async fn replicas_loading_the_same_folder_together_all_start(h: Harness) {
    let files: Vec<(String, String)> =
        (0..8).map(|n| (format!("w{n}.yaml"), definition(&format!("w{n}"), "a"))).collect();
    let files: Vec<(&str, String)> = files.iter().map(|(name, source)| (name.as_str(), source.clone())).collect();
    let dir = folder(&files);
    let replicas: Vec<_> = (0..4).map(|_| h.with_config(config(&dir))).collect();
    let loads = futures_util::future::join_all(replicas.iter().map(|replica| replica.load_definitions_dir())).await;
    for load in loads {
        assert_eq!(load.expect("every replica starts").len(), 8);
    }
    let listed = replicas[0].list("default", None, false, None, 100).await.expect("list");
    assert!(listed.definitions.iter().all(|d| d.version == 1), "one version each");
    assert_eq!(listed.definitions.len(), 8);
}

async fn an_invalid_file_stops_the_load_and_stores_nothing(h: Harness) {
    let dir = folder(&[("a.yaml", definition("alpha", "a")), ("b.yaml", "name: beta\nsteps:\n  - id: x\n".into())]);
    let error = h.with_config(config(&dir)).load_definitions_dir().await.expect_err("invalid");
    let WorkflowError::InvalidDefinition { problems, .. } = &error else { panic!("{error}") };
    assert!(problems.iter().all(|p| p.file.ends_with("b.yaml")), "{problems:?}");
    assert!(error.to_string().contains("missing_step_kind"), "{error}");
    assert_eq!(h.stored_rows().await, 0);
}

/// With `skip_invalid_definitions`, the valid files load and an invalid
/// one leaves its workflow at its latest stored version.
async fn an_invalid_file_is_passed_over_when_the_configuration_says_so(h: Harness) {
    let dir = folder(&[("a.yaml", definition("alpha", "a")), ("b.yaml", definition("beta", "b"))]);
    let skipping = WorkflowConfig { skip_invalid_definitions: true, ..config(&dir) };
    h.with_config(skipping.clone()).load_definitions_dir().await.expect("load");
    std::fs::write(dir.path().join("a.yaml"), definition("alpha", "a2")).expect("edit");
    std::fs::write(dir.path().join("b.yaml"), "name: beta\nsteps:\n  - id: x\n").expect("a bad edit");
    let loaded = h.with_config(skipping).load_definitions_dir().await.expect("the valid files load");
    let names: Vec<(&str, u32)> =
        loaded.iter().map(|outcome| (outcome.put.definition.name.as_str(), outcome.put.definition.version)).collect();
    assert_eq!(names, [("alpha", 2)]);
    let beta = h.workflows.get("default", "beta", None).await.expect("beta as stored");
    assert_eq!(beta.version, 1, "the bad edit changed nothing");
}

/// A version applied from elsewhere (`chorus workflow apply`) stays the
/// latest when the folder is loaded again with its older text; a file
/// edited since becomes the latest.
async fn a_restart_keeps_a_version_applied_since_the_folder_was_loaded(h: Harness) {
    let dir = folder(&[("a.yaml", definition("alpha", "a"))]);
    let workflows = h.with_config(config(&dir));
    workflows.load_definitions_dir().await.expect("load");
    let applied = workflows.put("default", &definition("alpha", "b"), "hot/a.yaml", "ana").await.expect("apply");
    assert_eq!(applied.put.definition.version, 2);

    let restarted = workflows.load_definitions_dir().await.expect("reload");
    assert_eq!((restarted[0].put.definition.version, restarted[0].put.unchanged), (2, true), "the applied one stays");
    assert_eq!(workflows.head("default", "alpha").await.expect("latest").latest, 2);

    std::fs::write(dir.path().join("a.yaml"), definition("alpha", "c")).expect("edit");
    let edited = workflows.load_definitions_dir().await.expect("load the edit");
    assert_eq!((edited[0].put.definition.version, edited[0].put.unchanged), (3, false), "an edit is new");
    let again = workflows.put("default", &definition("alpha", "a"), "hot/a.yaml", "ana").await.expect("apply");
    assert_eq!(again.put.definition.version, 4, "an operator's put of an old text makes it the latest again");
}
