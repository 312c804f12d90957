//! The service's loop of `profiler.dispatch = "kubernetes-jobs"`: claim the next job of a
//! GPU model the cluster has (under a lease, as [`KUBE_JOBS_HOLDER`]), run it as a
//! Kubernetes Job while renewing the lease, then settle what the Job's pod did not: a Job
//! that failed (or succeeded without a report) is re-queued with the Job's reason, or
//! failed on its last attempt; a workload the Job cannot run fails at once with the reason.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{JobEnd, KubeJobError, KubeJobs, KUBE_JOBS_HOLDER};
use crate::{
    domain::{now_ms, GpuName, WorkloadName},
    store::{ClaimedJob, JobClaimer, Store, StoreError, Submitted},
};

/// What one turn of the dispatcher did.
#[derive(Debug, Clone, PartialEq)]
pub enum DispatchOutcome {
    /// No job was ready.
    Idle,
    /// The Job's pod reported through the agents' API (a profile, or its own failure).
    Reported { workload: WorkloadName },
    /// The Job failed without a report: the profiling job is back in the queue.
    Requeued {
        workload: WorkloadName,
        reason: String,
    },
    /// The profiling job failed for good.
    Failed {
        workload: WorkloadName,
        reason: String,
    },
    /// The service stopped: the Job was deleted and the profiling job re-queued.
    Interrupted { workload: WorkloadName },
}

#[derive(Clone)]
pub struct KubeDispatcher {
    kube: KubeJobs,
    store: Store,
    /// The GPU models the cluster's nodes have: each claim asks for one of them.
    gpus: Vec<GpuName>,
    lease_ms: i64,
    max_attempts: u32,
    retry_backoff: Duration,
}

impl KubeDispatcher {
    pub fn new(
        kube: KubeJobs,
        store: Store,
        gpus: Vec<GpuName>,
        lease_ms: i64,
        max_attempts: u32,
        retry_backoff: Duration,
    ) -> Self {
        Self {
            kube,
            store,
            gpus,
            lease_ms,
            max_attempts,
            retry_backoff,
        }
    }

    /// The next job of one of the GPU models, its GPU model filled in.
    async fn claim(&self) -> Result<Option<ClaimedJob>, StoreError> {
        for gpu in &self.gpus {
            let claimer = JobClaimer {
                holder: KUBE_JOBS_HOLDER,
                gpu: Some(gpu),
                lease_ms: self.lease_ms,
                max_attempts: self.max_attempts,
            };
            if let Some(mut job) = self.store.claim_job(&claimer, now_ms()).await? {
                job.gpu.get_or_insert_with(|| gpu.clone());
                return Ok(Some(job));
            }
        }
        Ok(None)
    }

    async fn renew(&self, job: &ClaimedJob) {
        let renewed = self
            .store
            .renew_lease(job, self.lease_ms, "running as a Kubernetes Job", now_ms())
            .await;
        if let Err(error) = renewed {
            tracing::debug!(%error, job = job.id, "lease not renewed");
        }
    }

    /// Claims a job and runs it as a Kubernetes Job to its end.
    pub async fn run_once(&self, shutdown: &CancellationToken) -> anyhow::Result<DispatchOutcome> {
        let Some(job) = self.claim().await? else {
            return Ok(DispatchOutcome::Idle);
        };
        let workload = job.workload.clone();
        let ended = self.kube.run(&job, shutdown, || self.renew(&job)).await;
        let now = now_ms();
        Ok(match ended {
            Ok(JobEnd::Succeeded) => {
                match self.store.renew_lease(&job, self.lease_ms, "", now).await {
                    // Still ours: the pod exited 0 without reporting anything.
                    Ok(_) => {
                        let reason = "the Kubernetes Job succeeded but its pod reported nothing";
                        self.failed_attempt(&job, reason.into()).await?
                    }
                    Err(_) => DispatchOutcome::Reported { workload },
                }
            }
            Ok(JobEnd::Failed { reason }) => self.failed_attempt(&job, reason).await?,
            Err(KubeJobError::Cancelled) => {
                let why = "the service stopped while its Kubernetes Job ran; it will run again";
                self.store.release_job(&job, why, now, now).await?;
                DispatchOutcome::Interrupted { workload }
            }
            Err(error) if error.is_permanent() => {
                let reason = error.to_string();
                settled(self.store.fail_job(&job, &reason, now).await, &job)?
                    .unwrap_or(DispatchOutcome::Failed { workload, reason })
            }
            Err(error) => self.failed_attempt(&job, error.to_string()).await?,
        })
    }

    /// A failed attempt: re-queued after a backoff, or failed on its last attempt. A pod
    /// that reported first (the claim is settled) wins.
    async fn failed_attempt(
        &self,
        job: &ClaimedJob,
        error: String,
    ) -> Result<DispatchOutcome, StoreError> {
        let workload = job.workload.clone();
        let now = now_ms();
        if job.attempts >= self.max_attempts {
            let reason = format!("profiling failed {} times; last: {error}", job.attempts);
            tracing::warn!(%reason, job = job.id, "profiling job failed for good");
            let done = self.store.fail_job(job, &reason, now).await;
            return Ok(settled(done, job)?.unwrap_or(DispatchOutcome::Failed { workload, reason }));
        }
        let wait = self.retry_backoff * (1u32 << job.attempts.saturating_sub(1).min(16));
        let reason = format!(
            "attempt {} of {} failed ({error}); retrying in {}s",
            job.attempts,
            self.max_attempts,
            wait.as_secs()
        );
        tracing::warn!(%reason, job = job.id, "Kubernetes Job failed");
        let done = self
            .store
            .retry_job(job, &error, &reason, now + wait.as_millis() as i64, now)
            .await;
        Ok(settled(done, job)?.unwrap_or(DispatchOutcome::Requeued { workload, reason }))
    }

    /// Runs jobs until `shutdown`, looking for one every poll interval while there is none.
    pub async fn run(self, shutdown: CancellationToken) {
        let idle = self.kube.poll_interval();
        tracing::info!(gpus = ?self.gpus, "Kubernetes Job dispatcher started");
        while !shutdown.is_cancelled() {
            let pause = match self.run_once(&shutdown).await {
                Ok(DispatchOutcome::Idle) => idle,
                Ok(_) => Duration::ZERO,
                Err(error) => {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "Kubernetes Job dispatcher error"
                    );
                    idle
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        tracing::info!("Kubernetes Job dispatcher stopped");
    }
}

/// `Some(Reported)` when the pod settled the claim first (the update was a repeat, or the
/// claim is no longer held), `None` when this update was applied.
fn settled(
    done: Result<Submitted<()>, StoreError>,
    job: &ClaimedJob,
) -> Result<Option<DispatchOutcome>, StoreError> {
    let reported = Some(DispatchOutcome::Reported {
        workload: job.workload.clone(),
    });
    match done {
        Ok(Submitted::Applied(())) => Ok(None),
        Ok(Submitted::Duplicate) | Err(StoreError::ClaimLost { .. }) => Ok(reported),
        Err(error) => Err(error),
    }
}
