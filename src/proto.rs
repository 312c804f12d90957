//! Generated gRPC types of `coloc.v1`. They stop at the API layer: handlers convert them into
//! domain types on the way in and back on the way out.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("coloc.v1");

/// Encoded descriptor set of `coloc.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/coloc_descriptor.bin"));
