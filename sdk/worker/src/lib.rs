//! Write a chorus task-store worker in a few lines.
//!
//! A worker claims the tasks of one agent over a gRPC stream, runs a handler
//! on each (several at once, up to its capacity), renews each task's lease
//! while the handler runs, and completes or fails the task with what the
//! handler returns. It reconnects when the task store goes away, continues
//! the trace of whoever created the task, and stops when told to.
//!
//! ```no_run
//! use chorus_worker::{Reply, TaskContext, Worker};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), chorus_worker::WorkerError> {
//!     let client = chorus_worker::connect("http://127.0.0.1:7800").await?;
//!     let shutdown = chorus_worker::shutdown_on_signal();
//!     Worker::new(client, "uppercase")
//!         .namespace("default")
//!         .capacity(4)
//!         .run(
//!             |task: TaskContext| async move {
//!                 task.status("shouting").await?;
//!                 Ok(Reply::text(task.text().to_uppercase()))
//!             },
//!             shutdown,
//!         )
//!         .await
//! }
//! ```
//!
//! A handler's `Err(HandlerError::retryable(..))` requeues the task while the
//! agent's `max_retries` last; `HandlerError::rejected(reason)` ends it
//! `REJECTED` (the agent can't or won't do it); `HandlerError::fatal(..)`, any
//! other error turned into a `HandlerError` by `?`, and a panic fail it.

mod ask;
mod backoff;
mod context;
#[doc(hidden)]
pub mod echo;
mod ending;
mod error;
#[doc(hidden)]
pub mod phases;
mod placement;
mod reply;
#[doc(hidden)]
pub mod reviewer;
mod task;
#[cfg(test)]
mod tests;
mod worker;

use std::time::Duration;

use chorus_proto::taskstore::task_store_client::TaskStoreClient;
use chorus_runtime::transport::Transport;
use tonic::transport::{Channel, Endpoint};

pub use chorus_proto::taskstore as proto;
pub use chorus_runtime::signal::shutdown_on_signal;
pub use context::TaskContext;
pub use error::{HandlerError, WorkerError};
#[doc(hidden)]
pub use placement::{Placement, RETRIES};
pub use reply::{Reply, text_artifact, text_part};
pub use tokio_util::sync::CancellationToken;
pub use worker::{DEFAULT_LEASE, DEFAULT_NAMESPACE, Worker};

/// The task-store client a worker uses: every call over the network carries
/// the current W3C trace context ([`Transport::remote`]); one in process runs
/// in the caller's span.
pub type Client = TaskStoreClient<Transport>;

/// Connects to the task store at `url` (`http://host:port`).
///
/// The connection is kept alive with HTTP/2 pings so that a vanished server is
/// noticed, and is re-established on demand after it breaks.
pub async fn connect(url: &str) -> Result<Client, WorkerError> {
    Ok(client_from_channel(channel(url).await?))
}

/// A client of the task store at `url` that connects on its first call, not
/// now: a worker started before its task store (a pod beside the service)
/// waits for it, its claim stream retrying with backoff, instead of
/// exiting. A malformed `url` is still an error at once.
pub fn connect_lazy(url: &str) -> Result<Client, WorkerError> {
    Ok(client_from_channel(endpoint(url)?.connect_lazy()))
}

/// Connects as [`connect`] does, every call carrying `token` as a bearer
/// token: a task store served beside a gateway that checks credentials
/// takes one for every namespace.
pub async fn connect_with_token(url: &str, token: &str) -> Result<Client, WorkerError> {
    let transport = Transport::remote(channel(url).await?)
        .with_bearer(token)
        .map_err(|_| WorkerError::Config("the token cannot be sent in a header"))?;
    Ok(client_over(transport))
}

async fn channel(url: &str) -> Result<Channel, WorkerError> {
    endpoint(url)?.connect().await.map_err(|source| WorkerError::Connect { url: url.to_owned(), source })
}

/// The task store at `url`, with the worker's connection settings.
fn endpoint(url: &str) -> Result<Endpoint, WorkerError> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|source| WorkerError::Connect { url: url.to_owned(), source })?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    Ok(endpoint)
}

/// A client over an existing channel (a lazy one, one with TLS, ...).
pub fn client_from_channel(channel: Channel) -> Client {
    client_over(Transport::remote(channel))
}

/// A client over any transport, such as a task store in this process
/// ([`Transport::in_process`]).
///
/// Answers are not limited to gRPC's default 4 MiB: a task grows with every
/// message and artifact, and one past that size could otherwise be claimed
/// but never decoded, its lease running out again and again.
pub fn client_over(transport: Transport) -> Client {
    TaskStoreClient::new(transport).max_decoding_message_size(usize::MAX)
}
