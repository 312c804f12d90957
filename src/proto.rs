//! Generated gRPC types of `coloc.v1`. They stop at the API layer: handlers convert them into
//! domain types on the way in and back on the way out. [`podresources`] holds the kubelet's
//! PodResources API (package `v1`), whose client `coloc agent` is.
#![allow(clippy::all, missing_docs)]

tonic::include_proto!("coloc.v1");

/// Encoded descriptor set of `coloc.v1`, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/coloc_descriptor.bin"));

/// The kubelet's PodResources API v1 (`k8s.io/kubelet/pkg/apis/podresources/v1`, vendored in
/// proto/kubelet/): its client for `coloc agent`, its server for tests that play the kubelet.
pub mod podresources {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("v1");
}
