//! The in-process job queue of `coloc serve`'s worker: claims straight from the store
//! (jobs for any GPU model, and for the backend's own), outcomes through the advisor so
//! the catalog stays in step, no lease (a crash of the server re-queues the job at the
//! next start), and a deleted workload's run stopped through the advisor's job tokens.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{ClaimedJob, JobOutcome, JobQueue, Measurement, QueueError};
use crate::{
    advisor::{Advisor, Error as AdvisorError},
    domain::{now_ms, GpuName},
    store::{JobClaimer, Store, StoreError, IN_PROCESS_HOLDER},
};

#[derive(Clone)]
pub struct LocalQueue {
    advisor: Arc<Advisor>,
    store: Store,
    /// The GPU model the backend measures on, when it can tell.
    gpu: Option<GpuName>,
}

impl LocalQueue {
    pub fn new(advisor: Arc<Advisor>, store: Store, gpu: Option<GpuName>) -> Self {
        Self {
            advisor,
            store,
            gpu,
        }
    }
}

fn queue_error(error: AdvisorError) -> QueueError {
    match error {
        AdvisorError::UnknownWorkload(_) | AdvisorError::UnknownJob(_) => QueueError::WorkloadGone,
        AdvisorError::ClaimLost { now, .. } => QueueError::ClaimLost(now),
        AdvisorError::StorageUnavailable(cause) => QueueError::Unavailable(cause.chain()),
        other => QueueError::Refused(other.to_string()),
    }
}

fn store_error(error: StoreError) -> QueueError {
    queue_error(AdvisorError::from(error))
}

fn ok<T>(_: T) -> Result<(), QueueError> {
    Ok(())
}

#[tonic::async_trait]
impl JobQueue for LocalQueue {
    async fn claim(&self) -> Result<Option<ClaimedJob>, QueueError> {
        self.store
            .claim_job(
                &JobClaimer {
                    holder: IN_PROCESS_HOLDER,
                    gpu: self.gpu.as_ref(),
                    lease_ms: 0,
                    max_attempts: self.advisor.agent_policy().max_attempts,
                },
                now_ms(),
            )
            .await
            .map_err(|e| QueueError::Other(anyhow::Error::new(e)))
    }

    fn renew_every(&self) -> Option<Duration> {
        None
    }

    async fn renew(&self, job: &ClaimedJob, progress: &str) -> Result<(), QueueError> {
        self.store
            .renew_lease(job, 0, progress, now_ms())
            .await
            .map_err(store_error)
            .and_then(ok)
    }

    async fn complete(&self, job: &ClaimedJob, measured: &Measurement) -> Result<(), QueueError> {
        self.advisor
            .complete_job(job, &measured.profile, &measured.note)
            .await
            .map_err(queue_error)
            .and_then(ok)
    }

    async fn release(
        &self,
        job: &ClaimedJob,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError> {
        let now = now_ms();
        self.store
            .release_job(job, reason, now + wait.as_millis() as i64, now)
            .await
            .map_err(store_error)
            .and_then(ok)
    }

    async fn retry(
        &self,
        job: &ClaimedJob,
        error: &str,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError> {
        let now = now_ms();
        self.store
            .retry_job(job, error, reason, now + wait.as_millis() as i64, now)
            .await
            .map_err(store_error)
            .and_then(ok)
    }

    async fn fail(&self, job: &ClaimedJob, error: &str) -> Result<(), QueueError> {
        self.store
            .fail_job(job, error, now_ms())
            .await
            .map_err(store_error)
            .and_then(ok)
    }

    fn watch(&self, job: &ClaimedJob, parent: &CancellationToken) -> CancellationToken {
        self.advisor.start_job(&job.workload, parent)
    }

    fn unwatch(&self, job: &ClaimedJob) {
        self.advisor.end_job(&job.workload);
    }

    fn record(&self, outcome: JobOutcome) {
        self.advisor.stats().job(outcome);
    }
}
