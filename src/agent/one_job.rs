//! `coloc profile-job`: the measuring step inside a Kubernetes Job's pod
//! (`profiler.dispatch = "kubernetes-jobs"`). The service already claimed the job; the pod
//! measures the workload's command (this container's program, in its own image) with the
//! nvml backend — Nsight Compute where the image or node has it, else an NVML-only profile
//! with a note — and reports through the agents' API under that claim, with the same job
//! loop as an agent ([`crate::worker::Worker`]) over a queue that holds this one job.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{announcement, AgentIdentity, RemoteQueue};
use crate::{
    domain::{LaunchSpec, WorkloadName},
    profiler::Backend,
    settings::ProfilerSettings,
    sync::Unpoisoned,
    worker::{ClaimedJob, JobOutcome, JobQueue, Measurement, QueueError, RunOutcome, Worker},
};

/// The claim the service handed to this pod.
#[derive(Debug, Clone)]
pub struct HandedClaim {
    pub job_id: i64,
    pub claim: i64,
    pub attempt: u32,
    pub workload: WorkloadName,
}

/// The launch spec of the container's command: its program and arguments, the container's
/// environment (coloc's own variables left out), its working directory.
pub fn container_launch(command: &[String]) -> anyhow::Result<LaunchSpec> {
    let (program, args) = command
        .split_first()
        .context("no command to profile after `--`")?;
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(name, _)| {
            !name.starts_with("COLOC") && name != "NODE_NAME" && name != "CUDA_VISIBLE_DEVICES"
        })
        .collect();
    Ok(LaunchSpec {
        program: program.clone(),
        args: args.to_vec(),
        env,
        working_dir: None,
        timeout_secs: None,
        throughput_regex: None,
        nvtx_range: None,
        image: None,
    })
}

/// A queue of the one job the service claimed for this pod; the rest is the agents' API.
struct OneJob {
    remote: RemoteQueue,
    job: std::sync::Mutex<Option<ClaimedJob>>,
}

#[tonic::async_trait]
impl JobQueue for OneJob {
    async fn claim(&self) -> Result<Option<ClaimedJob>, QueueError> {
        Ok(self.job.lock().unpoisoned().take())
    }
    fn renew_every(&self) -> Option<Duration> {
        self.remote.renew_every()
    }
    async fn renew(&self, job: &ClaimedJob, progress: &str) -> Result<(), QueueError> {
        self.remote.renew(job, progress).await
    }
    async fn complete(&self, job: &ClaimedJob, measured: &Measurement) -> Result<(), QueueError> {
        self.remote.complete(job, measured).await
    }
    async fn release(&self, job: &ClaimedJob, why: &str, wait: Duration) -> Result<(), QueueError> {
        self.remote.release(job, why, wait).await
    }
    async fn retry(
        &self,
        job: &ClaimedJob,
        error: &str,
        reason: &str,
        wait: Duration,
    ) -> Result<(), QueueError> {
        self.remote.retry(job, error, reason, wait).await
    }
    async fn fail(&self, job: &ClaimedJob, error: &str) -> Result<(), QueueError> {
        self.remote.fail(job, error).await
    }
    fn watch(&self, job: &ClaimedJob, parent: &CancellationToken) -> CancellationToken {
        self.remote.watch(job, parent)
    }
    fn unwatch(&self, job: &ClaimedJob) {
        self.remote.unwatch(job)
    }
    fn record(&self, outcome: JobOutcome) {
        self.remote.record(outcome)
    }
}

/// Measures `launch` for the claim and reports the outcome through the agents' API.
pub async fn run(
    channel: tonic::transport::Channel,
    token: Option<String>,
    identity: AgentIdentity,
    settings: ProfilerSettings,
    handed: HandedClaim,
    launch: LaunchSpec,
    shutdown: CancellationToken,
) -> anyhow::Result<RunOutcome> {
    let backend = Backend::from_settings(&settings).context("cannot set up the profiler")?;
    let (_, announced) = announcement(&identity, &backend, &settings)
        .await
        .context("cannot tell this node's GPU model")?;
    let remote = RemoteQueue::connect(channel, token, announced, &shutdown).await?;
    let job = ClaimedJob {
        id: handed.job_id,
        claim: handed.claim,
        holder: identity.id.clone(),
        workload: handed.workload,
        gpu: None,
        attempts: handed.attempt,
        launch: Some(launch),
        lease_expires_ms: 0,
    };
    let queue = OneJob {
        remote,
        job: std::sync::Mutex::new(Some(job)),
    };
    Worker::with_queue(queue, Arc::new(backend), settings)
        .run_once(&shutdown)
        .await
}
