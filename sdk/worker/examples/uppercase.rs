//! A worker for agent `uppercase`: answers every task with its text in upper
//! case. Run with `CHORUS_URL=http://host:port cargo run --example uppercase`.

use chorus_runtime::telemetry::{self, TelemetryConfig};
use chorus_worker::{Reply, TaskContext, Worker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let telemetry = telemetry::init("uppercase-worker", &TelemetryConfig::default())?;
    let url = std::env::var("CHORUS_URL").unwrap_or_else(|_| "http://127.0.0.1:7800".to_owned());
    let client = chorus_worker::connect(&url).await?;
    Worker::new(client, "uppercase")
        .capacity(4) // tasks at once (default 1)
        .run(
            |task: TaskContext| async move {
                task.status("shouting").await?; // a progress message on the task
                Ok(Reply::text(task.text().to_uppercase()))
            },
            chorus_worker::shutdown_on_signal(),
        )
        .await?;
    telemetry.shutdown().await;
    Ok(())
}
