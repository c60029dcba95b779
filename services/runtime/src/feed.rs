//! Streams fed by a task: what each service's long-lived streams share.

use tokio::sync::mpsc;

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
