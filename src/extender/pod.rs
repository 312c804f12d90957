//! What coloc reads from a pod: the workload it runs (`coloc.io/workload`), the fraction
//! of its exclusive throughput it must keep (`coloc.io/min-job-fraction`: checked when it
//! is placed, and, once it runs, for every pod placed beside it), and once it is placed,
//! the GPUs it holds. The GPU comes from `coloc.io/gpu` (set by the operator's own
//! tooling; several ids comma-separated) or else from HAMi's allocation annotation
//! `hami.io/vgpu-devices-allocated` (`UUID,TYPE,MEMORY_MIB,CORES:` per device, `;` after
//! each container). NVIDIA's device plugin writes no pod annotation: its assignment is
//! known to the kubelet, whose PodResources API `coloc agent` reports into the one cluster
//! view (`crate::cluster`, which also says which source wins when they disagree).
//!
//! The pod's sharing mode comes from KAI-Scheduler's `kai.scheduler/gpu-compute-sharing-mode`
//! (`sm-sharing`: MPS; `time-slicing`); a pod without it is for the server's
//! `model.default_sharing_mode` (KAI's own default, where KAI shares the GPU, is
//! time-slicing: docs/kubernetes.md).

use k8s_openapi::api::core::v1::Pod;

use crate::domain::SharingMode;

pub const WORKLOAD_ANNOTATION: &str = "coloc.io/workload";
pub const MIN_JOB_FRACTION_ANNOTATION: &str = "coloc.io/min-job-fraction";
pub const GPU_ANNOTATION: &str = "coloc.io/gpu";
pub const HAMI_ALLOCATED_ANNOTATION: &str = "hami.io/vgpu-devices-allocated";
/// KAI-Scheduler's compute sharing mode of a fractional GPU pod.
pub const KAI_SHARING_MODE_ANNOTATION: &str = "kai.scheduler/gpu-compute-sharing-mode";
/// The PromQL template of the pod's throughput, read by the observer.
pub const THROUGHPUT_QUERY_ANNOTATION: &str = "coloc.io/throughput-query";

/// What a pod being scheduled asks of coloc.
#[derive(Debug, Clone, PartialEq)]
pub struct PodAsk {
    pub workload: String,
    pub min_job_fraction: Option<f64>,
    /// The pod's sharing mode; `None`: not said (the server's default).
    pub sharing_mode: Option<SharingMode>,
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|value| value.trim())
        .filter(|value| !value.is_empty())
}

/// The pod's `coloc.io/min-job-fraction`, `Err` with a readable reason when malformed.
fn min_job_fraction(pod: &Pod) -> Result<Option<f64>, String> {
    match annotation(pod, MIN_JOB_FRACTION_ANNOTATION) {
        None => Ok(None),
        Some(raw) => match raw.parse::<f64>() {
            Ok(fraction) if fraction > 0.0 && fraction <= 1.0 => Ok(Some(fraction)),
            _ => Err(format!(
                "annotation {MIN_JOB_FRACTION_ANNOTATION} must be a number in (0, 1], got {raw:?}"
            )),
        },
    }
}

/// The pod's KAI-Scheduler sharing mode, `Err` with a readable reason for a value KAI does
/// not write.
fn sharing_mode(pod: &Pod) -> Result<Option<SharingMode>, String> {
    match annotation(pod, KAI_SHARING_MODE_ANNOTATION) {
        None => Ok(None),
        Some("sm-sharing") => Ok(Some(SharingMode::Mps)),
        Some("time-slicing") => Ok(Some(SharingMode::TimeSlicing)),
        Some(raw) => Err(format!(
            "annotation {KAI_SHARING_MODE_ANNOTATION} must be \"sm-sharing\" or \"time-slicing\", \
             got {raw:?}"
        )),
    }
}

/// The pod's ask; `Ok(None)` when it names no workload (coloc leaves it alone), `Err` with
/// a readable reason when an annotation is malformed.
pub fn pod_ask(pod: &Pod) -> Result<Option<PodAsk>, String> {
    let Some(workload) = annotation(pod, WORKLOAD_ANNOTATION) else {
        return Ok(None);
    };
    let min_job_fraction = min_job_fraction(pod)?;
    Ok(Some(PodAsk {
        workload: workload.to_string(),
        min_job_fraction,
        sharing_mode: sharing_mode(pod)?,
    }))
}

/// A pod that holds GPUs on a node: a resident of each (kept in the one cluster view).
pub use crate::cluster::Residency;

/// Where the pod runs, when it is a resident: it names a workload, is bound to a node, is
/// not finished (phase Pending-but-bound or Running: the device plugin has given it its
/// GPU) nor being deleted, and its GPU is known.
pub fn residency(pod: &Pod) -> Option<Residency> {
    let workload = annotation(pod, WORKLOAD_ANNOTATION)?;
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !matches!(phase, Some("Running") | Some("Pending")) {
        return None;
    }
    let gpus = gpu_ids(pod);
    if gpus.is_empty() {
        return None;
    }
    Some(Residency {
        node: node.to_string(),
        gpus,
        workload: workload.to_string(),
        min_job_fraction: min_job_fraction(pod).ok().flatten(),
    })
}

/// The GPUs the pod holds: `coloc.io/gpu`, else HAMi's allocation; each id once.
pub fn gpu_ids(pod: &Pod) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut push = |id: &str| {
        let id = id.trim();
        if !id.is_empty() && !ids.iter().any(|known| known == id) {
            ids.push(id.to_string());
        }
    };
    if let Some(named) = annotation(pod, GPU_ANNOTATION) {
        named.split(',').for_each(&mut push);
    } else if let Some(allocated) = annotation(pod, HAMI_ALLOCATED_ANNOTATION) {
        for container in allocated.split(';') {
            for device in container.split(':') {
                if let Some(uuid) = device.split(',').next() {
                    push(uuid);
                }
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn hami_allocation_names_each_device_once_across_containers() {
        let pod = pod(serde_json::json!({"metadata": {"annotations": {
            "hami.io/vgpu-devices-allocated":
                "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,3000,0:;GPU-7023a4c2-4128-840d-2b86-ab87d8bf7f47,NVIDIA,4000,50:GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,NVIDIA,1000,0:;"
        }}}));
        assert_eq!(
            gpu_ids(&pod),
            [
                "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448",
                "GPU-7023a4c2-4128-840d-2b86-ab87d8bf7f47"
            ]
        );
    }

    #[test]
    fn the_operators_gpu_annotation_wins_over_hami() {
        let pod = pod(serde_json::json!({"metadata": {"annotations": {
            "coloc.io/gpu": "gpu-3",
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3000,0:;"
        }}}));
        assert_eq!(gpu_ids(&pod), ["gpu-3"]);
    }

    #[test]
    fn a_malformed_fraction_is_reported_and_an_unannotated_pod_asks_nothing() {
        let bad = pod(serde_json::json!({"metadata": {"annotations": {
            "coloc.io/workload": "resnet", "coloc.io/min-job-fraction": "1.5"}}}));
        assert!(pod_ask(&bad).unwrap_err().contains("min-job-fraction"));
        let plain = pod(serde_json::json!({"metadata": {"name": "web"}}));
        assert_eq!(pod_ask(&plain), Ok(None));
    }

    #[test]
    fn the_kai_sharing_mode_is_read_and_a_value_kai_does_not_write_is_malformed() {
        let with_mode = |mode: &str| {
            pod(serde_json::json!({"metadata": {"annotations": {
                "coloc.io/workload": "w", "gpu-fraction": "0.5",
                "kai.scheduler/gpu-compute-sharing-mode": mode}}}))
        };
        let mode = |raw: &str| pod_ask(&with_mode(raw)).map(|ask| ask.unwrap().sharing_mode);
        assert_eq!(mode("sm-sharing"), Ok(Some(SharingMode::Mps)));
        assert_eq!(mode("time-slicing"), Ok(Some(SharingMode::TimeSlicing)));
        assert!(mode("mps")
            .unwrap_err()
            .contains("gpu-compute-sharing-mode"));
        let plain =
            pod(serde_json::json!({"metadata": {"annotations": {"coloc.io/workload": "w"}}}));
        assert_eq!(pod_ask(&plain).unwrap().unwrap().sharing_mode, None);
    }

    #[test]
    fn finished_or_unbound_pods_are_not_residents() {
        let base = |phase: &str, node: Option<&str>| {
            pod(serde_json::json!({
                "metadata": {"annotations": {"coloc.io/workload": "w", "coloc.io/gpu": "g0"}},
                "spec": {"containers": [], "nodeName": node},
                "status": {"phase": phase}
            }))
        };
        assert!(residency(&base("Running", Some("n1"))).is_some());
        assert!(residency(&base("Succeeded", Some("n1"))).is_none());
        assert!(residency(&base("Failed", Some("n1"))).is_none());
        assert!(residency(&base("Pending", None)).is_none());
    }

    #[test]
    fn a_residents_fraction_is_kept_and_a_malformed_one_counts_as_none() {
        let running = |fraction: &str| {
            pod(serde_json::json!({
                "metadata": {"annotations": {"coloc.io/workload": "w", "coloc.io/gpu": "g0",
                    "coloc.io/min-job-fraction": fraction}},
                "spec": {"containers": [], "nodeName": "n1"},
                "status": {"phase": "Running"}
            }))
        };
        assert_eq!(
            residency(&running("0.6")).unwrap().min_job_fraction,
            Some(0.6)
        );
        assert_eq!(residency(&running("most")).unwrap().min_job_fraction, None);
    }
}
