//! Compiles the protocol definitions in `proto/` with protox (pure Rust, so no `protoc` is needed) and
//! writes the encoded descriptor set of the services Tollgate serves next to the generated code, for gRPC
//! server reflection. The xDS protocols (Tollgate is their client) are compiled apart, so reflection does
//! not list a discovery service nobody can call here.

use std::{env, fs, path::PathBuf};

use prost::Message;

/// The services Tollgate serves.
const PROTOS: &[&str] = &[
    "envoy/service/ratelimit/v3/rls.proto",
    "tollgate/v1/ratelimiter.proto",
];

/// The xDS client's protocols: Aggregated Discovery and the rules resource it carries.
const XDS_PROTOS: &[&str] = &[
    "envoy/service/discovery/v3/ads.proto",
    "ratelimit/config/ratelimit/v3/rls_conf.proto",
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
    // The tests serve ADS from the generated server, so both sides are built here too.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(XDS_PROTOS, ["proto"])?)?;
    Ok(())
}
