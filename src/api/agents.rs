//! The gRPC face of profiling agents: `coloc.v1.ProfilingAgents`. Handlers convert the
//! request into domain values, call the advisor, and convert the answer back; the claim
//! and lease rules live in the advisor and the store. ReportPodDevices hands a node's
//! PodResources snapshot to the one cluster view.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::convert;
use crate::{
    advisor::{Advisor, AgentFailure, AgentView},
    domain::{now_ms, GpuName, ValidationError},
    proto::{self as pb, profiling_agents_server::ProfilingAgents},
    store::{ClaimedJob, NewAgent, IN_PROCESS_HOLDER},
};

pub use pb::profiling_agents_server::ProfilingAgentsServer;

/// Free text an agent sends (node, ncu version, progress) is kept to this many characters.
const MAX_SHORT_TEXT: usize = 256;
/// Errors and reasons are kept to this many characters.
const MAX_LONG_TEXT: usize = 4096;

pub struct AgentsService {
    advisor: Arc<Advisor>,
}

impl AgentsService {
    pub fn new(advisor: Arc<Advisor>) -> Self {
        Self { advisor }
    }
}

/// An agent id: like a workload name (letters, digits and . _ - : / +, 1 to 128), and
/// not the in-process worker's holder name, whose claims no agent may touch.
fn agent_id(raw: &str) -> Result<String, ValidationError> {
    if raw == IN_PROCESS_HOLDER {
        return Err(ValidationError::new(
            "agent_id",
            format!("agent_id {IN_PROCESS_HOLDER:?} is reserved for the in-process worker"),
        ));
    }
    convert::workload_name("agent_id", raw)
        .map(|name| name.as_str().to_string())
        .map_err(|e| ValidationError::new("agent_id", e.message.replace("name", "agent_id")))
}

fn text(field: &str, raw: String, max: usize) -> Result<String, ValidationError> {
    if raw.chars().count() > max || raw.chars().any(|c| c.is_control() && c != '\n') {
        return Err(ValidationError::new(
            field,
            format!("{field} must be at most {max} characters, without control characters"),
        ));
    }
    Ok(raw)
}

fn job_ref(job_id: u64, claim: u64) -> Result<(i64, i64), ValidationError> {
    let job_id = i64::try_from(job_id)
        .ok()
        .filter(|&id| id > 0)
        .ok_or_else(|| ValidationError::new("job_id", "job_id must name a claimed job"))?;
    let claim = i64::try_from(claim)
        .ok()
        .filter(|&c| c > 0)
        .ok_or_else(|| ValidationError::new("claim", "claim must be the claim's token"))?;
    Ok((job_id, claim))
}

fn agent_to_pb(view: AgentView) -> pb::Agent {
    let record = view.record;
    pb::Agent {
        agent_id: record.id,
        node: record.node,
        gpu: record.gpu,
        gpu_memory_gb: record.gpu_memory_gb,
        ncu_version: record.ncu_version,
        backend: record.backend,
        announced_at: Some(convert::timestamp(record.announced_at_ms)),
        last_seen: Some(convert::timestamp(record.last_seen_ms)),
        live: view.live,
        job_id: record.job_id.map_or(0, |id| id as u64),
        job_workload: record.job_workload.unwrap_or_default(),
    }
}

fn job_to_pb(job: ClaimedJob) -> pb::ProfilingJob {
    pb::ProfilingJob {
        job_id: job.id as u64,
        claim: job.claim as u64,
        workload: job.workload.to_string(),
        gpu: job.gpu.map(|g| g.as_str().to_string()).unwrap_or_default(),
        attempt: job.attempts,
        launch: job.launch.map(convert::launch_spec_to_pb),
        lease_expires_at: Some(convert::timestamp(job.lease_expires_ms)),
    }
}

#[tonic::async_trait]
impl ProfilingAgents for AgentsService {
    async fn announce_agent(
        &self,
        request: Request<pb::AnnounceAgentRequest>,
    ) -> Result<Response<pb::AnnounceAgentResponse>, Status> {
        let raw = request.into_inner();
        let agent = (|| -> Result<_, ValidationError> {
            let gpu_memory_gb = raw.gpu_memory_gb;
            if !(gpu_memory_gb > 0.0 && gpu_memory_gb <= 1024.0) {
                return Err(ValidationError::new(
                    "gpu_memory_gb",
                    format!("gpu_memory_gb must be above 0 and at most 1024, got {gpu_memory_gb}"),
                ));
            }
            Ok(NewAgent {
                id: agent_id(&raw.agent_id)?,
                node: text("node", raw.node, MAX_SHORT_TEXT)?,
                gpu: GpuName::parse("gpu", &raw.gpu)?,
                gpu_memory_gb,
                ncu_version: text("ncu_version", raw.ncu_version, MAX_SHORT_TEXT)?,
                backend: text("backend", raw.backend, 32)?,
            })
        })()?;
        let view = self.advisor.announce_agent(agent).await?;
        Ok(Response::new(pb::AnnounceAgentResponse {
            agent: Some(agent_to_pb(view)),
            lease_secs: (self.advisor.agent_policy().lease_ms / 1000) as u32,
        }))
    }

    async fn claim_profiling_job(
        &self,
        request: Request<pb::ClaimProfilingJobRequest>,
    ) -> Result<Response<pb::ClaimProfilingJobResponse>, Status> {
        let id = agent_id(&request.into_inner().agent_id)?;
        let job = self.advisor.claim_for_agent(&id).await?;
        Ok(Response::new(pb::ClaimProfilingJobResponse {
            job: job.map(job_to_pb),
        }))
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let raw = request.into_inner();
        let (id, job_id, claim, progress) = (|| -> Result<_, ValidationError> {
            let id = agent_id(&raw.agent_id)?;
            let (job_id, claim) = job_ref(raw.job_id, raw.claim)?;
            Ok((
                id,
                job_id,
                claim,
                text("progress", raw.progress, MAX_SHORT_TEXT)?,
            ))
        })()?;
        let expires = self
            .advisor
            .renew_lease(&id, job_id, claim, &progress)
            .await?;
        Ok(Response::new(pb::RenewLeaseResponse {
            lease_expires_at: Some(convert::timestamp(expires)),
        }))
    }

    async fn submit_profile(
        &self,
        request: Request<pb::SubmitProfileRequest>,
    ) -> Result<Response<pb::SubmitProfileResponse>, Status> {
        let raw = request.into_inner();
        let (id, job_id, claim, profile, note) = (|| -> Result<_, ValidationError> {
            let id = agent_id(&raw.agent_id)?;
            let (job_id, claim) = job_ref(raw.job_id, raw.claim)?;
            let profile = convert::profile(raw.profile, now_ms())?;
            let note = text("note", raw.note, MAX_LONG_TEXT)?;
            Ok((id, job_id, claim, profile, note))
        })()?;
        let (record, duplicate) = self
            .advisor
            .submit_profile(&id, job_id, claim, &profile, &note)
            .await?;
        Ok(Response::new(pb::SubmitProfileResponse {
            workload: Some(convert::workload_to_pb(record)),
            duplicate,
        }))
    }

    async fn submit_failure(
        &self,
        request: Request<pb::SubmitFailureRequest>,
    ) -> Result<Response<pb::SubmitFailureResponse>, Status> {
        let raw = request.into_inner();
        let (id, job_id, claim, failure) = (|| -> Result<_, ValidationError> {
            let id = agent_id(&raw.agent_id)?;
            let (job_id, claim) = job_ref(raw.job_id, raw.claim)?;
            let error = text("error", raw.error, MAX_LONG_TEXT)?;
            let reason = text("reason", raw.reason, MAX_LONG_TEXT)?;
            // A day at most: a longer wait is a mistake, not a policy.
            let retry_after_ms = i64::try_from(raw.retry_after_ms)
                .ok()
                .filter(|&ms| ms <= 86_400_000)
                .ok_or_else(|| {
                    ValidationError::new("retry_after_ms", "retry_after_ms must be at most a day")
                })?;
            let failure = match pb::JobFailureKind::try_from(raw.kind) {
                Ok(pb::JobFailureKind::Wait) => AgentFailure::Wait {
                    reason,
                    retry_after_ms,
                },
                Ok(pb::JobFailureKind::Retry) => AgentFailure::Retry {
                    error,
                    reason,
                    retry_after_ms,
                },
                Ok(pb::JobFailureKind::Final) => AgentFailure::Final { error },
                _ => {
                    return Err(ValidationError::new(
                        "kind",
                        "kind must be WAIT, RETRY or FINAL",
                    ))
                }
            };
            Ok((id, job_id, claim, failure))
        })()?;
        let duplicate = self
            .advisor
            .submit_failure(&id, job_id, claim, failure)
            .await?;
        Ok(Response::new(pb::SubmitFailureResponse { duplicate }))
    }

    async fn submit_calibration(
        &self,
        request: Request<pb::SubmitCalibrationRequest>,
    ) -> Result<Response<pb::SubmitCalibrationResponse>, Status> {
        let raw = request.into_inner();
        let id = agent_id(&raw.agent_id)?;
        let mode = super::sharing::sharing_mode(raw.sharing_mode)?.unwrap_or_default();
        let (members, observed_at_ms) = convert::calibration(raw, now_ms())?;
        let (id, created) = self
            .advisor
            .submit_calibration(&id, members, observed_at_ms, mode)
            .await?;
        Ok(Response::new(pb::SubmitCalibrationResponse {
            observation_id: id as u64,
            created,
        }))
    }

    async fn report_pod_devices(
        &self,
        request: Request<pb::ReportPodDevicesRequest>,
    ) -> Result<Response<pb::ReportPodDevicesResponse>, Status> {
        let raw = request.into_inner();
        let node = text("node", raw.node, MAX_SHORT_TEXT)?;
        if node.trim().is_empty() {
            return Err(ValidationError::new("node", "node is required").into());
        }
        let pods = super::cluster::pod_devices(raw.pods)?;
        let (pods, gpus) = self.advisor.report_pod_devices(&node, pods);
        tracing::debug!(agent = %raw.agent_id, %node, pods, gpus, "pod devices reported");
        Ok(Response::new(pb::ReportPodDevicesResponse {
            pods: pods as u32,
            gpus: gpus as u32,
        }))
    }

    async fn list_agents(
        &self,
        _request: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let agents = self.advisor.agents().await?;
        Ok(Response::new(pb::ListAgentsResponse {
            agents: agents.into_iter().map(agent_to_pb).collect(),
        }))
    }
}
