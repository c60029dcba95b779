//! The built-in `reviewer` agent: reviews the files a message refers to, and
//! shows each way a worker talks to the person behind an IDE (through the
//! gateway's ACP bridge, or any A2A client):
//!
//! 1. it shows its plan ([`PLAN`] in a status message's metadata: the files
//!    to read, then the question) and keeps it current, and reports progress
//!    as working status messages, one per step, `pace` apart;
//! 2. a file the message only links to (a `file://` URL part, as an IDE's
//!    resource link arrives) it asks for: the task goes `input-required`
//!    with [`READ_TEXT_FILE`] `{"path": ...}` in the status message's
//!    metadata, and the next user message holds the file's text (a file the
//!    message embeds, a text part with a filename, is read from there; a
//!    message with no file is reviewed as text itself);
//! 3. it reviews each file (lines, words, TODO/FIXME markers, long lines,
//!    trailing spaces);
//! 4. it asks whether to publish the review (`input-required` again); the
//!    answer `allow` completes the task with the review as an artifact named
//!    `review` and a one-line summary, any other answer completes it without.
//!
//! A task a workflow's step made has no one to answer: the reviewer asks
//! nothing (a linked file goes unread), and completes with the review, its
//! artifact holding a data part `{summary, confidence, files}` for the steps
//! after it.

mod review;

use std::time::Duration;

use chorus_proto::taskstore::{Message, Role, TaskState, part::Content};
use chorus_runtime::uri;
use prost_types::{Struct, Value, value::Kind as ValueKind};
use tokio_util::sync::CancellationToken;

use crate::reply::{agent_message, text_part};
use crate::{Client, HandlerError, Placement, Reply, TaskContext, WorkerError, text_artifact};

/// The reviewer agent's id.
pub const AGENT_ID: &str = "reviewer";
/// How many tasks one reviewer worker handles at once.
pub const CAPACITY: u32 = 8;
/// Metadata key of a request for a file of the client's (the gateway's ACP
/// bridge answers it with `fs/read_text_file`).
pub const READ_TEXT_FILE: &str = "acp/readTextFile";
/// Metadata key of the reviewer's plan (the ACP bridge shows it as a `plan`).
pub const PLAN: &str = "acp/plan";
/// The answer that lets the reviewer publish its review: an IDE's option
/// over ACP; over A2A a person may also say yes.
pub const ALLOW: &str = "allow";
/// The answers, in any case, that let it publish.
const YES: [&str; 6] = [ALLOW, "yes", "y", "ok", "publish", "approve"];
/// The pause between two steps by default.
pub const DEFAULT_PACE: Duration = Duration::from_millis(100);

/// Runs a reviewer worker placed at `placement` until `shutdown` is
/// cancelled, pausing `pace` between the steps of a review.
pub async fn run(
    client: Client,
    placement: Placement,
    pace: Duration,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    placement.worker(client, AGENT_ID).capacity(CAPACITY).run(move |task| handle(task, pace), shutdown).await
}

/// One file of the message.
enum Source {
    Embedded(String),
    /// An absolute path to ask the client for.
    Linked(String),
}

/// The reviewer's handler.
pub async fn handle(task: TaskContext, pace: Duration) -> Result<Reply, HandlerError> {
    let unattended = for_a_workflow(task.task());
    let files = files_of(task.task().history.iter().rev().find(|m| m.role == i32::from(Role::User)));
    let names: Vec<String> = files.iter().map(|(name, _)| name.clone()).collect();
    show_plan(&task, &names, 0, "pending").await?;
    step(&task, format!("Reviewing {}.", names.join(", ")), pace).await?;
    let mut reviews = Vec::new();
    for (read, (name, source)) in files.into_iter().enumerate() {
        let text = match source {
            Source::Embedded(text) => text,
            Source::Linked(path) if unattended => {
                show_plan(&task, &names, read + 1, "pending").await?;
                step(&task, format!("Could not read {name}: no one to ask for {path} in a workflow run."), pace)
                    .await?;
                continue;
            }
            Source::Linked(path) => {
                let mut question = task.agent_message(vec![text_part(format!("May I read {path}?"))]);
                question.metadata = Some(file_request(&path));
                let answer = task.ask_message(question).await?;
                let failed = answer.metadata.as_ref().and_then(|m| m.fields.get(READ_TEXT_FILE)).and_then(|request| {
                    match &request.kind {
                        Some(ValueKind::StructValue(fields)) => fields.fields.get("error").cloned(),
                        _ => None,
                    }
                });
                if let Some(error) = failed {
                    show_plan(&task, &names, read + 1, "pending").await?;
                    step(&task, format!("Could not read {name}: {}.", string_of(&error)), pace).await?;
                    continue;
                }
                texts(&answer).join("\n")
            }
        };
        let found = review::review(&name, &text);
        show_plan(&task, &names, read + 1, "pending").await?;
        step(&task, format!("Read {name}: {}.", review::count(found.lines, "line")), pace).await?;
        reviews.push(found);
    }
    if reviews.is_empty() {
        return Ok(Reply::text("There was nothing I could read to review."));
    }
    let summary = review::summary(&reviews);
    if unattended {
        show_plan(&task, &names, names.len(), "completed").await?;
        let mut artifact = text_artifact("review", review::table(&reviews));
        artifact.parts.push(review::verdict(&reviews, &summary));
        return Ok(Reply::text(summary).with_artifact(artifact));
    }
    show_plan(&task, &names, names.len(), "in_progress").await?;
    let answer = task.ask(format!("{summary} Publish the review?")).await?;
    show_plan(&task, &names, names.len(), "completed").await?;
    if texts(&answer).first().is_some_and(|text| publishes(text)) {
        let artifact = text_artifact("review", review::table(&reviews));
        return Ok(Reply::text(format!("Published: {summary}")).with_artifact(artifact));
    }
    Ok(Reply::text("The review was not published."))
}

/// Whether `answer` lets the reviewer publish its review.
fn publishes(answer: &str) -> bool {
    let answer = answer.trim().trim_end_matches(['.', '!']);
    YES.iter().any(|yes| answer.eq_ignore_ascii_case(yes))
}

/// Whether a workflow's step made the task (its metadata names the
/// workflow): no one answers its questions then, so the reviewer asks none,
/// and answers with its verdict as data for the steps after it.
fn for_a_workflow(task: &chorus_proto::taskstore::Task) -> bool {
    task.metadata.as_ref().is_some_and(|metadata| metadata.fields.contains_key("workflow"))
}

/// The files a message refers to, by name; the message itself when none.
fn files_of(message: Option<&Message>) -> Vec<(String, Source)> {
    let Some(message) = message else {
        return vec![("the message".to_owned(), Source::Embedded(String::new()))];
    };
    let mut files = Vec::new();
    let mut words = Vec::new();
    for part in &message.parts {
        match &part.content {
            Some(Content::Url(url)) => {
                if let Some(path) = uri::file_path(url) {
                    let path = path.display().to_string();
                    let name = if part.filename.is_empty() { path.clone() } else { part.filename.clone() };
                    files.push((name, Source::Linked(path)));
                }
            }
            Some(Content::Text(text)) if !part.filename.is_empty() => {
                files.push((part.filename.clone(), Source::Embedded(text.clone())));
            }
            Some(Content::Text(text)) => words.push(text.clone()),
            Some(Content::Raw(_) | Content::Data(_)) | None => {}
        }
    }
    if files.is_empty() {
        files.push(("the message".to_owned(), Source::Embedded(words.join("\n"))));
    }
    files
}

fn texts(message: &Message) -> Vec<&str> {
    message
        .parts
        .iter()
        .filter_map(|part| match &part.content {
            Some(Content::Text(text)) => Some(text.as_str()),
            Some(Content::Raw(_) | Content::Url(_) | Content::Data(_)) | None => None,
        })
        .collect()
}

fn string_of(value: &Value) -> String {
    match &value.kind {
        Some(ValueKind::StringValue(text)) => text.clone(),
        other => format!("{other:?}"),
    }
}

/// `{READ_TEXT_FILE: {"path": path}}`.
fn file_request(path: &str) -> Struct {
    let string = |text: &str| Value { kind: Some(ValueKind::StringValue(text.to_owned())) };
    let request = Struct { fields: [("path".to_owned(), string(path))].into() };
    Struct { fields: [(READ_TEXT_FILE.to_owned(), Value { kind: Some(ValueKind::StructValue(request)) })].into() }
}

/// Shows the plan (metadata [`PLAN`]): read each of `files`, the first
/// `done` of them read (or given up), then ask before publishing (`asking`:
/// that step's status).
async fn show_plan(task: &TaskContext, files: &[String], done: usize, asking: &str) -> Result<(), HandlerError> {
    let string = |text: &str| Value { kind: Some(ValueKind::StringValue(text.to_owned())) };
    let entry = |content: &str, priority: &str, status: &str| {
        let fields = [("content", content), ("priority", priority), ("status", status)]
            .into_iter()
            .map(|(key, text)| (key.to_owned(), string(text)))
            .collect();
        Value { kind: Some(ValueKind::StructValue(Struct { fields })) }
    };
    let mut entries: Vec<Value> = files
        .iter()
        .enumerate()
        .map(|(index, file)| {
            let status = match index.cmp(&done) {
                std::cmp::Ordering::Less => "completed",
                std::cmp::Ordering::Equal => "in_progress",
                std::cmp::Ordering::Greater => "pending",
            };
            entry(&format!("Read {file}"), "high", status)
        })
        .collect();
    entries.push(entry("Ask before publishing the review", "medium", asking));
    let plan = Value { kind: Some(ValueKind::ListValue(prost_types::ListValue { values: entries })) };
    let mut message = agent_message(task.task(), vec![text_part("Plan")]);
    message.metadata = Some(Struct { fields: [(PLAN.to_owned(), plan)].into() });
    task.update_status(TaskState::Working, message).await?;
    Ok(())
}

/// Reports a step, then pauses `pace` (or stops when the task is cancelled).
async fn step(task: &TaskContext, text: String, pace: Duration) -> Result<(), HandlerError> {
    task.status(text).await?;
    tokio::select! {
        () = task.cancelled() => Err(HandlerError::fatal("the task was cancelled")),
        () = tokio::time::sleep(pace) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use chorus_proto::taskstore::Part;

    use super::*;

    #[test]
    fn allow_or_a_yes_publishes_the_review() {
        for answer in ["allow", "Allow", "yes", "Yes!", " y ", "OK.", "publish", "Approve"] {
            assert!(publishes(answer), "{answer:?}");
        }
        for answer in ["reject", "no", "yes, but not now", ""] {
            assert!(!publishes(answer), "{answer:?}");
        }
    }

    #[test]
    fn linked_and_embedded_files_are_told_apart_from_words() {
        let url =
            Part { content: Some(Content::Url("file:///src/a.rs".into())), filename: "a.rs".into(), ..Part::default() };
        let embedded =
            Part { content: Some(Content::Text("fn b() {}".into())), filename: "/src/b.rs".into(), ..Part::default() };
        let words = Part { content: Some(Content::Text("review these".into())), ..Part::default() };
        let message = Message { parts: vec![words.clone(), url, embedded], ..Message::default() };
        let files = files_of(Some(&message));
        let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["a.rs", "/src/b.rs"]);
        assert!(matches!(&files[0].1, Source::Linked(path) if path == "/src/a.rs"));
        let linked = |url: &str| Part { content: Some(Content::Url(url.into())), ..Part::default() };
        let links = vec![linked("file:///src/with%20space.rs"), linked("file://localhost/src/c.rs")];
        let files = files_of(Some(&Message { parts: links, ..Message::default() }));
        let paths: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(paths, ["/src/with space.rs", "/src/c.rs"], "decoded, as the IDE names the file");
        let plain = files_of(Some(&Message { parts: vec![words], ..Message::default() }));
        assert!(
            matches!(&plain[..], [(name, Source::Embedded(text))] if name == "the message" && text == "review these")
        );
    }
}
