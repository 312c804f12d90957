//! The question Place answers, in domain terms: the job, the candidate GPUs with their
//! residents (and each resident's own floor), the objective, the caps and the rule, and the
//! checks a query must pass before any GPU is scored.

use super::{DEFAULT_MAX_JOBS_PER_GPU, MAX_JOBS_PER_GPU, MAX_PLACE_GPUS};
use crate::{
    advisor::Policy,
    domain::{GpuName, ValidationError, WorkloadName, MAX_MEMBERS},
};

/// One candidate GPU and what already runs on it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    /// Opaque, unique in a request.
    pub id: String,
    /// The node the GPU sits in; empty when not known.
    pub node: String,
    /// The GPU model; `None` = the default rules (as in Rank).
    pub gpu: Option<GpuName>,
    /// Memory available on this GPU, GB; `None` = the GPU model's total memory.
    pub memory_gb: Option<f64>,
    /// The workloads already running there (checked names; a name may repeat: copies).
    pub residents: Vec<String>,
    /// Each resident's own floor: the lowest fraction of its exclusive throughput it may
    /// keep (`resident_floors[i]` is `residents[i]`'s; `None` = no floor of its own). Empty =
    /// no resident has one; otherwise one per resident. Checked besides the query's
    /// `min_resident_fraction`, as it is (on the low ends with `cautious`).
    pub resident_floors: Vec<Option<f64>>,
}

impl GpuState {
    /// The `k`-th resident's own floor.
    pub fn floor(&self, k: usize) -> Option<f64> {
        self.resident_floors.get(k).copied().flatten()
    }
}

/// A Place request in domain terms.
///
/// In-process callers (the cluster simulator, the Kubernetes extender) build one, call
/// [`super::Advisor::place`] and read the [`PlaceAnswer`]; they never touch protobuf types.
/// An empty `gpus` places against the occupancy coloc keeps (AssignJob/ReleaseJob),
/// filtered by `nodes` and `gpu_filter`.
#[derive(Debug, Clone)]
pub struct PlaceQuery {
    /// The job to place.
    pub workload: WorkloadName,
    pub gpus: Vec<GpuState>,
    /// With `gpus` empty: only GPUs on these nodes (empty = every node).
    pub nodes: Vec<String>,
    /// With `gpus` empty: only GPUs of this GPU model.
    pub gpu_filter: Option<GpuName>,
    /// The objective, rule, cautious reading, the job's floor (`min_job_fraction`), every
    /// resident's (`min_partner_fraction`, besides the residents' own floors) and whether
    /// predicted losses are listed.
    pub policy: Policy,
    /// Jobs a GPU may hold with the new one included.
    pub max_jobs_per_gpu: usize,
    /// 0 = every GPU that qualifies.
    pub top_k: usize,
    pub include_oversubscribed: bool,
    /// Whether each placement lists its members' predictions; off for callers that read
    /// only the gains (the extender and the binding webhook), which spares building them.
    pub with_members: bool,
}

impl PlaceQuery {
    /// A query with the defaults for everything but the job and the GPUs (the default
    /// [`Policy`]).
    pub fn new(workload: WorkloadName, gpus: Vec<GpuState>) -> Self {
        Self {
            workload,
            gpus,
            nodes: Vec::new(),
            gpu_filter: None,
            policy: Policy::default(),
            max_jobs_per_gpu: DEFAULT_MAX_JOBS_PER_GPU,
            top_k: 0,
            include_oversubscribed: false,
            with_members: true,
        }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.gpus.len() > MAX_PLACE_GPUS {
            return Err(ValidationError::new(
                "gpus",
                format!(
                    "at most {MAX_PLACE_GPUS} GPUs may be named, got {}",
                    self.gpus.len()
                ),
            ));
        }
        if self.top_k > MAX_PLACE_GPUS {
            return Err(ValidationError::new(
                "top_k",
                format!(
                    "top_k must be between 0 (all) and {MAX_PLACE_GPUS}, got {}",
                    self.top_k
                ),
            ));
        }
        if !(1..=MAX_JOBS_PER_GPU).contains(&self.max_jobs_per_gpu) {
            return Err(ValidationError::new(
                "max_jobs_per_gpu",
                format!(
                    "max_jobs_per_gpu must be between 1 and {MAX_JOBS_PER_GPU} (0 = {DEFAULT_MAX_JOBS_PER_GPU}), got {}",
                    self.max_jobs_per_gpu
                ),
            ));
        }
        check_fraction("min_job_fraction", self.policy.min_job_fraction)?;
        check_fraction("min_resident_fraction", self.policy.min_partner_fraction)?;
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(
            self.gpus.len(),
            foldhash::fast::RandomState::default(),
        );
        for (i, gpu) in self.gpus.iter().enumerate() {
            if !seen.insert(gpu.id.as_str()) {
                return Err(ValidationError::new(
                    format!("gpus[{i}].id"),
                    format!("GPU id {:?} is listed twice", gpu.id),
                ));
            }
            if gpu.residents.len() > MAX_MEMBERS {
                return Err(ValidationError::new(
                    format!("gpus[{i}].residents"),
                    format!(
                        "a GPU runs at most {MAX_MEMBERS} jobs, got {} residents",
                        gpu.residents.len()
                    ),
                ));
            }
            if !gpu.resident_floors.is_empty() && gpu.resident_floors.len() != gpu.residents.len() {
                return Err(ValidationError::new(
                    format!("gpus[{i}].resident_min_fractions"),
                    format!(
                        "give one floor per resident or none, got {} floors for {} residents",
                        gpu.resident_floors.len(),
                        gpu.residents.len()
                    ),
                ));
            }
            for (k, floor) in gpu.resident_floors.iter().enumerate() {
                check_fraction(&format!("gpus[{i}].resident_min_fractions[{k}]"), *floor)?;
            }
        }
        Ok(())
    }
}

/// A floor must be a fraction of the exclusive throughput: in (0, 1].
fn check_fraction(field: &str, fraction: Option<f64>) -> Result<(), ValidationError> {
    match fraction {
        Some(fraction) if !(fraction > 0.0 && fraction <= 1.0) => Err(ValidationError::new(
            field,
            format!(
                "{field} is the fraction of its exclusive throughput a job keeps: \
                 between 0 (no limit) and 1, got {fraction}"
            ),
        )),
        _ => Ok(()),
    }
}
