//! Compiles `proto/meridian/v1/*.proto` with protox (pure Rust), so no system `protoc` is needed.
//! Only with the `wire` feature: without it the crate is the domain types alone.

#[cfg(feature = "wire")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/meridian/v1/meridian.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // Service stubs only with the `grpc` feature; message types always.
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure().build_client(grpc).build_server(grpc).compile_fds(descriptors)?;
    Ok(())
}

#[cfg(not(feature = "wire"))]
fn main() {}
