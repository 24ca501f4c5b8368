//! Compiles `proto/apache/rocketmq/v2/*.proto` with protox (a protobuf compiler in Rust: no
//! `protoc` needed) and generates the messages (prost) and the service (tonic).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/apache/rocketmq/v2/definition.proto",
        "proto/apache/rocketmq/v2/service.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
