//! Compiles the chorus contracts with protox (pure Rust: the build needs no
//! `protoc`) and exports the descriptor set for gRPC reflection.

use std::{env, fs, path::PathBuf};

use prost::Message as _;

const PROTOS: &[&str] = &[
    "chorus/eventbus/v1/eventbus.proto",
    "chorus/gateway/v1/gateway.proto",
    "chorus/hub/v1/hub.proto",
    "chorus/taskstore/v1/taskstore.proto",
    "chorus/workflow/v1/workflow.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("chorus_descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::ChorusCodec")
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
