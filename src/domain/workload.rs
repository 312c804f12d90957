//! Workloads: what a scheduler places, described once and profiled once per GPU model.

use std::collections::BTreeMap;

use super::{GpuName, LaunchSpec, Profile, ValidationError, WorkloadName};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadMode {
    Training,
    Inference,
}

impl WorkloadMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Training => "training",
            Self::Inference => "inference",
        }
    }

    pub fn from_db(raw: &str) -> Option<Self> {
        match raw {
            "training" => Some(Self::Training),
            "inference" => Some(Self::Inference),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadState {
    PendingProfile,
    Profiled,
    Failed,
}

impl WorkloadState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingProfile => "pending_profile",
            Self::Profiled => "profiled",
            Self::Failed => "failed",
        }
    }

    pub fn from_db(raw: &str) -> Option<Self> {
        match raw {
            "pending_profile" => Some(Self::PendingProfile),
            "profiled" => Some(Self::Profiled),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

const MAX_LABELS: usize = 64;
const MAX_LABEL_CHARS: usize = 256;
const MAX_MODEL_CHARS: usize = 256;
/// Larger than any batch a single GPU runs; a bigger number is a client bug.
const MAX_BATCH_SIZE: u32 = 1 << 20;

/// Free-form string labels, sorted so that they serialize the same way every time.
pub type Labels = BTreeMap<String, String>;

/// A workload as a client registers it.
#[derive(Debug, Clone)]
pub struct NewWorkload {
    pub name: WorkloadName,
    pub mode: WorkloadMode,
    pub model: String,
    pub batch_size: u32,
    pub labels: Labels,
    pub profile: Option<Profile>,
    /// How the profiling worker runs it, when it is to be profiled here.
    pub launch: Option<LaunchSpec>,
    /// GPU models to profile it on (one job each) when it has no profile; empty = one job
    /// any profiler may run. The advisor fills the default (docs/profiling.md, "Profiling agents").
    pub profile_on: Vec<GpuName>,
}

impl NewWorkload {
    /// Checks the free-text parts; the typed parts were checked when they were built.
    pub fn validate_text(
        model: &str,
        batch_size: u32,
        labels: &Labels,
    ) -> Result<(), ValidationError> {
        if model.chars().count() > MAX_MODEL_CHARS || model.chars().any(char::is_control) {
            return Err(ValidationError::new(
                "model",
                format!("model must be at most {MAX_MODEL_CHARS} printable characters"),
            ));
        }
        if batch_size > MAX_BATCH_SIZE {
            return Err(ValidationError::new(
                "batch_size",
                format!("batch_size {batch_size} is larger than {MAX_BATCH_SIZE}"),
            ));
        }
        if labels.len() > MAX_LABELS {
            return Err(ValidationError::new(
                "labels",
                format!(
                    "at most {MAX_LABELS} labels are allowed, got {}",
                    labels.len()
                ),
            ));
        }
        for (key, value) in labels {
            if key.is_empty() || key.chars().count() > MAX_LABEL_CHARS {
                return Err(ValidationError::new(
                    "labels",
                    format!("label keys must be 1 to {MAX_LABEL_CHARS} characters"),
                ));
            }
            if value.chars().count() > MAX_LABEL_CHARS {
                return Err(ValidationError::new(
                    "labels",
                    format!("label {key:?} is longer than {MAX_LABEL_CHARS} characters"),
                ));
            }
        }
        Ok(())
    }
}
