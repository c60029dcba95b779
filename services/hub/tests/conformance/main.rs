//! The hub's conformance suite: every test runs against SQLite and, when
//! `CHORUS_TEST_POSTGRES_URL` is set, against PostgreSQL.

mod delegation;
mod direct;
mod discovery;
mod harness;
mod state;
mod streams;
mod topics;
