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
    spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config(extra)).await
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

/// The recording that H100 run took for bmm-2048_batch8-inf (`tests/fixtures/nvml/`), and
/// what `tests/fixtures/nvml/expected.py` prints for it.
const H100_BMM_SAMPLES: &str = "nvml/h100_bmm_samples.jsonl";
const H100_GPU: &str = "NVIDIA H100 80GB HBM3";

/// What `tests/fixtures/nvml/expected.py` computes for a recording, run now: (readings,
/// utilization.gpu mean, utilization.memory mean, peak process memory in GiB).
fn independent_summary(file: &str) -> (usize, f64, f64, f64) {
    let script = fixtures().join("nvml/expected.py");
    let output = std::process::Command::new("python3")
        .arg(&script)
        .arg(fixtures().join(file))
        .output()
        .expect("python3 runs tests/fixtures/nvml/expected.py");
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8(output.stdout).unwrap();
    let after = |label: &str, from: &str| -> f64 {
        let line = printed
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} line in {printed}"));
        let rest = &line[line.find(from).unwrap_or_else(|| panic!("{line}")) + from.len()..];
        let number: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        number.parse().unwrap_or_else(|_| panic!("{line}"))
    };
    (
        after("samples:", "samples: ") as usize,
        after("utilization.gpu", "mean "),
        after("utilization.memory", "mean "),
        after("peak process memory", "= "),
    )
}

/// The real H100 recordings summarized by `profiler::gpu::summarize`, against
/// `tests/fixtures/nvml/expected.py` (Python, json module only, the rule the README states),
/// run here, and the figures it printed when the recordings were added.
#[test]
fn the_real_h100_recordings_summarize_to_the_independent_means_and_peaks() {
    use coloc::profiler::{gpu::summarize, GpuSampler};

    let read_all = |file: &str, count: usize| {
        let sampler = RecordedSampler::from_file(&fixtures().join(file)).unwrap();
        let info = sampler.info().unwrap();
        let samples: Vec<_> = (0..count).map(|_| sampler.sample(0).unwrap()).collect();
        (info, samples)
    };
    let close = |actual: f64, expected: f64| {
        assert!(
            (actual - expected).abs() <= 1e-12 * expected,
            "expected {expected}, got {actual}"
        )
    };
    // expected.py: "samples: 134; highest 100.0; steady window: index 23 to 131, 109
    // samples", utilization.gpu mean 99.4862385321101, utilization.memory mean
    // 7.944954128440367, peak 1050673152 bytes = 0.978515625 GiB; the GPU 85520809984 bytes.
    let (info, samples) = read_all(H100_BMM_SAMPLES, 134);
    assert_eq!(info.name, H100_GPU);
    assert_eq!(info.total_memory_bytes, 85_520_809_984);
    let (sm, mem, gb) = summarize(&samples).unwrap();
    let (readings, gpu_mean, memory_mean, peak_gb) = independent_summary(H100_BMM_SAMPLES);
    assert_eq!(readings, 134);
    close(sm, gpu_mean);
    close(mem, memory_mean);
    assert_eq!(gb, peak_gb);
    close(sm, 99.4862385321101);
    close(mem, 7.944954128440367);
    assert_eq!(gb, 0.978515625);
    // expected.py: "samples: 113; highest 100.0; steady window: index 27 to 107, 81
    // samples", means 99.03703703703704 and 7.925925925925926, peak 1281359872 bytes =
    // 1.193359375 GiB. Its first reading (6 %) is activity left from before the workload
    // started (NVML's utilization covers a past period): below half the highest, it does
    // not open the window, nor do the 22 idle start-up readings after it.
    let bert = "nvml/h100_bert_encoder_samples.jsonl";
    let (info, samples) = read_all(bert, 113);
    assert_eq!(info.name, H100_GPU);
    let (sm, mem, gb) = summarize(&samples).unwrap();
    let (readings, gpu_mean, memory_mean, peak_gb) = independent_summary(bert);
    assert_eq!(readings, 113);
    close(sm, gpu_mean);
    close(mem, memory_mean);
    assert_eq!(gb, peak_gb);
    close(sm, 99.03703703703704);
    close(mem, 7.925925925925926);
    assert_eq!(gb, 1.193359375);
}

/// A real profile end to end: the H100 bmm run's NVML readings replayed and its ncu output
/// written by the fake ncu, byte for byte; the workload stays long enough for the worker to
/// read the whole recording (134 readings at 1 ms here instead of 100 ms).
#[tokio::test]
async fn the_nvml_backend_profiles_a_workload_and_makes_it_profiled() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok", "42.5", "0.5"]))))
        .await
        .unwrap();
    let raw_dir = TempDir::new().unwrap();
    let settings = ProfilerSettings {
        ncu_path: fake_ncu().into(),
        max_attempts: 3,
        keep_raw_dir: Some(raw_dir.path().to_path_buf()),
        ..app.settings.profiler.clone()
    };
    let worker = worker_replaying(&app, settings, H100_BMM_SAMPLES);

    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Profiled { note, .. } if note.is_empty()),
        "{outcome:?}"
    );
    assert_eq!(
        worker.run_once(&CancellationToken::new()).await.unwrap(),
        RunOutcome::Idle
    );

    // What the worker read, as profiler.keep_raw_dir kept it: the recording, line for line,
    // then its last reading repeated (RecordedSampler repeats it once the recording is out).
    let kept: Vec<PathBuf> = std::fs::read_dir(raw_dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let recording = std::fs::read_to_string(fixtures().join(H100_BMM_SAMPLES)).unwrap();
    let read = std::fs::read_to_string(kept[0].join("nvml_samples.jsonl")).unwrap();
    let (whole, repeats) = read
        .strip_prefix(recording.as_str())
        .map(|rest| (true, rest.lines().collect::<Vec<_>>()))
        .unwrap_or((false, Vec::new()));
    assert!(
        whole,
        "the worker did not read the whole recording ({} of 134 readings)",
        read.lines().count() - 1
    );
    let last = recording.lines().last().unwrap();
    assert!(repeats.iter().all(|line| line == &last), "{repeats:?}");
    let repeated = repeats.len() as f64;
    // ncu's output, as the fake ncu wrote it: the real recording, byte for byte.
    assert_eq!(
        std::fs::read(kept[0].join("ncu.csv")).unwrap(),
        std::fs::read(fixtures().join("ncu/h100_bmm_nvtx_details.csv")).unwrap()
    );

    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::Profiled, "{}", w.state_reason);
    let profile = &w.profiles[0];
    assert_eq!(profile.gpu, H100_GPU);
    // 85520809984 bytes in GiB.
    assert_eq!(profile.gpu_memory_gb, 79.6474609375);
    assert_eq!(profile.source(), pb::ProfileSource::Measured);
    assert!(!profile.kernel_missing);
    let system = profile.system.as_ref().unwrap();
    assert_eq!(system.exclusive_throughput, 42.5);
    assert_eq!(system.throughput_unit, "samples/s");
    let close = |actual: f64, expected: f64| (actual - expected).abs() <= 1e-9 * expected.max(1.0);
    // tests/fixtures/nvml/expected.py: the steady window (index 23 to 131) holds 109
    // readings summing to 10844 (utilization.gpu) and 866 (utilization.memory); the
    // repeats of the last, idle, reading fall outside it; the peak is 1050673152 bytes =
    // 0.978515625 GiB.
    assert!(
        close(system.sm_busy_pct, 10_844.0 / 109.0),
        "{} after {repeated} repeats",
        system.sm_busy_pct
    );
    assert!(
        close(system.mem_busy_pct, 866.0 / 109.0),
        "{} after {repeated} repeats",
        system.mem_busy_pct
    );
    assert_eq!(system.memory_gb, 0.978515625);
    // The kernel metrics are the recording's one kernel (a cutlass SGEMM): what
    // tests/fixtures/ncu/expected.py prints for h100_bmm_nvtx_details.csv.
    let kernel = profile.kernel.as_ref().unwrap();
    assert!(close(kernel.threads, 262_144.0), "{kernel:?}");
    assert!(close(kernel.compute_throughput_pct, 85.78), "{kernel:?}");
    assert!(close(kernel.dram_throughput_pct, 4.55), "{kernel:?}");
    assert!(close(kernel.memory_throughput_pct, 46.7), "{kernel:?}");
    assert!(close(kernel.registers, 52_953_088.0), "{kernel:?}");
    assert_eq!(kernel.static_shared_memory_bytes, 0.0, "{kernel:?}");
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 0, 1, 0)
    );
}

#[tokio::test]
async fn without_nsight_compute_the_system_metrics_are_kept_and_the_gap_is_stated() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let worker = nvml_worker(&app, "/nonexistent/ncu", 3);
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Profiled { note, .. } if note.contains("Nsight Compute")),
        "{outcome:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::Profiled);
    assert!(
        w.state_reason.contains("kernel metrics missing"),
        "{}",
        w.state_reason
    );
    assert!(w.profiles[0].kernel_missing);
    assert_eq!(
        w.profiles[0].system.as_ref().unwrap().exclusive_throughput,
        42.5
    );
}

#[tokio::test]
async fn an_ncu_output_lacking_metrics_keeps_the_system_metrics_and_names_what_is_missing() {
    let mut app = app("").await;
    let mut spec = launch(&["ok"]);
    // A real recording that holds no launch statistics (see ../shared/data/ncu-real).
    let recording = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/ncu-real/actual-param_dropout_nsight162.csv");
    spec.env = [(
        "FAKE_NCU_OUTPUT".to_string(),
        recording.display().to_string(),
    )]
    .into();
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Profiled { note, .. }
            if note.contains("162 kernel(s) read, but the output lacks 4 of the 8 metrics")),
        "{outcome:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::Profiled);
    assert!(
        w.state_reason.contains("kernel metrics missing")
            && w.state_reason.contains("launch__thread_count"),
        "{}",
        w.state_reason
    );
    let profile = &w.profiles[0];
    assert!(
        profile.kernel_missing,
        "a partial profile is never complete"
    );
    assert_eq!(profile.kernel.as_ref().unwrap().threads, 0.0);
    assert_eq!(profile.system.as_ref().unwrap().exclusive_throughput, 42.5);
}

#[tokio::test]
async fn a_failing_workload_is_retried_then_failed_with_its_error() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["fail"]))))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 2);
    let first = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&first, RunOutcome::WillRetry { attempt: 1, .. }),
        "{first:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert!(
        w.state_reason.contains("attempt 1 of 2"),
        "{}",
        w.state_reason
    );

    let second = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(matches!(&second, RunOutcome::Failed { .. }), "{second:?}");
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::Failed);
    assert!(
        w.state_reason.contains("out of memory (simulated)"),
        "{}",
        w.state_reason
    );
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 0, 0, 1)
    );
    assert_eq!(
        worker.run_once(&CancellationToken::new()).await.unwrap(),
        RunOutcome::Idle
    );
}

#[tokio::test]
async fn a_workload_without_a_throughput_line_fails_its_attempt() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["silent"]))))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 1)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Failed { error, .. } if error.contains("COLOC_THROUGHPUT")),
        "{outcome:?}"
    );
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Failed
    );
}

#[tokio::test]
async fn a_time_limit_kills_the_whole_process_group() {
    let mut app = app("").await;
    let pid_file = app.dir.path().join("grandchild.pid");
    let mut spec = launch(&["hang", pid_file.to_str().unwrap()]);
    // Long enough for the child to start its grandchild on a loaded machine (with 1 s the
    // child was sometimes killed before the grandchild existed, and the test saw nothing).
    spec.timeout_secs = 3;
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::WillRetry { error, .. } if error.contains("killed")),
        "{outcome:?}"
    );
    let grandchild = wait_for_file(&pid_file).await;
    assert!(
        eventually_dead(grandchild).await,
        "grandchild {grandchild} survived the time limit"
    );
}

#[tokio::test]
async fn deleting_a_workload_stops_its_running_job() {
    let mut app = app("").await;
    let pid_file = app.dir.path().join("grandchild.pid");
    app.client
        .register_workload(register(
            "w",
            Some(launch(&["hang", pid_file.to_str().unwrap()])),
        ))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let running = tokio::spawn(async move { worker.run_once(&CancellationToken::new()).await });
    let grandchild = wait_for_file(&pid_file).await;
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: "w".into() })
        .await
        .unwrap();
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Cancelled { .. }),
        "{outcome:?}"
    );
    assert!(
        eventually_dead(grandchild).await,
        "the workload kept running after its deletion"
    );
    assert_eq!(app.count("profiling_jobs").await, 0);
}

#[tokio::test]
async fn a_shutdown_puts_the_running_job_back_without_counting_the_attempt() {
    let mut app = app("").await;
    let pid_file = app.dir.path().join("grandchild.pid");
    app.client
        .register_workload(register(
            "w",
            Some(launch(&["hang", pid_file.to_str().unwrap()])),
        ))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let running = tokio::spawn(async move { worker.run_once(&stop).await });
    let grandchild = wait_for_file(&pid_file).await;
    shutdown.cancel();
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Interrupted { .. }),
        "{outcome:?}"
    );
    assert!(eventually_dead(grandchild).await);
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (1, 0, 0, 0)
    );
    let attempts = app.query_i64("SELECT attempts FROM profiling_jobs").await;
    assert_eq!(attempts, 0);
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::PendingProfile
    );
}

#[tokio::test]
async fn a_job_running_when_the_process_died_is_pending_again_after_a_restart() {
    let app = app("").await;
    let mut client = app.client.clone();
    client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    // The worker claims the job and the process dies before it finishes.
    let claimed = app
        .advisor
        .store()
        .claim_next_job(0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.attempts, 1);
    assert_eq!(
        app.advisor.store().job_counts().await.unwrap(),
        (0, 1, 0, 0)
    );
    let dir = app.stop().await;

    let restarted = spawn_app_with_config(dir, &config("")).await;
    assert_eq!(
        restarted.advisor.store().job_counts().await.unwrap(),
        (1, 0, 0, 0)
    );
    let outcome = nvml_worker(&restarted, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_workload_gets_only_the_allow_listed_environment_and_its_gpu() {
    let mut app = app("env_allowlist = [\"PATH\"]\n").await;
    let env_file = app.dir.path().join("env.txt");
    let mut spec = launch(&["env", env_file.to_str().unwrap()]);
    spec.env = [("MY_SETTING".to_string(), "on".to_string())].into();
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, "/nonexistent/ncu", 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    let names: Vec<String> = std::fs::read_to_string(&env_file)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // The interpreter chain adds a few of its own (a pyenv shim exports PYENV_*, a shell
    // PWD and SHLVL, Python LC_CTYPE); everything else must come from the worker.
    let added_by_interpreter = |n: &str| {
        n.starts_with("PYENV")
            || n.starts_with("_PYENV")
            || ["PWD", "SHLVL", "LC_CTYPE", "_"].contains(&n)
    };
    let own: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !added_by_interpreter(n))
        .collect();
    assert_eq!(own, ["CUDA_VISIBLE_DEVICES", "MY_SETTING", "PATH"]);
    // Nothing of the worker's own environment leaks but PATH.
    for (name, _) in std::env::vars() {
        if name != "PATH" && !added_by_interpreter(&name) {
            assert!(!names.contains(&name), "{name} leaked into the workload");
        }
    }
    assert!(
        std::env::var("CARGO_MANIFEST_DIR").is_ok(),
        "the test process has more variables"
    );
}

#[tokio::test]
async fn the_nvml_backend_waits_with_a_visible_reason_when_nvml_cannot_start() {
    if NvmlSampler::init(0).is_ok() {
        eprintln!("NVML works on this machine: the no-driver path cannot be exercised here");
        return;
    }
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let settings = app.settings.profiler.clone();
    let backend = Backend::Nvml(NvmlBackend::new(settings.clone(), None));
    let worker = Worker::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Arc::new(backend),
        settings,
    );
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Waiting { reason, .. } if reason.contains("NVML")),
        "{outcome:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert!(w.state_reason.contains("NVML"), "{}", w.state_reason);
    let attempts = app.query_i64("SELECT attempts FROM profiling_jobs").await;
    assert_eq!(attempts, 0, "waiting for NVML is not a failed attempt");
}

#[tokio::test]
async fn the_nvml_backend_fails_a_workload_that_has_no_launch_spec() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", None))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Failed { error, .. } if error.contains("launch spec")),
        "{outcome:?}"
    );
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Failed
    );
}

#[tokio::test]
async fn the_replay_backend_profiles_from_the_dataset_and_the_workload_ranks_at_once() {
    let mut app = app("").await;
    let gpu = coloc::domain::GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&app.advisor, &kace_dir(), &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    // A workload of the dataset with no measured pairs, registered anew without a profile.
    let name = "vit-base-patch16-224_batch1-inf";
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: name.into() })
        .await
        .unwrap();
    app.client
        .register_workload(register(name, None))
        .await
        .unwrap();
    app.client
        .register_workload(register("not-in-the-dataset", None))
        .await
        .unwrap();
    let settings = ProfilerSettings {
        backend: coloc::settings::ProfilerBackend::Replay,
        replay_dir: Some(kace_dir()),
        ..app.settings.profiler.clone()
    };
    let backend = Backend::from_settings(&settings).unwrap();
    let worker = Worker::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Arc::new(backend),
        settings,
    );

    let first = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(&first, RunOutcome::Profiled { workload, .. } if workload.as_str() == name),
        "{first:?}"
    );
    let second = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(matches!(&second, RunOutcome::Failed { .. }), "{second:?}");

    let w = workload(&mut app, name).await;
    assert_eq!(w.state(), pb::WorkloadState::Profiled);
    assert_eq!(w.profiles[0].source(), pb::ProfileSource::Replay);
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: name.into(),
            top_k: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ranked.ranked.len(), 3);
}

#[tokio::test]
async fn the_server_runs_its_worker_and_stops_it_cleanly() {
    let extra = format!(
        "backend = \"replay\"\nreplay_dir = \"{}\"\npoll_interval_ms = 20\n",
        kace_dir().display()
    );
    let mut app = app(&extra).await;
    let name = "whisper-large-v2_batch8-inf";
    app.client
        .register_workload(register(name, None))
        .await
        .unwrap();
    // The server's own worker profiles it in the background.
    let mut state = pb::WorkloadState::PendingProfile;
    for _ in 0..500 {
        state = workload(&mut app, name).await.state();
        if state != pb::WorkloadState::PendingProfile {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, pb::WorkloadState::Profiled);
    app.stop().await;
}

/// The store refuses writes right after the worker claimed a job (the write lock held by
/// another process, a full disk): the worker keeps retrying the job's outcome until the
/// store takes it, so the job never stays RUNNING with no worker running it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_state_write_after_a_claim_is_retried_until_it_lands() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let store = app.advisor.store().clone();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let running = tokio::spawn(async move { worker.run_once(&CancellationToken::new()).await });
    // Claimed: the workload's child processes take tens of milliseconds from here.
    let claimed = std::time::Instant::now();
    while store.job_counts().await.unwrap().1 == 0 {
        assert!(claimed.elapsed() < Duration::from_secs(10), "never claimed");
        tokio::task::yield_now().await;
    }
    store.faults().fail_commits(true);
    let failing = std::time::Instant::now();
    while store.write_health().failures() == 0 {
        assert!(
            failing.elapsed() < Duration::from_secs(10),
            "the worker never tried to write"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Still claimed while the store refuses the outcome.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !running.is_finished(),
        "the worker gave up on the job's outcome"
    );
    store.faults().fail_commits(false);
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    assert_eq!(store.job_counts().await.unwrap(), (0, 0, 1, 0));
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Profiled
    );
}

/// Another process holds SQLite's write lock for longer than the busy timeout (5 s) right
/// after the worker claimed a job: the worker's write of the outcome fails with "database
/// is locked" and is tried again until the lock is gone; the job ends done, never stranded
/// in RUNNING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_busy_timeout_delays_the_outcome_but_never_strands_the_job() {
    use sqlx::{Connection, Executor};

    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok"]))))
        .await
        .unwrap();
    let store = app.advisor.store().clone();
    let mut holder = sqlx::SqliteConnection::connect(&database_url(&app.dir))
        .await
        .unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let running = tokio::spawn(async move { worker.run_once(&CancellationToken::new()).await });
    let claimed = std::time::Instant::now();
    while store.job_counts().await.unwrap().1 == 0 {
        assert!(claimed.elapsed() < Duration::from_secs(10), "never claimed");
        tokio::task::yield_now().await;
    }
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let locked = std::time::Instant::now();
    while store.write_health().failures() == 0 {
        assert!(
            locked.elapsed() < Duration::from_secs(30),
            "the worker's write never timed out on the lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !running.is_finished(),
        "the worker gave up on the job's outcome"
    );
    assert_eq!(store.job_counts().await.unwrap().1, 1, "still claimed");
    holder.execute("ROLLBACK").await.unwrap();
    let outcome = running.await.unwrap().unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    assert_eq!(store.job_counts().await.unwrap(), (0, 0, 1, 0));
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Profiled
    );
}

/// The allow-list `<dir>/*` admits only files that really are in `<dir>`: no `..` climbing
/// out, no symlink to a program elsewhere, no deeper folder; and a file swapped for a
/// symlink after registration is refused right before the launch.
#[tokio::test]
async fn the_allow_list_cannot_be_escaped_by_dots_symlinks_or_subfolders() {
    let jobs = TempDir::new().unwrap();
    let jobs_dir = std::fs::canonicalize(jobs.path()).unwrap();
    std::fs::create_dir_all(jobs_dir.join("a/b")).unwrap();
    let workload_copy = jobs_dir.join("workload.py");
    std::fs::copy(fake_workload(), &workload_copy).unwrap();
    std::fs::copy(fake_workload(), jobs_dir.join("a/b/c")).unwrap();
    std::os::unix::fs::symlink("/bin/sh", jobs_dir.join("sh")).unwrap();
    let config = format!(
        "[profiler]\nallowed_programs = [\"{}/*\"]\nretry_backoff_secs = 0\nsample_interval_ms = 1\n",
        jobs_dir.display()
    );
    let mut app = spawn_app_with_config(Arc::new(TempDir::new().unwrap()), &config).await;
    let before = app.dump_store().await;
    for program in [
        format!("{}/../../../../bin/sh", jobs_dir.display()),
        format!("{}/sh", jobs_dir.display()),
        format!("{}/a/b/c", jobs_dir.display()),
    ] {
        let mut spec = launch(&["ok"]);
        spec.program = program.clone();
        let message = expect_code(
            app.client
                .register_workload(register("w", Some(spec)))
                .await,
            Code::PermissionDenied,
        );
        assert!(message.contains("allowed_programs"), "{program}: {message}");
    }
    assert_eq!(app.dump_store().await, before);

    // Allowed at registration, swapped for a symlink to /bin/sh before the worker runs it.
    let mut spec = launch(&["ok"]);
    spec.program = workload_copy.display().to_string();
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    std::fs::remove_file(&workload_copy).unwrap();
    std::os::unix::fs::symlink("/bin/sh", &workload_copy).unwrap();
    let worker = nvml_worker(&app, &fake_ncu(), 3);
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    let RunOutcome::Failed { error, .. } = &outcome else {
        panic!("the swapped program was not refused: {outcome:?}");
    };
    assert!(error.contains("resolves to /"), "{error}");
    assert_eq!(
        workload(&mut app, "w").await.state(),
        pb::WorkloadState::Failed
    );
}

/// Runs one statement on the test's database file, beside the server.
async fn execute_sql(app: &TestApp, statement: &str) {
    let url = crate::helpers::database_url(&app.dir);
    let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
        .execute(&mut connection)
        .await
        .unwrap();
}

/// Makes the store refuse (a constraint of its own, not a storage fault) every update of
/// a job's state that matches `when`.
async fn refuse_job_updates(app: &TestApp, when: &str) {
    execute_sql(
        app,
        "CREATE TABLE IF NOT EXISTS refusals (n INTEGER CHECK (n > 0))",
    )
    .await;
    execute_sql(
        app,
        &format!(
            "CREATE TRIGGER refuse_job_updates AFTER UPDATE OF state ON profiling_jobs \
             WHEN {when} BEGIN INSERT INTO refusals VALUES (0); END"
        ),
    )
    .await;
}

/// The store refuses to mark the job failed: the worker hands the job back (a counted
/// attempt) instead of leaving it RUNNING with nobody running it.
#[tokio::test]
async fn a_job_whose_failure_is_refused_is_handed_back_not_left_running() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["fail"]))))
        .await
        .unwrap();
    refuse_job_updates(&app, "NEW.state = 'failed'").await;
    let worker = nvml_worker(&app, &fake_ncu(), 1);
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_once(&CancellationToken::new()),
    )
    .await
    .expect("the worker kept retrying a refused write")
    .unwrap();
    let RunOutcome::HandedBack { reason, .. } = &outcome else {
        panic!("the job was not handed back: {outcome:?}");
    };
    assert!(
        reason.contains("failing the job was refused") && reason.contains("back in the queue"),
        "{reason}"
    );
    let store = app.advisor.store().clone();
    assert_eq!(store.job_counts().await.unwrap(), (1, 0, 0, 0));
    assert_eq!(
        app.query_i64("SELECT attempts FROM profiling_jobs").await,
        1
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::PendingProfile);
    assert_eq!(&w.state_reason, reason);
    // A refusal is no storage fault: health stays as it was.
    assert!(!store.write_health().failing());
}

/// Every change of the running job's state is refused: the worker keeps the job as
/// unsettled and hands it back before it claims anything else, so the job does not stay
/// RUNNING once the store takes writes again.
#[tokio::test]
async fn a_job_left_claimed_by_refused_writes_is_handed_back_before_the_next_claim() {
    let app = app("").await;
    app.client
        .clone()
        .register_workload(register("w", Some(launch(&["fail"]))))
        .await
        .unwrap();
    refuse_job_updates(&app, "OLD.state = 'running'").await;
    let worker = nvml_worker(&app, &fake_ncu(), 1);
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_once(&CancellationToken::new()),
    )
    .await
    .expect("the worker kept retrying a refused write")
    .unwrap_err();
    assert!(
        format!("{error:#}").contains("could not be handed back"),
        "{error:#}"
    );
    let store = app.advisor.store();
    assert_eq!(store.job_counts().await.unwrap(), (0, 1, 0, 0));
    // Still refused: the worker claims nothing new while it holds the job.
    assert!(worker.run_once(&CancellationToken::new()).await.is_err());
    assert_eq!(store.job_counts().await.unwrap(), (0, 1, 0, 0));

    execute_sql(&app, "DROP TRIGGER refuse_job_updates").await;
    // Handed back first, then claimed again and failed for good, as it should have been.
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(matches!(outcome, RunOutcome::Failed { .. }), "{outcome:?}");
    assert_eq!(store.job_counts().await.unwrap(), (0, 0, 0, 1));
}

/// The kept readings replay: the recording's GPU, then its readings in the order served
/// (the last one repeats once the recording is used up).
fn the_kept_readings_replay(recording: &Path, folder: &Path) {
    let recorded: Vec<serde_json::Value> = std::fs::read_to_string(recording)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kept: Vec<serde_json::Value> = std::fs::read_to_string(folder.join("nvml_samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(kept.len() >= 2, "{kept:?}");
    assert_eq!(kept[0], recorded[0]);
    for (i, sample) in kept[1..].iter().enumerate() {
        assert_eq!(
            sample,
            &recorded[(i + 1).min(recorded.len() - 1)],
            "sample {i}"
        );
    }
    RecordedSampler::from_file(&folder.join("nvml_samples.jsonl")).unwrap();
}

/// The command lines and output of both phases, as run.
fn the_kept_command_lines_are_the_ones_run(folder: &Path) {
    let lines = |file: &str| -> Vec<String> {
        std::fs::read_to_string(folder.join(file))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let system = lines("system_command.txt");
    assert!(system[0].ends_with("fake_workload.py"), "{system:?}");
    assert_eq!(system[1..3], ["ok", "42.5"]);
    assert!(system.last().unwrap().starts_with("# environment: "));
    let kernel = lines("kernel_command.txt");
    assert_eq!(kernel[0], fake_ncu());
    assert!(kernel.iter().any(|a| a == "--nvtx-include"), "{kernel:?}");
    assert!(
        kernel.iter().any(|a| a.ends_with("fake_workload.py")),
        "{kernel:?}"
    );
    assert!(lines("system_stdout.txt").contains(&"COLOC_THROUGHPUT 42.5 samples/s".to_string()));
}

/// With `profiler.keep_raw_dir`, a profile leaves its raw measurements in a folder of its
/// own: the NVML readings as a recording that replays (the readings the worker was served,
/// in order), ncu's CSV from which the stored kernel metrics are rebuilt exactly, and the
/// command lines and output of both phases.
#[tokio::test]
async fn the_raw_measurements_of_a_profile_are_kept_when_asked() {
    let mut app = app("").await;
    app.client
        .register_workload(register("w", Some(launch(&["ok", "42.5"]))))
        .await
        .unwrap();
    let raw = TempDir::new().unwrap();
    let recording = fixtures().join("nvml/synthetic_samples.jsonl");
    let settings = ProfilerSettings {
        ncu_path: fake_ncu().into(),
        keep_raw_dir: Some(raw.path().to_path_buf()),
        ..app.settings.profiler.clone()
    };
    let backend = NvmlBackend::new(
        settings.clone(),
        Some(Arc::new(RecordedSampler::from_file(&recording).unwrap())),
    );
    let worker = Worker::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Arc::new(Backend::Nvml(backend)),
        settings,
    );
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );
    // A system phase that fails (no throughput line) still leaves its readings and output.
    app.client
        .register_workload(register("s", Some(launch(&["silent"]))))
        .await
        .unwrap();
    let outcome = worker.run_once(&CancellationToken::new()).await.unwrap();
    assert!(
        !matches!(outcome, RunOutcome::Profiled { .. }),
        "{outcome:?}"
    );

    let mut folders: Vec<PathBuf> = std::fs::read_dir(raw.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    folders.sort();
    assert_eq!(folders.len(), 2, "{folders:?}");
    let failed = &folders[0];
    assert!(failed
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("s-"));
    let mut kept: Vec<String> = std::fs::read_dir(failed)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            "nvml_samples.jsonl",
            "system_command.txt",
            "system_stderr.txt",
            "system_stdout.txt"
        ]
    );
    let folder = &folders[1];
    let name = folder.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.strip_prefix("w-")
            .is_some_and(|ms| ms.parse::<u64>().is_ok()),
        "{name}"
    );

    the_kept_readings_replay(&recording, folder);
    // ncu's CSV rebuilds the stored kernel metrics exactly.
    let text = std::fs::read_to_string(folder.join("ncu.csv")).unwrap();
    let rebuilt = coloc::profiler::ncu::parse(&text)
        .unwrap()
        .kernel_metrics()
        .unwrap();
    let w = workload(&mut app, "w").await;
    let stored = w.profiles[0].kernel.as_ref().unwrap();
    assert_eq!(
        (
            rebuilt.threads,
            rebuilt.compute_throughput_pct,
            rebuilt.registers
        ),
        (
            stored.threads,
            stored.compute_throughput_pct,
            stored.registers
        )
    );

    the_kept_command_lines_are_the_ones_run(folder);
}
