//! The chorus hub: agent-to-agent messaging (topics, direct messages,
//! delegation, broadcast) through durable inboxes, shared versioned state,
//! and discovery.
//!
//! - [`domain`]: agents, messages, state and their rules, free of wire types;
//! - [`repository`]: the storage contract and its SQL implementation;
//! - [`service`]: waits, streams, wake-ups and the reaper;
//! - [`grpc`]: the `chorus.hub.v1` handlers, which convert and delegate.

pub mod config;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod repository;
pub mod service;

pub use config::HubConfig;
pub use repository::sql::MIGRATIONS;
pub use service::Hub;
