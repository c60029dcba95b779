//! Readiness: the checks `/healthz` runs, such as whether a service this
//! process calls over the network answers its health check.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use axum::http::StatusCode;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus as WireStatus, health_client::HealthClient,
};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::transport::Transport;

/// A readiness check: `Err(reason)` keeps `/healthz` at 503.
pub type ReadinessProbe = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// How long a [`serving_probe`] waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A readiness check of a service this process calls over `transport`
/// (at `target`): ready while that service's health check answers serving
/// within two seconds.
pub fn serving_probe(transport: Transport, service: &'static str, target: String) -> ReadinessProbe {
    Arc::new(move || {
        let mut client = HealthClient::new(transport.clone());
        let target = target.clone();
        Box::pin(async move {
            let request = HealthCheckRequest { service: service.to_owned() };
            match tokio::time::timeout(PROBE_TIMEOUT, client.check(request)).await {
                Ok(Ok(answer)) if answer.get_ref().status == WireStatus::Serving as i32 => Ok(()),
                Ok(Ok(_)) => Err(format!("{service} at {target} is not serving")),
                Ok(Err(status)) => Err(format!("{service} at {target}: {}", status.message())),
                Err(_) => Err(format!("{service} at {target} did not answer within {PROBE_TIMEOUT:?}")),
            }
        })
    })
}

/// How often the gRPC health status is brought in line with the probes.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Whether every probe passes; else the reason of the first that fails.
async fn ready(probes: &[ReadinessProbe]) -> Result<(), String> {
    for probe in probes {
        probe().await?;
    }
    Ok(())
}

/// `GET /healthz`: ok once every probe passes, else 503 naming the first that fails.
pub(super) async fn healthz(probes: Arc<Vec<ReadinessProbe>>) -> (StatusCode, String) {
    match ready(&probes).await {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
    }
}

/// Keeps, until `shutdown`, the gRPC health status of the server ("") and
/// of each of `services` at what the probes say, as `/healthz` does: a
/// caller that checks a service's gRPC health (a gateway its task store, a
/// Kubernetes gRPC probe) sees it not serving while its database is down.
pub(super) fn follow(
    probes: Arc<Vec<ReadinessProbe>>,
    health: HealthReporter,
    services: Vec<&'static str>,
    shutdown: CancellationToken,
) {
    if probes.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut serving = true;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
            let ready = ready(&probes).await;
            if ready.is_ok() == serving || shutdown.is_cancelled() {
                continue;
            }
            serving = ready.is_ok();
            let status = if serving { ServingStatus::Serving } else { ServingStatus::NotServing };
            match ready {
                Ok(()) => tracing::info!("ready again: health checks answer serving"),
                Err(reason) => tracing::warn!(%reason, "not ready: health checks answer not serving"),
            }
            for service in services.iter().copied().chain([""]) {
                health.set_service_status(service, status).await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tonic_health::pb::HealthCheckRequest;

    use super::*;
    use crate::server::{
        ServerBuilder, ServerConfig,
        tests::{flag_probe, started},
    };

    #[tokio::test]
    async fn grpc_health_follows_the_probes() {
        let up = Arc::new(AtomicBool::new(true));
        let mut builder = ServerBuilder::new(ServerConfig::default());
        builder.add_readiness_probe(flag_probe(&up, "the database is down"));
        let (address, shutdown, server) = started(builder).await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{address}")).unwrap().connect_lazy();
        let mut health = HealthClient::new(channel);
        let mut status_becomes = async |wanted: WireStatus| {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let status = health.check(HealthCheckRequest::default()).await.unwrap().into_inner().status;
                if status == wanted as i32 {
                    return;
                }
                assert!(tokio::time::Instant::now() < deadline, "health stayed {status}, not {wanted:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        status_becomes(WireStatus::Serving).await;
        up.store(false, Ordering::SeqCst);
        status_becomes(WireStatus::NotServing).await;
        up.store(true, Ordering::SeqCst);
        status_becomes(WireStatus::Serving).await;
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
