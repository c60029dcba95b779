//! Work that must finish once begun, whether or not anyone still waits.

use std::future::Future;

/// Runs `future` on a task of its own and waits for it. Dropping the wait (a
/// client hung up, so the server dropped its request's work; a timeout ran
/// out) leaves the work running to its end instead of stopping it between
/// two steps that belong together. A panic in `future` resumes in the caller.
pub async fn to_completion<F>(future: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match tokio::spawn(future).await {
        Ok(output) => output,
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only a runtime shutting down cancels the task, and that drops
            // this caller too.
            Err(_) => std::future::pending().await,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
        time::Duration,
    };

    use super::to_completion;

    #[tokio::test]
    async fn work_goes_on_when_its_caller_gives_up() {
        let finished = Arc::new(AtomicBool::new(false));
        let work = {
            let finished = Arc::clone(&finished);
            async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                finished.store(true, Ordering::SeqCst);
            }
        };
        let given_up = tokio::time::timeout(Duration::from_millis(5), to_completion(work)).await;
        assert!(given_up.is_err(), "the caller stopped waiting");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(finished.load(Ordering::SeqCst), "the work ran to its end anyway");
    }

    #[tokio::test]
    async fn answers_with_the_work_and_passes_its_panic_on() {
        assert_eq!(to_completion(async { 7 }).await, 7);
        let panicked = tokio::spawn(to_completion(async { panic!("boom") })).await.unwrap_err();
        assert!(panicked.is_panic());
    }
}
