//! Compiles the protocol definitions in `proto/` with protox (pure Rust, so no `protoc` is needed) and
//! writes the encoded descriptor set next to the generated code for gRPC server reflection.

use std::{env, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "tollgate/v1/ratelimiter.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("descriptor_set.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
