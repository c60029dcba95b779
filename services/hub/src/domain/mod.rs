//! Domain types and rules of the hub, free of wire types.

mod model;
mod receive;

pub use model::*;
pub use receive::{MESSAGE_OVERHEAD_BYTES, Selection, select};
