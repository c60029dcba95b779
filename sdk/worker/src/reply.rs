//! What a handler answers, and helpers to build messages, parts and artifacts.

use chorus_proto::taskstore::{Artifact, Message, Part, Role, Task, part::Content};
use prost::Message as _;

/// A handler's answer: the agent's final message and the task's artifacts.
///
/// A reply with no parts completes the task without a final message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    parts: Vec<Part>,
    artifacts: Vec<Artifact>,
}

impl Reply {
    /// A reply without message or artifacts.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reply whose final message is one text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self::new().with_part(text_part(text))
    }

    /// Adds a part to the final message.
    #[must_use]
    pub fn with_part(mut self, part: Part) -> Self {
        self.parts.push(part);
        self
    }

    /// Adds an artifact to the completed task.
    #[must_use]
    pub fn with_artifact(mut self, artifact: Artifact) -> Self {
        self.artifacts.push(artifact);
        self
    }

    /// The parts of the final message.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The artifacts the task completes with.
    pub fn artifacts(&self) -> &[Artifact] {
        &self.artifacts
    }

    /// The final message (for `task`) and the artifacts.
    pub(crate) fn into_completion(self, task: &Task) -> (Option<Message>, Vec<Artifact>) {
        let message = (!self.parts.is_empty()).then(|| agent_message(task, self.parts));
        (message, self.artifacts)
    }
}

/// `artifact` in pieces of about `max` bytes to send one after another (the
/// first replacing the artifact, the others appended): a text part longer
/// than that is cut, at character boundaries, into consecutive text parts
/// (the chunks of one text, as a streamed artifact's are); other parts go
/// whole, one piece holding as many as fit.
pub(crate) fn pieces(mut artifact: Artifact, max: usize) -> Vec<Artifact> {
    let parts = std::mem::take(&mut artifact.parts);
    let mut pieces = Vec::new();
    let mut piece: Vec<Part> = Vec::new();
    let mut size = 0;
    for part in parts.into_iter().flat_map(|part| cut(part, max)) {
        let len = part.encoded_len();
        if size + len > max && !piece.is_empty() {
            pieces.push(Artifact { parts: std::mem::take(&mut piece), ..artifact.clone() });
            size = 0;
        }
        size += len;
        piece.push(part);
    }
    pieces.push(Artifact { parts: piece, ..artifact });
    pieces
}

/// A text part longer than `max` bytes as consecutive parts of at most that
/// (a character longer than `max` stays whole); any other part as it is.
fn cut(mut part: Part, max: usize) -> Vec<Part> {
    let text = match part.content.take() {
        Some(Content::Text(text)) if text.len() > max => text,
        content => {
            part.content = content;
            return vec![part];
        }
    };
    let mut parts = Vec::new();
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let mut end = max.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        parts.push(Part { content: Some(Content::Text(rest[..end].to_owned())), ..part.clone() });
        rest = &rest[end..];
    }
    parts
}

/// A text part.
pub fn text_part(text: impl Into<String>) -> Part {
    Part { content: Some(Content::Text(text.into())), ..Part::default() }
}

/// An artifact named `name` with a fresh id and one text part.
pub fn text_artifact(name: impl Into<String>, text: impl Into<String>) -> Artifact {
    Artifact {
        artifact_id: uuid::Uuid::new_v4().to_string(),
        name: name.into(),
        parts: vec![text_part(text)],
        ..Artifact::default()
    }
}

/// A message from the agent working on `task`, with a fresh id.
pub(crate) fn agent_message(task: &Task, parts: Vec<Part>) -> Message {
    Message {
        message_id: uuid::Uuid::new_v4().to_string(),
        context_id: task.context_id.clone(),
        task_id: task.id.clone(),
        role: Role::Agent.into(),
        parts,
        ..Message::default()
    }
}

/// A user message (an instruction to another agent) with a fresh id.
pub(crate) fn user_message(parts: Vec<Part>) -> Message {
    Message { message_id: uuid::Uuid::new_v4().to_string(), role: Role::User.into(), parts, ..Message::default() }
}

/// The parts of the most recent user message of `task`'s history; none when
/// there is no such message.
pub(crate) fn latest_user_parts(task: &Task) -> &[Part] {
    let latest = task.history.iter().rev().find(|message| message.role == i32::from(Role::User));
    latest.map(|message| message.parts.as_slice()).unwrap_or_default()
}

/// The text parts of `parts`, joined by newlines.
pub(crate) fn text_of(parts: &[Part]) -> String {
    let texts: Vec<&str> = parts
        .iter()
        .filter_map(|part| match &part.content {
            Some(Content::Text(text)) => Some(text.as_str()),
            Some(Content::Raw(_) | Content::Url(_) | Content::Data(_)) | None => None,
        })
        .collect();
    texts.join("\n")
}

/// The text parts of the most recent user message of `task`'s history,
/// joined by newlines; empty when there is none.
pub(crate) fn user_text(task: &Task) -> String {
    text_of(latest_user_parts(task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(role: Role, parts: Vec<Part>) -> Message {
        Message { role: role.into(), parts, ..Message::default() }
    }

    fn task(history: Vec<Message>) -> Task {
        Task { id: "t1".into(), context_id: "c1".into(), history, ..Task::default() }
    }

    #[test]
    fn text_is_the_latest_user_message_text_parts_joined() {
        let url = Part { content: Some(Content::Url("https://example.com".into())), ..Part::default() };
        let task = task(vec![
            message(Role::User, vec![text_part("first")]),
            message(Role::User, vec![text_part("a"), url, text_part("b")]),
            message(Role::Agent, vec![text_part("agent says")]),
        ]);
        assert_eq!(user_text(&task), "a\nb");
    }

    #[test]
    fn text_is_empty_without_a_user_message() {
        assert_eq!(user_text(&task(vec![])), "");
        let agent_only = task(vec![message(Role::Agent, vec![text_part("hi")])]);
        assert_eq!(user_text(&agent_only), "");
    }

    #[test]
    fn completion_carries_an_agent_message_of_the_task() {
        let task = task(vec![]);
        let reply = Reply::text("done").with_artifact(text_artifact("out", "x"));
        let (message, artifacts) = reply.into_completion(&task);
        let message = message.expect("a text reply has a message");
        assert_eq!(message.role, i32::from(Role::Agent));
        assert_eq!(message.context_id, "c1");
        assert_eq!(message.task_id, "t1");
        assert!(uuid::Uuid::parse_str(&message.message_id).is_ok());
        assert_eq!(message.parts, vec![text_part("done")]);
        assert_eq!(artifacts.len(), 1);
        assert_eq!(artifacts[0].name, "out");
    }

    #[test]
    fn a_large_artifact_goes_in_pieces_that_rejoin_to_its_text() {
        let text = "é".repeat(1_000) + &"x".repeat(3_001);
        let data = Part { content: Some(Content::Data(Default::default())), ..Part::default() };
        let mut artifact = text_artifact("out", text.clone());
        artifact.parts.push(data.clone());
        let cut = pieces(artifact.clone(), 1_000);
        assert!(cut.len() >= 5, "{}", cut.len());
        assert!(cut.iter().all(|piece| piece.artifact_id == artifact.artifact_id && piece.name == "out"));
        let size = |piece: &Artifact| piece.parts.iter().map(prost::Message::encoded_len).sum::<usize>();
        assert!(cut.iter().all(|piece| size(piece) <= 1_000 + 8), "about the size asked");
        let parts: Vec<Part> = cut.into_iter().flat_map(|piece| piece.parts).collect();
        assert_eq!(parts.last(), Some(&data), "a data part goes whole, in order");
        assert_eq!(text_of(&parts[..parts.len() - 1]).replace('\n', ""), text);
        let small = text_artifact("small", "fits");
        assert_eq!(pieces(small.clone(), 1_000), vec![small], "one that fits is one piece");
    }

    #[test]
    fn empty_reply_completes_without_a_message() {
        let (message, artifacts) = Reply::new().into_completion(&task(vec![]));
        assert!(message.is_none());
        assert!(artifacts.is_empty());
    }
}
