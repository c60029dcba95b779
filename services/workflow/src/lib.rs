//! The chorus workflow engine, first slice: versioned YAML workflow
//! definitions (runs are not built yet).
//!
//! - [`domain`]: definitions and validation problems, free of wire types;
//! - [`parse`]: YAML → a checked definition, or every problem with its place;
//! - [`repository`]: the storage contract and its SQL implementation;
//! - [`service`]: put, validate, get, list and loading a folder;
//! - [`grpc`]: the `chorus.workflow.v1` handlers, which convert and delegate.

pub mod config;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod parse;
pub mod repository;
pub mod service;

pub use config::WorkflowConfig;
pub use repository::sql::MIGRATIONS;
pub use service::Workflows;
