//! The `chorus.taskstore.v1` gRPC service: handlers convert and delegate.

mod convert;
mod handlers;
mod pages;
mod push_convert;

pub use handlers::TaskStoreGrpc;
