//! Real `coloc agent` processes: two agents of two GPU models sharing the jobs by model,
//! and an agent killed mid-job whose job the next agent takes after the lease.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_profile_each_workload_on_their_own_gpu_model() {
    let app = app(5).await;
    let mut big = spawn_agent(&app, "agent-24", GPU_24);
    let mut small = spawn_agent(&app, "agent-16", GPU_16);
    until(Duration::from_secs(15), "both agents announced", || async {
        live_agents(&app).await.len() == 2
    })
    .await;
    assert_both_agents_announced_their_gpu(&app).await;
    register_workloads_for_both_gpus_one_and_none(&app).await;
    until(
        Duration::from_secs(20),
        "both workloads are profiled",
        || async {
            workload(&app, "everywhere").await.profiles.len() == 2
                && workload(&app, "small-only").await.profiles.len() == 1
        },
    )
    .await;
    assert_each_agent_ran_only_its_gpu_model_s_jobs(&app).await;
    assert_operators_see_both_agents(&app).await;
    big.kill().await.unwrap();
    small.kill().await.unwrap();
}

/// agent-16 and agent-24 are listed live, on their node, with their GPU model, memory and
/// Nsight Compute version.
async fn assert_both_agents_announced_their_gpu(app: &TestApp) {
    let agents = live_agents(app).await;
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
}

/// "everywhere" names no GPU model (a job for each served one), "small-only" the 16 GB one,
/// "nobody-serves" one no agent serves: four jobs, the last one waiting with its reason.
async fn register_workloads_for_both_gpus_one_and_none(app: &TestApp) {
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
}

/// Each workload was profiled on the GPU models it asked for, by the agents of those
/// models only; the unserved model's job still waits.
async fn assert_each_agent_ran_only_its_gpu_model_s_jobs(app: &TestApp) {
    let everywhere = workload(app, "everywhere").await;
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
    let small_only = workload(app, "small-only").await;
    assert_eq!(small_only.state(), pb::WorkloadState::Profiled);
    assert_eq!(small_only.profiles[0].gpu, GPU_16);
    assert_eq!(small_only.profiles[0].gpu_memory_gb, 16.0);
    // The unserved GPU model's job still waits, never taken by an agent of another model.
    assert_eq!(
        workload(app, "nobody-serves").await.state(),
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
}

/// `coloc agents list` and the per-agent metrics show both agents and what they did.
async fn assert_operators_see_both_agents(app: &TestApp) {
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
    let metrics = reqwest_metrics(app).await;
    assert!(
        metrics.contains("coloc_agent_jobs_total{agent=\"agent-16\",outcome=\"profiled\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("coloc_agent_jobs_total{agent=\"agent-24\",outcome=\"profiled\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("coloc_agent_last_seen_timestamp_seconds{agent=\"agent-16\""));
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
