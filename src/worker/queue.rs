//! The job queue the worker loop talks to, and every type its methods take and return:
//! the claimed job (the store's claim), the measurement submitted (the profiler's), the
//! outcome counted (the advisor's) and why a call failed. An implementation (the
//! in-process [`super::LocalQueue`], an agent's gRPC queue) imports them all from here.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use crate::{advisor::JobOutcome, profiler::Measurement, store::ClaimedJob};

/// Why a queue call failed, by what the loop does about it.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue cannot be reached or written now (storage fault, server unreachable):
    /// the same call is tried again.
    #[error("the job queue is unavailable: {0}")]
    Unavailable(String),
    /// The claim was lost (the lease expired; the job went back to the queue): drop it.
    #[error("the claim was lost: {0}")]
    ClaimLost(String),
    /// The job's workload was deleted.
    #[error("the workload was deleted")]
    WorkloadGone,
    /// The queue refused what was submitted (e.g. an invalid profile).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Where jobs come from and outcomes go: the advisor in-process, or the service over
/// gRPC. Every submission names the claim, and a repeat of one is acknowledged.
#[tonic::async_trait]
pub trait JobQueue: Send + Sync {
    /// The next job this holder can run, if any.
    async fn claim(&self) -> Result<Option<ClaimedJob>, QueueError>;
    /// How often the running job's lease must be renewed; `None` = it has no lease.
    fn renew_every(&self) -> Option<Duration>;
    /// Extends the running job's lease and reports progress.
    async fn renew(&self, job: &ClaimedJob, progress: &str) -> Result<(), QueueError>;
    async fn complete(&self, job: &ClaimedJob, measured: &Measurement) -> Result<(), QueueError>;
    /// Back to pending, uncounted, for `wait`.
    async fn release(
        &self,
        job: &ClaimedJob,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError>;
    /// A failed attempt, retried after `wait`.
    async fn retry(
        &self,
        job: &ClaimedJob,
        error: &str,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError>;
    /// Failed for good.
    async fn fail(&self, job: &ClaimedJob, error: &str) -> Result<(), QueueError>;
    /// A token cancelled when the job must stop (its workload deleted) or `parent` is.
    fn watch(&self, job: &ClaimedJob, parent: &CancellationToken) -> CancellationToken;
    fn unwatch(&self, job: &ClaimedJob);
    /// Counts what became of a turn (the in-process worker's metrics).
    fn record(&self, outcome: JobOutcome);
}
