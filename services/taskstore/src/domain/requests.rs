//! What callers ask of the repository, and what it answers, beyond the model.

use std::{collections::HashMap, fmt, str::FromStr, time::Duration};

use super::{Artifact, JsonObject, Message, Owner, SpawnContext, Task, TaskState, TaskStatus};

/// A task to create for an agent.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub namespace: String,
    pub agent_id: String,
    /// The task's context; `None`: its message's, else a new one.
    pub context_id: Option<String>,
    pub message: Message,
    pub metadata: Option<JsonObject>,
    pub spawn_context: SpawnContext,
    /// W3C trace context of the creating request, handed to the worker.
    pub trace_context: HashMap<String, String>,
    /// Creates with one key in a namespace make one task; `None`: the
    /// message id is the key.
    pub idempotency_key: Option<String>,
    /// The agent's answer, when it gives one as the task is made.
    pub answer: Option<TaskAnswer>,
    /// The gateway that runs the task's turn itself and follows it from
    /// the start (see [`TaskStore::follow_task`](crate::service::TaskStore::follow_task)).
    pub follower: Option<TurnFollower>,
    /// The creator runs the task's turns itself: no worker claims it, and
    /// its agent's writes need no lease. An answer or a follower implies it.
    /// Otherwise a worker runs it, and every write of its agent needs the
    /// lease of the worker's claim.
    pub run_by_creator: bool,
}

/// Who follows a task's turn, and for how long unless it renews.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnFollower {
    pub name: String,
    pub lease: Duration,
}

/// An agent's answer to a task's first message: the task is created with
/// it, already settled.
#[derive(Debug, Clone)]
pub struct TaskAnswer {
    pub state: TaskState,
    /// The status message, which the history keeps after the first message.
    pub message: Option<Message>,
    pub artifacts: Vec<Artifact>,
}

impl TaskAnswer {
    /// A state a new task can be answered with: terminal or interrupted,
    /// and not `canceled` (nobody canceled it).
    pub fn can_settle_in(state: TaskState) -> bool {
        state != TaskState::Canceled && (state.is_terminal() || state.is_interrupted())
    }
}

/// The id given to two of `artifacts`, if any: artifacts written whole at
/// once (an answer's, a completion's) are one each.
pub fn repeated_artifact_id(artifacts: &[Artifact]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    artifacts.iter().map(|artifact| artifact.artifact_id.as_str()).find(|id| !seen.insert(*id))
}

/// A child task to create below a parent.
#[derive(Debug, Clone)]
pub struct NewSubtask {
    pub namespace: String,
    pub parent_id: String,
    pub agent_id: String,
    pub message: Message,
    /// `None`: the parent task itself owns the child.
    pub owner: Option<Owner>,
    pub metadata: Option<JsonObject>,
    pub trace_context: HashMap<String, String>,
    /// The lease on the parent the spawn is made under, when a worker makes it.
    pub lease_id: Option<String>,
}

/// A move through the state machine.
#[derive(Debug, Clone)]
pub struct StatusUpdate {
    pub state: TaskState,
    pub message: Option<Message>,
    pub lease_id: Option<String>,
}

/// An artifact, or a chunk appended to one.
#[derive(Debug, Clone)]
pub struct ArtifactChunk {
    pub artifact: Artifact,
    pub append: bool,
    pub last_chunk: bool,
    pub lease_id: Option<String>,
}

/// A worker asking for tasks.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub namespace: String,
    pub agent_id: String,
    pub worker_id: String,
    pub capacity: u32,
    pub lease: Duration,
    pub max_retries: u32,
}

/// A task handed to a worker under a lease.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub task: Task,
    pub lease_id: String,
    pub lease_expires_at: i64,
    pub trace_context: HashMap<String, String>,
}

/// What a claim stream that tells of cancellations sends.
#[derive(Debug, Clone)]
pub enum ClaimEvent {
    /// A task leased to the worker.
    Claimed(Box<Claimed>),
    /// A task leased to the worker on this stream was canceled: this one.
    Canceled(String),
}

/// The tasks a worker holds leases on, and whether its agent has a task
/// waiting to be claimed.
#[derive(Debug, Clone, Default)]
pub struct WorkerLeases {
    /// Each leased task's id and the end of its lease (µs).
    pub active: Vec<(String, i64)>,
    pub ready: bool,
}

/// The lease a new task is created under when a worker waiting for its
/// agent's tasks takes it at once.
#[derive(Debug, Clone)]
pub struct Handoff {
    pub worker_id: String,
    pub lease_id: String,
    pub lease_expires_at: i64,
    /// How long the lease was granted for: what a renewal naming no length
    /// extends it by.
    pub lease: Duration,
    pub max_retries: u32,
}

/// A created task, and whether it went to the worker of the [`Handoff`]
/// (a repeated create returns the first one's task, without).
#[derive(Debug, Clone)]
pub struct Created {
    pub task: Task,
    pub handed_off: bool,
}

/// The answer to a lease renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub lease_expires_at: i64,
    /// The task was canceled: the worker should stop.
    pub canceled: bool,
}

/// How a worker hands a task back: claimable once `after` has passed, or,
/// with `others_first`, by any other worker at once and by this one once
/// `after` has passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandBack {
    pub after: std::time::Duration,
    pub others_first: bool,
}

/// A completed task, and whether this call completed it: a retry of a
/// completion that landed (its answer lost on the way) finds it so already.
#[derive(Debug, Clone)]
pub struct Completed {
    pub task: Task,
    pub now: bool,
}

/// A lease that ran out, and what became of its task.
#[derive(Debug, Clone)]
pub struct Expiry {
    pub task: Task,
    pub requeued: bool,
}

/// The finished root a purge examined last: the next batch starts after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeCursor {
    pub finished_at: i64,
    pub namespace: String,
    pub id: String,
}

/// One batch of a purge: the tasks it deleted, and where the next batch
/// starts (`None`: no finished root is left to examine).
#[derive(Debug, Clone, Default)]
pub struct Purged {
    pub tasks: u64,
    pub next: Option<PurgeCursor>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InboxKind {
    Completion,
    Status,
    Question,
    Error,
}

impl InboxKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completion => "completion",
            Self::Status => "status",
            Self::Question => "question",
            Self::Error => "error",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [Self::Completion, Self::Status, Self::Question, Self::Error].into_iter().find(|kind| kind.as_str() == value)
    }
}

/// A message held for an owner until read.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxMessage {
    pub id: String,
    pub kind: InboxKind,
    pub owner: Owner,
    pub task_id: String,
    pub parent_task_id: Option<String>,
    pub message: Option<Message>,
    /// For completions: the child's final state.
    pub task_state: Option<TaskState>,
    pub created_at: i64,
}

/// How a read of an owner's inbox treats the messages it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxRead {
    /// Leaves them unread.
    Peek,
    /// Marks them read: a reply that does not reach the reader loses them.
    Consume,
    /// Hides them from other reads for `deadline`; unless acknowledged by
    /// then, they are read again.
    Hold { deadline: std::time::Duration },
}

/// The most message bytes one inbox read returns, beyond the first message:
/// a reply stays under a gRPC client's default 4 MiB limit.
pub const INBOX_READ_BYTES: i64 = 3 * 1024 * 1024;

/// A child telling its owner something.
#[derive(Debug, Clone)]
pub struct Notification {
    pub namespace: String,
    pub task_id: String,
    pub kind: InboxKind,
    pub message: Message,
    pub lease_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Created,
    StatusChanged,
    ArtifactUpdated,
    MessageAdded,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::StatusChanged => "status_changed",
            Self::ArtifactUpdated => "artifact_updated",
            Self::MessageAdded => "message_added",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        [Self::Created, Self::StatusChanged, Self::ArtifactUpdated, Self::MessageAdded]
            .into_iter()
            .find(|kind| kind.as_str() == value)
    }
}

/// Position in the event log: events are totally ordered by (tx, id), and a
/// reader only ever sees positions below which nothing can still commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    pub tx: i64,
    pub id: i64,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.tx, self.id)
    }
}

impl FromStr for Cursor {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        let (tx, id) = value.split_once('.').ok_or(())?;
        let cursor = Self { tx: tx.parse().map_err(drop)?, id: id.parse().map_err(drop)? };
        if cursor.tx < 0 || cursor.id < 0 {
            return Err(());
        }
        Ok(cursor)
    }
}

/// Where a watch of one task resumes: after `after`, but for the changes in
/// `seen`, which sort after it yet are already in the snapshot the cursor
/// came with (PostgreSQL: committed while an older transaction was still
/// running). Written `tx.id`, then `+tx.id` for each seen change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskCursor {
    pub after: Cursor,
    pub seen: Vec<Cursor>,
}

impl From<Cursor> for TaskCursor {
    fn from(after: Cursor) -> Self {
        Self { after, seen: Vec::new() }
    }
}

impl fmt::Display for TaskCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.after)?;
        self.seen.iter().try_for_each(|seen| write!(f, "+{seen}"))
    }
}

impl FromStr for TaskCursor {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        let mut cursors = value.split('+').map(str::parse);
        let after = cursors.next().ok_or(())??;
        let seen = cursors.collect::<Result<Vec<Cursor>, ()>>()?;
        if seen.len() > MAX_SEEN || seen.iter().any(|seen| *seen <= after) {
            return Err(());
        }
        Ok(Self { after, seen })
    }
}

/// Most seen changes a task cursor carries; a snapshot holds fewer (it
/// waits for them to commit in order instead).
pub const MAX_SEEN: usize = 64;

/// One recorded change to a task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEvent {
    pub cursor: Cursor,
    pub kind: EventKind,
    pub namespace: String,
    pub task_id: String,
    pub context_id: String,
    pub agent_id: String,
    /// The task's status after the change.
    pub status: TaskStatus,
    pub artifact: Option<Artifact>,
    pub append: bool,
    pub last_chunk: bool,
    pub message: Option<Message>,
    /// When the change was recorded: microseconds since the Unix epoch.
    pub created_at: i64,
}

/// Events read from the log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventBatch {
    pub events: Vec<TaskEvent>,
    /// More events after these have committed but are not readable yet: an
    /// older transaction is still running (PostgreSQL). Read again shortly.
    pub held_back: bool,
}

/// Which events to read.
#[derive(Debug, Clone)]
pub struct EventQuery {
    pub namespace: String,
    pub task_id: Option<String>,
    pub agent_id: Option<String>,
    pub context_id: Option<String>,
    pub after: Cursor,
    pub limit: u32,
}

/// An A2A push-notification (webhook) config of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushConfig {
    pub id: String,
    pub task_id: String,
    pub url: String,
    pub token: Option<String>,
    pub auth_scheme: Option<String>,
    pub auth_credentials: Option<String>,
}

/// Names one push config among every namespace's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PushConfigKey {
    pub namespace: String,
    pub task_id: String,
    pub id: String,
}

/// A gateway's hold on the push configs it follows (it alone delivers them
/// and advances their cursors) or the tasks whose turns it runs, until
/// `until` (micros) unless it renews.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushLease {
    /// The gateway, unique among live ones and the same across its restarts.
    pub follower: String,
    pub until: i64,
}

/// Names one task among every namespace's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskKey {
    pub namespace: String,
    pub task_id: String,
}

/// What a follower of turns learns as it keeps following: the tasks it
/// lost, and those it claimed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Followed {
    pub lost: Vec<TaskKey>,
    pub claimed: Vec<TaskKey>,
}

/// A push config whose task has not ended for it: it still gets the task's
/// changes after `delivered` (`None`: from the task's first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingPush {
    pub key: PushConfigKey,
    pub delivered: Option<Cursor>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Counted, PageToken};

    #[test]
    fn cursors_and_page_tokens_round_trip_and_reject_garbage() {
        let cursor = Cursor { tx: 7, id: 42 };
        assert_eq!(cursor.to_string().parse::<Cursor>(), Ok(cursor));
        assert!("x".parse::<Cursor>().is_err());
        assert!("-1.2".parse::<Cursor>().is_err());
        let token = PageToken { timestamp: 5, id: "a~b".into(), counted: None };
        assert_eq!(token.to_string().parse::<PageToken>(), Ok(token.clone()));
        let counted =
            PageToken { timestamp: -5, id: "a!b~c".into(), counted: Some(Counted { total: 12, filters: 255 }) };
        assert_eq!(counted.to_string(), "12@ff!-5~a!b~c");
        assert_eq!(counted.to_string().parse::<PageToken>(), Ok(counted));
        assert_eq!("12!5~a~b".parse::<PageToken>(), Ok(token), "an earlier version's total is counted again");
        for garbage in ["5~", "x!5~a", "!5~a", "5!~a", "-1!5~a", "1@!5~a", "1@zz!5~a", "@1!5~a"] {
            assert!(garbage.parse::<PageToken>().is_err(), "{garbage}");
        }
        assert!(Cursor { tx: 1, id: 9 } < Cursor { tx: 2, id: 1 });
    }

    #[test]
    fn task_cursors_carry_the_changes_a_snapshot_has_seen() {
        let plain = TaskCursor::from(Cursor { tx: 7, id: 42 });
        assert_eq!(plain.to_string(), "7.42", "a plain cursor is a task cursor");
        let seen = TaskCursor { after: Cursor { tx: 7, id: 42 }, seen: vec![Cursor { tx: 9, id: 40 }] };
        assert_eq!(seen.to_string(), "7.42+9.40");
        assert_eq!("7.42+9.40".parse::<TaskCursor>(), Ok(seen));
        for garbage in ["", "+", "7.42+", "7.42+x", "7.42+7.41", &format!("1.1{}", "+2.2".repeat(MAX_SEEN + 1))] {
            assert!(garbage.parse::<TaskCursor>().is_err(), "{garbage}");
        }
    }
}
