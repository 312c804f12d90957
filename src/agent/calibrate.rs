//! `coloc calibrate` through the service: this node's GPU runs pairs of workloads together
//! and the service stores what they achieved as `calibrated` runs of this GPU model. It
//! speaks the agents' API only, with an agent's token: it announces itself as an agent
//! (so the service knows its GPU model), reads the workloads through ListWorkloads (an
//! agent may read) and submits each pair with SubmitCalibration, which stores it on the
//! GPU model the agent announced, only for workloads profiled there.

use std::time::Duration;

use anyhow::Context;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic::{metadata::MetadataValue, transport::Channel, Code, Request};

use super::AgentIdentity;
use crate::{
    api::convert,
    domain::{GpuName, LaunchSpec, Observation, WorkloadName},
    profiler::{
        self,
        calibrate::{CalibrationSummary, CalibrationTarget},
        Backend,
    },
    proto::{
        self as pb, colocation_advisor_client::ColocationAdvisorClient,
        profiling_agents_client::ProfilingAgentsClient,
    },
    settings::{ProfilerBackend, ProfilerSettings},
};

/// How often a submission is tried while the service is unavailable, and the first wait.
const SUBMIT_TRIES: u32 = 8;
const FIRST_WAIT: Duration = Duration::from_millis(100);

/// The service as calibration's target, for one announced agent.
pub struct ServiceTarget {
    agents: Mutex<ProfilingAgentsClient<Channel>>,
    advisor: Mutex<ColocationAdvisorClient<Channel>>,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    agent_id: String,
}

impl ServiceTarget {
    pub fn new(channel: Channel, token: Option<String>, agent_id: String) -> anyhow::Result<Self> {
        let authorization = match token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("COLOC_TOKEN is not a valid header value"))?,
            ),
            None => None,
        };
        Ok(Self {
            agents: Mutex::new(ProfilingAgentsClient::new(channel.clone())),
            advisor: Mutex::new(ColocationAdvisorClient::new(channel)),
            authorization,
            agent_id,
        })
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

    /// Announces the agent: the service learns this node's GPU model, on which it stores
    /// the pairs.
    pub async fn announce(&self, announcement: pb::AnnounceAgentRequest) -> anyhow::Result<()> {
        let request = self.request(announcement);
        self.agents
            .lock()
            .await
            .announce_agent(request)
            .await
            .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))
            .context("announcing the agent")?;
        Ok(())
    }
}

#[tonic::async_trait]
impl CalibrationTarget for ServiceTarget {
    async fn workloads(&self, gpu: &GpuName) -> anyhow::Result<Vec<(WorkloadName, LaunchSpec)>> {
        let mut found = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = self.request(pb::ListWorkloadsRequest {
                page_size: 1000,
                page_token: page_token.clone(),
                state: pb::WorkloadState::Unspecified as i32,
            });
            let page = self
                .advisor
                .lock()
                .await
                .list_workloads(request)
                .await
                .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))
                .context("listing the workloads")?
                .into_inner();
            for workload in page.workloads {
                let profiled_here = workload
                    .profiles
                    .iter()
                    .any(|p| p.gpu == gpu.as_str() && !p.kernel_missing);
                let Some(launch) = workload.launch.filter(|_| profiled_here) else {
                    continue;
                };
                let name = WorkloadName::parse("name", &workload.name)
                    .map_err(|e| anyhow::anyhow!("the service sent {}", e.message))?;
                let launch = convert::launch_spec(launch)
                    .map_err(|e| anyhow::anyhow!("the service sent {}", e.message))?;
                found.push((name, launch));
            }
            if page.next_page_token.is_empty() {
                return Ok(found);
            }
            page_token = page.next_page_token;
        }
    }

    async fn store(&self, run: &Observation) -> anyhow::Result<Option<String>> {
        let message = pb::SubmitCalibrationRequest {
            agent_id: self.agent_id.clone(),
            members: run
                .members
                .iter()
                .map(|m| pb::ColocatedMember {
                    workload: m.workload.to_string(),
                    throughput: m.throughput,
                    job_id: m.job_id.clone(),
                })
                .collect(),
            // The same time on every try: a retried submission is stored once.
            observed_at: Some(convert::timestamp(run.observed_at_ms)),
            sharing_mode: Some(crate::api::sharing_mode_to_pb(run.sharing_mode) as i32),
        };
        let mut wait = FIRST_WAIT;
        for attempt in 1..=SUBMIT_TRIES {
            let request = self.request(message.clone());
            let answer = self.agents.lock().await.submit_calibration(request).await;
            match answer {
                Ok(_) => return Ok(None),
                Err(status)
                    if matches!(
                        status.code(),
                        Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument
                    ) =>
                {
                    return Ok(Some(status.message().to_string()))
                }
                Err(status)
                    if attempt < SUBMIT_TRIES
                        && matches!(status.code(), Code::Unavailable | Code::Unknown) =>
                {
                    tracing::warn!(
                        error = status.message(),
                        retry_in_ms = wait.as_millis() as u64,
                        "submitting a pair failed; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(status) => {
                    return Err(anyhow::anyhow!("{:?}: {}", status.code(), status.message()))
                }
            }
        }
        unreachable!("the last try returns")
    }
}

/// Runs `coloc calibrate` on this node: announces it as the agent `identity` (its GPU
/// model from NVML, or from `profiler.nvml_recording`), runs the pairs of `plan` of the
/// workloads profiled on that GPU model, and submits each one.
pub async fn run(
    channel: Channel,
    token: Option<String>,
    identity: AgentIdentity,
    settings: ProfilerSettings,
    plan: &profiler::calibrate::Plan,
    cancel: &CancellationToken,
) -> anyhow::Result<CalibrationSummary> {
    // Calibration runs workloads on the GPU, whatever backend the agent profiles with.
    let settings = ProfilerSettings {
        backend: ProfilerBackend::Nvml,
        ..settings
    };
    let backend = Backend::from_settings(&settings).context("cannot set up the profiler")?;
    let (gpu, announcement) = super::announcement(&identity, &backend, &settings)
        .await
        .context("calibrate runs workloads on a GPU")?;
    let target = ServiceTarget::new(channel, token, identity.id.clone())?;
    target.announce(announcement).await?;
    tracing::info!(agent = %identity.id, gpu = %gpu.as_str(), "announced; calibrating");
    profiler::calibrate::calibrate(&target, &gpu, &settings, plan, cancel).await
}
