//! Domain types and rules of the event bus, free of wire types.

mod graph;
mod model;
mod pattern;

pub use graph::{Handlers, Participant, Verdict, find_cycle, settle, topological_order, verdict};
pub use model::*;
pub use pattern::{EventType, Pattern};
