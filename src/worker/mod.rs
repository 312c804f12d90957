//! The profiling job loop, one job at a time (a profiling GPU is dedicated and
//! exclusive): a loop around [`Worker::run_once`], which tests drive directly. The loop
//! talks to its job queue through [`JobQueue`], so that the in-process worker of `coloc
//! serve` ([`LocalQueue`], over the advisor) and `coloc agent` (a gRPC queue, in
//! `agent`) share this one implementation: claim, measure while renewing the lease,
//! submit the profile or the failure.

pub mod kube_jobs;
mod leases;
mod local;
mod queue;

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

pub use leases::LeaseSweeper;
pub use local::LocalQueue;
pub use queue::{ClaimedJob, JobOutcome, JobQueue, Measurement, QueueError};

use crate::{
    advisor::Advisor,
    domain::WorkloadName,
    profiler::{Backend, ProfileError},
    settings::ProfilerSettings,
    store::Store,
    sync::Unpoisoned,
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
    /// The lease was lost before the job finished (the holder was too slow to renew):
    /// the job is someone else's now, and nothing was submitted.
    LeaseLost { workload: WorkloadName },
    /// The queue refused to record the attempt's outcome (e.g. to fail the job), so the
    /// job was handed back to the queue instead, with the refusal as its reason.
    HandedBack {
        workload: WorkloadName,
        reason: String,
    },
}

impl RunOutcome {
    /// The workload the turn was about; `None` when it was idle.
    pub fn workload(&self) -> Option<&WorkloadName> {
        match self {
            Self::Idle => None,
            Self::Profiled { workload, .. }
            | Self::WillRetry { workload, .. }
            | Self::Failed { workload, .. }
            | Self::Waiting { workload, .. }
            | Self::Cancelled { workload }
            | Self::Interrupted { workload }
            | Self::LeaseLost { workload }
            | Self::HandedBack { workload, .. } => Some(workload),
        }
    }
}

/// What became of a claimed job's outcome: recorded as asked (or nothing was left to
/// record), or refused and the job handed back to the queue with this reason.
#[derive(Debug)]
enum Settled {
    Recorded,
    HandedBack(String),
}

impl Settled {
    /// `recorded` when the outcome was recorded, else the hand-back.
    fn outcome(self, recorded: RunOutcome) -> RunOutcome {
        match (self, recorded.workload().cloned()) {
            (Self::HandedBack(reason), Some(workload)) => {
                RunOutcome::HandedBack { workload, reason }
            }
            _ => recorded,
        }
    }
}

pub struct Worker<Q: JobQueue = LocalQueue> {
    queue: Q,
    backend: Arc<Backend>,
    settings: ProfilerSettings,
    /// A claimed job whose outcome and hand-back were both refused: the worker no longer
    /// runs it, so it hands it back before it claims anything else.
    unsettled: std::sync::Mutex<Option<(ClaimedJob, String)>>,
}

impl Worker<LocalQueue> {
    /// The in-process worker of `coloc serve`: jobs from `advisor`'s store, for any GPU
    /// model and the backend's own.
    pub fn new(
        advisor: Arc<Advisor>,
        store: Store,
        backend: Arc<Backend>,
        settings: ProfilerSettings,
    ) -> Self {
        let gpu = backend.gpu().ok().map(|(gpu, _)| gpu);
        Self::with_queue(LocalQueue::new(advisor, store, gpu), backend, settings)
    }
}

impl<Q: JobQueue + Clone> Worker<Q> {
    /// A worker like this one (same queue, backend and settings), nothing unsettled: a
    /// new leader's term starts one.
    pub fn fresh(&self) -> Self {
        Self::with_queue(
            self.queue.clone(),
            self.backend.clone(),
            self.settings.clone(),
        )
    }
}

impl<Q: JobQueue> Worker<Q> {
    pub fn with_queue(queue: Q, backend: Arc<Backend>, settings: ProfilerSettings) -> Self {
        Self {
            queue,
            backend,
            settings,
            unsettled: std::sync::Mutex::new(None),
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(16);
        Duration::from_secs(self.settings.retry_backoff_secs.saturating_mul(factor))
    }

    /// Claims the next ready job, profiles its workload, and records the outcome.
    pub async fn run_once(&self, shutdown: &CancellationToken) -> anyhow::Result<RunOutcome> {
        self.hand_back_unsettled(shutdown).await?;
        let job = match self.queue.claim().await {
            Ok(None) => return Ok(RunOutcome::Idle),
            Ok(Some(job)) => job,
            Err(error) => return Err(anyhow::Error::new(error).context("claiming a job")),
        };
        let outcome = self.handle(job, shutdown).await?;
        self.queue.record(match &outcome {
            RunOutcome::Idle => return Ok(outcome),
            RunOutcome::Profiled { .. } => JobOutcome::Profiled,
            RunOutcome::WillRetry { .. } => JobOutcome::WillRetry,
            RunOutcome::Failed { .. } => JobOutcome::Failed,
            RunOutcome::Waiting { .. } => JobOutcome::Waiting,
            RunOutcome::Cancelled { .. } => JobOutcome::Cancelled,
            RunOutcome::Interrupted { .. } => JobOutcome::Interrupted,
            RunOutcome::LeaseLost { .. } => JobOutcome::LeaseLost,
            RunOutcome::HandedBack { .. } => JobOutcome::Waiting,
        });
        Ok(outcome)
    }

    /// Measures while renewing the lease; a lost lease or a deleted workload stops the
    /// run. Returns the measurement and whether the lease was lost.
    async fn measure(
        &self,
        job: &ClaimedJob,
        cancel: &CancellationToken,
    ) -> (Result<Measurement, ProfileError>, bool) {
        let lost = std::sync::atomic::AtomicBool::new(false);
        let renewing = async {
            let Some(every) = self.queue.renew_every() else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(every).await;
                match self.queue.renew(job, "profiling").await {
                    Ok(()) => {}
                    Err(QueueError::ClaimLost(why)) => {
                        tracing::warn!(%why, "lease lost; stopping the run");
                        lost.store(true, std::sync::atomic::Ordering::Relaxed);
                        cancel.cancel();
                        return std::future::pending().await;
                    }
                    Err(QueueError::WorkloadGone) => {
                        tracing::info!("workload deleted while profiling; stopping the run");
                        cancel.cancel();
                        return std::future::pending().await;
                    }
                    // Renewed again within the lease, a third of it later.
                    Err(error) => tracing::warn!(%error, "lease renewal failed; trying again"),
                }
            }
        };
        let measured = tokio::select! {
            measured = self.backend.profile(&job.workload, job.launch.as_ref(), cancel) => measured,
            never = renewing => never,
        };
        (measured, lost.load(std::sync::atomic::Ordering::Relaxed))
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
        let queue = &self.queue;
        let workload = job.workload.clone();
        tracing::info!("profiling");
        let cancel = queue.watch(&job, shutdown);
        let (measured, lease_lost) = self.measure(&job, &cancel).await;
        queue.unwatch(&job);
        if lease_lost {
            return Ok(RunOutcome::LeaseLost { workload });
        }

        Ok(match measured {
            Ok(measurement) => {
                let stored = self
                    .persist("storing the profile", shutdown, || {
                        queue.complete(&job, &measurement)
                    })
                    .await;
                match stored {
                    Ok(()) => {
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
                    Err(QueueError::WorkloadGone) => RunOutcome::Cancelled { workload },
                    Err(QueueError::ClaimLost(why)) => {
                        tracing::warn!(%why, "the measured profile came too late: the lease was lost");
                        RunOutcome::LeaseLost { workload }
                    }
                    // Stopping while the queue still fails: the job stays RUNNING and goes
                    // back to pending at the next start (or when its lease runs out).
                    Err(error) if shutdown.is_cancelled() => {
                        return Err(anyhow::Error::new(error).context("storing the profile"))
                    }
                    // The profile was refused: the job must not stay claimed.
                    Err(error) => {
                        let error = format!("the measured profile could not be stored: {error}");
                        self.fail_for_good(&job, workload, error, shutdown).await?
                    }
                }
            }
            Err(ProfileError::Cancelled) if shutdown.is_cancelled() => {
                // Stopping: one attempt; a job left RUNNING is re-queued at the next start.
                let settled = self
                    .settle(&job, "releasing the job", shutdown, || {
                        queue.release(
                            &job,
                            "profiling was interrupted by a shutdown; it will run again",
                            Duration::ZERO,
                        )
                    })
                    .await?;
                tracing::info!("interrupted; job re-queued");
                settled.outcome(RunOutcome::Interrupted { workload })
            }
            Err(ProfileError::Cancelled) => {
                tracing::info!("workload deleted while profiling; run stopped");
                RunOutcome::Cancelled { workload }
            }
            Err(ProfileError::Unavailable(reason)) => {
                let wait = Duration::from_millis(self.settings.poll_interval_ms);
                let why = format!("waiting for the profiler: {reason}");
                let settled = self
                    .settle(&job, "releasing the job", shutdown, || {
                        queue.release(&job, &why, wait)
                    })
                    .await?;
                settled.outcome(RunOutcome::Waiting { workload, reason })
            }
            Err(ProfileError::Permanent(error)) => {
                self.fail_for_good(&job, workload, error, shutdown).await?
            }
            Err(ProfileError::Failed(error)) if job.attempts >= self.settings.max_attempts => {
                let error = format!("profiling failed {} times; last: {error}", job.attempts);
                self.fail_for_good(&job, workload, error, shutdown).await?
            }
            Err(ProfileError::Failed(error)) => {
                let backoff = self.backoff(job.attempts);
                let reason = format!(
                    "attempt {} of {} failed ({error}); retrying in {}s",
                    job.attempts,
                    self.settings.max_attempts,
                    backoff.as_secs()
                );
                let settled = self
                    .settle(&job, "scheduling a retry", shutdown, || {
                        queue.retry(&job, &error, &reason, backoff)
                    })
                    .await?;
                tracing::warn!(%error, attempt = job.attempts, "profiling attempt failed");
                settled.outcome(RunOutcome::WillRetry {
                    workload,
                    attempt: job.attempts,
                    error,
                })
            }
        })
    }

    /// Fails the job for good with `error` (handed back instead when the queue refuses).
    async fn fail_for_good(
        &self,
        job: &ClaimedJob,
        workload: WorkloadName,
        error: String,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<RunOutcome> {
        let settled = self
            .settle(job, "failing the job", shutdown, || {
                self.queue.fail(job, &error)
            })
            .await?;
        if matches!(settled, Settled::Recorded) {
            tracing::warn!(%error, "profiling failed for good");
        }
        Ok(settled.outcome(RunOutcome::Failed { workload, error }))
    }

    /// Runs `call` until it succeeds, fails for a reason other than an unavailable queue,
    /// or the holder stops: a claimed job's outcome must reach the queue, or the job would
    /// stay RUNNING with nobody running it. Waits grow from 100 ms to 5 s.
    async fn persist<T, F, Fut>(
        &self,
        what: &str,
        shutdown: &CancellationToken,
        mut call: F,
    ) -> Result<T, QueueError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        let mut wait = Duration::from_millis(100);
        loop {
            match call().await {
                Err(QueueError::Unavailable(error)) if !shutdown.is_cancelled() => {
                    tracing::warn!(
                        %error,
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

    /// [`persist`](Self::persist) for a failure's outcome: a lost claim or a deleted
    /// workload means there is nothing left to record. When the queue refuses the outcome
    /// for another reason than being unavailable, the job is handed back instead (a job
    /// must never stay claimed by a worker that no longer runs it).
    async fn settle<F, Fut>(
        &self,
        job: &ClaimedJob,
        what: &str,
        shutdown: &CancellationToken,
        call: F,
    ) -> anyhow::Result<Settled>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), QueueError>>,
    {
        match self.persist(what, shutdown, call).await {
            Ok(()) | Err(QueueError::WorkloadGone) => Ok(Settled::Recorded),
            Err(QueueError::ClaimLost(why)) => {
                tracing::warn!(%why, "{what}: the lease was lost; nothing to record");
                Ok(Settled::Recorded)
            }
            // Stopping while the queue is unavailable: the job stays RUNNING and goes back
            // to pending at the next start (or when its lease runs out).
            Err(error @ QueueError::Unavailable(_)) => {
                Err(anyhow::Error::new(error).context(what.to_string()))
            }
            Err(refused) => self.hand_back(job, what, &refused, shutdown).await,
        }
    }

    /// Hands back a job whose outcome the queue refused: as a failed attempt first (so
    /// `max_attempts` still ends a job that keeps failing), else uncounted. When even that
    /// is refused, the job is kept as unsettled and handed back before the next claim.
    async fn hand_back(
        &self,
        job: &ClaimedJob,
        what: &str,
        refused: &QueueError,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Settled> {
        tracing::warn!(error = %refused, "{what} was refused; handing the job back");
        let error = format!("{what} was refused: {refused}");
        let reason = format!("{error}; the job is back in the queue");
        let wait = self.backoff(job.attempts.max(1));
        let counted = self
            .persist("handing the job back", shutdown, || {
                self.queue.retry(job, &error, &reason, wait)
            })
            .await;
        let handed_back = match counted {
            Err(QueueError::Refused(_) | QueueError::Other(_)) => {
                self.persist("handing the job back", shutdown, || {
                    self.queue.release(job, &reason, wait)
                })
                .await
            }
            other => other,
        };
        match handed_back {
            Ok(()) | Err(QueueError::WorkloadGone | QueueError::ClaimLost(_)) => {
                Ok(Settled::HandedBack(reason))
            }
            Err(failed) => {
                *self.unsettled.lock().unpoisoned() = Some((job.clone(), reason));
                Err(anyhow::Error::new(failed).context(format!(
                    "{what} was refused ({refused}) and the job could not be handed back; \
                     it is handed back before the next claim"
                )))
            }
        }
    }

    /// Hands back the job a refused outcome left claimed, if any, before a new claim:
    /// the worker claims nothing while it still holds a job it no longer runs.
    async fn hand_back_unsettled(&self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let unsettled = self.unsettled.lock().unpoisoned().take();
        let Some((job, reason)) = unsettled else {
            return Ok(());
        };
        let handed_back = self
            .persist("handing back a job left claimed", shutdown, || {
                self.queue.release(&job, &reason, Duration::ZERO)
            })
            .await;
        match handed_back {
            Ok(()) | Err(QueueError::WorkloadGone | QueueError::ClaimLost(_)) => {
                tracing::info!(workload = %job.workload, job = job.id, "job left claimed handed back");
                Ok(())
            }
            Err(error) => {
                *self.unsettled.lock().unpoisoned() = Some((job, reason));
                Err(anyhow::Error::new(error).context(
                    "a job whose outcome was refused is still claimed; no new claim until it \
                     is handed back",
                ))
            }
        }
    }

    /// Runs jobs until `shutdown`; a running job is stopped and put back to pending.
    pub async fn run(self, shutdown: CancellationToken) {
        let idle = Duration::from_millis(self.settings.poll_interval_ms);
        self.run_with_pause(shutdown, idle).await
    }

    /// [`run`](Self::run), looking for a job every `idle` while there is none.
    pub async fn run_with_pause(self, shutdown: CancellationToken, idle: Duration) {
        tracing::info!(backend = self.backend.name(), "profiling worker started");
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
