//! Tasks this process saw become terminal, kept a short while for the
//! blocking calls that wait on them.
//!
//! A terminal task never changes again, so a copy taken from the write that
//! finished it answers `AwaitTask` as well as a read would: a blocking
//! `SendMessage` whose task is completed in this process (a worker here, or
//! one whose completion this replica served) needs no read after the
//! completion wakes it, or none at all when the task finished first.

use super::recent::Recent;
use crate::domain::Task;

/// Recently finished tasks, whole (full history, artifacts).
#[derive(Debug, Default)]
pub(super) struct Settled {
    tasks: Recent<Task>,
}

impl Settled {
    /// Keeps `task` if it is terminal. `task` must be whole: its full history
    /// and its artifacts.
    pub(super) fn keep(&self, task: &Task) {
        if task.status.state.is_terminal() {
            self.tasks.keep(&task.namespace, &task.id, task.clone());
        }
    }

    /// The task, if it finished here lately, with the last `history_length`
    /// messages of its history (`None`: all).
    pub(super) fn get(&self, namespace: &str, id: &str, history_length: Option<u32>) -> Option<Task> {
        let mut task = self.tasks.get(namespace, id)?;
        if let Some(length) = history_length {
            let skip = task.history.len().saturating_sub(length as usize);
            task.history.drain(..skip);
        }
        Some(task)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Message, Role, TaskState, TaskStatus};

    fn task(id: &str, state: TaskState, messages: usize) -> Task {
        Task {
            namespace: "ns".into(),
            id: id.into(),
            context_id: "ctx".into(),
            agent_id: "agent".into(),
            status: TaskStatus { state, message: None, timestamp: 1 },
            artifacts: Vec::new(),
            history: (0..messages).map(|n| Message::text(format!("m{n}"), Role::User, format!("text {n}"))).collect(),
            metadata: None,
            parent_id: None,
            owner: None,
            depth: 0,
            spawn_context: crate::domain::SpawnContext::Agent,
            attempt: 1,
            created_at: 1,
        }
    }

    #[test]
    fn keeps_terminal_tasks_only() {
        let settled = Settled::default();
        settled.keep(&task("working", TaskState::Working, 1));
        settled.keep(&task("interrupted", TaskState::InputRequired, 1));
        settled.keep(&task("done", TaskState::Completed, 1));
        assert!(settled.get("ns", "working", None).is_none());
        assert!(settled.get("ns", "interrupted", None).is_none());
        assert_eq!(settled.get("ns", "done", None).map(|task| task.id), Some("done".to_owned()));
        assert!(settled.get("other", "done", None).is_none(), "namespaces never mix");
    }

    #[test]
    fn gives_the_asked_history_window() {
        let settled = Settled::default();
        settled.keep(&task("done", TaskState::Failed, 3));
        let ids = |length| -> Vec<String> {
            settled.get("ns", "done", length).unwrap().history.into_iter().map(|message| message.message_id).collect()
        };
        assert_eq!(ids(None), ["m0", "m1", "m2"]);
        assert_eq!(ids(Some(2)), ["m1", "m2"]);
        assert_eq!(ids(Some(0)), Vec::<String>::new());
        assert_eq!(ids(Some(9)), ["m0", "m1", "m2"]);
    }
}
