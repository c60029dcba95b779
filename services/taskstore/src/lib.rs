//! The chorus task store: A2A tasks, worker leases and the subtask lifecycle.
//!
//! - [`domain`]: the task model and its rules, free of wire types;
//! - [`repository`]: the storage contract and its SQL implementation;
//! - [`service`]: waiting, wake-ups, the lease reaper and the outbox relay
//!   around the repository;
//! - [`grpc`]: the `chorus.taskstore.v1` handlers, which convert and delegate.

pub mod config;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod repository;
pub mod service;

pub use config::TaskStoreConfig;
pub use repository::sql::MIGRATIONS;
pub use service::TaskStore;
