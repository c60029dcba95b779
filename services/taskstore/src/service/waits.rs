//! Calls that wait for tasks: a task settling, blocking spawn, and await.

use std::time::Duration;

use chorus_runtime::{
    time::micros,
    wakeup::{Waiter, wait_any},
};
use tokio::time::Instant;

use super::{TaskStore, keys};
use crate::{
    domain::{NewSubtask, Task, new_task_id, now_micros},
    error::{Result, TaskStoreError},
};

/// The longest any call here waits, whatever it asks for (beyond it, a
/// deadline would overflow the clock).
const LONGEST_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The signals a task created here has had when nothing but its creation
/// changed it (see `TaskStore::fresh`).
const CREATED: u64 = 1;

/// What an await found.
#[derive(Debug, Clone)]
pub struct AwaitOutcome {
    /// Finished children; their completions are now delivered.
    pub finished: Vec<Task>,
    pub pending: Vec<String>,
    pub timed_out: bool,
}

/// A task about to be created here: its id, and a waiter on it made before
/// its insert, so that no change after the insert can slip past it.
pub(super) struct Creating {
    pub(super) id: String,
    waiter: Waiter,
}

impl Creating {
    /// The waiter, if `task` is the one this creation made: a retried create
    /// answers with the task of the first, which may have changed since.
    pub(super) fn waiter_for(self, task: &Task) -> Option<Waiter> {
        (task.id == self.id).then_some(self.waiter)
    }
}

impl TaskStore {
    /// A new task's id in `namespace`, watched from before its insert.
    pub(super) fn creating(&self, namespace: &str) -> Creating {
        let id = new_task_id();
        let waiter = self.wakeups.waiter(&keys::task(namespace, &id));
        Creating { id, waiter }
    }

    /// Spawns a subtask. When `blocking`, waits until the child finishes or
    /// is interrupted, or `timeout` passes; a finished child's completion is
    /// then delivered here and not to the inbox nor to an unnamed await,
    /// which do not see it while the wait lasts. Returns the child and
    /// whether the wait timed out.
    pub async fn spawn_subtask(
        &self,
        subtask: NewSubtask,
        blocking: bool,
        timeout: Option<Duration>,
    ) -> Result<(Task, bool)> {
        let creating = self.creating(&subtask.namespace);
        let timeout = timeout.unwrap_or_else(|| self.config.default_spawn_timeout()).min(LONGEST_WAIT);
        let awaited_until = blocking.then(|| now_micros().saturating_add(micros(timeout)));
        let child = self.repository.spawn_subtask(&creating.id, subtask, &self.config.limits, awaited_until).await?;
        self.changed(&child);
        if !blocking {
            return Ok((child, false));
        }
        let created = creating.waiter_for(&child);
        let mut wait = Wait { store: self.clone(), child: Some(child.clone()) };
        let (child, timed_out) = self.await_since(&child.namespace, &child.id, None, timeout, created).await?;
        wait.end(child.status.state.is_terminal()).await?;
        Ok((child, timed_out))
    }

    /// Waits until the task is terminal or interrupted, or `timeout` passes;
    /// returns it as it then is (with `history_length` of its history) and
    /// whether the timeout passed first.
    pub async fn await_task(
        &self,
        namespace: &str,
        id: &str,
        history_length: Option<u32>,
        timeout: Duration,
    ) -> Result<(Task, bool)> {
        let created = self.fresh.take(namespace, id);
        self.await_since(namespace, id, history_length, timeout, created).await
    }

    /// [`await_task`](Self::await_task) of a task whose waiter `created`,
    /// when given, was made before the insert that created it here.
    async fn await_since(
        &self,
        namespace: &str,
        id: &str,
        history_length: Option<u32>,
        timeout: Duration,
        created: Option<Waiter>,
    ) -> Result<(Task, bool)> {
        let deadline = Instant::now() + timeout.min(LONGEST_WAIT);
        if let Some(mut waiter) = created {
            // Unchanged since its creation, the task is neither terminal nor
            // interrupted, so there is nothing to read before a change
            // signals (at once if one has), or the poll comes.
            let poll = self.config.poll_interval().min(deadline.saturating_duration_since(Instant::now()));
            waiter.wait_past(CREATED, poll).await;
        }
        loop {
            let mut waiter = self.wakeups.waiter(&keys::task(namespace, id));
            if let Some(task) = self.settled.get(namespace, id, history_length) {
                return Ok((task, false));
            }
            let task = self.repository.get_task(namespace, id, history_length).await?;
            let state = task.status.state;
            if state.is_terminal() || state.is_interrupted() {
                return Ok((task, false));
            }
            let now = Instant::now();
            if self.shutdown.is_cancelled() {
                return Err(TaskStoreError::ShuttingDown);
            }
            if now >= deadline {
                return Ok((task, true));
            }
            waiter.wait(self.config.poll_interval().min(deadline - now)).await;
        }
    }

    /// Waits for children of `parent_id` (all outstanding ones, or `task_ids`)
    /// until all — or, with `any`, one — have finished, or `timeout` passes.
    /// Of the outstanding ones, a finished child is reported only by the
    /// await that consumes its completion, so only once.
    pub async fn await_subtasks(
        &self,
        namespace: &str,
        parent_id: &str,
        task_ids: &[String],
        any: bool,
        timeout: Duration,
    ) -> Result<AwaitOutcome> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut waiters = vec![self.wakeups.waiter(&keys::task(namespace, parent_id))];
            let children = self.repository.children(namespace, parent_id, task_ids).await?;
            waiters.extend(children.iter().map(|child| self.wakeups.waiter(&keys::task(namespace, &child.id))));
            let (mut finished, pending): (Vec<Task>, Vec<Task>) =
                children.into_iter().partition(|child| child.status.state.is_terminal());
            let now = Instant::now();
            if self.shutdown.is_cancelled() {
                return Err(TaskStoreError::ShuttingDown);
            }
            let out_of_time = now >= deadline;
            if out_of_time || is_done(any, &finished, &pending) {
                let finished_ids: Vec<String> = finished.iter().map(|task| task.id.clone()).collect();
                let taken = self.repository.take_completions(namespace, &finished_ids).await?;
                if task_ids.is_empty() {
                    // Unnamed, a child is reported by whoever consumes its
                    // completion: a concurrent await or inbox read may have.
                    finished.retain(|task| taken.contains(&task.id));
                }
                let done = is_done(any, &finished, &pending);
                if done || out_of_time {
                    return Ok(AwaitOutcome {
                        finished,
                        pending: pending.into_iter().map(|task| task.id).collect(),
                        timed_out: !done,
                    });
                }
                continue;
            }
            wait_any(&mut waiters, self.config.poll_interval().min(deadline - now)).await;
        }
    }
}

/// A blocking spawn's wait on its child, ended once: by the spawn, or, when
/// the spawn's caller goes away first, on drop (the completion then goes to
/// the inbox rather than wait out the hold).
struct Wait {
    store: TaskStore,
    /// The child, until the wait ends.
    child: Option<Task>,
}

impl Wait {
    /// Ends the wait, consuming the child's completion when `taken`; when not,
    /// readers of the owner's inbox are woken for it.
    async fn end(&mut self, taken: bool) -> Result<()> {
        let Some(child) = self.child.take() else { return Ok(()) };
        self.store.end_wait(&child, taken).await
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        // Without a runtime (the process is ending) the hold lapses at its deadline.
        if let (Some(child), Ok(runtime)) = (self.child.take(), tokio::runtime::Handle::try_current()) {
            let store = self.store.clone();
            runtime.spawn(async move {
                if let Err(error) = store.end_wait(&child, false).await {
                    tracing::debug!(task_id = %child.id, %error, "a blocking spawn's wait ended with its caller");
                }
            });
        }
    }
}

impl TaskStore {
    async fn end_wait(&self, child: &Task, taken: bool) -> Result<()> {
        self.repository.end_blocking_wait(&child.namespace, &child.id, taken).await?;
        if !taken && let Some(owner) = &child.owner {
            self.wakeups.notify(&keys::inbox(&child.namespace, owner));
        }
        Ok(())
    }
}

/// Whether an await has what it waits for: every child finished, or, with
/// `any`, one (or none is left to wait for).
fn is_done(any: bool, finished: &[Task], pending: &[Task]) -> bool {
    pending.is_empty() || (any && !finished.is_empty())
}
