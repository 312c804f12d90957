//! The profiling worker inside `coloc serve`: one job at a time (the profiling GPU is
//! dedicated and exclusive), as a loop around [`Worker::run_once`], which tests drive
//! directly.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    advisor::{Advisor, Error as AdvisorError, JobOutcome},
    domain::{now_ms, WorkloadName},
    profiler::{Backend, ProfileError},
    settings::ProfilerSettings,
    store::{ClaimedJob, Store},
};

/// What one turn of the worker did.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// No job was ready.
    Idle,
    Profiled {
        workload: WorkloadName,
        note: String,
    },
    /// The attempt failed and the job will be retried after a backoff.
    WillRetry {
        workload: WorkloadName,
        attempt: u32,
        error: String,
    },
    /// The job failed for good.
    Failed {
        workload: WorkloadName,
        error: String,
    },
    /// The backend cannot run now; the job waits (no attempt counted).
    Waiting {
        workload: WorkloadName,
        reason: String,
    },
    /// The workload was deleted while it was being profiled.
    Cancelled { workload: WorkloadName },
    /// The server is stopping: the job went back to pending.
    Interrupted { workload: WorkloadName },
}

pub struct Worker {
    /// Stores profiles and keeps the catalog in step (and stops a deleted workload's run).
    advisor: Arc<Advisor>,
    /// The job queue.
    store: Store,
    backend: Arc<Backend>,
    settings: ProfilerSettings,
}

impl Worker {
    pub fn new(
        advisor: Arc<Advisor>,
        store: Store,
        backend: Arc<Backend>,
        settings: ProfilerSettings,
    ) -> Self {
        Self {
            advisor,
            store,
            backend,
            settings,
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(16);
        Duration::from_secs(self.settings.retry_backoff_secs.saturating_mul(factor))
    }

    /// Claims the next ready job, profiles its workload, and records the outcome.
    pub async fn run_once(&self, shutdown: &CancellationToken) -> anyhow::Result<RunOutcome> {
        let job = match self.store.claim_next_job(now_ms()).await? {
            None => return Ok(RunOutcome::Idle),
            Some(job) => job,
        };
        let outcome = self.handle(job, shutdown).await?;
        self.advisor.stats().job(match &outcome {
            RunOutcome::Idle => return Ok(outcome),
            RunOutcome::Profiled { .. } => JobOutcome::Profiled,
            RunOutcome::WillRetry { .. } => JobOutcome::WillRetry,
            RunOutcome::Failed { .. } => JobOutcome::Failed,
            RunOutcome::Waiting { .. } => JobOutcome::Waiting,
            RunOutcome::Cancelled { .. } => JobOutcome::Cancelled,
            RunOutcome::Interrupted { .. } => JobOutcome::Interrupted,
        });
        Ok(outcome)
    }

    #[tracing::instrument(
        name = "profile",
        skip_all,
        fields(backend = self.backend.name(), workload = %job.workload, job = job.id, attempt = job.attempts)
    )]
    async fn handle(
        &self,
        job: ClaimedJob,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<RunOutcome> {
        let store = &self.store;
        let workload = job.workload.clone();
        tracing::info!("profiling");
        let cancel = self.advisor.start_job(&workload, shutdown);
        let measured = self
            .backend
            .profile(&workload, job.launch.as_ref(), &cancel)
            .await;
        self.advisor.end_job(&workload);

        let now = now_ms();
        Ok(match measured {
            Ok(measurement) => {
                let stored = self
                    .persist("storing the profile", shutdown, || {
                        self.advisor
                            .complete_job(&job, &measurement.profile, &measurement.note)
                    })
                    .await;
                match stored {
                    Ok(_) => {
                        tracing::info!(
                            system_secs = measurement.phase_secs.0,
                            kernel_secs = measurement.phase_secs.1,
                            note = %measurement.note,
                            "profiled"
                        );
                        RunOutcome::Profiled {
                            workload,
                            note: measurement.note,
                        }
                    }
                    // Deleted while it was being profiled.
                    Err(AdvisorError::UnknownWorkload(_)) => RunOutcome::Cancelled { workload },
                    // Stopping while the store still fails: the job stays RUNNING in the
                    // store and goes back to pending when the server starts again.
                    Err(error) if shutdown.is_cancelled() => {
                        return Err(anyhow::Error::new(error).context("storing the profile"))
                    }
                    // The profile was refused: the job must not stay claimed.
                    Err(error) => {
                        let error = format!("the measured profile could not be stored: {error}");
                        self.persist_store("failing the job", shutdown, || {
                            store.fail_job(job.id, &error, now)
                        })
                        .await?;
                        tracing::warn!(%error, "profiling failed for good");
                        RunOutcome::Failed { workload, error }
                    }
                }
            }
            Err(ProfileError::Cancelled) if shutdown.is_cancelled() => {
                // The server is stopping: one attempt; a job left RUNNING is re-queued at
                // the next start.
                store
                    .release_job(
                        job.id,
                        "profiling was interrupted by a shutdown; it will run again",
                        0,
                        now,
                    )
                    .await?;
                tracing::info!("interrupted; job re-queued");
                RunOutcome::Interrupted { workload }
            }
            Err(ProfileError::Cancelled) => {
                tracing::info!("workload deleted while profiling; run stopped");
                RunOutcome::Cancelled { workload }
            }
            Err(ProfileError::Unavailable(reason)) => {
                let wait = now + self.settings.poll_interval_ms as i64;
                let why = format!("waiting for the profiler: {reason}");
                self.persist_store("releasing the job", shutdown, || {
                    store.release_job(job.id, &why, wait, now)
                })
                .await?;
                RunOutcome::Waiting { workload, reason }
            }
            Err(ProfileError::Permanent(error)) => {
                self.persist_store("failing the job", shutdown, || {
                    store.fail_job(job.id, &error, now)
                })
                .await?;
                tracing::warn!(%error, "profiling failed for good");
                RunOutcome::Failed { workload, error }
            }
            Err(ProfileError::Failed(error)) if job.attempts >= self.settings.max_attempts => {
                let error = format!("profiling failed {} times; last: {error}", job.attempts);
                self.persist_store("failing the job", shutdown, || {
                    store.fail_job(job.id, &error, now)
                })
                .await?;
                tracing::warn!(%error, "profiling failed for good");
                RunOutcome::Failed { workload, error }
            }
            Err(ProfileError::Failed(error)) => {
                let backoff = self.backoff(job.attempts);
                let reason = format!(
                    "attempt {} of {} failed ({error}); retrying in {}s",
                    job.attempts,
                    self.settings.max_attempts,
                    backoff.as_secs()
                );
                let not_before = now + backoff.as_millis() as i64;
                self.persist_store("scheduling a retry", shutdown, || {
                    store.retry_job(job.id, &error, &reason, not_before, now)
                })
                .await?;
                tracing::warn!(%error, attempt = job.attempts, "profiling attempt failed");
                RunOutcome::WillRetry {
                    workload,
                    attempt: job.attempts,
                    error,
                }
            }
        })
    }

    /// Runs `write` until it succeeds, fails for a reason other than a storage fault, or
    /// the server stops: a claimed job's outcome must reach the store, or the job would
    /// stay RUNNING with no worker running it. Waits grow from 100 ms to 5 s.
    async fn persist<T, F, Fut>(
        &self,
        what: &str,
        shutdown: &CancellationToken,
        mut write: F,
    ) -> Result<T, AdvisorError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, AdvisorError>>,
    {
        let mut wait = Duration::from_millis(100);
        loop {
            match write().await {
                Err(AdvisorError::StorageUnavailable(error)) if !shutdown.is_cancelled() => {
                    tracing::warn!(
                        error = error.chain(),
                        retry_in_ms = wait.as_millis() as u64,
                        "{what} failed; retrying"
                    );
                    tokio::select! {
                        _ = shutdown.cancelled() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                done => return done,
            }
        }
    }

    /// [`persist`](Self::persist) for a store write.
    async fn persist_store<F, Fut>(
        &self,
        what: &str,
        shutdown: &CancellationToken,
        mut write: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), crate::store::StoreError>>,
    {
        self.persist(what, shutdown, || {
            let written = write();
            async move { written.await.map_err(AdvisorError::from) }
        })
        .await
        .map_err(|error| anyhow::Error::new(error).context(what.to_string()))
    }

    /// Runs jobs until `shutdown`; a running job is stopped and put back to pending.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(backend = self.backend.name(), "profiling worker started");
        let idle = Duration::from_millis(self.settings.poll_interval_ms);
        while !shutdown.is_cancelled() {
            let pause = match self.run_once(&shutdown).await {
                Ok(RunOutcome::Idle | RunOutcome::Waiting { .. }) => idle,
                Ok(_) => Duration::ZERO,
                Err(error) => {
                    tracing::error!(error = format!("{error:#}"), "profiling worker error");
                    idle
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
        tracing::info!("profiling worker stopped");
    }
}
