//! The built-in agents of `chorus dev`: workers like any other that call the
//! task store of this process in process. An agent that stops while the
//! process serves is logged at once and keeps `/healthz` at 503, since
//! every task sent to it would wait for a worker that is gone.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
};

use anyhow::Context as _;
use chorus_runtime::{
    metrics::Metrics,
    server::{ReadinessProbe, ServerBuilder, ServerConfig},
};
use chorus_worker::WorkerError;
use tokio_util::sync::CancellationToken;

/// The agents of `chorus dev` keep their worker ids across restarts
/// (`echo@chorus-dev`, ...): the tasks they held when the process stopped,
/// or was killed, are requeued as it starts again and done again.
const DEV_WORKER_NAME: &str = "chorus-dev";

/// Starts `echo`, `reviewer` (which the catalog lists only when configured
/// to) and the phase agents of the example workflows; the readiness check
/// that fails once one of them stopped.
pub(crate) fn start_demo_agents(
    client: chorus_worker::Client,
    metrics: Metrics,
    shutdown: &CancellationToken,
) -> ReadinessProbe {
    let stopped = Stopped::default();
    let pace = chorus_worker::reviewer::DEFAULT_PACE;
    let placement =
        chorus_worker::Placement::new(chorus_worker::DEFAULT_NAMESPACE).named(DEV_WORKER_NAME).counted_in(metrics);
    let echo = chorus_worker::echo::run(client.clone(), placement.clone(), shutdown.clone());
    stopped.watch("echo", echo, shutdown);
    let reviewer = chorus_worker::reviewer::run(client.clone(), placement.clone(), pace, shutdown.clone());
    stopped.watch("reviewer", reviewer, shutdown);
    stopped.watch("phases", chorus_worker::phases::run(client, placement, shutdown.clone()), shutdown);
    stopped.probe()
}

/// Serves `/healthz` and `/metrics` of `chorus agent` on `listen` until
/// `shutdown`: ready while the agent holds its `streams` claim streams open.
/// Returns the metrics for the agent's workers to count into.
pub(crate) async fn serve_health(
    listen: &str,
    config: ServerConfig,
    streams: usize,
    shutdown: &CancellationToken,
) -> anyhow::Result<Metrics> {
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let mut server = ServerBuilder::new(config);
    let metrics = server.metrics();
    let open = metrics.clone();
    let wanted = i64::try_from(streams).unwrap_or(i64::MAX);
    server.add_readiness_probe(Arc::new(move || {
        let held = open.worker_claim_streams.get().get();
        Box::pin(async move {
            match held {
                held if held >= wanted => Ok(()),
                held => {
                    Err(format!("{held} of the agent's {wanted} claim streams open: its task store is out of reach"))
                }
            }
        })
    }));
    tracing::info!(address = %listener.local_addr()?, "serving /healthz and /metrics");
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        if let Err(error) = server.serve(listener, shutdown).await {
            tracing::error!(%error, "the agent's /healthz and /metrics server stopped");
        }
    });
    Ok(metrics)
}

/// The first agent that stopped while it should have worked on, and why.
#[derive(Debug, Clone, Default)]
struct Stopped(Arc<OnceLock<String>>);

impl Stopped {
    /// Runs `agent` in the background, noting its end unless `shutdown` ended it.
    fn watch(
        &self,
        name: &'static str,
        agent: impl Future<Output = Result<(), WorkerError>> + Send + 'static,
        shutdown: &CancellationToken,
    ) {
        let stopped = self.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let outcome = agent.await;
            if shutdown.is_cancelled() {
                return;
            }
            let reason = match outcome {
                Ok(()) => "it stopped".to_owned(),
                Err(error) => error.to_string(),
            };
            tracing::error!(agent = name, error = %reason, "a built-in agent stopped; its tasks wait for a worker");
            let _ = stopped.0.set(format!("the built-in agent {name} stopped: {reason}"));
        });
    }

    fn probe(&self) -> ReadinessProbe {
        let stopped = self.clone();
        Arc::new(move || {
            let reason = stopped.0.get().cloned();
            Box::pin(async move { reason.map_or(Ok(()), Err) })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn settled(probe: &ReadinessProbe) -> Result<(), String> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        probe().await
    }

    #[tokio::test]
    async fn an_agent_that_fails_while_serving_fails_readiness() {
        let shutdown = CancellationToken::new();
        let stopped = Stopped::default();
        stopped.watch("echo", std::future::pending(), &shutdown);
        let refused = tonic::Status::invalid_argument("no such namespace");
        stopped.watch("reviewer", async move { Err(WorkerError::Stream(refused)) }, &shutdown);
        let reason = settled(&stopped.probe()).await.expect_err("not ready");
        assert!(reason.contains("reviewer") && reason.contains("no such namespace"), "{reason}");
    }

    #[tokio::test]
    async fn an_agent_that_ends_without_an_error_while_serving_fails_readiness() {
        let shutdown = CancellationToken::new();
        let stopped = Stopped::default();
        stopped.watch("phases", async { Ok(()) }, &shutdown);
        let reason = settled(&stopped.probe()).await.expect_err("not ready");
        assert!(reason.contains("phases stopped"), "{reason}");
    }

    #[tokio::test]
    async fn agents_that_stop_at_shutdown_leave_readiness_alone() {
        let shutdown = CancellationToken::new();
        let stopped = Stopped::default();
        let ended = shutdown.clone();
        stopped.watch(
            "echo",
            async move {
                ended.cancelled().await;
                Ok(())
            },
            &shutdown,
        );
        let probe = stopped.probe();
        assert_eq!(settled(&probe).await, Ok(()));
        shutdown.cancel();
        assert_eq!(settled(&probe).await, Ok(()));
    }
}
