//! Profiling agents against one real server: real `coloc agent` child processes (the nvml
//! backend with NVML replaced by a recording per GPU model and Nsight Compute by
//! `tests/fixtures/workloads/fake_ncu.py`), the generated client for the agent protocol
//! itself (a slow agent, duplicate submissions), real SQLite files. One file per part of
//! an agent's life: `processes` (real agents profiling, and dying), `announce` (announcing,
//! tokens, listing, restarts and migrations), `leases` (claims, leases, submissions) and
//! `calibration` (`coloc calibrate` and SubmitCalibration). This file holds what they
//! share.

mod announce;
mod calibration;
mod kube_jobs;
mod leases;
mod processes;

use std::{
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use coloc::proto::{self as pb, profiling_agents_client::ProfilingAgentsClient};
use tempfile::TempDir;
use tonic::{transport::Channel, Code};

use crate::helpers::{expect_code, spawn_app_with_config, TestApp};

const GPU_24: &str = "Recorded Test GPU 24GB";
const GPU_16: &str = "Recorded Test GPU 16GB";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn recording(gpu: &str) -> PathBuf {
    fixtures().join(match gpu {
        GPU_24 => "nvml/synthetic_samples.jsonl",
        _ => "nvml/synthetic_samples_16gb.jsonl",
    })
}

/// A server with no profiler of its own, whose agents' leases last `lease_secs`.
async fn app(lease_secs: u64) -> TestApp {
    let config = format!(
        "[agents]\nlease_secs = {lease_secs}\nlive_secs = 60\n[profiler]\nallowed_programs = [\"{}/*\"]\n",
        fixtures().join("workloads").display()
    );
    spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await
}

/// `coloc SUBCOMMAND --addr <app>` as a GPU node of `gpu`: NVML replaced by its
/// recording, ncu by the fake one, the fake workloads allowed.
fn gpu_node_command(app: &TestApp, subcommand: &str, gpu: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"));
    command
        .args([subcommand, "--addr", &format!("http://{}", app.addr)])
        .env("COLOC__PROFILER__NVML_RECORDING", recording(gpu))
        .env(
            "COLOC__PROFILER__NCU_PATH",
            fixtures().join("workloads/fake_ncu.py"),
        )
        .env(
            "COLOC__PROFILER__ALLOWED_PROGRAMS",
            format!("{}/*", fixtures().join("workloads").display()),
        );
    command
}

/// A real `coloc agent` for `gpu` (its NVML recording), logging into the test's folder.
fn spawn_agent(app: &TestApp, id: &str, gpu: &str) -> tokio::process::Child {
    let log = std::fs::File::create(app.dir.path().join(format!("{id}.log"))).unwrap();
    gpu_node_command(app, "agent", gpu)
        .args(["--id", id, "--node", &format!("node-of-{id}")])
        .env_remove("COLOC_TOKEN")
        .env("COLOC__PROFILER__BACKEND", "nvml")
        .env("COLOC__PROFILER__SAMPLE_INTERVAL_MS", "1")
        .env("COLOC__PROFILER__POLL_INTERVAL_MS", "50")
        .env("COLOC__PROFILER__RETRY_BACKOFF_SECS", "0")
        .env("COLOC__LOG__FORMAT", "text")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn agents_client(app: &TestApp) -> ProfilingAgentsClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect_lazy();
    ProfilingAgentsClient::new(channel)
}

fn fake_workload() -> String {
    fixtures()
        .join("workloads/fake_workload.py")
        .display()
        .to_string()
}

fn register(name: &str, args: &[&str], gpus: &[&str]) -> pb::RegisterWorkloadRequest {
    pb::RegisterWorkloadRequest {
        name: name.into(),
        mode: pb::WorkloadMode::Inference as i32,
        model: "fake".into(),
        batch_size: 1,
        launch: Some(pb::LaunchSpec {
            program: fake_workload(),
            args: args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }),
        profile_on_gpus: gpus.iter().map(|g| g.to_string()).collect(),
        ..Default::default()
    }
}

/// Polls `check` every 20 ms until it holds, for at most `limit`; what the agents do is
/// watched through the service's state, never waited for with a fixed sleep.
async fn until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn live_agents(app: &TestApp) -> Vec<pb::Agent> {
    agents_client(app)
        .list_agents(pb::ListAgentsRequest {})
        .await
        .unwrap()
        .into_inner()
        .agents
}

async fn workload(app: &TestApp, name: &str) -> pb::Workload {
    app.client
        .clone()
        .get_workload(pb::GetWorkloadRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

fn agent_log(app: &TestApp, id: &str) -> String {
    std::fs::read_to_string(app.dir.path().join(format!("{id}.log"))).unwrap_or_default()
}

/// The metrics page, over plain HTTP.
async fn reqwest_metrics(app: &TestApp) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(app.metrics_addr.unwrap())
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text
}

fn kill_hard(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn announce(id: &str, gpu: &str) -> pb::AnnounceAgentRequest {
    pb::AnnounceAgentRequest {
        agent_id: id.into(),
        node: "node-a".into(),
        gpu: gpu.into(),
        gpu_memory_gb: 16.0,
        ncu_version: String::new(),
        backend: "nvml".into(),
    }
}

fn measured_profile(gpu: &str, throughput: f64) -> pb::Profile {
    let mut profile = crate::helpers::profile(7, 3.0);
    profile.gpu = gpu.into();
    profile.source = pb::ProfileSource::Measured as i32;
    profile.system.as_mut().unwrap().exclusive_throughput = throughput;
    profile
}

fn submit(agent: &str, job: &pb::ProfilingJob, profile: pb::Profile) -> pb::SubmitProfileRequest {
    pb::SubmitProfileRequest {
        agent_id: agent.into(),
        job_id: job.job_id,
        claim: job.claim,
        profile: Some(profile),
        note: String::new(),
    }
}

const AGENT_TOKEN: &str = "agent-token-0123456789abcdef";
const READER_TOKEN: &str = "reader-token-0123456789abcdef";

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// A server like [`app`] with more `[profiler]` settings (e.g. `max_attempts`).
async fn app_with_profiler(lease_secs: u64, profiler: &str) -> TestApp {
    let config = format!(
        "[agents]\nlease_secs = {lease_secs}\nlive_secs = 60\n[profiler]\nallowed_programs = [\"{}/*\"]\n{profiler}",
        fixtures().join("workloads").display()
    );
    spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await
}

async fn claim_one(agents: &mut ProfilingAgentsClient<Channel>, id: &str) -> pb::ProfilingJob {
    agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .expect("a job to claim")
}

/// One agent, `agent`, announced on a 16 GB GPU, holding the job of workload `workload`
/// registered for that GPU model.
async fn one_agent_holding(
    app: &TestApp,
    agents: &mut ProfilingAgentsClient<Channel>,
    agent: &str,
    workload: &str,
) -> pb::ProfilingJob {
    agents
        .announce_agent(announce(agent, GPU_16))
        .await
        .unwrap();
    app.client
        .clone()
        .register_workload(register(workload, &["ok"], &[GPU_16]))
        .await
        .unwrap();
    claim_one(agents, agent).await
}

const OPERATOR_TOKEN: &str = "operator-token-0123456789abcdef";

/// A server with auth on (reader, agent and operator tokens), agents' leases of 30 s.
async fn app_with_tokens() -> TestApp {
    let dir = Arc::new(TempDir::new().unwrap());
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("reader {READER_TOKEN}\nagent {AGENT_TOKEN}\noperator {OPERATOR_TOKEN}\n"),
    )
    .unwrap();
    let config = format!(
        "[auth]\ntokens_file = \"{}\"\n[agents]\nlease_secs = 30\nlive_secs = 60\n[profiler]\nallowed_programs = [\"{}/*\"]\n",
        tokens.display(),
        fixtures().join("workloads").display()
    );
    spawn_app_with_config(dir, &config).await
}

/// `name`, profiled on `gpu` (its exclusive throughput `throughput`), with a launch spec
/// running the fake workload with `args` unless `args` is empty.
fn profiled(name: &str, gpu: &str, throughput: f64, args: &[&str]) -> pb::RegisterWorkloadRequest {
    let mut profile = measured_profile(gpu, throughput);
    profile.gpu_memory_gb = if gpu == GPU_16 { 16.0 } else { 24.0 };
    let mut request = register(name, args, &[]);
    request.profile = Some(profile);
    if args.is_empty() {
        request.launch = None;
    }
    request
}

/// `coloc calibrate` with `args` as the node `node-c` (a real child process; NVML
/// replaced by the 24 GB recording, the fake workloads allowed), against `app`.
async fn calibrate(app: &TestApp, args: &[&str]) -> std::process::Output {
    gpu_node_command(app, "calibrate", GPU_24)
        .args(["--id", "node-c-gpu0", "--node", "node-c"])
        .args(args)
        .env("COLOC_TOKEN", AGENT_TOKEN)
        .env("COLOC_NO_PROGRESS", "1")
        .env("COLOC__LOG__FORMAT", "text")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap()
}
