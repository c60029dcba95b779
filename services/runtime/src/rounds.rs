//! Work done in rounds, on a task of its own, until shutdown.

use std::{future::Future, time::Duration};

use tokio::{task::JoinHandle, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Runs `round` every `every`, the first at once, until `shutdown`. A round
/// that runs long (a purge of a large backlog) delays only the next round of
/// its own, not the rounds of other work, such as expiring leases.
pub fn spawn_rounds<F, R>(every: Duration, shutdown: CancellationToken, mut round: F) -> JoinHandle<()>
where
    F: FnMut() -> R + Send + 'static,
    R: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = interval.tick() => round().await,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rounds_run_at_once_then_every_period_until_shutdown() {
        let rounds = Arc::new(AtomicU32::new(0));
        let shutdown = CancellationToken::new();
        let counted = Arc::clone(&rounds);
        let task = spawn_rounds(Duration::from_secs(60), shutdown.clone(), move || {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 1, "the first at once");
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 3);
        shutdown.cancel();
        task.await.unwrap();
    }
}
