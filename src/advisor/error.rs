//! The advisor's one error type, with a variant per cause: what went wrong, in domain
//! terms. Which gRPC status each cause becomes is decided in one place only,
//! `api/status.rs`; callers inside the house match on causes (the worker, for instance,
//! tells "the workload was deleted" from any other failure). Only `Internal` carries an
//! opaque cause, which is logged and never sent to clients.

use crate::{
    domain::{GpuName, ValidationError},
    store::StoreError,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request value failed validation; the error names the field.
    #[error(transparent)]
    InvalidRequest(#[from] ValidationError),
    /// A workload named by a request (as the one to read, delete or give a profile) is not
    /// registered.
    #[error("workload {0:?} not found")]
    UnknownWorkload(String),
    /// Rank's target is not registered.
    #[error("target workload {0:?} not found")]
    UnknownTarget(String),
    /// The job Place is asked to place is not registered.
    #[error("workload {0:?} to place not found; register it first")]
    UnknownPlaceWorkload(String),
    /// A reported run names a workload that is not registered.
    #[error("workload {0:?} not found; register it before reporting runs with it")]
    UnknownReportedWorkload(String),
    #[error("workload {0:?} already exists")]
    WorkloadExists(String),
    /// A request names no GPU model and none can be inferred: nothing is profiled yet.
    #[error("no GPU model is known yet; register a workload with a profile first")]
    NoGpuModelKnown,
    /// A request names no GPU model and several are known without a configured default.
    #[error(
        "several GPU models are known, no default is configured and not exactly one has a \
         trained model; name one in gpu"
    )]
    AmbiguousGpuModel,
    #[error(
        "no model has been trained for GPU model {:?} yet; report colocated runs and call Train",
        .0.as_str()
    )]
    NoModelForGpu(GpuName),
    /// The target of Rank has no (complete) profile on the GPU model asked about.
    #[error("target {workload} has no profile on GPU model {:?}", .gpu.as_str())]
    TargetNotProfiled { workload: String, gpu: GpuName },
    /// A member of an explicit set (Predict) has no profile on the GPU model asked about.
    #[error("{workload} has no profile on GPU model {:?}", .gpu.as_str())]
    MemberNotProfiled { workload: String, gpu: GpuName },
    #[error(
        "the memory of GPU model {:?} is unknown; pass gpu_memory_gb or store a profile that carries it",
        .0.as_str()
    )]
    GpuMemoryUnknown(GpuName),
    /// A fit could not be made (too few usable runs, degenerate data); the champion stays.
    #[error("{0}")]
    TrainingFailed(String),
    #[error("GPU model {:?} has no model version {version}", .gpu.as_str())]
    UnknownModelVersion { gpu: GpuName, version: u64 },
    #[error("GPU model {:?} has no pinned model", .0.as_str())]
    NothingPinned(GpuName),
    /// Launch specs are refused: the operator allowed no program.
    #[error(
        "this server runs no workloads: profiler.allowed_programs is empty, so launch specs \
         are refused"
    )]
    LaunchSpecsDisabled,
    /// An assignment the occupancy's rules refuse: the job runs elsewhere, the GPU is known
    /// as another model or node, or it is full.
    #[error(transparent)]
    Occupancy(crate::store::OccupancyConflict),
    #[error("program {program:?} is not allowed by profiler.allowed_programs: {reason}")]
    ProgramNotAllowed { program: String, reason: String },
    /// A profiling agent that never announced itself.
    #[error("agent {0:?} is not known; announce it first (AnnounceAgent)")]
    UnknownAgent(String),
    /// A claimed profiling job that no longer exists (its workload was deleted).
    #[error("profiling job {0} not found; its workload was deleted")]
    UnknownJob(i64),
    /// A renewal or submission from a holder that lost the job: its lease expired and the
    /// job went back to the queue or to another claim. The holder must drop the job.
    #[error("the claim on profiling job {job_id} was lost: {now}")]
    ClaimLost { job_id: i64, now: String },
    /// A renewal or submission from an agent that does not hold the claim it names (the
    /// claim is another agent's): refused, nothing changes.
    #[error(
        "agent {sender:?} does not hold claim {claim} of profiling job {job_id} (agent \
         {holder:?} does); only the claim's holder may renew it or submit its outcome"
    )]
    NotClaimHolder {
        job_id: i64,
        claim: i64,
        holder: String,
        sender: String,
    },
    /// A submitted profile of another GPU model than the job asked for.
    #[error("profiling job {job_id} is for GPU model {job_gpu:?}; the profile was measured on {profile_gpu:?}")]
    WrongGpuForJob {
        job_id: i64,
        job_gpu: String,
        profile_gpu: String,
    },
    /// The store cannot write now (disk full, read-only or failing volume): the same call
    /// may succeed once the fault is gone. Health says NOT_SERVING meanwhile.
    #[error("the database cannot be written right now; retry later")]
    StorageUnavailable(#[source] StoreError),
    /// Runs named by id (DeleteRuns) that are not stored.
    #[error("no stored run has id {}; nothing was deleted", .0.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))]
    UnknownRuns(Vec<i64>),
    /// A GPU of the occupancy named by id that coloc does not know.
    #[error("GPU {0:?} is not in the occupancy (coloc gpus list shows the known ones)")]
    UnknownClusterGpu(String),
    /// A node with no GPU in the occupancy.
    #[error("no GPU of the occupancy is on node {0:?}")]
    UnknownNode(String),
    /// A workload without a profile on the GPU model named.
    #[error("workload {workload:?} has no profile on GPU model {:?}", .gpu.as_str())]
    UnknownProfile { workload: String, gpu: GpuName },
    /// A leader-only write of a server that no longer leads (its lease was taken over or
    /// ran out): refused, nothing written.
    #[error("this server no longer leads: {0}")]
    NotLeader(String),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::WorkloadNotFound(name) => Self::UnknownWorkload(name),
            StoreError::WorkloadExists(name) => Self::WorkloadExists(name),
            StoreError::Occupancy(conflict) => Self::Occupancy(conflict),
            StoreError::AgentNotFound(id) => Self::UnknownAgent(id),
            StoreError::JobNotFound(id) => Self::UnknownJob(id),
            StoreError::ClaimLost { job_id, now, .. } => Self::ClaimLost { job_id, now },
            StoreError::NotClaimHolder {
                job_id,
                claim,
                holder,
                sender,
            } => Self::NotClaimHolder {
                job_id,
                claim,
                holder,
                sender,
            },
            StoreError::WrongGpuForJob {
                job_id,
                job_gpu,
                profile_gpu,
            } => Self::WrongGpuForJob {
                job_id,
                job_gpu,
                profile_gpu,
            },
            StoreError::NotLeader { holder, token, now } => {
                Self::NotLeader(format!("{holder} (fencing token {token}): {now}"))
            }
            fault if fault.is_storage_fault() => Self::StorageUnavailable(fault),
            other => Self::Internal(anyhow::Error::new(other)),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
