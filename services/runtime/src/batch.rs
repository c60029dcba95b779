//! Group commit: requests that wait at the same time are served together.
//!
//! A busy service makes many small writes at once; each costs the database a
//! statement and a commit. A [`Batcher`] hands every request to one task
//! that takes all that are waiting (up to a limit), serves them with one
//! call — one statement, one commit — and answers each. A few batches may be
//! in the database at once; while they are, the next one gathers, so batches
//! grow with the load, and a lone request goes at once.

use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc, oneshot};

type Serve<T, R> = dyn Fn(Vec<T>) -> BoxFuture<'static, Vec<R>> + Send + Sync;
type Request<T, R> = (T, oneshot::Sender<R>);

/// Serves requests `T` in batches with one answer `R` each. Cheap to clone;
/// its task starts on first use and ends when every clone is gone.
pub struct Batcher<T, R> {
    serve: Arc<Serve<T, R>>,
    limit: usize,
    in_flight: usize,
    sender: Arc<OnceLock<mpsc::UnboundedSender<Request<T, R>>>>,
}

impl<T, R> Clone for Batcher<T, R> {
    fn clone(&self) -> Self {
        Self {
            serve: Arc::clone(&self.serve),
            limit: self.limit,
            in_flight: self.in_flight,
            sender: Arc::clone(&self.sender),
        }
    }
}

impl<T, R> std::fmt::Debug for Batcher<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("limit", &self.limit).finish_non_exhaustive()
    }
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    /// `serve` answers a batch of at most `limit` requests, in their order;
    /// up to `in_flight` batches are served at once.
    pub fn new(
        limit: usize,
        in_flight: usize,
        serve: impl Fn(Vec<T>) -> BoxFuture<'static, Vec<R>> + Send + Sync + 'static,
    ) -> Self {
        Self { serve: Arc::new(serve), limit: limit.max(1), in_flight: in_flight.max(1), sender: Arc::default() }
    }

    /// The answer to `request`; `None` if the batch it went in was dropped
    /// unanswered (the runtime is shutting down).
    pub async fn call(&self, request: T) -> Option<R> {
        let sender = self.sender.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(serve_batches(Arc::clone(&self.serve), self.limit, self.in_flight, receiver));
            sender
        });
        let (reply, answer) = oneshot::channel();
        sender.send((request, reply)).ok()?;
        answer.await.ok()
    }
}

async fn serve_batches<T: Send + 'static, R: Send + 'static>(
    serve: Arc<Serve<T, R>>,
    limit: usize,
    in_flight: usize,
    mut receiver: mpsc::UnboundedReceiver<Request<T, R>>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut waiting = Vec::with_capacity(limit);
    loop {
        // A free slot first: requests gather while every slot is busy.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
        if receiver.recv_many(&mut waiting, limit).await == 0 {
            return;
        }
        let (batch, replies): (Vec<T>, Vec<_>) = waiting.drain(..).unzip();
        let answers = serve(batch);
        tokio::spawn(async move {
            for (reply, answer) in replies.into_iter().zip(answers.await) {
                reply.send(answer).ok();
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures_util::FutureExt as _;

    use super::*;

    #[tokio::test]
    async fn requests_waiting_together_are_served_in_one_batch_in_order() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&sizes);
        let batcher = Batcher::new(3, 1, move |batch: Vec<u32>| {
            seen.lock().expect("sizes").push(batch.len());
            async move { batch.into_iter().map(|n| n * 10).collect() }.boxed()
        });
        let answers = futures_util::future::join_all((1..=5).map(|n| batcher.call(n))).await;
        assert_eq!(answers, [Some(10), Some(20), Some(30), Some(40), Some(50)]);
        assert_eq!(*sizes.lock().expect("sizes"), [3, 2], "at most the limit per batch");
        assert_eq!(batcher.call(7).await, Some(70), "a lone request goes alone");
    }
}
