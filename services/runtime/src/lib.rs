//! The chorus runtime: what every service shares.
//!
//! - [`config`]: layered configuration (defaults < `chorus.toml` < `CHORUS_*` < flags);
//! - [`detach`]: work that runs to its end even when its caller gives up;
//! - [`egress`]: which addresses outbound HTTP may reach (SSRF guards);
//! - [`telemetry`]: tracing, OTLP export, W3C trace-context propagation;
//! - [`metrics`]: Prometheus metrics, counted at the server's edge and by the services;
//! - [`server`]: one server builder for gRPC + HTTP on one pre-bound port;
//! - [`storage`]: a database URL selects PostgreSQL or SQLite; embedded migrations;
//! - [`error`]: the closed error-code enum mapped once to gRPC and HTTP;
//! - [`feed`]: sending what a stream's task read to its receiver;
//! - [`grpc`]: the namespace check and response streams every handler uses;
//! - [`glob`]: event-type patterns (`task.*`);
//! - [`validate`]: proto input checks that name the offending field;
//! - [`wakeup`]: commit signals between writers and waiting readers;
//! - [`registry`]: the streams open in this process, for hand-offs;
//! - [`rounds`]: work done in rounds on a task of its own (purges);
//! - [`time`]: stored times (microseconds) and protobuf timestamps;
//! - [`transport`]: gRPC clients over the network or in process;
//! - [`signal`]: shutdown on Ctrl-C and SIGTERM;
//! - `testing` (cargo feature `testing`): a PostgreSQL database per test.

pub mod batch;
pub mod config;
pub mod detach;
pub mod egress;
pub mod error;
pub mod feed;
mod flat_writes;
pub mod glob;
pub mod grpc;
pub mod metrics;
pub mod outage;
pub mod registry;
pub mod rounds;
pub mod server;
pub mod signal;
pub mod storage;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod time;
pub mod transport;
mod upgrade;
pub mod uri;
pub mod validate;
pub mod wakeup;
