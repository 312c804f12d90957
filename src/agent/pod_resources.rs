//! Where this node's pods really run: `coloc agent` calls the kubelet's PodResources API
//! (`v1.PodResourcesLister/List` on `agents.pod_resources_socket`, a Unix socket) and
//! reports each pod's GPU UUIDs to the service (ReportPodDevices), a full snapshot of the
//! node every `agents.pod_devices_interval_secs`: a pod that left is gone from the next
//! report. The devices taken are those of `agents.gpu_resources`: NVIDIA's device plugin
//! names whole GPUs by UUID under `nvidia.com/gpu` (`nvidia.com/gpu.shared` when it
//! renames shared GPUs), and under time-slicing or MPS each replica as `UUID::N`
//! (`NewAnnotatedID` in its `internal/rm/devices.go`), which is cut back to the UUID;
//! HAMi's device plugin registers `nvidia.com/gpu` too. A List that fails sends nothing
//! (an empty snapshot would release every pod of the node); the service then keeps the
//! last report until it goes stale.

use std::{path::PathBuf, time::Duration};

use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{Channel, Endpoint, Uri},
    Request,
};

use crate::proto::{
    self as pb,
    podresources::{
        pod_resources_lister_client::PodResourcesListerClient, ListPodResourcesRequest,
    },
    profiling_agents_client::ProfilingAgentsClient,
};

/// The kubelet's own client takes answers up to this size (`defaultPodResourcesMaxSize`).
const MAX_LIST_BYTES: usize = 16 * 1024 * 1024;
/// How long one List may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("cannot reach the kubelet's PodResources socket {path}: {source}")]
    Connect {
        path: String,
        source: tonic::transport::Error,
    },
    #[error("the kubelet's PodResources List failed: {0}")]
    List(tonic::Status),
    #[error("the service refused the pod devices report: {0}")]
    Report(tonic::Status),
}

/// The GPUs each pod holds in a List answer: devices of `resources`, replica suffixes
/// cut, each UUID once per pod; pods without any are left out.
pub fn pod_gpus(
    answer: &pb::podresources::ListPodResourcesResponse,
    resources: &[String],
) -> Vec<pb::PodDevices> {
    let mut pods = Vec::new();
    for pod in &answer.pod_resources {
        let mut gpu_ids: Vec<String> = Vec::new();
        let devices = pod.containers.iter().flat_map(|c| &c.devices);
        for device in devices.filter(|d| resources.contains(&d.resource_name)) {
            for id in &device.device_ids {
                let uuid = id.split_once("::").map_or(id.as_str(), |(uuid, _)| uuid);
                if !uuid.is_empty() && !gpu_ids.iter().any(|known| known == uuid) {
                    gpu_ids.push(uuid.to_string());
                }
            }
        }
        if !gpu_ids.is_empty() {
            pods.push(pb::PodDevices {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                gpu_ids,
            });
        }
    }
    pods
}

/// Calls List on the kubelet's socket once.
pub async fn list(
    socket: &std::path::Path,
) -> Result<pb::podresources::ListPodResourcesResponse, PodResourcesError> {
    let path = socket.to_path_buf();
    // The URI is unused: the connector always dials the socket.
    let channel = Endpoint::from_static("http://[::]:0")
        .timeout(LIST_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|source| PodResourcesError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let mut client =
        PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_LIST_BYTES);
    Ok(client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(PodResourcesError::List)?
        .into_inner())
}

/// Reports the node's pods and GPUs to the service, periodically.
pub struct PodDevicesReporter {
    pub socket: PathBuf,
    pub resources: Vec<String>,
    pub agent_id: String,
    pub node: String,
    pub interval: Duration,
    client: ProfilingAgentsClient<Channel>,
    authorization: Option<MetadataValue<Ascii>>,
}

impl PodDevicesReporter {
    pub fn new(
        channel: Channel,
        token: Option<&str>,
        agent_id: String,
        node: String,
        settings: &crate::settings::AgentsSettings,
    ) -> anyhow::Result<Self> {
        let authorization = match token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("COLOC_TOKEN is not a valid header value"))?,
            ),
            None => None,
        };
        Ok(Self {
            socket: PathBuf::from(&settings.pod_resources_socket),
            resources: settings.gpu_resources.clone(),
            agent_id,
            node,
            interval: Duration::from_secs(settings.pod_devices_interval_secs),
            client: ProfilingAgentsClient::new(channel),
            authorization,
        })
    }

    /// Lists the node's pods once and reports them; the service's answer (pods, GPUs).
    pub async fn report_once(&self) -> Result<pb::ReportPodDevicesResponse, PodResourcesError> {
        let answer = list(&self.socket).await?;
        let mut request = Request::new(pb::ReportPodDevicesRequest {
            agent_id: self.agent_id.clone(),
            node: self.node.clone(),
            pods: pod_gpus(&answer, &self.resources),
        });
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(self
            .client
            .clone()
            .report_pod_devices(request)
            .await
            .map_err(PodResourcesError::Report)?
            .into_inner())
    }

    /// Reports every interval until `shutdown`; failures are logged (the first of a run
    /// as a warning) and tried again next time.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            match self.report_once().await {
                Ok(answer) => {
                    if failing {
                        tracing::info!("pod devices reported again");
                    }
                    failing = false;
                    tracing::debug!(
                        pods = answer.pods,
                        gpus = answer.gpus,
                        "pod devices reported"
                    );
                }
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(%error, "cannot report this node's pod devices; retrying");
                }
                Err(error) => tracing::debug!(%error, "pod devices still not reported"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
