//! The chorus workflow engine: versioned YAML definitions and their durable
//! runs.
//!
//! - [`domain`]: definitions, runs and their records, free of wire types;
//! - [`parse`]: YAML → a checked definition, or every problem with its place;
//! - [`repository`]: the storage contracts and their SQL implementations;
//! - [`service`]: definitions and the runs API;
//! - [`engine`]: the rules of a run, and the loops that drive runs;
//! - [`effects`]: steps' side effects over the other services;
//! - [`grpc`]: the `chorus.workflow.v1` handlers, which convert and delegate.

pub mod config;
pub mod domain;
pub mod effects;
pub mod engine;
pub mod error;
pub mod grpc;
pub mod parse;
pub mod repository;
pub mod service;

pub use config::WorkflowConfig;
pub use repository::sql::MIGRATIONS;
pub use service::Workflows;
