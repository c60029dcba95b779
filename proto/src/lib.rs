//! The chorus v1 contracts: generated messages, servers and clients.
//!
//! The module tree mirrors the proto packages (`chorus.taskstore.v1` is
//! [`chorus::taskstore::v1`]); the short aliases below are what callers use.

pub mod codec;
pub mod json;

/// Generated code, one module per proto package.
#[allow(missing_debug_implementations, unreachable_pub, clippy::all, clippy::clone_on_ref_ptr, rust_2018_idioms)]
pub mod chorus {
    pub mod eventbus {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/chorus.eventbus.v1.rs"));
        }
    }
    pub mod gateway {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/chorus.gateway.v1.rs"));
        }
    }
    pub mod hub {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/chorus.hub.v1.rs"));
        }
    }
    pub mod taskstore {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/chorus.taskstore.v1.rs"));
        }
    }
    pub mod workflow {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/chorus.workflow.v1.rs"));
        }
    }
}

pub use chorus::eventbus::v1 as eventbus;
pub use chorus::gateway::v1 as gateway;
pub use chorus::hub::v1 as hub;
pub use chorus::taskstore::v1 as taskstore;
pub use chorus::workflow::v1 as workflow;

/// Every chorus service's file descriptors, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/chorus_descriptor.bin"));

/// The file descriptors of the A2A 1.0 gRPC binding (`lf.a2a.v1`), which the
/// gateway serves through the `a2a-pb` crate, for gRPC reflection.
pub const A2A_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/a2a_descriptor.bin"));

pub use prost;
pub use prost_types;
pub use tonic;
