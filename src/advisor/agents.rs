//! Profiling agents in domain terms (docs/profiling.md, "Profiling agents"): announcing, claiming a
//! job of the agent's GPU model under a lease, renewing it, submitting the outcome, and
//! routing a new workload's profiling jobs to the GPU models agents serve. A claim's
//! token makes every submission safe to repeat and refuses a holder that lost the job.

use crate::{
    domain::{now_ms, ColocatedMember, GpuName, Observation, Profile},
    store::{
        AgentRecord, ClaimedJob, JobClaimer, NewAgent, ObservationSource, Submitted, WorkloadRecord,
    },
};

use super::{Advisor, Error, JobOutcome, Result};

/// How long leases last and when an agent counts as live (`agents.*` settings).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentPolicy {
    /// A claim's lease without a renewal.
    pub lease_ms: i64,
    /// An agent seen within this long is live: new workloads are routed to its GPU model.
    pub live_ms: i64,
    /// A job whose lease expired on this attempt fails for good (`profiler.max_attempts`).
    pub max_attempts: u32,
}

impl Default for AgentPolicy {
    fn default() -> Self {
        Self {
            lease_ms: 30_000,
            live_ms: 90_000,
            max_attempts: 3,
        }
    }
}

impl AgentPolicy {
    /// How often the service sweeps expired leases on its own: a third of a lease (at
    /// least 100 ms), so a job whose agent died is pending again at most a third of a
    /// lease after its lease ran out.
    pub fn sweep_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.lease_ms / 3).max(100) as u64)
    }
}

/// What an agent says became of an attempt that produced no profile.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentFailure {
    /// The agent cannot run jobs now: the job waits `retry_after_ms`, uncounted.
    Wait { reason: String, retry_after_ms: i64 },
    /// The attempt failed: retry after `retry_after_ms`.
    Retry {
        error: String,
        reason: String,
        retry_after_ms: i64,
    },
    /// The job fails for good.
    Final { error: String },
}

/// An agent as listed, with whether it is live.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    pub record: AgentRecord,
    pub live: bool,
}

impl Advisor {
    pub fn agent_policy(&self) -> &AgentPolicy {
        &self.agent_policy
    }

    pub async fn announce_agent(&self, agent: NewAgent) -> Result<AgentView> {
        let record = self.store.announce_agent(&agent, now_ms()).await?;
        tracing::info!(agent = %record.id, node = %record.node, gpu = %record.gpu, "agent announced");
        Ok(AgentView { record, live: true })
    }

    pub async fn agents(&self) -> Result<Vec<AgentView>> {
        let since = now_ms() - self.agent_policy.live_ms;
        Ok(self
            .store
            .agents()
            .await?
            .into_iter()
            .map(|record| AgentView {
                live: record.last_seen_ms >= since,
                record,
            })
            .collect())
    }

    /// Claims the next job the agent's GPU model can run, under a lease.
    pub async fn claim_for_agent(&self, agent_id: &str) -> Result<Option<ClaimedJob>> {
        let agent = self
            .store
            .agent(agent_id)
            .await?
            .ok_or_else(|| Error::UnknownAgent(agent_id.to_string()))?;
        let gpu = GpuName::parse("gpu", &agent.gpu)
            .map_err(|e| Error::Internal(anyhow::anyhow!("stored agent GPU: {}", e.message)))?;
        Ok(self
            .store
            .claim_job(
                &JobClaimer {
                    holder: agent_id,
                    gpu: Some(&gpu),
                    lease_ms: self.agent_policy.lease_ms,
                    max_attempts: self.agent_policy.max_attempts,
                },
                now_ms(),
            )
            .await?)
    }

    /// Extends the lease of a claim `agent_id` holds; returns its new end (ms).
    pub async fn renew_lease(
        &self,
        agent_id: &str,
        job_id: i64,
        claim: i64,
        progress: &str,
    ) -> Result<i64> {
        let job = self.submitted_job(agent_id, job_id, claim).await?;
        Ok(self
            .store
            .renew_lease(&job, self.agent_policy.lease_ms, progress, now_ms())
            .await?)
    }

    /// Returns jobs whose lease ran out to the queue (or fails them on their last
    /// attempt), without waiting for a claim. Returns how many.
    pub async fn expire_leases(&self) -> Result<u64> {
        let expired = self
            .store
            .expire_leases(self.agent_policy.max_attempts, now_ms())
            .await?;
        if expired > 0 {
            tracing::warn!(
                expired,
                "profiling jobs whose lease ran out were taken back"
            );
        }
        Ok(expired)
    }

    /// The claimed job a renewal or submission of `agent_id` names, as the store knows it.
    async fn submitted_job(&self, agent_id: &str, job_id: i64, claim: i64) -> Result<ClaimedJob> {
        let workload = self
            .store
            .job_workload(job_id)
            .await?
            .ok_or(Error::UnknownJob(job_id))?;
        Ok(ClaimedJob {
            id: job_id,
            claim,
            holder: agent_id.to_string(),
            workload,
            gpu: None,
            attempts: 0,
            launch: None,
            lease_expires_ms: 0,
        })
    }

    /// An agent's measured profile: stored once per claim (a repeat answers `true`, the
    /// duplicate flag, and the workload as it is).
    pub async fn submit_profile(
        &self,
        agent_id: &str,
        job_id: i64,
        claim: i64,
        profile: &Profile,
        note: &str,
    ) -> Result<(WorkloadRecord, bool)> {
        let job = self.submitted_job(agent_id, job_id, claim).await?;
        match self.complete_job(&job, profile, note).await {
            Ok(Submitted::Applied(record)) => {
                self.stats.agent_job(agent_id, JobOutcome::Profiled);
                Ok((record, false))
            }
            Ok(Submitted::Duplicate) => Ok((self.store.workload_of_job(&job).await?, true)),
            Err(error @ Error::ClaimLost { .. }) => {
                self.stats.agent_job(agent_id, JobOutcome::LeaseLost);
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// An agent's failed attempt. Returns true for a repeat of the same claim's outcome.
    pub async fn submit_failure(
        &self,
        agent_id: &str,
        job_id: i64,
        claim: i64,
        failure: AgentFailure,
    ) -> Result<bool> {
        let job = self.submitted_job(agent_id, job_id, claim).await?;
        let now = now_ms();
        let (submitted, outcome) = match &failure {
            AgentFailure::Wait {
                reason,
                retry_after_ms,
            } => (
                self.store
                    .release_job(&job, reason, now + retry_after_ms, now)
                    .await,
                JobOutcome::Waiting,
            ),
            AgentFailure::Retry {
                error,
                reason,
                retry_after_ms,
            } => (
                self.store
                    .retry_job(&job, error, reason, now + retry_after_ms, now)
                    .await,
                JobOutcome::WillRetry,
            ),
            AgentFailure::Final { error } => (
                self.store.fail_job(&job, error, now).await,
                JobOutcome::Failed,
            ),
        };
        match submitted {
            Ok(Submitted::Applied(())) => {
                self.stats.agent_job(agent_id, outcome);
                Ok(false)
            }
            Ok(Submitted::Duplicate) => Ok(true),
            Err(error) => {
                let error = Error::from(error);
                if matches!(error, Error::ClaimLost { .. }) {
                    self.stats.agent_job(agent_id, JobOutcome::LeaseLost);
                }
                Err(error)
            }
        }
    }

    /// A run `coloc calibrate` measured on the agent's GPU: stored once as a `calibrated`
    /// run of the agent's GPU model (as announced). Every member must be profiled there,
    /// so an agent adds training data only for workloads and the GPU model it can run.
    /// Returns the run's id and whether it is new.
    pub async fn submit_calibration(
        &self,
        agent_id: &str,
        members: Vec<ColocatedMember>,
        observed_at_ms: i64,
        sharing_mode: crate::domain::SharingMode,
    ) -> Result<(i64, bool)> {
        let agent = self
            .store
            .agent(agent_id)
            .await?
            .ok_or_else(|| Error::UnknownAgent(agent_id.to_string()))?;
        let gpu = GpuName::parse("gpu", &agent.gpu)
            .map_err(|e| Error::Internal(anyhow::anyhow!("stored agent GPU: {}", e.message)))?;
        let mut observation = Observation::new(gpu.clone(), members, observed_at_ms)?;
        observation.sharing_mode = sharing_mode;
        {
            let catalog = self.read_catalog();
            let table = catalog.gpu(&gpu);
            for member in &observation.members {
                if !catalog.contains(&member.workload) {
                    return Err(Error::UnknownReportedWorkload(
                        member.workload.as_str().to_string(),
                    ));
                }
                if table
                    .as_ref()
                    .and_then(|t| t.get(&member.workload))
                    .is_none()
                {
                    return Err(Error::MemberNotProfiled {
                        workload: member.workload.as_str().to_string(),
                        gpu: gpu.clone(),
                    });
                }
            }
        }
        let stored = self
            .record_run(observation, ObservationSource::Calibrated)
            .await?;
        tracing::info!(agent = agent_id, gpu = %gpu.as_str(), run = stored.0, created = stored.1, "calibrated run stored");
        Ok(stored)
    }

    /// The GPU models a new workload without a profile is profiled on when it names none:
    /// every GPU model with a live agent, else `model.default_gpu`, else none (one job any
    /// profiler may run).
    pub(super) async fn default_profile_gpus(&self) -> Result<Vec<GpuName>> {
        let live = self
            .store
            .live_agent_gpus(now_ms() - self.agent_policy.live_ms)
            .await?;
        if !live.is_empty() {
            return live
                .iter()
                .map(|name| {
                    GpuName::parse("gpu", name).map_err(|e| {
                        Error::Internal(anyhow::anyhow!("stored agent GPU: {}", e.message))
                    })
                })
                .collect();
        }
        Ok(self.default_gpu.iter().cloned().collect())
    }

    /// Why a new workload's jobs wait, when some GPU model it asks for has no live agent
    /// and no in-process worker runs here; `None` when every job has a taker.
    pub(super) async fn unserved_reason(&self, gpus: &[GpuName]) -> Result<Option<String>> {
        let Some(no_profiler) = &self.no_profiler_reason else {
            // The in-process worker takes any GPU model's job it can measure.
            return Ok(None);
        };
        if gpus.is_empty() {
            return Ok(Some(no_profiler.clone()));
        }
        let live = self
            .store
            .live_agent_gpus(now_ms() - self.agent_policy.live_ms)
            .await?;
        let unserved: Vec<&str> = gpus
            .iter()
            .map(GpuName::as_str)
            .filter(|gpu| !live.iter().any(|l| l == gpu))
            .collect();
        Ok((!unserved.is_empty()).then(|| {
            format!(
                "waiting: no agent serves GPU model {} (run `coloc agent` on a node with it); {no_profiler}",
                unserved
                    .iter()
                    .map(|g| format!("{g:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }))
    }
}
