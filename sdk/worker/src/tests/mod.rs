//! The worker against the real task store, booted in-process on a real
//! socket; outcomes are read back through the task store's API.

mod connection;
mod outcomes;
mod reruns;
mod server;

use std::{future::Future, time::Duration};

use chorus_proto::taskstore::{Message, Task, TaskEvent, TaskState, part::Content, task_event::Kind};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::server::LiveStore;
use crate::{HandlerError, Reply, TaskContext, Worker, WorkerError};

const PATIENCE: Duration = Duration::from_secs(10);
/// The agent the tests' workers work for.
const AGENT: &str = "tester";
const NAMESPACE: &str = crate::DEFAULT_NAMESPACE;

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn text_of(message: Option<&Message>) -> Option<&str> {
    match message?.parts.first()?.content.as_ref()? {
        Content::Text(text) => Some(text),
        Content::Raw(_) | Content::Url(_) | Content::Data(_) => None,
    }
}

fn state_of(task: &Task) -> TaskState {
    task.status.as_ref().map_or(TaskState::Unspecified, |status| status.state())
}

/// The text of the task's status message.
fn status_text(task: &Task) -> Option<&str> {
    text_of(task.status.as_ref()?.message.as_ref())
}

/// The status messages of the status changes to `state`, in order.
fn status_changes(events: &[TaskEvent], state: TaskState) -> Vec<Option<&str>> {
    events
        .iter()
        .filter(|event| event.kind() == Kind::StatusChanged)
        .filter_map(|event| event.status.as_ref())
        .filter(|status| status.state() == state)
        .map(|status| text_of(status.message.as_ref()))
        .collect()
}

/// A worker for [`AGENT`] running in the background.
struct Running {
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), WorkerError>>,
}

impl Running {
    async fn start<H, F>(store: &LiveStore, configure: impl FnOnce(Worker) -> Worker, handler: H) -> Self
    where
        H: Fn(TaskContext) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
    {
        Self::start_for(store, AGENT, configure, handler).await
    }

    async fn start_for<H, F>(
        store: &LiveStore,
        agent_id: &str,
        configure: impl FnOnce(Worker) -> Worker,
        handler: H,
    ) -> Self
    where
        H: Fn(TaskContext) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Reply, HandlerError>> + Send + 'static,
    {
        let client = crate::connect(&store.url).await.expect("connect");
        let worker =
            Worker::new(client, agent_id).reconnect_backoff(Duration::from_millis(1), Duration::from_millis(20));
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(configure(worker).run(handler, shutdown.clone()));
        Self { shutdown, run }
    }

    async fn stop(self) -> Result<(), WorkerError> {
        self.shutdown.cancel();
        within("run to return", self.run).await.expect("run does not panic")
    }

    /// Ends the worker as a killed process ends: nothing is handed back.
    async fn kill(self) {
        self.run.abort();
        assert!(within("run to end", self.run).await.is_err_and(|error| error.is_cancelled()));
    }
}
