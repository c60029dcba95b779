//! `chorus workflow validate|apply|list`.

use std::path::{Path, PathBuf};

use chorus_proto::workflow::{
    Definition, DisableWorkflowRequest, EnableWorkflowRequest, GetDefinitionRequest, ListDefinitionsRequest,
    PutDefinitionRequest, ValidateDefinitionRequest, ValidationProblem, ValidationProblems,
    validation_problem::Severity, workflow_client::WorkflowClient,
};
use chorus_runtime::transport::Transport;
use chorus_workflow::{domain::has_errors, grpc::problem_out, parse::parse};
use prost::Message as _;

use super::{Failure, Outcome, Target, view};

type Client = WorkflowClient<Transport>;

fn read(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|error| Failure::Call(format!("cannot read {}: {error}", path.display())))
}

/// `file:line:column: error in `field` [code]: message`, as compilers print.
fn problem_line(problem: &ValidationProblem) -> String {
    let severity = if problem.severity() == Severity::Warning { "warning" } else { "error" };
    let field = if problem.field.is_empty() { String::new() } else { format!(" in `{}`", problem.field) };
    format!(
        "{}:{}:{}: {severity}{field} [{}]: {}",
        problem.file, problem.line, problem.column, problem.code, problem.message
    )
}

/// A definition file read and checked.
struct Checked {
    file: PathBuf,
    source: String,
    /// The workflow it defines, when it is valid.
    name: Option<String>,
}

/// What checks definitions: the parser this binary carries, or the server
/// the definitions go to.
pub(super) enum Checker<'c> {
    Local,
    Server(&'c mut Client, &'c Target),
}

/// What a checker found in one file.
struct Verdict {
    problems: Vec<ValidationProblem>,
    valid: bool,
    name: String,
}

impl Checker<'_> {
    async fn check(&mut self, source: &str, file: &Path) -> Result<Verdict, Failure> {
        let file = file.display().to_string();
        match self {
            Self::Local => {
                let parsed = parse(source, &file);
                let valid = !has_errors(&parsed.problems);
                let problems = parsed.problems.into_iter().map(problem_out).collect();
                Ok(Verdict { problems, valid, name: parsed.name.unwrap_or_default() })
            }
            Self::Server(client, target) => {
                let request =
                    ValidateDefinitionRequest { namespace: target.namespace.clone(), source: source.to_owned(), file };
                let answer = client.validate_definition(request).await?.into_inner();
                Ok(Verdict { problems: answer.problems, valid: answer.valid, name: answer.name })
            }
        }
    }
}

/// Reads and checks every file `paths` name, printing each problem; the
/// files, and whether all are valid and no two define one workflow.
async fn check_all(checker: &mut Checker<'_>, paths: &[PathBuf]) -> Result<(Vec<Checked>, bool), Failure> {
    let mut checked = Vec::new();
    let mut valid = true;
    for file in definition_files_of(paths)? {
        let source = read(&file)?;
        let answer = checker.check(&source, &file).await?;
        for problem in &answer.problems {
            outln!("{}", problem_line(problem));
        }
        valid &= answer.valid;
        let mut name = answer.valid.then_some(answer.name);
        if let Some(first) = checked.iter().find(|other: &&Checked| name.is_some() && other.name == name) {
            outln!(
                "{}:1:1: error in `name` [duplicate_name]: workflow `{}` is also defined in {}",
                file.display(),
                name.take().unwrap_or_default(),
                first.file.display()
            );
            valid = false;
        }
        checked.push(Checked { file, source, name });
    }
    Ok((checked, valid))
}

pub(super) async fn validate(mut checker: Checker<'_>, paths: &[PathBuf]) -> Outcome {
    let (checked, valid) = check_all(&mut checker, paths).await?;
    for Checked { file, name, .. } in &checked {
        if let Some(name) = name {
            outln!("{}: ok ({name})", file.display());
        }
    }
    if valid { Ok(()) } else { Err(Failure::No) }
}

/// The files a path names: itself, or a folder's *.yaml and *.yml files.
fn definition_files(path: &Path) -> Result<Vec<PathBuf>, Failure> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| Failure::Call(format!("cannot read {}: {e}", path.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|file| file.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The files `paths` name, each a file or a folder of definitions; a folder
/// without any is an error.
fn definition_files_of(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    let mut files = Vec::new();
    for path in paths {
        let found = definition_files(path)?;
        if found.is_empty() {
            return Err(Failure::Call(format!("{} has no *.yaml or *.yml files", path.display())));
        }
        files.extend(found);
    }
    Ok(files)
}

/// Applies every definition, or none: each file is checked first, and one
/// that is invalid, or two that define one workflow, leave every workflow
/// as it was.
pub(super) async fn apply(client: &mut Client, target: &Target, paths: &[PathBuf]) -> Outcome {
    let (checked, valid) = check_all(&mut Checker::Server(client, target), paths).await?;
    if !valid {
        eprintln!("nothing applied");
        return Err(Failure::No);
    }
    let mut applied = true;
    for Checked { file, source, .. } in checked {
        let request = PutDefinitionRequest {
            namespace: target.namespace.clone(),
            source,
            file: file.display().to_string(),
            created_by: view::user(),
        };
        let answer = match client.put_definition(request).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                // Only an invalid definition's problems are the answer "no";
                // any other refusal (a bad namespace, ...) is the call failing.
                let problems = problems(&status);
                if problems.is_empty() {
                    return Err(status.into());
                }
                applied = false;
                for problem in &problems {
                    outln!("{}", problem_line(problem));
                }
                continue;
            }
        };
        let definition = answer.definition.unwrap_or_default();
        let unchanged = if answer.unchanged { " (unchanged)" } else { "" };
        // Its warnings were printed as it was checked.
        outln!("{} v{}{unchanged}", definition.name, definition.version);
    }
    if applied { Ok(()) } else { Err(Failure::No) }
}

/// The ValidationProblems detail of a put refused for an invalid definition.
fn problems(status: &tonic::Status) -> Vec<ValidationProblem> {
    let Ok(details) = tonic_types::Status::decode(status.details()) else { return Vec::new() };
    details
        .details
        .iter()
        .filter(|any| any.type_url.ends_with("chorus.workflow.v1.ValidationProblems"))
        .filter_map(|any| ValidationProblems::decode(any.value.as_slice()).ok())
        .flat_map(|detail| detail.problems)
        .collect()
}

pub(super) async fn list(client: &mut Client, target: &Target, name: Option<String>, json: bool) -> Outcome {
    let mut definitions = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListDefinitionsRequest {
            namespace: target.namespace.clone(),
            name: name.clone().unwrap_or_default(),
            page_size: 100,
            page_token: page_token.clone(),
            ..ListDefinitionsRequest::default()
        };
        let page = client.list_definitions(request).await?.into_inner();
        definitions.extend(page.definitions);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if let Some(name) = name.filter(|_| definitions.is_empty()) {
        return Err(unknown(&name, target));
    }
    if definitions.is_empty() {
        eprintln!("(namespace `{}` holds no workflows)", target.namespace);
    }
    if json {
        return view::print_json(definitions.iter().map(definition_json));
    }
    let mut rows = vec![vec![
        "NAME".to_owned(),
        "VERSION".into(),
        "TRIGGERS".into(),
        "STATUS".into(),
        "FILE".into(),
        "CREATED".into(),
    ]];
    for definition in definitions {
        let triggers: Vec<String> = definition
            .triggers
            .iter()
            .map(|t| if t.cron.is_empty() { t.event_type.clone() } else { format!("cron {}", t.cron) })
            .collect();
        rows.push(vec![
            definition.name,
            definition.version.to_string(),
            if triggers.is_empty() { "-".into() } else { triggers.join(",") },
            if definition.disabled.is_some() { "disabled" } else { "enabled" }.into(),
            definition.file,
            view::time(definition.created_at.as_ref()),
        ]);
    }
    out!("{}", view::table(&rows));
    Ok(())
}

/// A definition as JSON, its fields in the proto's names (a listing carries no source).
fn definition_json(definition: &Definition) -> serde_json::Value {
    let triggers: Vec<serde_json::Value> = definition
        .triggers
        .iter()
        .map(|trigger| {
            serde_json::json!({
                "event_type": trigger.event_type,
                "filter": view::struct_json(trigger.filter.as_ref()),
                "cron": trigger.cron,
            })
        })
        .collect();
    serde_json::json!({
        "name": definition.name,
        "version": definition.version,
        "description": definition.description,
        "triggers": triggers,
        "file": definition.file,
        "source_sha256": definition.source_sha256,
        "created_by": definition.created_by,
        "created_at": view::timestamp_json(definition.created_at.as_ref()),
        "disabled": definition.disabled.as_ref().map(|disabled| serde_json::json!({
            "disabled_by": disabled.disabled_by,
            "reason": disabled.reason,
            "disabled_at": view::timestamp_json(disabled.disabled_at.as_ref()),
        })),
    })
}

/// `chorus workflow disable`: no trigger, schedule or start makes a run of
/// `name` until it is enabled; runs already started go on.
pub(super) async fn disable(client: &mut Client, target: &Target, name: String, reason: String) -> Outcome {
    let request =
        DisableWorkflowRequest { namespace: target.namespace.clone(), name, reason, disabled_by: view::user() };
    let definition = client.disable_workflow(request).await?.into_inner();
    let disabled = definition.disabled.unwrap_or_default();
    outln!(
        "{} disabled by {} at {}: it starts no run until `chorus workflow enable {}`; runs already started go on",
        definition.name,
        disabled.disabled_by,
        view::time(disabled.disabled_at.as_ref()),
        definition.name
    );
    Ok(())
}

/// `chorus workflow source`: a version's YAML, as applied, on stdout.
pub(super) async fn source(client: &mut Client, target: &Target, name: String, version: u32) -> Outcome {
    let request = GetDefinitionRequest { namespace: target.namespace.clone(), name, version };
    let definition = client.get_definition(request).await?.into_inner();
    out!("{}", definition.source);
    Ok(())
}

/// `chorus workflow enable`: `name` starts runs again.
pub(super) async fn enable(client: &mut Client, target: &Target, name: String) -> Outcome {
    let request = EnableWorkflowRequest { namespace: target.namespace.clone(), name, enabled_by: view::user() };
    let definition = client.enable_workflow(request).await?.into_inner();
    outln!("{} enabled (v{})", definition.name, definition.version);
    Ok(())
}

/// A list filtered by `workflow` came back `empty`: an error when that is
/// because the namespace holds no such workflow.
pub(super) async fn check_known(
    client: &mut Client,
    target: &Target,
    workflow: Option<String>,
    empty: bool,
) -> Result<(), Failure> {
    let Some(name) = workflow.filter(|_| empty) else { return Ok(()) };
    let request = ListDefinitionsRequest {
        namespace: target.namespace.clone(),
        name: name.clone(),
        page_size: 1,
        ..ListDefinitionsRequest::default()
    };
    match client.list_definitions(request).await?.into_inner().definitions.is_empty() {
        true => Err(unknown(&name, target)),
        false => Ok(()),
    }
}

/// A workflow name the namespace does not hold.
fn unknown(name: &str, target: &Target) -> Failure {
    Failure::Call(format!("no workflow `{name}` in namespace {}", target.namespace))
}
