//! The Kubernetes Job one profiling job becomes: the workload's own image on a node of the
//! job's GPU model (the GPU product label that GPU feature discovery writes), one GPU for
//! the Job's lifetime only, and coloc's measuring step injected: an init container copies
//! the `coloc` binary from coloc's image into an emptyDir, and the main container runs the
//! workload's command under `coloc profile-job`, which reports through the agents' API.

use k8s_openapi::api::batch::v1::Job;
use serde_json::{json, Value};

use super::KubeJobError;
use crate::{
    domain::{GpuName, LaunchSpec},
    settings::KubeJobSettings,
    store::ClaimedJob,
};

/// Where the init container puts the `coloc` binary in the Job's pod.
pub const INJECTED_DIR: &str = "/coloc/bin";
/// Where coloc's image keeps its binary (deploy/Dockerfile).
const IMAGE_BINARY: &str = "/usr/local/bin/coloc";
/// Label of every Job (and its pod) that coloc creates, valued by the profiling job's id.
pub const JOB_LABEL: &str = "coloc.io/profiling-job";
/// Annotation naming the workload (workload names are not all valid label values).
pub const WORKLOAD_ANNOTATION: &str = "coloc.io/workload";

/// The Job's name: one per claim, so a retried attempt never meets its predecessor.
pub fn job_name(job: &ClaimedJob) -> String {
    format!("coloc-profile-{}-{}", job.id, job.claim)
}

/// The value GPU feature discovery gives `nvidia.com/gpu.product` for a GPU model as NVML
/// names it: spaces become dashes ("Tesla V100-SXM2-32GB" → "Tesla-V100-SXM2-32GB").
pub fn gpu_product_label(gpu: &GpuName) -> Result<String, KubeJobError> {
    let value = gpu.as_str().trim().replace(' ', "-");
    let valid = !value.is_empty()
        && value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        Ok(value)
    } else {
        Err(KubeJobError::GpuLabel(gpu.as_str().to_string()))
    }
}

/// The main container's environment: the launch spec's, then what `coloc profile-job`
/// reads (its claim, the service's address, the token from a Secret, the profiler's
/// settings: NVML, the program allowed).
fn environment(
    job: &ClaimedJob,
    launch: &LaunchSpec,
    settings: &KubeJobSettings,
    max_attempts: u32,
) -> Vec<Value> {
    let mut env: Vec<Value> = launch
        .env
        .iter()
        .map(|(name, value)| json!({"name": name, "value": value}))
        .collect();
    let mut set = |name: &str, value: String| env.push(json!({"name": name, "value": value}));
    set("COLOC_ADDR", settings.service_addr.clone());
    set("COLOC_AGENT_ID", job.holder.clone());
    set("COLOC_JOB_ID", job.id.to_string());
    set("COLOC_CLAIM", job.claim.to_string());
    set("COLOC_ATTEMPT", job.attempts.to_string());
    set("COLOC_WORKLOAD", job.workload.as_str().to_string());
    set("COLOC__PROFILER__BACKEND", "nvml".into());
    set("COLOC__PROFILER__ALLOWED_PROGRAMS", launch.program.clone());
    // The pod fails the job for good on the service's last attempt, not its own default's.
    set("COLOC__PROFILER__MAX_ATTEMPTS", max_attempts.to_string());
    // NVML needs the driver's utility libraries in the container.
    set("NVIDIA_DRIVER_CAPABILITIES", "compute,utility".into());
    env.push(json!({
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }));
    if !settings.token_secret.is_empty() {
        env.push(json!({
            "name": "COLOC_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": settings.token_secret, "key": "token"}},
        }));
    }
    env
}

/// The Job for `job`'s claim, as coloc creates it (plain JSON, as the API server takes it);
/// `max_attempts` is the service's `profiler.max_attempts`.
pub fn job_manifest(
    job: &ClaimedJob,
    settings: &KubeJobSettings,
    max_attempts: u32,
) -> Result<Value, KubeJobError> {
    let launch = job.launch.as_ref().ok_or(KubeJobError::NoLaunchSpec)?;
    let image = launch.image.as_ref().ok_or(KubeJobError::NoImage)?;
    let gpu = job.gpu.as_ref().ok_or(KubeJobError::NoGpuModel)?;
    let product = gpu_product_label(gpu)?;
    let name = job_name(job);
    let labels = json!({
        "app.kubernetes.io/name": "coloc",
        "app.kubernetes.io/component": "profiling-job",
        JOB_LABEL: job.id.to_string(),
    });
    let mut command = vec![
        format!("{INJECTED_DIR}/coloc"),
        "profile-job".to_string(),
        "--".to_string(),
        launch.program.clone(),
    ];
    command.extend(launch.args.iter().cloned());
    let mut main = json!({
        "name": "workload",
        "image": image,
        "command": command,
        "env": environment(job, launch, settings, max_attempts),
        "resources": {
            "requests": {"nvidia.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1"},
        },
        "volumeMounts": [{"name": "coloc-bin", "mountPath": INJECTED_DIR, "readOnly": true}],
    });
    if let Some(dir) = &launch.working_dir {
        main["workingDir"] = json!(dir);
    }
    Ok(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {WORKLOAD_ANNOTATION: job.workload.as_str(), "coloc.io/gpu": gpu.as_str()},
        },
        "spec": {
            // coloc counts attempts itself: a failed pod fails the Job, and coloc decides.
            "backoffLimit": 0,
            "activeDeadlineSeconds": settings.active_deadline_secs,
            "ttlSecondsAfterFinished": settings.ttl_secs_after_finished,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {settings.gpu_label.as_str(): product},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "volumes": [{"name": "coloc-bin", "emptyDir": {}}],
                    "initContainers": [{
                        "name": "coloc",
                        "image": settings.coloc_image,
                        "command": ["cp", IMAGE_BINARY, format!("{INJECTED_DIR}/coloc")],
                        "volumeMounts": [{"name": "coloc-bin", "mountPath": INJECTED_DIR}],
                    }],
                    "containers": [main],
                },
            },
        },
    }))
}

/// [`job_manifest`] as kube-rs's typed Job.
pub fn typed_job(
    job: &ClaimedJob,
    settings: &KubeJobSettings,
    max_attempts: u32,
) -> Result<Job, KubeJobError> {
    serde_json::from_value(job_manifest(job, settings, max_attempts)?)
        .map_err(|e| KubeJobError::Manifest(e.to_string()))
}
