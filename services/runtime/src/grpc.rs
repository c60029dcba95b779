//! What every service's gRPC handlers share: the namespace check, the
//! shape of a response stream, and how many items fit in one message.

use std::pin::Pin;

use futures_util::{Stream, StreamExt as _};
use tonic::Status;

use crate::{
    telemetry::record_ids,
    validate::{self, FieldViolation},
};

/// A server-streaming response.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// How many of the leading items, `encoded_len` bytes each on the wire,
/// one message carries within `budget` bytes: at least one (an item larger
/// than the budget goes alone), so a page or batch always moves on. Each
/// item also costs its field's tag and length, counted here.
pub fn fitting(encoded_lens: impl IntoIterator<Item = usize>, budget: usize) -> usize {
    let mut used = 0;
    let mut count = 0;
    for len in encoded_lens {
        used += len + 8;
        if used > budget && count > 0 {
            break;
        }
        count += 1;
    }
    count
}

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

#[cfg(test)]
mod tests {
    use super::fitting;

    #[test]
    fn items_fit_within_the_budget_and_at_least_one_goes() {
        assert_eq!(fitting([100; 5], 330), 3);
        assert_eq!(fitting([1_000, 10], 330), 1, "an item larger than the budget goes alone");
        assert_eq!(fitting([10; 4], 1_000), 4);
        assert_eq!(fitting(std::iter::empty(), 1_000), 0);
    }
}
