//! Compiles the chorus contracts with protox (pure Rust: the build needs no
//! `protoc`) and exports the descriptor set for gRPC reflection, with the
//! A2A schema's (see `a2a/README.md`).

use std::{env, fs, path::PathBuf};

use prost::Message as _;

const PROTOS: &[&str] = &[
    "chorus/eventbus/v1/eventbus.proto",
    "chorus/gateway/v1/gateway.proto",
    "chorus/hub/v1/hub.proto",
    "chorus/taskstore/v1/taskstore.proto",
    "chorus/workflow/v1/workflow.proto",
];

/// The A2A schema, under its own include root: described, not generated.
const A2A_ROOT: &str = "a2a";
const A2A_PROTOS: &[&str] =
    &["a2a.proto", "google/api/annotations.proto", "google/api/client.proto", "google/api/field_behavior.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    for proto in A2A_PROTOS {
        println!("cargo:rerun-if-changed={A2A_ROOT}/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("chorus_descriptor.bin"), descriptors.encode_to_vec())?;
    let a2a = protox::compile(A2A_PROTOS, [A2A_ROOT])?;
    fs::write(out_dir.join("a2a_descriptor.bin"), a2a.encode_to_vec())?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::ChorusCodec")
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
