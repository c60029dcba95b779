//! Sessions as the gateway keeps them: `session/load` replays a context's
//! tasks, `session/list` finds the contexts the bridge's prompts made.

use std::collections::HashMap;
use std::path::PathBuf;

use a2a::{ListTasksRequest, Message, Role, Task, TaskState};
use serde_json::Value;

use super::Ide;
use super::ask;
use super::content::{Content, ToolCall, ToolKind, ToolStatus, Update, content_of};
use super::error::Result;
use super::plan;
use super::session::SESSION_METADATA;
use super::upstream::Upstream;

/// The gateway's largest page.
const PAGE_SIZE: i32 = 100;
/// How many of the newest tasks `session/list` looks through.
const LIST_SCAN: usize = 1000;

/// A session as `session/list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionSummary {
    pub(crate) id: String,
    pub(crate) cwd: PathBuf,
    pub(crate) additional_directories: Vec<PathBuf>,
    pub(crate) title: Option<String>,
    /// RFC 3339.
    pub(crate) updated_at: Option<String>,
}

/// Every task the bridge made in context `context_id` for its agent, oldest
/// first, with history and artifacts.
pub(crate) async fn tasks_of(upstream: &Upstream, context_id: &str) -> Result<Vec<Task>> {
    let mut tasks = Vec::new();
    let mut page_token = None;
    loop {
        let request = query(Some(context_id), PAGE_SIZE, page_token.take(), None, true);
        let page = upstream.list(request).await?;
        tasks.extend(page.tasks.into_iter().filter(|task| made_for(upstream.agent(), task)));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = Some(page.next_page_token);
    }
    Ok(in_prompt_order(tasks))
}

/// A session's tasks as the gateway lists them, most recently updated
/// first, in the order their turns were prompted in: a turn left waiting
/// (interrupted, decided later) can be updated after the turns that
/// followed it. A task made before the bridge noted when keeps its place.
fn in_prompt_order(mut tasks: Vec<Task>) -> Vec<Task> {
    tasks.reverse();
    tasks.sort_by_cached_key(prompted_at);
    tasks
}

/// One `ListTasks` page request; `history_length` unset is the whole history.
fn query(
    context_id: Option<&str>,
    page_size: i32,
    page_token: Option<String>,
    history_length: Option<i32>,
    include_artifacts: bool,
) -> ListTasksRequest {
    ListTasksRequest {
        context_id: context_id.map(str::to_owned),
        status: None,
        page_size: Some(page_size),
        page_token,
        history_length,
        status_timestamp_after: None,
        include_artifacts: Some(include_artifacts),
        tenant: None,
    }
}

/// The newest hundred tasks the bridge made in context `context_id` for its
/// agent, without history or artifacts, in prompt order.
pub(crate) async fn briefly(upstream: &Upstream, context_id: &str) -> Result<Vec<Task>> {
    let request = query(Some(context_id), PAGE_SIZE, None, Some(0), false);
    let tasks = upstream.list(request).await?.tasks;
    Ok(in_prompt_order(tasks.into_iter().filter(|task| made_for(upstream.agent(), task)).collect()))
}

/// The session's task that waits for its answer, if one does (of `tasks`,
/// in prompt order, the last): a connection that closed while the turn
/// waited left it so, and the session's next prompt answers it.
pub(crate) fn waiting(tasks: &[Task]) -> Option<String> {
    let task = tasks.iter().rev().find(|task| task.status.state == TaskState::InputRequired)?;
    Some(task.id.clone())
}

/// What a loaded session says after its replay when a task waits for its
/// answer: it asked last, and the next prompt answers it.
pub(crate) fn remind(ide: &dyn Ide, session_id: &str) -> Result<()> {
    let text = "(This session's last question still waits for an answer: your next prompt answers it.)";
    ide.update(session_id, Update::Agent { message_id: None, content: Content::Text(text.to_owned()) })
}

/// `session/load`: the conversation of `tasks` as `session/update`s, in order.
/// Each task's artifacts come before its last agent message (the answer).
pub(crate) fn replay(ide: &dyn Ide, session_id: &str, tasks: &[Task]) -> Result<()> {
    for task in tasks {
        let history = task.history.as_deref().unwrap_or_default();
        let answer = history.iter().rposition(|message| message.role == Role::Agent).unwrap_or(history.len());
        for (index, message) in history.iter().enumerate() {
            if index == answer {
                replay_artifacts(ide, session_id, task)?;
            }
            replay_message(ide, session_id, message)?;
        }
        if answer == history.len() {
            replay_artifacts(ide, session_id, task)?;
        }
    }
    Ok(())
}

fn replay_message(ide: &dyn Ide, session_id: &str, message: &Message) -> Result<()> {
    if let Some(request) = ask::file_request(Some(message)) {
        if message.role == Role::Agent {
            let call = ToolCall {
                id: format!("read-{}", message.message_id),
                title: format!("Read {}", request.path.display()),
                kind: ToolKind::Read,
                status: ToolStatus::Completed,
                content: Vec::new(),
                locations: vec![request.path],
            };
            ide.update(session_id, Update::ToolCall(call))?;
        }
        return Ok(());
    }
    if message.role != Role::User
        && let Some(plan) = plan::plan_of(message)
    {
        return ide.update(session_id, Update::Plan(plan));
    }
    // The IDE's answer to a question, not words the user typed: as live, a
    // question answered.
    if let Some(chosen) = message.metadata.as_ref().and_then(|metadata| metadata.get(ask::PERMISSION)) {
        let chosen = chosen.as_str().unwrap_or_default();
        let call = ToolCall {
            id: format!("input-{}", message.message_id),
            title: format!("Answered: {chosen}"),
            kind: ToolKind::Other,
            status: ToolStatus::Completed,
            content: vec![Content::Text(chosen.to_owned())],
            locations: Vec::new(),
        };
        return ide.update(session_id, Update::ToolCall(call));
    }
    let thought = plan::is_thought(message);
    for part in &message.parts {
        let message_id = Some(message.message_id.clone());
        let content = content_of(part);
        let update = match message.role {
            Role::User => Update::User { message_id, content },
            Role::Agent | Role::Unspecified if thought => Update::Thought { message_id, content },
            Role::Agent | Role::Unspecified => Update::Agent { message_id, content },
        };
        ide.update(session_id, update)?;
    }
    Ok(())
}

fn replay_artifacts(ide: &dyn Ide, session_id: &str, task: &Task) -> Result<()> {
    for artifact in task.artifacts.as_deref().unwrap_or_default() {
        let call = ToolCall {
            id: format!("artifact-{}", artifact.artifact_id),
            title: artifact.name.clone().filter(|name| !name.is_empty()).unwrap_or_else(|| "artifact".to_owned()),
            kind: ToolKind::Other,
            status: ToolStatus::Completed,
            content: artifact.parts.iter().map(content_of).collect(),
            locations: Vec::new(),
        };
        ide.update(session_id, Update::ToolCall(call))?;
    }
    Ok(())
}

/// `session/list`: the contexts among the newest tasks that this bridge's
/// prompts to the same agent made, newest first; `cwd` filters.
pub(crate) async fn list(upstream: &Upstream, cwd: Option<&PathBuf>) -> Result<Vec<SessionSummary>> {
    let mut sessions: Vec<SessionSummary> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut page_token = None;
    let mut scanned = 0;
    while scanned < LIST_SCAN {
        let request = query(None, PAGE_SIZE, page_token.take(), Some(0), false);
        let page = upstream.list(request).await?;
        scanned += page.tasks.len().max(1);
        for task in &page.tasks {
            let Some(found) = summary(upstream.agent(), task) else {
                continue;
            };
            match index.get(&found.id) {
                // Newest first: a task seen later is older, so its title is the earlier one.
                Some(&at) => sessions[at].title = found.title.or(sessions[at].title.take()),
                None => {
                    index.insert(found.id.clone(), sessions.len());
                    sessions.push(found);
                }
            }
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = Some(page.next_page_token);
    }
    sessions.retain(|session| cwd.is_none_or(|cwd| &session.cwd == cwd));
    Ok(sessions)
}

/// When the turn that made `task` was prompted, as the bridge noted it.
fn prompted_at(task: &Task) -> Option<String> {
    let session = task.metadata.as_ref()?.get(SESSION_METADATA)?;
    Some(session.get("promptedAt")?.as_str()?.to_owned())
}

/// Whether the bridge made `task` for `agent`: a session is one agent's,
/// and another agent's bridge neither lists, loads nor resumes it.
fn made_for(agent: &str, task: &Task) -> bool {
    let session = task.metadata.as_ref().and_then(|metadata| metadata.get(SESSION_METADATA));
    session.and_then(|session| session.get("agent")).and_then(Value::as_str) == Some(agent)
}

/// The session a task belongs to, if the bridge made it for `agent`.
fn summary(agent: &str, task: &Task) -> Option<SessionSummary> {
    if !made_for(agent, task) {
        return None;
    }
    let session = task.metadata.as_ref()?.get(SESSION_METADATA)?;
    let paths = |value: Option<&Value>| -> Vec<PathBuf> {
        value.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(PathBuf::from).collect()
    };
    Some(SessionSummary {
        id: task.context_id.clone(),
        cwd: PathBuf::from(session.get("cwd").and_then(Value::as_str)?),
        additional_directories: paths(session.get("additionalDirectories")),
        title: session.get("title").and_then(Value::as_str).filter(|title| !title.is_empty()).map(str::to_owned),
        updated_at: task.status.timestamp.map(|at| at.to_rfc3339()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn task(id: &str, prompted_at: &str) -> Task {
        let session = json!({ "agent": "approver", "cwd": "/w", "promptedAt": prompted_at });
        let task = json!({
            "id": id,
            "contextId": "s1",
            "status": { "state": "TASK_STATE_COMPLETED" },
            "metadata": { SESSION_METADATA: session },
        });
        serde_json::from_value(task).expect("a task")
    }

    #[test]
    fn the_last_task_left_waiting_is_the_one_the_next_prompt_answers() {
        let mut tasks = vec![task("first", "1"), task("second", "2"), task("third", "3")];
        assert_eq!(waiting(&tasks), None);
        tasks[0].status.state = TaskState::InputRequired;
        tasks[1].status.state = TaskState::InputRequired;
        assert_eq!(waiting(&tasks).as_deref(), Some("second"));
    }

    #[test]
    fn a_turn_decided_after_the_next_one_is_still_replayed_first() {
        // As listed: the first turn, interrupted and decided last, comes first.
        let listed = vec![
            task("first", "2026-11-28T01:00:00.000001Z"),
            task("third", "2026-11-28T01:02:00.000000Z"),
            task("second", "2026-11-28T01:01:00.000000Z"),
        ];
        let ids: Vec<String> = in_prompt_order(listed).into_iter().map(|task| task.id).collect();
        assert_eq!(ids, ["first", "second", "third"]);
    }
}
