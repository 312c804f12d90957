//! Place: "which GPU should this new job go to?" across GPUs that already run jobs.
//!
//! Each candidate GPU is scored by the predicted **gain**: the value of its set of jobs with
//! the new job minus the value without it (an empty GPU scores the job's own exclusive
//! value). A GPU is left out, with the reason, when the job or a resident cannot be
//! predicted there, the memory would overflow, a slowdown cap or a resident's own floor
//! would be broken, it holds too many jobs already or the new set breaks the query's
//! [`PlaceRule`] (gain, fair share, break-even).
//!
//! Predictions are the one prediction of `advisor::predict` (Predict's and Rank's too): a
//! co-runner never speeds a job up. A member's predicted throughput in a set is the lowest
//! the model predicts for it in any subset of that set that contains it (alone it runs at
//! its exclusive throughput), so adding a job to a GPU never raises anyone's prediction.
//! Sets repeat heavily in a real cluster; every distinct multiset of workloads is predicted
//! once per request.
//!
//! Where the model carries 80 % intervals, each member's answer carries its interval (the
//! model's for a set of that size, or its seen band for a set of workloads it was trained
//! on, around the member's prediction), and `cautious` checks the caps on the low ends.
//!
//! The query and its validation live in `query.rs`, the rule in `rule.rs`, set values and
//! the per-request set cache in `sets.rs`, the work in named steps in `work.rs`, the
//! checks of one GPU in `judge.rs` and safe exploration, within its budget, in `explore.rs`.

use std::sync::Arc;

use super::{predict::answerable, Catalog, Error, GpuProfiles, MemberPrediction, Policy, Result};
use crate::{
    domain::{GpuName, WorkloadName},
    model::ModelKind,
    store::StoredModel,
};

mod explore;
mod judge;
mod query;
mod rule;
pub(super) mod sets;
mod work;

pub use explore::{candidate as explore_candidate, Exploration};
pub use query::{GpuState, PlaceQuery};
pub use rule::PlaceRule;
pub(super) use sets::SetCache;
pub use sets::{PlacedSets, PLACED_SETS};
pub(super) use work::PlaceWork;

/// The most GPUs one Place request may name.
pub const MAX_PLACE_GPUS: usize = 100_000;
/// Jobs per GPU (residents and the new job) unless the request says otherwise.
pub const DEFAULT_MAX_JOBS_PER_GPU: usize = 4;
/// The largest `max_jobs_per_gpu` accepted: a set of n members is predicted through its
/// 2^n subsets (see the module header), which stays cheap up to 8.
pub const MAX_JOBS_PER_GPU: usize = 8;

/// One GPU the job may go to, with what the model predicts there.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub gpu_id: String,
    pub node: String,
    pub gpu: GpuName,
    /// The objective's value of the set with the job minus without it.
    pub gain: f64,
    /// The gain read on the members' low ends (their 80 % intervals; the point gain where
    /// the model has none): what a cautious policy orders GPUs by.
    pub gain_low: f64,
    pub value_before: f64,
    pub value_after: f64,
    /// The new job first, then each resident in the order given.
    pub members: Vec<MemberPrediction>,
    pub fits_memory: bool,
    /// Memory of the residents and the job, GB.
    pub memory_gb: f64,
    /// The limit it was checked against.
    pub gpu_memory_gb: f64,
    pub model_version: u64,
    /// Offered first to explore a set the model is unsure of (`observer.explore_budget`,
    /// `explore.rs`): the GPU where the new set's interval is widest among those whose low
    /// ends keep every cap and floor, in place of Place's best.
    pub explored: bool,
}

/// Why a GPU was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceSkipCode {
    /// The residents and the job would need more memory than the GPU has.
    ExceedsGpuMemory,
    /// The new job would keep less than `min_job_fraction`.
    JobSlowdown,
    /// A resident would keep less than `min_resident_fraction` or its own floor.
    ResidentSlowdown,
    /// The GPU already holds `max_jobs_per_gpu` jobs.
    TooManyJobs,
    /// A resident is not a registered workload.
    UnknownWorkload,
    /// No model serves the GPU's model, or it cannot check the floors or the rule asked
    /// for (a model that predicts only sums, with members not estimated).
    NoModel,
    /// The new job has no (complete) profile on the GPU's model.
    JobNotProfiled,
    /// A resident has no (complete) profile on the GPU's model.
    ResidentNotProfiled,
    /// Neither the GPU nor its model says how much memory it has.
    GpuMemoryUnknown,
    /// The new set breaks the query's [`PlaceRule`].
    RuleRefused,
    /// With the job, the GPU would do less work than its residents and the job apart, and
    /// the policy does not list losses.
    PredictedLoss,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SkippedGpu {
    pub gpu_id: String,
    pub code: PlaceSkipCode,
    /// A sentence for people.
    pub reason: String,
    /// The member at fault (a resident, or the new job), when one is.
    pub workload: Option<WorkloadName>,
    /// For a broken cap, floor or fair share: the fraction of its exclusive throughput that
    /// member was predicted to keep.
    pub predicted_fraction: Option<f64>,
    /// For a broken cap or floor: the cap or floor.
    pub floor: Option<f64>,
    /// `predicted_fraction` is the low end of the member's 80 % interval (`cautious`).
    pub on_low_end: bool,
}

/// The model that scored the GPUs of one GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelUsed {
    pub gpu: GpuName,
    pub version: u64,
    pub kind: ModelKind,
    /// The model predicts only sums: members were estimated from the sum in proportion to
    /// their exclusive throughputs.
    pub members_estimated: bool,
}

#[derive(Debug, Clone)]
pub struct PlaceAnswer {
    /// Best first: highest gain (on the low ends with a cautious policy), ties by GPU id.
    pub placements: Vec<Placement>,
    pub skipped: Vec<SkippedGpu>,
    pub models: Vec<ModelUsed>,
    /// The policy applied.
    pub policy: Policy,
}

/// Place without an advisor: against `catalog` and the serving model of each GPU model, at
/// once on this thread. For tools that hold their own catalog (benchmarks, tests); the
/// service calls [`super::Advisor::place`].
pub fn place_in(
    catalog: &Catalog,
    models: &std::collections::HashMap<GpuName, Arc<StoredModel>>,
    default_gpu: Option<&GpuName>,
    query: PlaceQuery,
) -> Result<PlaceAnswer> {
    query.validate()?;
    PlaceWork::new(catalog, models, default_gpu, query)?.run()
}

/// [`place_in`], keeping set predictions in `shared` across requests as the service does
/// (answers never depend on it; a tool that asks many times, such as the simulation, is
/// faster with it).
pub fn place_in_keeping(
    catalog: &Catalog,
    models: &std::collections::HashMap<GpuName, Arc<StoredModel>>,
    default_gpu: Option<&GpuName>,
    query: PlaceQuery,
    shared: &Arc<PlacedSets>,
) -> Result<PlaceAnswer> {
    query.validate()?;
    let mut work = PlaceWork::new(catalog, models, default_gpu, query)?;
    work.shared = Some(shared.clone());
    work.run()
}

/// Why the job cannot be placed on any GPU of a GPU model, or `None` when it can.
pub(super) fn job_not_placeable(
    gpu: &GpuName,
    table: &GpuProfiles,
    model: &StoredModel,
    job: &WorkloadName,
) -> Option<(PlaceSkipCode, String)> {
    if table.get(job).is_some_and(|entry| answerable(model, entry)) {
        return None;
    }
    let name = job.as_str();
    Some(if table.lacks_kernel_metrics(job) {
        (
            PlaceSkipCode::JobNotProfiled,
            format!(
                "the job {name} was profiled on GPU model {:?} without kernel metrics, and \
                 model version {} has no NVML-only twin; retrain or profile it again",
                gpu.as_str(),
                model.version
            ),
        )
    } else {
        (
            PlaceSkipCode::JobNotProfiled,
            format!(
                "the job {name} has no profile on GPU model {:?}",
                gpu.as_str()
            ),
        )
    })
}

/// Errors of a Place request as a whole (the job itself unknown).
pub(super) fn unknown_job(job: &WorkloadName) -> Error {
    Error::UnknownPlaceWorkload(job.as_str().to_string())
}

#[cfg(test)]
mod tests;
