//! Loading the definitions folder at start-up.

use chorus_workflow::{WorkflowConfig, error::WorkflowError};

use crate::harness::{Harness, conformance, definition};

conformance!(a_folder_loads_into_its_namespace_idempotently, an_invalid_file_stops_the_load_and_stores_nothing);

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

async fn an_invalid_file_stops_the_load_and_stores_nothing(h: Harness) {
    let dir = folder(&[("a.yaml", definition("alpha", "a")), ("b.yaml", "name: beta\nsteps:\n  - id: x\n".into())]);
    let error = h.with_config(config(&dir)).load_definitions_dir().await.expect_err("invalid");
    let WorkflowError::InvalidDefinition { problems, .. } = &error else { panic!("{error}") };
    assert!(problems.iter().all(|p| p.file.ends_with("b.yaml")), "{problems:?}");
    assert!(error.to_string().contains("missing_step_kind"), "{error}");
    assert_eq!(h.stored_rows().await, 0);
}
