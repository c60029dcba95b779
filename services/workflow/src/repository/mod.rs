//! The storage contracts: definitions and runs.

mod claims;
mod cursors;
mod gauges;
mod held;
mod run_rows;
pub mod runs;
mod slots;
pub mod sql;
pub mod sql_runs;

use async_trait::async_trait;

pub use self::runs::{
    Claim, Created, EventPage, Fence, RunRepository, Taker, Transition, TriggerCursor, Unfinished, Written,
};
use crate::{
    domain::{Definition, DefinitionPage, Disabled, Head, NewDefinition, PageToken, Put},
    error::Result,
};

/// Where definition versions are kept. Every call is scoped to a namespace.
#[async_trait]
pub trait DefinitionRepository: Send + Sync + std::fmt::Debug {
    /// Stores `definition` as the next version of its name, unless its
    /// source hash equals the latest version's (then returns that one, unchanged).
    async fn put(&self, definition: NewDefinition, now: i64) -> Result<Put>;

    /// One version (`None`: the latest), with its source.
    async fn get(&self, namespace: &str, name: &str, version: Option<u32>) -> Result<Option<Definition>>;

    /// The latest version of `name` and whether it is disabled, read
    /// without the definition; `None` when `name` has no version.
    async fn head(&self, namespace: &str, name: &str) -> Result<Option<Head>>;

    /// Disables `name`, every version of it; when it is disabled already,
    /// the first record stands. A name with no version is left alone.
    async fn disable(&self, namespace: &str, name: &str, disabled: Disabled) -> Result<()>;

    /// Enables `name` again, the runs it held in the queue due at `now`.
    async fn enable(&self, namespace: &str, name: &str, now: i64) -> Result<()>;

    /// With `name`: its versions, newest first; else the latest version of
    /// each name, by name. At most `limit`, after `after`.
    async fn list(
        &self,
        namespace: &str,
        name: Option<&str>,
        include_source: bool,
        after: Option<PageToken>,
        limit: u32,
    ) -> Result<DefinitionPage>;

    /// The latest version of every workflow in every namespace, with its
    /// source (what the trigger scheduler reads).
    async fn latest_everywhere(&self) -> Result<Vec<Definition>>;

    /// Every version in `namespace`, without its source, by name and version
    /// (what event triggers judge events by).
    async fn versions(&self, namespace: &str) -> Result<Vec<Definition>>;

    /// How many versions `namespace` holds. Versions are only ever added:
    /// another count means another put.
    async fn version_count(&self, namespace: &str) -> Result<u64>;
}
