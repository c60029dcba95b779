//! The chorus event bus: a durable, ordered log per namespace, and named
//! handlers that receive its events at least once, in the dependency order
//! of their `after` lists.
//!
//! - [`domain`]: events, handlers, deliveries and the ordering rules, free of wire types;
//! - [`repository`]: the storage contract and its SQL implementation;
//! - [`service`]: streams, wake-ups, the lease reaper and the in-process handler API;
//! - [`grpc`]: the `chorus.eventbus.v1` handlers, which convert and delegate.

pub mod config;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod repository;
pub mod service;

pub use config::EventBusConfig;
pub use repository::sql::MIGRATIONS;
pub use service::EventBus;
