//! Telemetry: one [`init`] call returning a guard.
//!
//! - `RUST_LOG` filters (default `info`); logs are pretty or JSON;
//! - spans are exported over OTLP/gRPC only when `OTEL_EXPORTER_OTLP_ENDPOINT`
//!   is set (the exporter reads the standard `OTEL_*` variables);
//! - W3C trace context is extracted by every server ([`server_span`]) and
//!   injected into every call over the network
//!   ([`Transport::remote`](crate::transport::Transport::remote)), export or
//!   not: a worker continues the trace of the request that created its task.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use opentelemetry::{
    propagation::{Extractor, Injector},
    trace::{TraceContextExt as _, TracerProvider as _},
};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    propagation::TraceContextPropagator,
    trace::{SdkTracerProvider, SpanData, SpanExporter},
};
use serde::{Deserialize, Serialize};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _};

/// Log output settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// Flushes exported spans when the process ends.
#[derive(Debug)]
#[must_use = "dropping the guard stops span export"]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl TelemetryGuard {
    /// Flushes and stops span export, off the async threads.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = flushed {
            eprintln!("chorus: span export shutdown failed: {error}");
        }
    }
}

/// Installs the global subscriber and propagator. Must run inside a tokio
/// runtime. A second call in one process keeps the first subscriber.
pub fn init(
    service_name: &str,
    config: &TelemetryConfig,
) -> Result<TelemetryGuard, opentelemetry_otlp::ExporterBuildError> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let (filter, refused) = filter_from(std::env::var(EnvFilter::DEFAULT_ENV).ok());
    // Colours only for a person at a terminal: in a file, a pipe (an IDE's
    // log pane), journald or `docker logs` they are escape codes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let provider = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => otlp_provider(service_name)?,
        // Spans sent nowhere still carry the trace context callers sent to
        // the calls and tasks they lead to; with no processor, an ended span
        // is dropped at once.
        _ => SdkTracerProvider::builder().build(),
    };
    // Another subscriber already installed (tests running several services
    // in one process) is not an error: the first one keeps logging.
    let _ = subscriber(filter, config.log_format, ansi, std::io::stderr, &provider).try_init();
    if let Some(refused) = refused {
        tracing::warn!("{refused}");
    }
    Ok(TelemetryGuard { provider })
}

/// The filter `RUST_LOG` (`value`) sets, or the default; and, when `value`
/// is not a filter, why, for a warning once logging works.
fn filter_from(value: Option<String>) -> (EnvFilter, Option<String>) {
    match value.filter(|value| !value.trim().is_empty()) {
        None => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(value) => match EnvFilter::try_new(&value) {
            Ok(filter) => (filter, None),
            Err(error) => {
                let refused = format!("RUST_LOG={value:?} is not a filter ({error}); logging with {DEFAULT_FILTER:?}");
                (EnvFilter::new(DEFAULT_FILTER), Some(refused))
            }
        },
    }
}

/// What is logged and traced unless `RUST_LOG` says otherwise.
const DEFAULT_FILTER: &str = "info,sqlx=warn,h2=warn";

/// The log and span layers, behind one filter. With a filter per layer,
/// lines went missing: on PostgreSQL, the line logged after some of sqlx's
/// queries, which ask whether their own logging is on (see the workflow e2e
/// test `every_start_logs_each_definition_it_loads`).
fn subscriber<W>(
    filter: EnvFilter,
    format: LogFormat,
    ansi: bool,
    writer: W,
    provider: &SdkTracerProvider,
) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let log = match format {
        LogFormat::Pretty => {
            tracing_subscriber::fmt::layer().with_writer(writer).with_target(false).with_ansi(ansi).boxed()
        }
        LogFormat::Json => tracing_subscriber::fmt::layer().with_writer(writer).json().flatten_event(true).boxed(),
    };
    let spans = tracing_opentelemetry::layer().with_tracer(provider.tracer("chorus"));
    tracing_subscriber::registry().with(filter).with(log).with(spans)
}

fn otlp_provider(service_name: &str) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let service_name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service_name.to_owned());
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?;
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .unwrap_or_default();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(Reported { inner: exporter, endpoint, failing: AtomicBool::new(false) })
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build())
}

/// Says when span export starts to fail, once, and when it works again: the
/// SDK drops a batch it could not send without a word, so a collector that
/// is down or misconfigured would otherwise go unnoticed.
#[derive(Debug)]
struct Reported<E> {
    inner: E,
    endpoint: String,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Reported<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let exported = self.inner.export(batch).await;
        let endpoint = &self.endpoint;
        match &exported {
            Err(error) if !self.failing.swap(true, Ordering::Relaxed) => tracing::warn!(
                %endpoint, %error, spans,
                "cannot export spans; they are dropped until the collector answers (said once)"
            ),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::info!(%endpoint, "span export works again");
            }
            _ => {}
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The span of one incoming request, continuing the caller's trace when the
/// request carries a W3C `traceparent`.
pub fn server_span<B>(request: &http::Request<B>) -> tracing::Span {
    let path = request.uri().path();
    let span = tracing::info_span!(
        "request",
        otel.name = %path.trim_start_matches('/'),
        otel.kind = "server",
        rpc.path = %path,
        namespace = tracing::field::Empty,
        task_id = tracing::field::Empty,
        context_id = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(request.headers()))
    });
    // Fails only when no OpenTelemetry layer is installed: then there is nothing to join.
    if span.set_parent(parent).is_ok() {
        // In the span's fields, so that each line logged under it joins its trace.
        let trace_id = span.context().span().span_context().trace_id();
        if trace_id != opentelemetry::trace::TraceId::INVALID {
            span.record("trace_id", tracing::field::display(trace_id));
        }
    }
    span
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Records ids on the current request span (see [`server_span`]), so traces
/// can be searched by them.
pub fn record_ids(namespace: &str, task_id: &str) {
    let span = tracing::Span::current();
    span.record("namespace", namespace);
    if !task_id.is_empty() {
        span.record("task_id", task_id);
    }
}

/// The current span's W3C trace context as header pairs (`traceparent`, ...).
pub fn current_context_headers() -> HashMap<String, String> {
    let mut headers = HashMap::new();
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.inject_context(&context, &mut headers));
    headers
}

/// Sets `span`'s parent from W3C header pairs (as [`current_context_headers`] made them).
pub fn set_parent_from_headers(span: &tracing::Span, headers: &HashMap<String, String>) {
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(headers));
    let _ = span.set_parent(parent);
}

/// Writes the current span's W3C trace context into a call's `headers`, so
/// that the server continues the caller's trace.
pub fn inject_current_context(headers: &mut http::HeaderMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut HeaderInjector(headers));
    });
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = http::HeaderName::from_bytes(key.as_bytes());
        let value = http::HeaderValue::try_from(value);
        if let (Ok(key), Ok(value)) = (key, value) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a subscriber wrote.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A line logged while a request is handled carries the request's
    /// trace id, the caller's when it sent one, so logs join traces.
    #[test]
    fn lines_logged_for_a_request_name_its_trace() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let written = Written::default();
        let provider = SdkTracerProvider::builder().build();
        let writer = written.clone();
        let subscriber = subscriber(EnvFilter::new("info"), LogFormat::Json, false, move || writer.clone(), &provider);
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let request = http::Request::builder()
            .uri("/chorus.taskstore.v1.TaskStore/GetTask")
            .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
            .body(())
            .unwrap();
        tracing::subscriber::with_default(subscriber, || {
            let _entered = server_span(&request).entered();
            tracing::info!("handled");
        });
        let written = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(written.lines().next().unwrap()).unwrap();
        assert_eq!(line["span"]["trace_id"], trace, "{line}");
    }

    #[test]
    fn a_rust_log_that_is_not_a_filter_is_said_and_the_default_kept() {
        let (filter, refused) = filter_from(Some("info,sqlx=loud".to_owned()));
        let refused = refused.expect("a complaint");
        assert!(refused.starts_with("RUST_LOG=\"info,sqlx=loud\" is not a filter"), "{refused}");
        assert_eq!(filter.to_string(), EnvFilter::new(DEFAULT_FILTER).to_string());
        for fine in [None, Some(String::new()), Some("debug,h2=info".to_owned())] {
            assert!(filter_from(fine.clone()).1.is_none(), "{fine:?}");
        }
        assert_eq!(filter_from(Some("debug".to_owned())).0.to_string(), "debug");
    }
}
