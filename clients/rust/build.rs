//! Compiles Tollgate's native API (`proto/tollgate/v1/ratelimiter.proto`, the server's own file through
//! the `proto` link) with protox, so neither `protoc` nor the server crate is needed. Client stubs only.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/tollgate");
    let descriptors = protox::compile(["tollgate/v1/ratelimiter.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(descriptors)?;
    Ok(())
}
