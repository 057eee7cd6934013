//! Compiles `proto/payments.proto` (the example's and the tests' service)
//! with `protox`, a protobuf compiler in Rust: no `protoc` to install.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/payments.proto");
    let descriptors = protox::compile(["payments.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
