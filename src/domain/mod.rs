//! Validated domain values. Everything that crosses into the advisor, the store or the model
//! has been checked here once, so the layers below never re-validate and never see a
//! generated protobuf type.

mod launch;
mod names;
mod observation;
mod profile;
mod sharing;
mod workload;

pub use launch::{AllowedPrograms, LaunchSpec, DEFAULT_NVTX_RANGE};
pub use names::{GpuName, WorkloadName};
pub use observation::{ColocatedMember, Observation, MAX_MEMBERS};
#[cfg(test)]
pub(crate) use profile::tests as profile_tests;
pub use profile::{
    check_memory_gb, check_throughput, gb_from_bytes, KernelMetrics, Profile, ProfileSource,
    SystemMetrics, BYTES_PER_GB, MAX_MEMORY_GB, MAX_REGISTERS, MAX_THREADS, MAX_THROUGHPUT,
};
pub use sharing::SharingMode;
pub use workload::{Labels, NewWorkload, WorkloadMode, WorkloadState};

/// A value that failed validation: which field (a path into the request, as the API spells
/// it, e.g. `profile.system.sm_busy_pct` or `members[1].throughput`) and a message written
/// for the person who sent it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    pub field: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error with its field seen from an enclosing message (`prefix.field`).
    pub fn within(mut self, prefix: &str) -> Self {
        if !self.field.starts_with(prefix) {
            self.field = if self.field.is_empty() {
                prefix.to_string()
            } else {
                format!("{prefix}.{}", self.field)
            };
        }
        self
    }
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
