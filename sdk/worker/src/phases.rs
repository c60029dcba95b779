//! The built-in phase agents of the example workflows (`workflows/`): one
//! worker per role of the seed-001 delivery pipeline and the deployment
//! workflow. Each answers its phase with a short summary and the fields the
//! workflows' templates and AUTO gates read (`test.output.passed`,
//! `security.output.critical`, `design.output.tasks`, ...). A task whose
//! message carries gate feedback answers that it addressed it.

use chorus_proto::{
    json::{value_from_json, value_to_json},
    taskstore::{Part, part::Content},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{Client, HandlerError, Placement, Reply, TaskContext, WorkerError, text_part};

/// The roles the phase agents work for.
pub const ROLES: &[&str] = &[
    "discovery",
    "design",
    "development",
    "test",
    "security",
    "validator",
    "deployment",
    "builder",
    "tester",
    "deployer",
];
/// How many tasks one phase worker handles at once.
pub const CAPACITY: u32 = 8;

/// Runs a worker for every role in [`ROLES`], placed at `placement`, until
/// `shutdown` is cancelled.
pub async fn run(client: Client, placement: Placement, shutdown: CancellationToken) -> Result<(), WorkerError> {
    let workers = ROLES.iter().map(|role| {
        let worker = placement.worker(client.clone(), role).capacity(CAPACITY);
        let handler = move |task: TaskContext| async move { handle(role, &task) };
        worker.run(handler, shutdown.clone())
    });
    futures_util::future::try_join_all(workers).await.map(drop)
}

fn handle(role: &str, task: &TaskContext) -> Result<Reply, HandlerError> {
    let feedback = task.task().history.first().and_then(|message| {
        message.parts.iter().find_map(|part| match &part.content {
            Some(Content::Data(data)) => {
                value_to_json(data).get("feedback").and_then(|f| f["reason"].as_str().map(str::to_owned))
            }
            _ => None,
        })
    });
    Ok(reply(role, &task.text(), feedback.as_deref()))
}

/// What the phase agent of `role` answers to `text`.
fn reply(role: &str, text: &str, feedback: Option<&str>) -> Reply {
    let mut output = match role {
        "discovery" => json!({ "prd": "PRD drafted", "acceptance_criteria": 3, "user_stories": 5 }),
        "design" => json!({ "architecture": "service + queue", "tasks": ["api", "storage", "ui"] }),
        "development" => json!({ "commits": 7, "tests_written": 12 }),
        "test" | "tester" => json!({ "passed": true, "coverage": 0.87 }),
        "security" => json!({ "critical": 0, "findings": [] }),
        "validator" => json!({ "ready": true }),
        "deployment" | "deployer" => json!({ "release_notes": "ready to ship" }),
        _ => json!({}),
    };
    let mut summary = format!("{role} done: {}", text.chars().take(80).collect::<String>());
    if let Some(feedback) = feedback {
        summary = format!("{summary} (addressed: {feedback})");
        output["addressed_feedback"] = json!(feedback);
    }
    output["summary"] = Value::String(summary.clone());
    let data = Part { content: Some(Content::Data(value_from_json(output))), ..Part::default() };
    Reply::new().with_part(text_part(summary)).with_part(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(reply: &Reply) -> Value {
        reply
            .parts()
            .iter()
            .find_map(|part| match &part.content {
                Some(Content::Data(data)) => Some(value_to_json(data)),
                _ => None,
            })
            .expect("a data part")
    }

    #[test]
    fn phases_answer_what_the_example_gates_read() {
        assert_eq!(data(&reply("test", "run the tests", None))["passed"], json!(true));
        assert_eq!(data(&reply("security", "scan", None))["critical"], json!(0));
        let again = data(&reply("design", "design it", Some("split the API")));
        assert_eq!(again["addressed_feedback"], json!("split the API"));
        assert!(again["summary"].as_str().is_some_and(|s| s.starts_with("design done")));
    }
}
