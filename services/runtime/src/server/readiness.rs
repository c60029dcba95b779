//! Readiness: the checks `/healthz` runs, such as whether a service this
//! process calls over the network answers its health check.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use axum::http::StatusCode;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus as WireStatus, health_client::HealthClient,
};

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

/// `GET /healthz`: ok once every probe passes, else 503 naming the first that fails.
pub(super) async fn healthz(probes: Arc<Vec<ReadinessProbe>>) -> (StatusCode, String) {
    for probe in probes.iter() {
        if let Err(reason) = probe().await {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n"));
        }
    }
    (StatusCode::OK, "ok\n".to_owned())
}
