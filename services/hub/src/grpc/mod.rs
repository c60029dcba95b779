//! The `chorus.hub.v1` gRPC service: handlers convert and delegate.

mod convert;
mod handlers;

pub use handlers::HubGrpc;
