//! A task as a step's output: the data its agent returned, and its text.

use chorus_proto::json::{value_from_json, value_to_json};
use chorus_proto::taskstore::{self as pb, TaskState, part::Content};
use serde_json::{Map, Value};

use super::TaskOutcome;

/// Whether a task's state is final.
pub(super) fn is_terminal(state: TaskState) -> bool {
    matches!(state, TaskState::Completed | TaskState::Failed | TaskState::Canceled | TaskState::Rejected)
}

/// A finished task as an outcome: completed → its output; else why not.
pub(super) fn outcome(task: &pb::Task) -> TaskOutcome {
    let status = task.status.as_ref();
    let state = status.map_or(TaskState::Unspecified, |s| s.state());
    let status_parts = status.and_then(|s| s.message.as_ref()).map(|m| m.parts.as_slice()).unwrap_or_default();
    if state != TaskState::Completed {
        let why = text_of(status_parts.iter());
        let state = state.as_str_name().trim_start_matches("TASK_STATE_").to_lowercase();
        let message = if why.is_empty() {
            format!("task {} ended {state}", task.id)
        } else {
            format!("task {} ended {state}: {why}", task.id)
        };
        return TaskOutcome::Failed(message);
    }
    let artifact_parts: Vec<&pb::Part> = task.artifacts.iter().flat_map(|a| a.parts.iter()).collect();
    let parts: Vec<&pb::Part> = if artifact_parts.is_empty() { status_parts.iter().collect() } else { artifact_parts };
    let mut output = Map::new();
    for part in &parts {
        if let Some(Content::Data(value)) = &part.content
            && let Value::Object(fields) = value_to_json(value)
        {
            output.extend(fields);
        }
    }
    // An artifact's text parts are chunks of one text (streamed, appended):
    // they join as they are; artifacts, and a message's parts, by lines.
    let text = if task.artifacts.is_empty() {
        text_of(status_parts.iter())
    } else {
        let texts = task.artifacts.iter().map(|artifact| texts(artifact.parts.iter()).concat());
        texts.filter(|text| !text.is_empty()).collect::<Vec<_>>().join("\n")
    };
    if output.is_empty()
        && let Some(fields) = object_in(&text)
    {
        output = fields;
    }
    output.entry("text").or_insert(Value::String(text));
    output.entry("task_id").or_insert(Value::String(task.id.clone()));
    TaskOutcome::Completed(Value::Object(output))
}

/// The JSON object a text reply is, alone or in a Markdown code fence (a
/// `json` one or a bare one), as many agents (a language model's) answer:
/// its fields are the output's, as a data part's would be.
fn object_in(text: &str) -> Option<Map<String, Value>> {
    let text = text.trim();
    let text = match text.strip_prefix("```") {
        Some(fenced) => fenced.strip_suffix("```")?.trim_start_matches("json").trim(),
        None => text,
    };
    match serde_json::from_str(text) {
        Ok(Value::Object(fields)) => Some(fields),
        _ => None,
    }
}

fn text_of<'p>(parts: impl Iterator<Item = &'p pb::Part>) -> String {
    texts(parts).join("\n")
}

fn texts<'p>(parts: impl Iterator<Item = &'p pb::Part>) -> Vec<&'p str> {
    parts
        .filter_map(|part| match &part.content {
            Some(Content::Text(text)) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The parts of a spawn's message: its input as text (a string) or data,
/// and on a rerun the gate's feedback and the previous attempt as data.
pub(super) fn message_parts(input: &Value) -> Vec<pb::Part> {
    let mut parts = vec![part_of(&input["input"])];
    if !input["feedback"].is_null() {
        let rerun = serde_json::json!({ "feedback": input["feedback"], "previous_attempt": input["previous_attempt"] });
        parts.push(part_of(&rerun));
    }
    parts
}

fn part_of(value: &Value) -> pb::Part {
    let content = match value {
        Value::String(text) => Content::Text(text.clone()),
        other => Content::Data(value_from_json(other.clone())),
    };
    pb::Part { content: Some(content), ..pb::Part::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: &str) -> pb::Part {
        pb::Part { content: Some(Content::Text(text.to_owned())), ..pb::Part::default() }
    }

    fn artifact(parts: &[&str]) -> pb::Artifact {
        pb::Artifact { parts: parts.iter().map(|part| text(part)).collect(), ..pb::Artifact::default() }
    }

    #[test]
    fn an_artifact_s_chunks_join_as_they_are_and_artifacts_by_lines() {
        let task = pb::Task {
            id: "t".into(),
            status: Some(pb::TaskStatus { state: TaskState::Completed.into(), ..pb::TaskStatus::default() }),
            artifacts: vec![artifact(&["chunk0;", "chunk1;", "chunk2;"]), artifact(&["notes"])],
            ..pb::Task::default()
        };
        let TaskOutcome::Completed(output) = outcome(&task) else { panic!("completed") };
        assert_eq!(output["text"], "chunk0;chunk1;chunk2;\nnotes");
    }

    fn answered(parts: Vec<pb::Part>) -> Value {
        let message = pb::Message { parts, ..pb::Message::default() };
        let status = pb::TaskStatus { state: TaskState::Completed.into(), message: Some(message), timestamp: None };
        let task = pb::Task { id: "t".into(), status: Some(status), ..pb::Task::default() };
        let TaskOutcome::Completed(output) = outcome(&task) else { panic!("completed") };
        output
    }

    #[test]
    fn a_reply_that_is_a_json_object_in_text_gives_its_fields() {
        let bare = answered(vec![text(r#"{"confidence": 0.2, "summary": "risky"}"#)]);
        assert_eq!(
            (&bare["confidence"], &bare["summary"], &bare["task_id"]),
            (&0.2.into(), &"risky".into(), &"t".into())
        );
        let fenced = answered(vec![text("```json\n{\"confidence\": 0.9}\n```")]);
        assert_eq!(fenced["confidence"], 0.9);
        for plain in ["looks good", "[1, 2]", "```\nnot json\n```", "{\"open\": "] {
            let output = answered(vec![text(plain)]);
            assert_eq!(output.as_object().map(Map::len), Some(2), "{plain}: only text and task_id");
        }
        let data = pb::Part {
            content: Some(Content::Data(value_from_json(serde_json::json!({"confidence": 0.5})))),
            ..pb::Part::default()
        };
        let both = answered(vec![data, text(r#"{"confidence": 0.1}"#)]);
        assert_eq!(both["confidence"], 0.5, "a data part's fields come first");
    }
}
