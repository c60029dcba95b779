//! The workflow definitions conformance suite: every test runs against
//! SQLite and, when `CHORUS_TEST_POSTGRES_URL` is set, against PostgreSQL.

mod auto_gates;
mod definitions;
mod disabled;
mod engines;
mod grpc;
mod harness;
mod hitl_gates;
mod loading;
mod outages;
mod parallel;
mod runs;
mod steps;
mod triggers;
