//! The profiling worker, driven through `Worker::run_once` beside a real server: launch
//! specs and the allow-list, the replay backend, and the nvml backend's job lifecycle with
//! real child processes. Only the GPU is replaced: NVML by a recording (a real one from an
//! H100 where the readings are asserted), Nsight Compute by a program that checks it is asked
//! what real ncu is asked and writes a details-page CSV that real ncu wrote
//! (`tests/fixtures/workloads/fake_ncu.py`).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use coloc::{
    import::{import_kace, KACE_GPU, KACE_GPU_MEMORY_GB},
    profiler::{Backend, NvmlBackend, NvmlSampler, RecordedSampler},
    proto as pb,
    settings::ProfilerSettings,
    worker::{RunOutcome, Worker},
};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::helpers::{database_url, expect_code, kace_dir, spawn_app_with_config, TestApp};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fake_workload() -> String {
    fixtures()
        .join("workloads/fake_workload.py")
        .display()
        .to_string()
}

/// Settings that allow the fixture programs; the server's own worker stays off so that
/// the tests drive theirs.
fn config(extra: &str) -> String {
    format!(
        "[profiler]\nallowed_programs = [\"{}/*\"]\nretry_backoff_secs = 0\nsample_interval_ms = 1\n{extra}",
        fixtures().join("workloads").display()
    )
}

async fn app(extra: &str) -> TestApp {
    let app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config(extra)).await;
    if crate::store_url::on_postgres() {
        until_the_first_term_has_begun(&app).await;
    }
    app
}

/// On PostgreSQL a server without a worker of its own puts the in-process jobs it finds
/// running back to pending when its leader term begins (`startup::leader_tasks`, the jobs
/// a stopped leader's worker left), and the term begins in a task of its own once the
/// server has started. A job these tests' worker claimed before that was taken back under
/// it (its profile then came "too late": `LeaseLost`, seen once in CI). So the tests start
/// claiming once the server leads (`coloc_leader 1`) and its first tasks have started.
async fn until_the_first_term_has_begun(app: &TestApp) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = crate::operations::scrape(app).await;
        if metrics
            .iter()
            .any(|(name, value)| name == "coloc_leader" && *value == 1.0)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server did not lead within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The term's tasks are spawned before the gauge is set; the take-back is their first
    // statement.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn launch(args: &[&str]) -> pb::LaunchSpec {
    pb::LaunchSpec {
        program: fake_workload(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

fn register(name: &str, launch: Option<pb::LaunchSpec>) -> pb::RegisterWorkloadRequest {
    pb::RegisterWorkloadRequest {
        name: name.into(),
        mode: pb::WorkloadMode::Inference as i32,
        model: "fake".into(),
        batch_size: 1,
        launch,
        ..Default::default()
    }
}

/// A worker on the nvml backend with NVML replaced by the synthetic recording and ncu by
/// `ncu_path`. The synthetic recording is busy from its third reading on: these tests'
/// workloads live a few milliseconds, far shorter than a real recording's start-up (the
/// H100 ones are idle for their first 2.3 s, 23 readings).
fn nvml_worker(app: &TestApp, ncu_path: &str, max_attempts: u32) -> Worker {
    let settings = ProfilerSettings {
        ncu_path: ncu_path.into(),
        max_attempts,
        ..app.settings.profiler.clone()
    };
    worker_replaying(app, settings, "nvml/synthetic_samples.jsonl")
}

/// A worker on the nvml backend with `settings` and NVML replaced by `recording`.
fn worker_replaying(app: &TestApp, settings: ProfilerSettings, recording: &str) -> Worker {
    let sampler = RecordedSampler::from_file(&fixtures().join(recording)).unwrap();
    let backend = NvmlBackend::new(settings.clone(), Some(Arc::new(sampler)));
    Worker::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Arc::new(Backend::Nvml(backend)),
        settings,
    )
}

fn fake_ncu() -> String {
    fixtures()
        .join("workloads/fake_ncu.py")
        .display()
        .to_string()
}

async fn workload(app: &mut TestApp, name: &str) -> pb::Workload {
    app.client
        .get_workload(pb::GetWorkloadRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

/// Waits (bounded) for a file the fake workload writes once it is running.
async fn wait_for_file(path: &std::path::Path) -> u32 {
    for _ in 0..500 {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text.trim().parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

/// True while `pid` is a live process (a zombie awaiting its reaper counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

async fn eventually_dead(pid: u32) -> bool {
    for _ in 0..200 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn launch_specs_are_refused_unless_the_program_is_allowed() {
    let dir = Arc::new(TempDir::new().unwrap());
    let mut closed = spawn_app_with_config(dir, "").await;
    let before = closed.dump_store().await;
    let message = expect_code(
        closed
            .client
            .register_workload(register("w", Some(launch(&["ok"]))))
            .await,
        Code::PermissionDenied,
    );
    assert!(message.contains("allowed_programs"), "{message}");
    assert_eq!(closed.dump_store().await, before);

    let mut open = app("").await;
    let mut elsewhere = launch(&["ok"]);
    elsewhere.program = "/usr/bin/yes".into();
    expect_code(
        open.client
            .register_workload(register("w", Some(elsewhere)))
            .await,
        Code::PermissionDenied,
    );
    let mut relative = launch(&["ok"]);
    relative.program = "fake_workload.py".into();
    expect_code(
        open.client
            .register_workload(register("w", Some(relative)))
            .await,
        Code::InvalidArgument,
    );

    let registered = open
        .client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(registered.state(), pb::WorkloadState::PendingProfile);
    assert_eq!(registered.launch.unwrap().program, fake_workload());
    assert_eq!(open.count("profiling_jobs").await, 1);
}

mod lifecycle;
mod recordings;
mod writes;
