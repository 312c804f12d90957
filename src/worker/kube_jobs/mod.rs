//! Profiling without an idle GPU (`profiler.dispatch = "kubernetes-jobs"`): for each
//! profiling job the service claims it under a lease, as the holder [`KUBE_JOBS_HOLDER`],
//! and creates a one-shot Kubernetes Job (`manifest`) that runs the workload's own image
//! on a node of the job's GPU model with coloc's measuring step injected. The Job's pod
//! reports the profile (or its failure) through the agents' API under that claim; the
//! service follows the Job (`lifecycle`), renews the lease while it runs, and re-queues
//! or fails the profiling job with the Job's reason when the Job fails without a report.
//! The GPU is requested only for the Job's lifetime. The agents' DaemonSet stays for bare
//! metal and calibration.

mod dispatch;
mod lifecycle;
mod manifest;
#[cfg(test)]
mod tests;

pub use dispatch::{DispatchOutcome, KubeDispatcher};
pub use lifecycle::{JobEnd, KubeJobs};
pub use manifest::{
    gpu_product_label, job_manifest, job_name, typed_job, INJECTED_DIR, JOB_LABEL,
    WORKLOAD_ANNOTATION,
};

/// The claim holder of every job handed to a Kubernetes Job; the Job's pod submits under it.
pub const KUBE_JOBS_HOLDER: &str = "kubernetes-jobs";

/// Why a profiling job could not become, or be followed as, a Kubernetes Job.
#[derive(Debug, thiserror::Error)]
pub enum KubeJobError {
    #[error("the workload has no launch spec: a Kubernetes Job runs its launch spec's program")]
    NoLaunchSpec,
    #[error(
        "the workload's launch spec names no image (launch.image): a Kubernetes Job needs one"
    )]
    NoImage,
    #[error("the profiling job names no GPU model: a Kubernetes Job must pick its node by one")]
    NoGpuModel,
    #[error("GPU model {0:?} is not usable as a node label value")]
    GpuLabel(String),
    #[error("the Job manifest does not fit the Kubernetes API types: {0}")]
    Manifest(String),
    #[error("the Kubernetes API refused or failed: {0}")]
    Api(#[from] kube::Error),
    #[error("the Job {0} disappeared before it finished")]
    JobGone(String),
    #[error("stopped")]
    Cancelled,
}

impl KubeJobError {
    /// No attempt can succeed: the workload or its job must change first.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::NoLaunchSpec
                | Self::NoImage
                | Self::NoGpuModel
                | Self::GpuLabel(_)
                | Self::Manifest(_)
        )
    }
}
