//! [`Bridge`]: the ACP operations of one connection, in the bridge's own
//! terms. The adapter calls these; they call the gateway and the [`Ide`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::content::Content;
use super::error::{AcpError, Result};
use super::history::{self, SessionSummary};
use super::session::{SessionContext, Sessions};
use super::turn::Turn;
use super::upstream::Upstream;
use super::{Ide, StopReason};

/// The id of the one authentication method: the gateway token.
pub const AUTH_METHOD: &str = "chorus-token";

/// What `initialize` answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentInfo {
    /// Whether the gateway wants a token (then `authMethods` lists [`AUTH_METHOD`]).
    pub(crate) needs_token: bool,
}

/// The ACP side of one connection. Shared by its handlers.
#[derive(Debug)]
pub(crate) struct Bridge {
    upstream: Upstream,
    sessions: Sessions,
    can_read_files: AtomicBool,
}

impl Bridge {
    pub(crate) fn new(upstream: Upstream) -> Self {
        Self { upstream, sessions: Sessions::default(), can_read_files: AtomicBool::new(false) }
    }

    /// `initialize`: notes what the IDE can do, and learns from the agent's
    /// card whether the gateway wants a token. An unreachable gateway is not
    /// an error yet: the first call that needs it reports it, and, as it may
    /// want a token once it is up (an IDE started before its chorus), the
    /// token method is offered.
    pub(crate) async fn initialize(&self, can_read_files: bool) -> AgentInfo {
        self.can_read_files.store(can_read_files, Ordering::Relaxed);
        let needs_token = match self.upstream.needs_token().await {
            Ok(needs) => needs,
            Err(error) => {
                tracing::warn!(agent = %self.upstream.agent(), %error, "cannot read the agent card");
                true
            }
        };
        AgentInfo { needs_token }
    }

    /// `authenticate` with method `method`.
    pub(crate) async fn authenticate(&self, method: &str) -> Result<()> {
        if method != AUTH_METHOD {
            return Err(AcpError::InvalidParams(format!(
                "unknown authentication method {method:?}; use {AUTH_METHOD:?}"
            )));
        }
        self.upstream.authenticate().await
    }

    /// Fails with `auth_required` when the gateway does not take the
    /// bridge's credentials, and with the gateway's error when the agent's
    /// card cannot be read (its card is read once, then kept).
    async fn check_access(&self) -> Result<()> {
        if self.upstream.needs_token().await? {
            self.upstream.check_access().await?;
        }
        Ok(())
    }

    /// `session/new`: a new A2A context.
    pub(crate) async fn new_session(&self, context: SessionContext) -> Result<String> {
        self.check_access().await?;
        let id = a2a::new_context_id();
        self.sessions.open(&id, context, None);
        Ok(id)
    }

    /// `session/load`: replays the context's tasks, then opens it.
    pub(crate) async fn load_session(&self, id: &str, context: SessionContext, ide: &dyn Ide) -> Result<()> {
        self.check_access().await?;
        let tasks = history::tasks_of(&self.upstream, id).await?;
        if tasks.is_empty() && self.sessions.context(id).is_err() {
            return Err(AcpError::NoSuchSession(id.to_owned(), self.upstream.agent().to_owned()));
        }
        history::replay(ide, id, &tasks)?;
        let waiting = history::waiting(&tasks);
        if waiting.is_some() {
            history::remind(ide, id)?;
        }
        self.sessions.open(id, context, waiting);
        Ok(())
    }

    /// `session/resume`: opens the context without replaying it.
    pub(crate) async fn resume_session(&self, id: &str, context: SessionContext) -> Result<()> {
        self.check_access().await?;
        let tasks = history::briefly(&self.upstream, id).await?;
        if tasks.is_empty() && self.sessions.context(id).is_err() {
            return Err(AcpError::NoSuchSession(id.to_owned(), self.upstream.agent().to_owned()));
        }
        self.sessions.open(id, context, history::waiting(&tasks));
        Ok(())
    }

    /// `session/list`: the gateway's sessions with this agent and the ones
    /// this connection opened that have no prompt yet.
    pub(crate) async fn list_sessions(&self, cwd: Option<PathBuf>) -> Result<Vec<SessionSummary>> {
        self.check_access().await?;
        let mut sessions = history::list(&self.upstream, cwd.as_ref()).await?;
        for (id, context) in self.sessions.all() {
            let unseen = sessions.iter().all(|session| session.id != id);
            if unseen && cwd.as_ref().is_none_or(|cwd| *cwd == context.cwd) {
                sessions.push(SessionSummary {
                    id,
                    cwd: context.cwd,
                    additional_directories: context.additional_directories,
                    title: None,
                    updated_at: None,
                });
            }
        }
        Ok(sessions)
    }

    /// `session/prompt`: one turn, to its stop reason.
    pub(crate) async fn prompt(&self, id: &str, prompt: Vec<Content>, ide: Arc<dyn Ide>) -> Result<StopReason> {
        let (context, guard) = self.sessions.start_turn(id)?;
        let can_read_files = self.can_read_files.load(Ordering::Relaxed);
        let turn = Turn::new(self.upstream.clone(), ide, id.to_owned(), context, &guard, can_read_files);
        turn.run(prompt).await
    }

    /// `session/cancel`.
    pub(crate) fn cancel(&self, id: &str) {
        if !self.sessions.cancel(id) {
            tracing::debug!(session_id = %id, "cancel for a session without a running turn");
        }
    }

    /// The connection closed: running turns stop and cancel their tasks,
    /// except those that wait for an answer, which wait on (see [`Turn`]).
    pub(crate) fn close(&self) {
        self.sessions.cancel_all();
    }
}
