//! Process signals.

use tokio_util::sync::CancellationToken;

/// A token cancelled on Ctrl-C (and on `SIGTERM` on Unix), for `Worker::run` and servers.
///
/// Must be called inside a tokio runtime.
pub fn shutdown_on_signal() -> CancellationToken {
    on_signal(true)
}

/// As [`shutdown_on_signal`], without its log line: for a command a person
/// runs at a terminal, which is no log.
pub fn shutdown_on_signal_quietly() -> CancellationToken {
    on_signal(false)
}

fn on_signal(logged: bool) -> CancellationToken {
    let token = CancellationToken::new();
    let on_signal = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        if logged {
            tracing::info!("shutdown signal received");
        }
        on_signal.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(error) => {
            tracing::warn!(error = %error, "cannot listen for sigterm");
            return ctrl_c().await;
        }
    };
    tokio::select! {
        () = ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    ctrl_c().await;
}

/// Waits for Ctrl-C; forever when it cannot be listened for (Ctrl-C then
/// keeps its default effect of ending the process).
async fn ctrl_c() {
    if let Err(error) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %error, "cannot listen for ctrl-c");
        std::future::pending::<()>().await;
    }
}
