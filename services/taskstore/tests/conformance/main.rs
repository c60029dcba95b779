//! The task store's conformance suite: every test runs against SQLite and,
//! when `CHORUS_TEST_POSTGRES_URL` is set, against PostgreSQL.

mod awaits;
mod bus;
mod cancels;
mod completions;
mod contexts;
mod events;
mod handoff;
mod harness;
mod inbox;
mod isolation;
mod outbox;
mod push;
mod relay;
mod release;
mod restarts;
mod retention;
mod runners;
mod subtasks;
mod tasks;
mod turns;
mod wakeups;
mod workers;
