//! Validated domain values. Everything that crosses into the advisor, the store or the model
//! has been checked here once, so the layers below never re-validate and never see a
//! generated protobuf type.

mod launch;
mod names;
mod observation;
mod profile;
mod workload;

pub use launch::{LaunchSpec, DEFAULT_NVTX_RANGE};
pub use names::{GpuName, WorkloadName};
pub use observation::{ColocatedMember, Observation, MAX_MEMBERS};
#[cfg(test)]
pub(crate) use profile::tests as profile_tests;
pub use profile::{
    check_memory_gb, gb_from_bytes, KernelMetrics, Profile, ProfileSource, SystemMetrics,
    BYTES_PER_GB,
};
pub use workload::{Labels, NewWorkload, WorkloadMode, WorkloadState};

/// A value that failed validation; the message is written for the person who sent it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ValidationError(pub String);

impl ValidationError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
