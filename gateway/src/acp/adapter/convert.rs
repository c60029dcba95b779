//! The bridge's types to and from the ACP v1 schema types.

use agent_client_protocol::v1::schema::{
    BlobResourceContents, ContentBlock, ContentChunk, EmbeddedResource, EmbeddedResourceResource, ListSessionsResponse,
    McpServer, MessageId, PermissionOption, PermissionOptionKind, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus,
    ResourceLink, SessionInfo, SessionUpdate, StopReason, TextResourceContents, ToolCall, ToolCallContent,
    ToolCallLocation, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use serde_json::Value;

use crate::acp::StopReason as Stop;
use crate::acp::ask::OPTIONS;
use crate::acp::content::{self, Body, Content, ToolStatus, Update};
use crate::acp::error::AcpError;
use crate::acp::history::SessionSummary;
use crate::acp::plan::{EntryStatus, PlanEntry as PlanStep, Priority};

/// An error as the SDK sends it.
pub(super) fn error(error: &AcpError) -> agent_client_protocol::Error {
    let code = agent_client_protocol::ErrorCode::new(error.code().value());
    let sdk = agent_client_protocol::Error::new(code, error.to_string());
    match error.data() {
        Some(data) => sdk.data(data),
        None => sdk,
    }
}

/// A prompt block.
pub(super) fn content_in(block: ContentBlock) -> Content {
    match block {
        ContentBlock::Text(text) => Content::Text(text.text),
        ContentBlock::ResourceLink(link) => Content::Link { uri: link.uri, name: link.name, mime_type: link.mime_type },
        ContentBlock::Resource(resource) => match resource.resource {
            EmbeddedResourceResource::TextResourceContents(text) => {
                Content::Resource { uri: text.uri, mime_type: text.mime_type, body: Body::Text(text.text) }
            }
            EmbeddedResourceResource::BlobResourceContents(blob) => {
                Content::Resource { uri: blob.uri, mime_type: blob.mime_type, body: Body::Blob(blob.blob) }
            }
            _ => Content::Unsupported("embedded resource of this kind"),
        },
        ContentBlock::Image(_) => Content::Unsupported("image"),
        ContentBlock::Audio(_) => Content::Unsupported("audio"),
        _ => Content::Unsupported("content of this kind"),
    }
}

/// What an MCP server's environment variable or header holds once stored.
const REDACTED: &str = "[redacted]";

/// The IDE's MCP servers, as the agent receives them in metadata: without
/// the values of their environment variables and headers, nor the
/// credentials and query values of their URLs, which IDEs fill with API
/// tokens, and which every message would otherwise store in the task's
/// history, for anyone who may read the task, and hand to the agent (a
/// remote one too).
pub(super) fn mcp_servers(servers: &[McpServer]) -> Vec<Value> {
    let mut servers: Vec<Value> = servers.iter().filter_map(|server| serde_json::to_value(server).ok()).collect();
    for server in &mut servers {
        for list in ["env", "headers"] {
            let entries = server.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten();
            for value in entries.filter_map(|entry| entry.get_mut("value")) {
                *value = Value::from(REDACTED);
            }
        }
        if let Some(url) = server.get_mut("url") {
            *url = Value::from(redacted_url(url.as_str().unwrap_or_default()));
        }
    }
    servers
}

/// `url` without its user name, password and query values (the names kept);
/// one that is not a URL, whole.
fn redacted_url(url: &str) -> String {
    let Ok(mut url) = reqwest::Url::parse(url) else { return REDACTED.to_owned() };
    if !url.username().is_empty() || url.password().is_some() {
        // Only a URL that cannot be a base has no user info to set, and
        // such a URL has none to hide.
        let _ = url.set_password(None);
        let _ = url.set_username("redacted");
    }
    if url.query().is_some() {
        let names: Vec<String> = url.query_pairs().map(|(name, _)| name.into_owned()).collect();
        url.query_pairs_mut().clear().extend_pairs(names.iter().map(|name| (name, "redacted")));
    }
    url.to_string()
}

fn content_out(content: Content) -> ContentBlock {
    match content {
        Content::Text(text) => ContentBlock::from(text),
        Content::Link { uri, name, mime_type } => {
            ContentBlock::ResourceLink(ResourceLink::new(name, uri).mime_type(mime_type))
        }
        Content::Resource { uri, mime_type, body } => {
            let resource = match body {
                Body::Text(text) => EmbeddedResourceResource::TextResourceContents(
                    TextResourceContents::new(text, uri).mime_type(mime_type),
                ),
                Body::Blob(blob) => EmbeddedResourceResource::BlobResourceContents(
                    BlobResourceContents::new(blob, uri).mime_type(mime_type),
                ),
            };
            ContentBlock::Resource(EmbeddedResource::new(resource))
        }
        Content::Unsupported(kind) => ContentBlock::from(format!("[{kind}]")),
    }
}

fn status_out(status: ToolStatus) -> ToolCallStatus {
    match status {
        ToolStatus::InProgress => ToolCallStatus::InProgress,
        ToolStatus::Completed => ToolCallStatus::Completed,
        ToolStatus::Failed => ToolCallStatus::Failed,
    }
}

fn kind_out(kind: content::ToolKind) -> ToolKind {
    match kind {
        content::ToolKind::Read => ToolKind::Read,
        content::ToolKind::Other => ToolKind::Other,
    }
}

fn tool_content(content: Vec<Content>) -> Vec<ToolCallContent> {
    content.into_iter().map(|content| ToolCallContent::from(content_out(content))).collect()
}

fn locations(paths: Vec<std::path::PathBuf>) -> Vec<ToolCallLocation> {
    paths.into_iter().map(ToolCallLocation::new).collect()
}

/// One `session/update`.
pub(super) fn update_out(update: Update) -> SessionUpdate {
    let chunk = |message_id: Option<String>, content: Content| {
        ContentChunk::new(content_out(content)).message_id(message_id.map(MessageId::new))
    };
    match update {
        Update::User { message_id, content } => SessionUpdate::UserMessageChunk(chunk(message_id, content)),
        Update::Agent { message_id, content } => SessionUpdate::AgentMessageChunk(chunk(message_id, content)),
        Update::Thought { message_id, content } => SessionUpdate::AgentThoughtChunk(chunk(message_id, content)),
        Update::Plan(entries) => SessionUpdate::Plan(Plan::new(entries.into_iter().map(plan_entry).collect())),
        Update::ToolCall(call) => SessionUpdate::ToolCall(
            ToolCall::new(call.id, call.title)
                .kind(kind_out(call.kind))
                .status(status_out(call.status))
                .content(tool_content(call.content))
                .locations(locations(call.locations)),
        ),
        Update::ToolChange { id, status, content } => {
            let fields = ToolCallUpdateFields::new().status(status.map(status_out)).content(content.map(tool_content));
            SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(id, fields))
        }
    }
}

fn plan_entry(entry: PlanStep) -> PlanEntry {
    let priority = match entry.priority {
        Priority::High => PlanEntryPriority::High,
        Priority::Medium => PlanEntryPriority::Medium,
        Priority::Low => PlanEntryPriority::Low,
    };
    let status = match entry.status {
        EntryStatus::Pending => PlanEntryStatus::Pending,
        EntryStatus::InProgress => PlanEntryStatus::InProgress,
        EntryStatus::Completed => PlanEntryStatus::Completed,
    };
    PlanEntry::new(entry.content, priority, status)
}

/// The tool call a permission question is about.
pub(super) fn permission_call(call: content::ToolCall) -> ToolCallUpdate {
    let fields = ToolCallUpdateFields::new()
        .title(call.title)
        .kind(kind_out(call.kind))
        .status(status_out(call.status))
        .content(tool_content(call.content));
    ToolCallUpdate::new(call.id, fields)
}

/// The options of every permission question.
pub(super) fn permission_options() -> Vec<PermissionOption> {
    OPTIONS
        .iter()
        .map(|option| {
            let kind = if option.allows { PermissionOptionKind::AllowOnce } else { PermissionOptionKind::RejectOnce };
            PermissionOption::new(option.id, option.name, kind)
        })
        .collect()
}

pub(super) fn stop_out(stop: Stop) -> StopReason {
    match stop {
        Stop::EndTurn => StopReason::EndTurn,
        Stop::Refusal => StopReason::Refusal,
        Stop::Cancelled => StopReason::Cancelled,
    }
}

pub(super) fn sessions_out(sessions: Vec<SessionSummary>) -> ListSessionsResponse {
    let infos = sessions
        .into_iter()
        .map(|session| {
            SessionInfo::new(session.id, session.cwd)
                .additional_directories(session.additional_directories)
                .title(session.title)
                .updated_at(session.updated_at)
        })
        .collect();
    ListSessionsResponse::new(infos)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn mcp_servers_keep_their_shape_but_not_their_secrets() {
        let servers: Vec<McpServer> = serde_json::from_value(json!([
            { "name": "github", "command": "/usr/bin/github-mcp", "args": ["--stdio"],
              "env": [{ "name": "GITHUB_TOKEN", "value": "ghp_SECRET123" }] },
            { "type": "http", "name": "remote", "url": "https://mcp.example.com",
              "headers": [{ "name": "Authorization", "value": "Bearer SECRET456" }] },
        ]))
        .expect("ACP MCP servers");
        let stored = mcp_servers(&servers);
        let text = serde_json::to_string(&stored).expect("JSON");
        assert!(!text.contains("SECRET"), "{text}");
        assert_eq!(stored[0]["env"][0], json!({ "name": "GITHUB_TOKEN", "value": REDACTED }));
        assert_eq!(stored[1]["headers"][0]["name"], "Authorization");
        assert_eq!(stored[1]["url"], "https://mcp.example.com/");
        let with_secrets = "https://user:SECRET-PASS@mcp.example.com/mcp?token=SECRET-QUERY&v=2";
        assert_eq!(redacted_url(with_secrets), "https://redacted@mcp.example.com/mcp?token=redacted&v=redacted");
        assert_eq!(redacted_url("not a url SECRET"), REDACTED);
    }
}
