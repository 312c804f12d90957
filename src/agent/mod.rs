//! `coloc agent`: a profiling agent on a GPU node, next to (not inside) the service. It
//! announces itself (id, node, GPU model and memory from its backend, ncu version), then
//! runs the same job loop as the in-process worker ([`crate::worker::Worker`]) over a
//! gRPC job queue ([`RemoteQueue`]): claim a job of its GPU model, measure it alone while
//! renewing the lease, submit the profile or the failure. The service keeps the queue and
//! decides; the agent only measures. `coloc calibrate` ([`calibrate`]) speaks the same
//! API from a GPU node, to give its GPU model training data; `coloc profile-job`
//! ([`one_job`]) measures one job the service claimed, inside a Kubernetes Job's pod.
//! Beside its job loop the agent reports where its node's pods run, from the kubelet's
//! PodResources API ([`pod_resources`]), unless `agents.pod_resources_socket` is empty.

pub mod calibrate;
pub mod one_job;
pub mod pod_resources;
mod remote;

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

pub use remote::RemoteQueue;

use crate::{
    domain::GpuName,
    profiler::{self, Backend},
    proto as pb,
    settings::{AgentsSettings, ProfilerBackend, ProfilerSettings},
    worker::Worker,
};

/// Who the agent is.
#[derive(Debug, Clone)]
pub struct AgentIdentity {
    pub id: String,
    pub node: String,
}

/// What `identity` announces on this node: its GPU model and memory from `backend`, and
/// the Nsight Compute version when it measures with NVML. Returns the GPU model too.
pub(crate) async fn announcement(
    identity: &AgentIdentity,
    backend: &Backend,
    settings: &ProfilerSettings,
) -> anyhow::Result<(GpuName, pb::AnnounceAgentRequest)> {
    let (gpu, gpu_memory_gb) = backend.gpu().map_err(|e| anyhow::anyhow!(e))?;
    let ncu_version = match settings.backend {
        ProfilerBackend::Nvml => profiler::ncu_version(&settings.ncu_path).await,
        _ => String::new(),
    };
    let request = pb::AnnounceAgentRequest {
        agent_id: identity.id.clone(),
        node: identity.node.clone(),
        gpu: gpu.as_str().to_string(),
        gpu_memory_gb,
        ncu_version,
        backend: backend.name().to_string(),
    };
    Ok((gpu, request))
}

/// Runs the agent until `shutdown`: a running job is stopped and handed back (released)
/// before it returns.
pub async fn run(
    channel: tonic::transport::Channel,
    token: Option<String>,
    identity: AgentIdentity,
    settings: ProfilerSettings,
    agents: AgentsSettings,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if settings.backend == ProfilerBackend::Off {
        anyhow::bail!(
            "setting profiler.backend is \"off\": an agent measures with \"nvml\" (or \"replay\")"
        );
    }
    let backend = Backend::from_settings(&settings).context("cannot set up the profiler")?;
    let (gpu, announcement) = announcement(&identity, &backend, &settings)
        .await
        .context("cannot tell this node's GPU model")?;
    let reporter = if agents.pod_resources_socket.is_empty() {
        None
    } else {
        Some(pod_resources::PodDevicesReporter::new(
            channel.clone(),
            token.as_deref(),
            identity.id.clone(),
            identity.node.clone(),
            &agents,
        )?)
    };
    let queue = RemoteQueue::connect(channel, token, announcement, &shutdown).await?;
    tracing::info!(agent = %identity.id, node = %identity.node, gpu = %gpu.as_str(), "agent announced; claiming jobs");
    let poll = Duration::from_millis(settings.poll_interval_ms);
    let reporting = async {
        if let Some(reporter) = reporter {
            reporter.run(shutdown.clone()).await;
        }
    };
    let working = Worker::with_queue(queue, Arc::new(backend), settings)
        .run_with_pause(shutdown.clone(), poll);
    tokio::join!(working, reporting);
    Ok(())
}
