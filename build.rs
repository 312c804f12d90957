//! Compiles proto/ with protox (no protoc binary needed) and keeps the encoded descriptor
//! set of coloc's API for gRPC server reflection. The kubelet's PodResources API (vendored
//! in proto/kubelet/) is compiled apart: `coloc agent` is its client, and it is not served.

use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptor_set = protox::compile(["coloc/v1/advisor.proto"], ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("coloc_descriptor.bin"),
        descriptor_set.encode_to_vec(),
    )?;
    tonic_prost_build::configure().compile_fds(descriptor_set)?;
    let kubelet = protox::compile(["kubelet/podresources/v1/api.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(kubelet)?;
    Ok(())
}
