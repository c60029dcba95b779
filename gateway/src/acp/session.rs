//! The sessions one ACP connection has open. A session *is* an A2A context:
//! its id is the context id, so the gateway keeps everything about it (its
//! tasks, their history and artifacts) and any later connection, over stdio
//! or WebSocket, can load or resume it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::error::{AcpError, Result};

/// Message metadata key of the IDE context sent with every prompt.
pub const SESSION_METADATA: &str = "acp/session";

/// What the IDE told the bridge about a session.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionContext {
    /// The IDE's working directory (absolute).
    pub(crate) cwd: PathBuf,
    pub(crate) additional_directories: Vec<PathBuf>,
    /// The MCP servers the IDE offers, as ACP describes them.
    pub(crate) mcp_servers: Vec<Value>,
}

impl SessionContext {
    /// Checks what the protocol requires of paths: they are absolute.
    pub(crate) fn new(cwd: PathBuf, additional_directories: Vec<PathBuf>, mcp_servers: Vec<Value>) -> Result<Self> {
        if !cwd.is_absolute() {
            return Err(AcpError::InvalidParams(format!("cwd must be an absolute path, got {}", cwd.display())));
        }
        if let Some(relative) = additional_directories.iter().find(|dir| !dir.is_absolute()) {
            return Err(AcpError::InvalidParams(format!(
                "additionalDirectories must be absolute paths, got {}",
                relative.display()
            )));
        }
        Ok(Self { cwd, additional_directories, mcp_servers })
    }

    /// The folders the IDE opened to the session: its working directory and
    /// the additional ones. The agent may read files in them alone.
    pub(crate) fn folders(&self) -> Vec<PathBuf> {
        std::iter::once(&self.cwd).chain(&self.additional_directories).cloned().collect()
    }

    /// The metadata every A2A message of the session carries: the IDE context.
    pub(crate) fn metadata(&self, session_id: &str) -> Value {
        json!({
            "sessionId": session_id,
            "cwd": self.cwd,
            "additionalDirectories": self.additional_directories,
            "mcpServers": self.mcp_servers,
        })
    }
}

/// One open session.
#[derive(Debug)]
struct Open {
    context: SessionContext,
    /// The running turn's cancellation, while there is one.
    turn: Option<CancellationToken>,
    /// A task of the session that waits for its answer since an earlier
    /// connection (found when the session was loaded or resumed): the
    /// session's next prompt answers it.
    waiting: Option<String>,
}

/// The sessions of one connection. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sessions {
    open: Arc<Mutex<HashMap<String, Open>>>,
    /// Fires when the connection closes.
    closing: CancellationToken,
}

/// A running turn: ends the session's turn when dropped.
#[derive(Debug)]
pub(crate) struct TurnGuard {
    sessions: Sessions,
    id: String,
    cancel: CancellationToken,
    /// The task the turn answers, left waiting by an earlier connection.
    pub(crate) waiting: Option<String>,
}

impl TurnGuard {
    /// Fires when `session/cancel` names the session, or the connection closes.
    pub(crate) fn cancel(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Fires when the connection closes.
    pub(crate) fn closing(&self) -> &CancellationToken {
        &self.sessions.closing
    }
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let mut open = self.sessions.lock();
        if let Some(session) = open.get_mut(&self.id) {
            session.turn = None;
        }
    }
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens (or re-opens, with a new context) session `id`, whose task
    /// `waiting`, if any, waits for its answer.
    pub(crate) fn open(&self, id: &str, context: SessionContext, waiting: Option<String>) {
        let mut open = self.lock();
        let turn = open.remove(id).and_then(|session| session.turn);
        open.insert(id.to_owned(), Open { context, turn, waiting });
    }

    /// The context of an open session.
    pub(crate) fn context(&self, id: &str) -> Result<SessionContext> {
        self.lock()
            .get(id)
            .map(|session| session.context.clone())
            .ok_or_else(|| AcpError::UnknownSession(id.to_owned()))
    }

    /// The ids and contexts of every open session.
    pub(crate) fn all(&self) -> Vec<(String, SessionContext)> {
        self.lock().iter().map(|(id, session)| (id.clone(), session.context.clone())).collect()
    }

    /// Starts a turn in session `id`: one at a time per session.
    pub(crate) fn start_turn(&self, id: &str) -> Result<(SessionContext, TurnGuard)> {
        let mut open = self.lock();
        let session = open.get_mut(id).ok_or_else(|| AcpError::UnknownSession(id.to_owned()))?;
        if session.turn.is_some() {
            return Err(AcpError::Busy(id.to_owned()));
        }
        let cancel = CancellationToken::new();
        session.turn = Some(cancel.clone());
        let waiting = session.waiting.take();
        let guard = TurnGuard { sessions: self.clone(), id: id.to_owned(), cancel, waiting };
        Ok((session.context.clone(), guard))
    }

    /// `session/cancel`: stops the session's running turn, if any.
    pub(crate) fn cancel(&self, id: &str) -> bool {
        let open = self.lock();
        let Some(cancel) = open.get(id).and_then(|session| session.turn.as_ref()) else {
            return false;
        };
        cancel.cancel();
        true
    }

    /// Cancels every running turn (the connection is closing).
    pub(crate) fn cancel_all(&self) {
        self.closing.cancel();
        for session in self.lock().values() {
            if let Some(cancel) = &session.turn {
                cancel.cancel();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> SessionContext {
        SessionContext::new(PathBuf::from("/work"), vec![], vec![]).expect("valid")
    }

    #[test]
    fn relative_paths_are_refused() {
        assert!(SessionContext::new(PathBuf::from("work"), vec![], vec![]).is_err());
        assert!(SessionContext::new(PathBuf::from("/work"), vec![PathBuf::from("lib")], vec![]).is_err());
    }

    #[test]
    fn one_turn_at_a_time_and_cancel_reaches_it() {
        let sessions = Sessions::default();
        assert!(matches!(sessions.start_turn("s"), Err(AcpError::UnknownSession(_))));
        sessions.open("s", context(), Some("t-1".to_owned()));
        let (_, guard) = sessions.start_turn("s").expect("first turn");
        assert_eq!(guard.waiting.as_deref(), Some("t-1"), "the first turn answers the waiting task");
        assert!(matches!(sessions.start_turn("s"), Err(AcpError::Busy(_))));
        assert!(sessions.cancel("s"));
        assert!(guard.cancel().is_cancelled());
        drop(guard);
        assert!(!sessions.cancel("s"), "no turn runs any more");
        let (_, again) = sessions.start_turn("s").expect("a new turn once the last one ended");
        assert!(!again.cancel().is_cancelled());
        assert_eq!(again.waiting, None, "and only the first");
        sessions.cancel_all();
        assert!(again.cancel().is_cancelled() && again.closing().is_cancelled());
    }
}
