//! The measuring step of a profiling Kubernetes Job (`coloc profile-job`), run as the Job's
//! pod would run it: the real binary, with the command line and environment of the main
//! container of the Job manifest coloc builds for the claim, against a real server. The
//! profile it submits arrives through the agents' API under the service's claim.

use std::{process::Stdio, time::Duration};

use coloc::{
    domain::{GpuName, LaunchSpec, WorkloadName},
    proto as pb,
    settings::KubeJobSettings,
    store::ClaimedJob,
    worker::kube_jobs::{job_manifest, KUBE_JOBS_HOLDER},
};

use super::{
    agents_client, announce, app, claim_one, fake_workload, fixtures, recording, workload, GPU_24,
};

#[tokio::test]
async fn the_job_s_pod_measures_the_workload_and_submits_its_profile_through_the_agents_api() {
    let app = app(30).await;
    let mut request = super::register("kjob", &["ok", "31"], &[GPU_24]);
    request.launch.as_mut().unwrap().image = "registry.example/fake:1".into();
    app.client.clone().register_workload(request).await.unwrap();
    // The service's claim, as its dispatcher holds it.
    let mut agents = agents_client(&app);
    let mut holder = announce(KUBE_JOBS_HOLDER, GPU_24);
    holder.gpu_memory_gb = 24.0;
    agents.announce_agent(holder).await.unwrap();
    let claimed = claim_one(&mut agents, KUBE_JOBS_HOLDER).await;
    assert_eq!(claimed.workload, "kjob");
    let job = ClaimedJob {
        id: claimed.job_id as i64,
        claim: claimed.claim as i64,
        holder: KUBE_JOBS_HOLDER.into(),
        workload: WorkloadName::parse("workload", "kjob").unwrap(),
        gpu: Some(GpuName::parse("gpu", GPU_24).unwrap()),
        attempts: claimed.attempt,
        launch: Some(LaunchSpec {
            program: fake_workload(),
            args: vec!["ok".into(), "31".into()],
            env: Default::default(),
            working_dir: None,
            timeout_secs: None,
            throughput_regex: None,
            nvtx_range: None,
            image: Some("registry.example/fake:1".into()),
        }),
        lease_expires_ms: 0,
    };
    let settings = KubeJobSettings {
        namespace: "coloc".into(),
        coloc_image: "coloc".into(),
        service_addr: format!("http://{}", app.addr),
        token_secret: String::new(),
        gpu_label: "nvidia.com/gpu.product".into(),
        active_deadline_secs: 600,
        ttl_secs_after_finished: 60,
        poll_interval_ms: 100,
        gpus: vec![GPU_24.into()],
    };
    let manifest = job_manifest(&job, &settings, 3).unwrap();
    let container = &manifest["spec"]["template"]["spec"]["containers"][0];
    let command: Vec<String> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(command[0], "/coloc/bin/coloc", "the injected binary");
    // The pod: the injected binary is this build's; the node gives NVML (a recording of
    // a 24 GB GPU here) and no Nsight Compute beyond the fake one.
    let mut pod = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"));
    pod.args(&command[1..])
        .env_remove("COLOC_TOKEN")
        .env("COLOC__PROFILER__NVML_RECORDING", recording(GPU_24))
        .env(
            "COLOC__PROFILER__NCU_PATH",
            fixtures().join("workloads/fake_ncu.py"),
        )
        .env("COLOC__PROFILER__SAMPLE_INTERVAL_MS", "1")
        .env("NODE_NAME", "gpu-node-7")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for variable in container["env"].as_array().unwrap() {
        if let Some(value) = variable["value"].as_str() {
            pod.env(variable["name"].as_str().unwrap(), value);
        }
    }
    let ran = tokio::time::timeout(Duration::from_secs(60), pod.output())
        .await
        .expect("the pod's measuring step finished")
        .unwrap();
    let log = String::from_utf8_lossy(&ran.stderr).to_string();
    assert!(ran.status.success(), "{log}");
    let profiled = workload(&app, "kjob").await;
    assert_eq!(profiled.state(), pb::WorkloadState::Profiled, "{log}");
    assert_eq!(profiled.profiles.len(), 1);
    let profile = &profiled.profiles[0];
    assert_eq!(profile.gpu, GPU_24);
    assert_eq!(profile.source(), pb::ProfileSource::Measured);
    assert_eq!(profile.system.as_ref().unwrap().exclusive_throughput, 31.0);
    assert!(!profile.kernel_missing, "the fake ncu measured the kernels");
    // The claim was the service's: the job is done under it.
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM profiling_jobs WHERE id = {} AND state = 'done' AND claim_holder = '{KUBE_JOBS_HOLDER}'",
            claimed.job_id
        ))
        .await,
        1
    );
}
