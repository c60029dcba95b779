//! A real OTLP/gRPC trace receiver: services under test export their spans to
//! it exactly as they would to an OpenTelemetry collector, and tests wait for
//! the spans they expect.
//!
//! ```text
//! let (receiver, endpoint) = OtlpReceiver::start().await?;
//! // start a service with OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, call it, then:
//! let spans = receiver.wait_for(|spans| spans.iter().any(|s| s.name == "handle_task"), deadline).await?;
//! ```

use std::{collections::BTreeMap, fmt, net::Ipv4Addr};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value::Value},
};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle, time::Instant};
use tonic::{
    Request, Response, Status,
    transport::{Server, server::TcpIncoming},
};

/// One exported span, flattened out of its resource and scope.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSpan {
    /// The exporting resource's `service.name` (empty when it sent none).
    pub service_name: String,
    /// Lowercase hex, 32 digits.
    pub trace_id: String,
    /// Lowercase hex, 16 digits.
    pub span_id: String,
    /// Lowercase hex; `None` for a root span.
    pub parent_span_id: Option<String>,
    pub name: String,
    /// Attribute values as text (`"42"`, `"true"`, the string itself, ...).
    pub attributes: BTreeMap<String, String>,
}

impl CollectedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// The span's parent, grandparent, ... as far as they were collected,
    /// nearest first.
    pub fn ancestors<'a>(&self, spans: &'a [CollectedSpan]) -> Vec<&'a CollectedSpan> {
        let mut chain: Vec<&CollectedSpan> = Vec::new();
        let mut parent_id = self.parent_span_id.as_deref();
        while let Some(id) = parent_id {
            let parent = spans.iter().find(|span| span.trace_id == self.trace_id && span.span_id == id);
            // A span seen twice means a cycle: only a broken exporter sends one.
            let Some(parent) = parent.filter(|parent| !chain.contains(parent)) else {
                break;
            };
            chain.push(parent);
            parent_id = parent.parent_span_id.as_deref();
        }
        chain
    }
}

impl fmt::Display for CollectedSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = self.parent_span_id.as_deref().unwrap_or("-");
        write!(
            f,
            "[{}] {} trace={} span={} parent={parent}",
            self.service_name, self.name, self.trace_id, self.span_id
        )?;
        for (key, value) in &self.attributes {
            write!(f, " {key}={value}")?;
        }
        Ok(())
    }
}

/// [`OtlpReceiver::wait_for`] gave up; holds what had arrived by then.
#[derive(Debug)]
pub struct WaitTimedOut {
    pub spans: Vec<CollectedSpan>,
}

impl fmt::Display for WaitTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the expected spans did not arrive in time; {} collected:", self.spans.len())?;
        for span in &self.spans {
            write!(f, "\n  {span}")?;
        }
        Ok(())
    }
}

impl std::error::Error for WaitTimedOut {}

/// Serves `opentelemetry.proto.collector.trace.v1.TraceService/Export` on a
/// free loopback port until dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    spans: watch::Receiver<Vec<CollectedSpan>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl OtlpReceiver {
    /// Starts the receiver; the URL is what `OTEL_EXPORTER_OTLP_ENDPOINT` takes.
    pub async fn start() -> std::io::Result<(Self, String)> {
        Self::serve(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?)
    }

    /// Starts the receiver on `listener`.
    pub fn serve(listener: TcpListener) -> std::io::Result<(Self, String)> {
        let endpoint = format!("http://{}", listener.local_addr()?);
        let (sender, spans) = watch::channel(Vec::new());
        let service = TraceServiceServer::new(Collector { spans: sender });
        let incoming = TcpIncoming::from(listener);
        let server = tokio::spawn(Server::builder().add_service(service).serve_with_incoming(incoming));
        Ok((Self { spans, server }, endpoint))
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.borrow().clone()
    }

    /// Waits until the spans received so far satisfy `predicate`, which is
    /// checked again on each export; returns them then.
    pub async fn wait_for(
        &self,
        mut predicate: impl FnMut(&[CollectedSpan]) -> bool,
        deadline: Instant,
    ) -> Result<Vec<CollectedSpan>, WaitTimedOut> {
        let mut spans = self.spans.clone();
        let satisfied = tokio::time::timeout_at(deadline, spans.wait_for(|spans| predicate(spans))).await;
        match satisfied {
            Ok(Ok(spans)) => Ok(spans.clone()),
            // The sender lives in the server task: it stopped.
            Ok(Err(_)) | Err(_) => Err(WaitTimedOut { spans: self.spans() }),
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Debug)]
struct Collector {
    spans: watch::Sender<Vec<CollectedSpan>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let collected = flatten(request.into_inner());
        if !collected.is_empty() {
            self.spans.send_modify(|spans| spans.extend(collected));
        }
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<CollectedSpan> {
    let mut collected = Vec::new();
    for resource_spans in request.resource_spans {
        let resource_attributes = resource_spans.resource.map(|resource| resource.attributes).unwrap_or_default();
        let service_name = attributes(resource_attributes).remove("service.name").unwrap_or_default();
        for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
            collected.push(CollectedSpan {
                service_name: service_name.clone(),
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: (!span.parent_span_id.is_empty()).then(|| hex(&span.parent_span_id)),
                name: span.name,
                attributes: attributes(span.attributes),
            });
        }
    }
    collected
}

fn attributes(values: Vec<KeyValue>) -> BTreeMap<String, String> {
    values.into_iter().map(|attribute| (attribute.key, text(attribute.value))).collect()
}

fn text(value: Option<AnyValue>) -> String {
    match value.and_then(|value| value.value) {
        None => String::new(),
        Some(Value::StringValue(text)) => text,
        Some(Value::BoolValue(value)) => value.to_string(),
        Some(Value::IntValue(value)) => value.to_string(),
        Some(Value::DoubleValue(value)) => value.to_string(),
        Some(Value::BytesValue(bytes)) => hex(&bytes),
        Some(value @ (Value::ArrayValue(_) | Value::KvlistValue(_) | Value::StringValueStrindex(_))) => {
            format!("{value:?}")
        }
    }
}

/// Lowercase hex, as W3C `traceparent` and trace UIs write ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::{
        collector::trace::v1::trace_service_client::TraceServiceClient,
        resource::v1::Resource,
        trace::v1::{ResourceSpans, ScopeSpans, Span},
    };

    use super::*;

    fn string(key: &str, value: &str) -> KeyValue {
        let value = Some(AnyValue { value: Some(Value::StringValue(value.to_owned())) });
        KeyValue { key: key.to_owned(), value, ..Default::default() }
    }

    fn export(service: &str, spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource { attributes: vec![string("service.name", service)], ..Default::default() }),
                scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
                ..Default::default()
            }],
        }
    }

    fn span(name: &str, span_id: u8, parent: Option<u8>) -> Span {
        Span {
            trace_id: vec![0xab; 16],
            span_id: vec![span_id; 8],
            parent_span_id: parent.map(|parent| vec![parent; 8]).unwrap_or_default(),
            name: name.to_owned(),
            attributes: vec![string("task_id", "t-1")],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn wait_for_resolves_on_the_export_that_satisfies_it() {
        let (receiver, endpoint) = OtlpReceiver::start().await.expect("receiver starts");
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let waiting = receiver.wait_for(|spans| spans.len() == 2, deadline);
        let exporting = async {
            let mut client = TraceServiceClient::connect(endpoint).await.expect("receiver accepts connections");
            client.export(export("svc-a", vec![span("root", 1, None)])).await.expect("first export");
            client.export(export("svc-b", vec![span("child", 2, Some(1))])).await.expect("second export");
        };
        let (spans, ()) = tokio::join!(waiting, exporting);
        let spans = spans.expect("both exports arrive");
        let [root, child] = spans.as_slice() else { panic!("two spans expected: {spans:?}") };
        assert_eq!(root.service_name, "svc-a");
        assert_eq!(root.trace_id, "ab".repeat(16));
        assert_eq!(root.span_id, "01".repeat(8));
        assert_eq!(root.parent_span_id, None);
        assert_eq!(child.service_name, "svc-b");
        assert_eq!(child.parent_span_id.as_deref(), Some(root.span_id.as_str()));
        assert_eq!(child.attribute("task_id"), Some("t-1"));
        assert_eq!(child.ancestors(&spans), [root]);
    }

    #[tokio::test]
    async fn wait_for_gives_up_at_the_deadline_with_what_arrived() {
        let (receiver, _endpoint) = OtlpReceiver::start().await.expect("receiver starts");
        let deadline = Instant::now() + std::time::Duration::from_millis(50);
        let timed_out = receiver.wait_for(|spans| !spans.is_empty(), deadline).await;
        assert!(timed_out.is_err_and(|timed_out| timed_out.spans.is_empty()));
    }
}
