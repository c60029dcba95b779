//! What the bridge exchanges with the IDE, in its own terms (the adapter
//! turns these into ACP types), and the mapping between them and A2A parts.

use std::collections::HashMap;
use std::path::PathBuf;

use a2a::{Part, PartContent};
use base64::Engine as _;
use chorus_runtime::uri::file_path;
use serde_json::{Value, json};

/// Metadata key of a part that came from an ACP resource: its URI.
pub(crate) const PART_URI: &str = "acp/uri";
/// Metadata key of the media type an ACP resource declared (kept out of the
/// part's own media type, which the agent's input modes would check).
const PART_MIME_TYPE: &str = "acp/mimeType";

/// One content block (ACP `ContentBlock`, the kinds the bridge handles).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Content {
    /// Plain text.
    Text(String),
    /// A reference to a resource the agent may read (`resource_link`).
    Link { uri: String, name: String, mime_type: Option<String> },
    /// A resource with its content (`resource`): text, or base64 when binary.
    Resource { uri: String, mime_type: Option<String>, body: Body },
    /// A kind the bridge does not take (image, audio): named, not converted.
    Unsupported(&'static str),
}

/// The content of an embedded resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Body {
    Text(String),
    /// Base64.
    Blob(String),
}

/// How far a tool call has got (ACP `ToolCallStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolStatus {
    InProgress,
    Completed,
    Failed,
}

/// What a tool call does (the ACP `ToolKind`s the bridge uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    /// Reads a file through the IDE.
    Read,
    /// An agent's artifact, or its question.
    Other,
}

/// A tool call as the IDE first sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub(crate) id: String,
    pub(crate) title: String,
    pub(crate) kind: ToolKind,
    pub(crate) status: ToolStatus,
    pub(crate) content: Vec<Content>,
    pub(crate) locations: Vec<PathBuf>,
}

/// One `session/update`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Update {
    /// Replayed user input (`user_message_chunk`).
    User { message_id: Option<String>, content: Content },
    /// The agent's words (`agent_message_chunk`).
    Agent { message_id: Option<String>, content: Content },
    /// The agent's thinking (`agent_thought_chunk`).
    Thought { message_id: Option<String>, content: Content },
    /// The agent's plan, replacing the one shown (`plan`).
    Plan(Vec<super::plan::PlanEntry>),
    /// A new tool call (`tool_call`).
    ToolCall(ToolCall),
    /// A change to a tool call (`tool_call_update`); `None` leaves a field as it was.
    ToolChange { id: String, status: Option<ToolStatus>, content: Option<Vec<Content>> },
}

/// The A2A part of one prompt block (none for a kind the bridge does not
/// take). A resource link becomes a URL part, an embedded text resource a
/// text part named by its URI's path; either keeps the URI in the part's
/// metadata under [`PART_URI`]. A blob that is not base64 is an error naming
/// its resource, not a part silently left out.
pub(crate) fn part_of(content: &Content) -> Result<Option<Part>, String> {
    let with_uri = |content: PartContent, uri: &str, filename: Option<String>, mime: &Option<String>| {
        let mut metadata = HashMap::from([(PART_URI.to_owned(), json!(uri))]);
        if let Some(mime) = mime {
            metadata.insert(PART_MIME_TYPE.to_owned(), json!(mime));
        }
        Part { content, filename, media_type: None, metadata: Some(metadata) }
    };
    Ok(match content {
        Content::Text(text) => Some(Part::text(text.clone())),
        Content::Link { uri, name, mime_type } => {
            Some(with_uri(PartContent::Url(uri.clone()), uri, Some(name.clone()), mime_type))
        }
        Content::Resource { uri, mime_type, body } => {
            let filename = Some(file_path(uri).map_or_else(|| uri.clone(), |path| path.display().to_string()));
            let content = match body {
                Body::Text(text) => PartContent::Text(text.clone()),
                Body::Blob(blob) => PartContent::Raw(
                    base64::engine::general_purpose::STANDARD
                        .decode(blob)
                        .map_err(|error| format!("resource {uri}: the blob is not base64: {error}"))?,
                ),
            };
            Some(with_uri(content, uri, filename, mime_type))
        }
        Content::Unsupported(_) => None,
    })
}

/// What the IDE shows for one A2A part.
pub(crate) fn content_of(part: &Part) -> Content {
    let meta = |key: &str| part.metadata.as_ref().and_then(|m| m.get(key)).and_then(Value::as_str).map(str::to_owned);
    let uri = meta(PART_URI);
    let mime_type = part.media_type.clone().or_else(|| meta(PART_MIME_TYPE));
    match &part.content {
        PartContent::Text(text) => match uri {
            Some(uri) => Content::Resource { uri, mime_type, body: Body::Text(text.clone()) },
            None => Content::Text(text.clone()),
        },
        PartContent::Url(url) => {
            Content::Link { uri: url.clone(), name: part.filename.clone().unwrap_or_else(|| url.clone()), mime_type }
        }
        PartContent::Data(data) => {
            Content::Text(serde_json::to_string_pretty(data).unwrap_or_else(|_| data.to_string()))
        }
        PartContent::Raw(bytes) => Content::Resource {
            uri: uri.unwrap_or_else(|| format!("data:{}", part.filename.as_deref().unwrap_or("bytes"))),
            mime_type,
            body: Body::Blob(base64::engine::general_purpose::STANDARD.encode(bytes)),
        },
    }
}

/// The text of a prompt, for titles: its text blocks joined.
pub(crate) fn text_of(prompt: &[Content]) -> String {
    let texts: Vec<&str> = prompt
        .iter()
        .filter_map(|content| match content {
            Content::Text(text) => Some(text.as_str()),
            Content::Link { .. } | Content::Resource { .. } | Content::Unsupported(_) => None,
        })
        .collect();
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_blocks_survive_the_trip_through_a2a_parts() {
        let blocks = [
            Content::Text("review this".to_owned()),
            Content::Link { uri: "file:///src/main.rs".to_owned(), name: "main.rs".to_owned(), mime_type: None },
            Content::Resource {
                uri: "file:///src/lib.rs".to_owned(),
                mime_type: Some("text/x-rust".to_owned()),
                body: Body::Text("fn f() {}".to_owned()),
            },
        ];
        for block in blocks {
            let part = part_of(&block).expect("a block the bridge takes").expect("a part");
            assert_eq!(part.media_type, None, "the agent's input modes must not refuse it: {part:?}");
            let back = content_of(&part);
            assert_eq!(block, back);
        }
    }

    fn resource(uri: &str, body: Body) -> Content {
        Content::Resource { uri: uri.to_owned(), mime_type: None, body }
    }

    #[test]
    fn embedded_resources_are_named_by_their_path() {
        let block = resource("file:///home/me/my%20project/a.txt", Body::Text("a".to_owned()));
        let part = part_of(&block).expect("a block the bridge takes").expect("a part");
        assert_eq!(part.filename.as_deref(), Some("/home/me/my project/a.txt"));
    }

    #[test]
    fn a_blob_that_is_not_base64_is_named_not_dropped() {
        let block = resource("file:///tmp/x.bin", Body::Blob("!!!notbase64!!!".to_owned()));
        let error = part_of(&block).expect_err("not base64");
        assert!(error.starts_with("resource file:///tmp/x.bin: the blob is not base64"), "{error}");
    }
}
