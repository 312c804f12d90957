//! The cluster view through the API: ListGpus' GPUs with each resident's source, and
//! ReportPodDevices' pods checked into the view's values (`crate::cluster`).

use super::convert::timestamp;
use crate::{domain::ValidationError, proto as pb};

pub fn resident_source_to_pb(source: crate::cluster::Source) -> pb::ResidentSource {
    use crate::cluster::Source;
    match source {
        Source::AssignJob => pb::ResidentSource::AssignJob,
        Source::PodResources => pb::ResidentSource::PodResources,
        Source::HamiAnnotation => pb::ResidentSource::HamiAnnotation,
        Source::GpuAnnotation => pb::ResidentSource::GpuAnnotation,
        Source::DraAllocation => pb::ResidentSource::DraAllocation,
    }
}

/// A GPU of the cluster view; a pod's job id is its `namespace/name`, and its workload is
/// empty when coloc does not know it.
pub fn cluster_gpu_to_pb(gpu: crate::cluster::ViewGpu) -> pb::ClusterGpu {
    pb::ClusterGpu {
        id: gpu.id,
        node: gpu.node,
        gpu: gpu.gpu_model.unwrap_or_default(),
        jobs: gpu
            .residents
            .into_iter()
            .map(|r| pb::ClusterJob {
                job_id: r.id,
                workload: r.workload.unwrap_or_default(),
                assigned_at: r.assigned_at_ms.map(timestamp),
                expires_at: r.expires_at_ms.map(timestamp),
                source: resident_source_to_pb(r.source) as i32,
            })
            .collect(),
    }
}

/// ReportPodDevices' pods, checked: a Kubernetes namespace and name each, 1 to
/// [`MAX_GPUS_PER_POD`] GPU ids of at most 128 printable characters.
pub fn pod_devices(
    raw: Vec<pb::PodDevices>,
) -> Result<Vec<crate::cluster::PodDevices>, ValidationError> {
    use crate::advisor::{MAX_GPUS_PER_POD, MAX_REPORTED_PODS};
    if raw.len() > MAX_REPORTED_PODS {
        return Err(ValidationError::new(
            "pods",
            format!("at most {MAX_REPORTED_PODS} pods, got {}", raw.len()),
        ));
    }
    let printable = |s: &str, max: usize| {
        !s.is_empty() && s.len() <= max && s.chars().all(|c| c.is_ascii_graphic())
    };
    raw.into_iter()
        .enumerate()
        .map(|(i, pod)| {
            if !printable(&pod.namespace, 63) || !printable(&pod.name, 253) || pod.namespace.contains('/') || pod.name.contains('/') {
                return Err(ValidationError::new(
                    format!("pods[{i}]"),
                    format!(
                        "pods[{i}] needs a namespace (at most 63 characters) and a name (at most 253), printable and without '/'"
                    ),
                ));
            }
            if pod.gpu_ids.is_empty()
                || pod.gpu_ids.len() > MAX_GPUS_PER_POD
                || !pod.gpu_ids.iter().all(|id| printable(id, 128))
            {
                return Err(ValidationError::new(
                    format!("pods[{i}].gpu_ids"),
                    format!(
                        "pods[{i}].gpu_ids must hold 1 to {MAX_GPUS_PER_POD} GPU ids of at most 128 printable characters"
                    ),
                ));
            }
            Ok(crate::cluster::PodDevices {
                pod: format!("{}/{}", pod.namespace, pod.name),
                gpus: pod.gpu_ids,
            })
        })
        .collect()
}
