//! The job queue of a profiling agent: `coloc.v1.ProfilingAgents` over gRPC. Statuses
//! become [`QueueError`]s by what the job loop does about them: UNAVAILABLE (or no
//! answer) is tried again, ABORTED is a lost claim, NOT_FOUND a deleted workload (or, on
//! a claim, a server that forgot the agent: it announces itself again).

use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::{metadata::MetadataValue, transport::Channel, Code, Request, Status};

use crate::{
    api::convert,
    domain::{now_ms, GpuName, WorkloadName},
    proto::{self as pb, profiling_agents_client::ProfilingAgentsClient},
    worker::{ClaimedJob, JobOutcome, JobQueue, Measurement, QueueError},
};

pub struct RemoteQueue {
    client: Mutex<ProfilingAgentsClient<Channel>>,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    announcement: pb::AnnounceAgentRequest,
    /// A third of the server's lease.
    renew_every: Duration,
}

fn queue_error(status: Status) -> QueueError {
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::ResourceExhausted => {
            QueueError::Unavailable(status.message().to_string())
        }
        Code::Aborted => QueueError::ClaimLost(status.message().to_string()),
        Code::NotFound => QueueError::WorkloadGone,
        Code::InvalidArgument | Code::FailedPrecondition => {
            QueueError::Refused(status.message().to_string())
        }
        code => QueueError::Other(anyhow::anyhow!("{code:?}: {}", status.message())),
    }
}

impl RemoteQueue {
    /// Announces the agent, trying again (1 s to 30 s apart) until the service answers or
    /// `shutdown`.
    pub async fn connect(
        channel: Channel,
        token: Option<String>,
        announcement: pb::AnnounceAgentRequest,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        let authorization = match token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("COLOC_TOKEN is not a valid header value"))?,
            ),
            None => None,
        };
        let mut queue = Self {
            client: Mutex::new(ProfilingAgentsClient::new(channel)),
            authorization,
            announcement,
            renew_every: Duration::from_secs(10),
        };
        let mut wait = Duration::from_secs(1);
        loop {
            match queue.announce().await {
                Ok(lease_secs) => {
                    queue.renew_every =
                        Duration::from_millis(u64::from(lease_secs.max(1)) * 1000 / 3);
                    return Ok(queue);
                }
                Err(QueueError::Unavailable(error)) => {
                    tracing::warn!(%error, retry_in_secs = wait.as_secs(), "cannot announce the agent; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => anyhow::bail!("stopped before the agent could announce itself"),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(Duration::from_secs(30));
                }
                Err(error) => return Err(anyhow::Error::new(error).context("announcing the agent")),
            }
        }
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request
    }

    async fn announce(&self) -> Result<u32, QueueError> {
        let request = self.request(self.announcement.clone());
        let answer = self
            .client
            .lock()
            .await
            .announce_agent(request)
            .await
            .map_err(queue_error)?;
        Ok(answer.into_inner().lease_secs)
    }

    fn agent_id(&self) -> String {
        self.announcement.agent_id.clone()
    }
}

fn claimed(agent_id: &str, job: pb::ProfilingJob) -> Result<ClaimedJob, QueueError> {
    let refused = |what: String| QueueError::Other(anyhow::anyhow!("the service sent {what}"));
    Ok(ClaimedJob {
        id: i64::try_from(job.job_id).map_err(|_| refused("an odd job id".into()))?,
        claim: i64::try_from(job.claim).map_err(|_| refused("an odd claim".into()))?,
        holder: agent_id.to_string(),
        workload: WorkloadName::parse("workload", &job.workload).map_err(|e| refused(e.message))?,
        gpu: if job.gpu.is_empty() {
            None
        } else {
            Some(GpuName::parse("gpu", &job.gpu).map_err(|e| refused(e.message))?)
        },
        attempts: job.attempt,
        launch: job
            .launch
            .map(convert::launch_spec)
            .transpose()
            .map_err(|e| refused(e.message))?,
        lease_expires_ms: job
            .lease_expires_at
            .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000),
    })
}

#[tonic::async_trait]
impl JobQueue for RemoteQueue {
    async fn claim(&self) -> Result<Option<ClaimedJob>, QueueError> {
        let ask = || {
            self.request(pb::ClaimProfilingJobRequest {
                agent_id: self.agent_id(),
            })
        };
        let answer = self.client.lock().await.claim_profiling_job(ask()).await;
        let answer = match answer {
            // The service forgot the agent (a new database): announce again, then claim.
            Err(status) if status.code() == Code::NotFound => {
                self.announce().await?;
                self.client.lock().await.claim_profiling_job(ask()).await
            }
            other => other,
        };
        answer
            .map_err(queue_error)?
            .into_inner()
            .job
            .map(|job| claimed(&self.announcement.agent_id, job))
            .transpose()
    }

    fn renew_every(&self) -> Option<Duration> {
        Some(self.renew_every)
    }

    async fn renew(&self, job: &ClaimedJob, progress: &str) -> Result<(), QueueError> {
        let request = self.request(pb::RenewLeaseRequest {
            agent_id: self.agent_id(),
            job_id: job.id as u64,
            claim: job.claim as u64,
            progress: progress.to_string(),
        });
        self.client
            .lock()
            .await
            .renew_lease(request)
            .await
            .map_err(queue_error)?;
        Ok(())
    }

    async fn complete(&self, job: &ClaimedJob, measured: &Measurement) -> Result<(), QueueError> {
        let request = self.request(pb::SubmitProfileRequest {
            agent_id: self.agent_id(),
            job_id: job.id as u64,
            claim: job.claim as u64,
            profile: Some(convert::profile_to_pb(&measured.profile)),
            note: measured.note.clone(),
        });
        let answer = self
            .client
            .lock()
            .await
            .submit_profile(request)
            .await
            .map_err(queue_error)?;
        if answer.into_inner().duplicate {
            tracing::info!("the service had this profile already (a retried submission)");
        }
        Ok(())
    }

    async fn release(
        &self,
        job: &ClaimedJob,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError> {
        self.failure(job, pb::JobFailureKind::Wait, "", reason, wait)
            .await
    }

    async fn retry(
        &self,
        job: &ClaimedJob,
        error: &str,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError> {
        self.failure(job, pb::JobFailureKind::Retry, error, reason, wait)
            .await
    }

    async fn fail(&self, job: &ClaimedJob, error: &str) -> Result<(), QueueError> {
        self.failure(job, pb::JobFailureKind::Final, error, "", Duration::ZERO)
            .await
    }

    fn watch(&self, _job: &ClaimedJob, parent: &CancellationToken) -> CancellationToken {
        // A deleted workload shows as NOT_FOUND on the next renewal.
        parent.child_token()
    }

    fn unwatch(&self, _job: &ClaimedJob) {}

    fn record(&self, outcome: JobOutcome) {
        // The service counts what agents submit; the agent logs it.
        tracing::info!(outcome = outcome.as_str(), at_ms = now_ms(), "job done");
    }
}

impl RemoteQueue {
    async fn failure(
        &self,
        job: &ClaimedJob,
        kind: pb::JobFailureKind,
        error: &str,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError> {
        let cut = |text: &str| text.chars().take(4096).collect::<String>();
        let request = self.request(pb::SubmitFailureRequest {
            agent_id: self.agent_id(),
            job_id: job.id as u64,
            claim: job.claim as u64,
            kind: kind as i32,
            error: cut(error),
            reason: cut(reason),
            retry_after_ms: wait.as_millis().min(86_400_000) as u64,
        });
        self.client
            .lock()
            .await
            .submit_failure(request)
            .await
            .map_err(queue_error)?;
        Ok(())
    }
}
