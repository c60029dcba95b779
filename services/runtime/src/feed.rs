//! Streams fed by a task: what each service's long-lived streams share.

use std::time::Duration;

use tokio::sync::mpsc;

/// How long a stopping service waits for room to tell a stream it ends.
const SHUTDOWN_NOTICE: Duration = Duration::from_secs(1);

/// Ends a stream because the service is stopping, with `error` (UNAVAILABLE):
/// its client then opens it again, on another replica or this one once
/// restarted, rather than take the end for the last of the stream.
pub async fn stopping<T, E>(sender: &mpsc::Sender<Result<T, E>>, error: E) {
    let _ = tokio::time::timeout(SHUTDOWN_NOTICE, sender.send(Err(error))).await;
}

/// Sends `items` in order, or the error that ends the stream. False when the
/// stream is over: it failed, or its receiver went away.
pub async fn forward<T, E>(items: Result<Vec<T>, E>, sender: &mpsc::Sender<Result<T, E>>) -> bool {
    match items {
        Ok(items) => {
            for item in items {
                if sender.send(Ok(item)).await.is_err() {
                    return false;
                }
            }
            true
        }
        Err(error) => {
            let _ = sender.send(Err(error)).await;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn items_go_in_order_and_an_error_ends_the_stream() {
        let (sender, mut receiver) = mpsc::channel::<Result<u32, &str>>(4);
        assert!(forward(Ok(vec![1, 2]), &sender).await);
        assert!(!forward(Err("broken"), &sender).await);
        assert_eq!(receiver.recv().await, Some(Ok(1)));
        assert_eq!(receiver.recv().await, Some(Ok(2)));
        assert_eq!(receiver.recv().await, Some(Err("broken")));
        drop(receiver);
        assert!(!forward(Ok(vec![3]), &sender).await, "the receiver went away");
    }
}
