//! The event bus's conformance suite: every test runs against SQLite and,
//! when `CHORUS_TEST_POSTGRES_URL` is set, against PostgreSQL.

mod harness;
mod log;
mod ordering;
mod retention;
mod retries;
mod streams;
mod wakeups;
