//! The `chorus.workflow.v1` gRPC service: handlers convert and delegate.

mod convert;
mod handlers;
mod run_convert;

pub use convert::problem_out;
pub use handlers::WorkflowGrpc;
