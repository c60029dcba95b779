//! What every service's gRPC handlers share: the namespace check and the
//! shape of a response stream.

use std::pin::Pin;

use futures_util::{Stream, StreamExt as _};
use tonic::Status;

use crate::{
    telemetry::record_ids,
    validate::{self, FieldViolation},
};

/// A server-streaming response.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Checks a request's namespace and records it on the request span.
pub fn namespace(value: &str) -> Result<String, FieldViolation> {
    let namespace = validate::namespace(value)?;
    record_ids(&namespace, "");
    Ok(namespace)
}

/// A service's stream as a response stream: each item converted to its wire
/// form, each error through the service's one error mapping.
pub fn stream_of<T, U, E>(
    stream: impl Stream<Item = Result<T, E>> + Send + 'static,
    convert: fn(T) -> U,
) -> ResponseStream<U>
where
    T: 'static,
    U: 'static,
    E: Into<Status> + 'static,
{
    Box::pin(stream.map(move |item| item.map(convert).map_err(Into::into)))
}
