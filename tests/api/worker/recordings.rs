//! The nvml backend on real recordings: the H100 readings against an independent reading
//! of the same file, what a profile keeps with and without Nsight Compute, and the raw
//! measurements kept when asked.

use super::*;

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

/// A cluster that forbids performance counters (ncu: ERR_NVGPUCTRPERM) still gets a
/// profile: stored NVML-only (kernel_missing), with the reason in the workload's
/// state_reason, rather than a failed job.
#[tokio::test]
async fn counters_forbidden_to_ncu_store_the_profile_nvml_only_with_the_reason() {
    let mut app = app("").await;
    let mut spec = launch(&["ok"]);
    let output = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ncu/err_nvgpuctrperm.log");
    spec.env = [("FAKE_NCU_OUTPUT".to_string(), output.display().to_string())].into();
    app.client
        .register_workload(register("w", Some(spec)))
        .await
        .unwrap();
    let outcome = nvml_worker(&app, &fake_ncu(), 3)
        .run_once(&CancellationToken::new())
        .await
        .unwrap();
    assert!(
        matches!(&outcome, RunOutcome::Profiled { note, .. } if note.contains("ERR_NVGPUCTRPERM")),
        "{outcome:?}"
    );
    let w = workload(&mut app, "w").await;
    assert_eq!(w.state(), pb::WorkloadState::Profiled);
    assert!(
        w.state_reason.contains("ERR_NVGPUCTRPERM") && w.state_reason.contains("NVML-only"),
        "{}",
        w.state_reason
    );
    let profile = &w.profiles[0];
    assert!(profile.kernel_missing);
    assert_eq!(profile.kernel.as_ref().unwrap().threads, 0.0);
    assert_eq!(profile.system.as_ref().unwrap().exclusive_throughput, 42.5);
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
