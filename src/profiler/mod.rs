//! Profiling a workload once, alone, on the dedicated profiling GPU. Backends behind one
//! type: `nvml` runs the workload from its launch spec — once while sampling NVML (system
//! metrics, throughput) and once under Nsight Compute for one step (kernel metrics) —
//! and `replay` serves profiles from a KACE-format dataset (demos, CI).

pub mod calibrate;
pub mod gpu;
pub mod ncu;
pub mod runner;
pub mod upload;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use tokio_util::sync::CancellationToken;

pub use gpu::{GpuInfo, GpuSample, GpuSampler, NvmlSampler, RecordedSampler};
use runner::{RunError, RunSpec};

use crate::{
    dataset::KaceDataset,
    domain::{
        gb_from_bytes, now_ms, AllowedPrograms, GpuName, KernelMetrics, LaunchSpec, Profile,
        ProfileSource, SystemMetrics, WorkloadName, DEFAULT_NVTX_RANGE,
    },
    settings::{ProfilerBackend, ProfilerSettings},
    sync::Unpoisoned,
};

/// Why a profile could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The backend cannot run at all now (no NVML): the job waits, no attempt is counted.
    #[error("{0}")]
    Unavailable(String),
    /// This attempt failed; another may succeed.
    #[error("{0}")]
    Failed(String),
    /// No attempt can succeed (no launch spec; not in the replay dataset).
    #[error("{0}")]
    Permanent(String),
    #[error("cancelled")]
    Cancelled,
}

/// A measured profile, and anything the operator should know about it.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub profile: Profile,
    /// E.g. that Nsight Compute was not available; empty when complete.
    pub note: String,
    /// Seconds the system (NVML) and kernel (ncu) phases took.
    pub phase_secs: (f64, f64),
}

pub enum Backend {
    Off,
    Replay(ReplayBackend),
    Nvml(NvmlBackend),
}

impl Backend {
    /// The backend the settings ask for. A machine without an NVIDIA driver still starts:
    /// the nvml backend says so once here, and then on each job it cannot run (the job
    /// waits, with the reason visible on the workload).
    pub fn from_settings(settings: &ProfilerSettings) -> anyhow::Result<Self> {
        Ok(match settings.backend {
            ProfilerBackend::Replay => Self::Replay(ReplayBackend::load(
                settings.replay_dir.as_deref().unwrap_or(Path::new("")),
                GpuName::parse("profiler.replay_gpu", &settings.replay_gpu)
                    .map_err(|e| anyhow::anyhow!(e.message))?,
                settings.replay_gpu_memory_gb,
            )?),
            ProfilerBackend::Nvml if settings.nvml_recording.is_some() => {
                let path = settings.nvml_recording.as_deref().unwrap_or(Path::new(""));
                let recorded = RecordedSampler::from_file(path).map_err(|e| {
                    anyhow::anyhow!("setting profiler.nvml_recording is invalid: {e}")
                })?;
                Self::Nvml(NvmlBackend::new(
                    settings.clone(),
                    Some(Arc::new(recorded) as Arc<dyn GpuSampler>),
                ))
            }
            ProfilerBackend::Nvml => {
                let sampler = match NvmlSampler::init(settings.gpu_index) {
                    Ok(sampler) => Some(Arc::new(sampler) as Arc<dyn GpuSampler>),
                    Err(error) => {
                        tracing::warn!(%error, "NVML is unavailable: profiling jobs will wait until it is");
                        None
                    }
                };
                Self::Nvml(NvmlBackend::new(settings.clone(), sampler))
            }
            ProfilerBackend::Off => Self::Off,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Replay(_) => "replay",
            Self::Nvml(_) => "nvml",
        }
    }

    /// The GPU model this backend measures on and its memory (GB), when it can tell:
    /// the replay backend's setting, NVML's (or the recording's) first GPU answer.
    pub fn gpu(&self) -> Result<(GpuName, f64), String> {
        match self {
            Self::Off => Err("profiling is off (profiler.backend = \"off\")".into()),
            Self::Replay(replay) => Ok((replay.gpu.clone(), replay.gpu_memory_gb)),
            Self::Nvml(nvml) => {
                let sampler = nvml.sampler().map_err(|e| e.to_string())?;
                let info = sampler.info()?;
                let gpu = GpuName::parse("gpu", info.name.trim())
                    .map_err(|e| format!("NVML names the GPU oddly: {}", e.message))?;
                Ok((gpu, gb_from_bytes(info.total_memory_bytes)))
            }
        }
    }

    pub async fn profile(
        &self,
        workload: &WorkloadName,
        launch: Option<&LaunchSpec>,
        cancel: &CancellationToken,
    ) -> Result<Measurement, ProfileError> {
        match self {
            Self::Off => Err(ProfileError::Unavailable(
                "profiling is off (profiler.backend = \"off\")".into(),
            )),
            Self::Replay(replay) => replay.profile(workload),
            Self::Nvml(nvml) => nvml.profile(workload, launch, cancel).await,
        }
    }
}

/// Serves profiles recorded in a KACE-format dataset, by workload name.
pub struct ReplayBackend {
    gpu: GpuName,
    gpu_memory_gb: f64,
    profiles: HashMap<String, (KernelMetrics, SystemMetrics)>,
}

impl ReplayBackend {
    pub fn load(dir: &Path, gpu: GpuName, gpu_memory_gb: f64) -> anyhow::Result<Self> {
        let dataset = KaceDataset::read(dir)?;
        let profiles = dataset
            .workloads
            .into_iter()
            .map(|w| (w.name.to_string(), (w.kernel, w.system)))
            .collect();
        Ok(Self {
            gpu,
            gpu_memory_gb,
            profiles,
        })
    }

    fn profile(&self, workload: &WorkloadName) -> Result<Measurement, ProfileError> {
        let (kernel, system) = self.profiles.get(workload.as_str()).ok_or_else(|| {
            ProfileError::Permanent(format!(
                "the replay dataset has no workload named {workload}"
            ))
        })?;
        Ok(Measurement {
            profile: Profile {
                gpu: self.gpu.clone(),
                kernel: *kernel,
                system: system.clone(),
                source: ProfileSource::Replay,
                gpu_memory_gb: Some(self.gpu_memory_gb),
                measured_at_ms: now_ms(),
                kernel_missing: false,
            },
            note: String::new(),
            phase_secs: (0.0, 0.0),
        })
    }
}

/// Measures on this machine's GPU: NVML for the system phase, Nsight Compute for the
/// kernel phase.
pub struct NvmlBackend {
    /// Boxed: the settings are most of the backend's size, and `Backend` holds it inline.
    settings: Box<ProfilerSettings>,
    sampler: OnceLock<Arc<dyn GpuSampler>>,
}

fn run_error(phase: &str, error: RunError) -> ProfileError {
    match error {
        RunError::Cancelled => ProfileError::Cancelled,
        RunError::Spawn { .. } => ProfileError::Permanent(format!("{phase}: {error}")),
        other => ProfileError::Failed(format!("{phase}: {other}")),
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

impl NvmlBackend {
    /// `sampler` replaces NVML (tests, recordings); `None` = NVML, initialised on first use.
    pub fn new(settings: ProfilerSettings, sampler: Option<Arc<dyn GpuSampler>>) -> Self {
        let cell = OnceLock::new();
        if let Some(sampler) = sampler {
            let _ = cell.set(sampler);
        }
        Self {
            settings: Box::new(settings),
            sampler: cell,
        }
    }

    fn sampler(&self) -> Result<Arc<dyn GpuSampler>, ProfileError> {
        if let Some(sampler) = self.sampler.get() {
            return Ok(sampler.clone());
        }
        let sampler: Arc<dyn GpuSampler> =
            Arc::new(NvmlSampler::init(self.settings.gpu_index).map_err(|e| {
                ProfileError::Unavailable(format!(
                    "{e}; the nvml backend needs the NVIDIA driver on this machine"
                ))
            })?);
        Ok(self.sampler.get_or_init(|| sampler).clone())
    }

    fn run_spec(&self, launch: &LaunchSpec, timeout_secs: u64) -> RunSpec {
        launch_run_spec(&self.settings, launch, timeout_secs)
    }

    async fn profile(
        &self,
        workload: &WorkloadName,
        launch: Option<&LaunchSpec>,
        cancel: &CancellationToken,
    ) -> Result<Measurement, ProfileError> {
        let launch = launch.ok_or_else(|| {
            ProfileError::Permanent(
                "the workload has no launch spec; the nvml backend runs workloads from one".into(),
            )
        })?;
        // Checked again right before the launch: the file, a symlink on its path or the
        // allow-list may have changed since registration. The resolved path is what runs.
        let allowed = AllowedPrograms::new(&self.settings.allowed_programs)
            .map_err(ProfileError::Permanent)?;
        let resolved = allowed.resolve(&launch.program).map_err(|reason| {
            ProfileError::Permanent(format!(
                "program {:?} is not allowed by profiler.allowed_programs: {reason}",
                launch.program
            ))
        })?;
        let launch = &LaunchSpec {
            program: resolved.to_string_lossy().into_owned(),
            ..launch.clone()
        };
        let sampler = self.sampler()?;
        let info = sampler.info().map_err(ProfileError::Unavailable)?;
        let gpu = GpuName::parse("gpu", info.name.trim()).map_err(|e| {
            ProfileError::Unavailable(format!("NVML names the GPU oddly: {}", e.message))
        })?;

        let raw = self
            .settings
            .keep_raw_dir
            .as_deref()
            .and_then(|dir| RawRecord::create(dir, workload));

        let started = std::time::Instant::now();
        let (system, samples) = self
            .system_phase(launch, sampler.as_ref(), &info, raw.as_ref(), cancel)
            .await?;
        let system_secs = started.elapsed().as_secs_f64();
        tracing::info!(
            samples = samples.len(),
            secs = system_secs,
            "system phase done"
        );

        let started = std::time::Instant::now();
        let (kernel, kernel_missing, note) =
            match find_ncu(&self.settings.ncu_path.to_string_lossy()) {
                None => (
                    KernelMetrics::MISSING,
                    true,
                    format!(
                        "kernel metrics missing: Nsight Compute was not found at {:?} \
                     (profiler.ncu_path); {NVML_ONLY_NOTE}",
                        self.settings.ncu_path
                    ),
                ),
                Some(ncu) => match self
                    .kernel_phase(&ncu, launch, raw.as_ref(), cancel)
                    .await?
                {
                    Ok(kernel) => (kernel, false, String::new()),
                    // Another attempt would print the same: keep the system metrics and say
                    // why the kernel metrics are missing.
                    Err(why) => (
                        KernelMetrics::MISSING,
                        true,
                        format!("kernel metrics missing: {why}; {NVML_ONLY_NOTE}"),
                    ),
                },
            };
        let kernel_secs = started.elapsed().as_secs_f64();
        tracing::info!(secs = kernel_secs, kernel_missing, "kernel phase done");

        let profile = Profile {
            gpu,
            kernel,
            system,
            source: ProfileSource::Measured,
            gpu_memory_gb: Some(gb_from_bytes(info.total_memory_bytes)),
            measured_at_ms: now_ms(),
            kernel_missing,
        };
        profile
            .validate()
            .map_err(|e| ProfileError::Failed(format!("the measured profile is invalid: {e}")))?;
        Ok(Measurement {
            profile,
            note,
            phase_secs: (system_secs, kernel_secs),
        })
    }

    /// Runs the workload alone while sampling NVML; returns its system metrics and the
    /// samples.
    async fn system_phase(
        &self,
        launch: &LaunchSpec,
        sampler: &dyn GpuSampler,
        info: &GpuInfo,
        raw: Option<&RawRecord>,
        cancel: &CancellationToken,
    ) -> Result<(SystemMetrics, Vec<GpuSample>), ProfileError> {
        let spec = self.run_spec(launch, self.settings.system_timeout_secs);
        if let Some(raw) = raw {
            raw.write_command("system", &spec);
        }
        let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
        let samples = std::sync::Mutex::new(Vec::new());
        let sampling_error = std::sync::Mutex::new(None);
        let run = runner::run(&spec, cancel, |pid| {
            let _ = pid_tx.send(pid);
        });
        // Samples until the run ends (select! then drops this loop); never finishes itself.
        let sampling = async {
            if let Ok(group) = pid_rx.await {
                let mut ticker =
                    tokio::time::interval(Duration::from_millis(self.settings.sample_interval_ms));
                loop {
                    ticker.tick().await;
                    match sampler.sample(group) {
                        Ok(sample) => samples.lock().unpoisoned().push(sample),
                        Err(error) => {
                            *sampling_error.lock().unpoisoned() = Some(error);
                            break;
                        }
                    }
                }
            }
            std::future::pending::<()>().await
        };
        let output = tokio::select! {
            output = run => output,
            _ = sampling => unreachable!("sampling never finishes"),
        };
        let output = output.map_err(|e| run_error("system phase", e))?;
        if let Some(raw) = raw {
            raw.write("system_stdout.txt", output.stdout.as_bytes());
            raw.write("system_stderr.txt", output.stderr.as_bytes());
            // Kept whatever comes next: a run without activity is when they matter most.
            raw.write_samples(info, &samples.lock().unpoisoned());
        }
        if !output.status.success() {
            return Err(ProfileError::Failed(format!(
                "system phase: the workload exited with {}: {}",
                output.status,
                tail(&output.stderr, 5)
            )));
        }
        if let Some(error) = sampling_error.into_inner().unpoisoned() {
            return Err(ProfileError::Failed(format!(
                "system phase: NVML sampling: {error}"
            )));
        }
        let (exclusive_throughput, throughput_unit) =
            runner::parse_throughput(&output.stdout, launch.throughput_regex.as_deref())
                .map_err(|e| ProfileError::Failed(format!("system phase: {e}")))?;
        let samples = samples.into_inner().unpoisoned();
        let (sm_busy_pct, mem_busy_pct, memory_gb) = gpu::summarize(&samples)
            .map_err(|e| ProfileError::Failed(format!("system phase: {e}")))?;
        Ok((
            SystemMetrics {
                exclusive_throughput,
                throughput_unit,
                sm_busy_pct,
                mem_busy_pct,
                memory_gb,
            },
            samples,
        ))
    }

    /// Runs the workload under Nsight Compute for one step and aggregates its kernels.
    /// `Ok(Err(why))`: ncu may not read the performance counters here (ERR_NVGPUCTRPERM,
    /// [`counters_forbidden`]), or it ran and its output was read but lacks metrics of the method
    /// (a partial profile, never stored as complete).
    async fn kernel_phase(
        &self,
        ncu: &Path,
        launch: &LaunchSpec,
        raw: Option<&RawRecord>,
        cancel: &CancellationToken,
    ) -> Result<Result<KernelMetrics, String>, ProfileError> {
        let selector = match launch.nvtx_range.as_deref() {
            None => ncu::StepSelector::Nvtx {
                range: DEFAULT_NVTX_RANGE.into(),
            },
            Some("") => ncu::StepSelector::Launches {
                skip: self.settings.ncu_launch_skip,
                count: self.settings.ncu_launch_count,
            },
            Some(range) => ncu::StepSelector::Nvtx {
                range: range.into(),
            },
        };
        // ncu writes its table into a file of its own (see `ncu`'s module header).
        let output_dir = tempfile::Builder::new()
            .prefix("coloc-ncu-")
            .tempdir()
            .map_err(|e| {
                ProfileError::Failed(format!(
                    "kernel phase: cannot make a folder for ncu's output: {e}"
                ))
            })?;
        let output_file = output_dir.path().join("ncu.csv");
        let mut spec = self.run_spec(launch, self.settings.kernel_timeout_secs);
        spec.program = ncu.to_string_lossy().into_owned();
        spec.args = ncu::ncu_args(&selector, &output_file);
        spec.args.push(launch.program.clone());
        spec.args.extend(launch.args.iter().cloned());
        if let Some(raw) = raw {
            raw.write_command("kernel", &spec);
        }
        let output = runner::run(&spec, cancel, |_| {})
            .await
            .map_err(|e| run_error("kernel phase", e))?;
        if let Some(raw) = raw {
            raw.write("kernel_stderr.txt", output.stderr.as_bytes());
        }
        let raw = raw.cloned();
        // Reading and parsing a large step's output is CPU work: off the async threads.
        let parsed = tokio::task::spawn_blocking(move || {
            if let Some(raw) = raw {
                // Byte for byte, as ncu wrote it (absent when ncu wrote nothing).
                if let Ok(bytes) = std::fs::read(&output_file) {
                    raw.write("ncu.csv", &bytes);
                }
            }
            let parsed = ncu::read_output_file(&output_file)
                .map(|text| (ncu::parse(&text).map(|table| table.kernel_metrics()), text));
            drop(output_dir);
            parsed
        })
        .await
        .map_err(|e| ProfileError::Failed(format!("kernel phase: reading ncu's output: {e}")))?;
        let text = parsed.as_ref().map_or("", |(_, text)| text.as_str());
        if let Some(said) = counters_forbidden(text).or_else(|| counters_forbidden(&output.stderr))
        {
            return Ok(Err(format!(
                "Nsight Compute may not read this GPU's performance counters here \
                 (ERR_NVGPUCTRPERM: the driver restricts them to administrators, as many \
                 clusters do in containers); ncu said: {said}"
            )));
        }
        if !output.status.success() {
            // ncu's own messages (==ERROR==) are in its output file; the workload's in stderr.
            let said = parsed
                .as_ref()
                .ok()
                .and_then(|(_, text)| {
                    text.lines()
                        .find(|line| line.starts_with("==ERROR=="))
                        .map(str::to_string)
                })
                .unwrap_or_else(|| tail(&output.stderr, 5));
            return Err(ProfileError::Failed(format!(
                "kernel phase: ncu exited with {}: {said}",
                output.status
            )));
        }
        let (built, _) = parsed.map_err(|e| ProfileError::Failed(format!("kernel phase: {e}")))?;
        match built.map_err(|e| ProfileError::Failed(format!("kernel phase: {e}")))? {
            Ok(kernel) => Ok(Ok(kernel)),
            Err(missing @ ncu::NcuError::MissingMetrics { .. }) => {
                Ok(Err(format!("Nsight Compute ran, but {missing}")))
            }
            Err(other) => Err(ProfileError::Failed(format!("kernel phase: {other}"))),
        }
    }
}

/// What a profile without kernel metrics is answered with, said in its note (the
/// workload's `state_reason`).
const NVML_ONLY_NOTE: &str = "stored NVML-only: answered by the model's NVML-only twin, with \
     wider intervals, until profiled again with Nsight Compute";

/// ncu's line saying it may not read the GPU's performance counters (ERR_NVGPUCTRPERM:
/// `NVreg_RestrictProfilingToAdminUsers`, the default in most containers), when `text`
/// holds one.
fn counters_forbidden(text: &str) -> Option<&str> {
    text.lines()
        .find(|line| line.contains("ERR_NVGPUCTRPERM"))
        .map(str::trim)
}

/// A workload's name as one path component: workload names may hold `/` and `.` (so
/// `../escaped` is a valid name), and a folder named after one must stay inside
/// `profiler.keep_raw_dir`. Every character but letters, digits, `-`, `_` and `+` becomes `_`.
fn raw_folder_name(workload: &WorkloadName) -> String {
    workload
        .as_str()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One profile's raw measurements under `profiler.keep_raw_dir`, in a folder of its own
/// (`<workload>-<unix ms>`). Keeping them is a side effect that never fails a profile: a
/// file that cannot be written is logged and left out.
#[derive(Clone)]
struct RawRecord {
    dir: PathBuf,
}

impl RawRecord {
    fn create(base: &Path, workload: &WorkloadName) -> Option<Self> {
        let dir = base.join(format!("{}-{}", raw_folder_name(workload), now_ms()));
        match std::fs::create_dir_all(&dir) {
            Ok(()) => Some(Self { dir }),
            Err(error) => {
                tracing::warn!(%error, dir = %dir.display(), "cannot keep the raw measurements");
                None
            }
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        let path = self.dir.join(name);
        if let Err(error) = std::fs::write(&path, bytes) {
            tracing::warn!(%error, path = %path.display(), "cannot keep a raw measurement");
        }
    }

    /// The command line of a phase (program and arguments, one per line, then the
    /// environment's names: their values may be secrets).
    fn write_command(&self, phase: &str, spec: &RunSpec) {
        let mut text = format!("{}\n", spec.program);
        for arg in &spec.args {
            text.push_str(arg);
            text.push('\n');
        }
        text.push_str("# environment: ");
        text.push_str(&spec.env.keys().cloned().collect::<Vec<_>>().join(" "));
        text.push('\n');
        self.write(&format!("{phase}_command.txt"), text.as_bytes());
    }

    /// The NVML readings as a recording that `profiler.nvml_recording` replays.
    fn write_samples(&self, info: &GpuInfo, samples: &[GpuSample]) {
        let lines = std::iter::once(serde_json::to_string(info))
            .chain(samples.iter().map(serde_json::to_string))
            .collect::<Result<Vec<_>, _>>();
        match lines {
            Ok(lines) => self.write("nvml_samples.jsonl", (lines.join("\n") + "\n").as_bytes()),
            Err(error) => tracing::warn!(%error, "cannot write the NVML readings"),
        }
    }
}

/// How a launch spec runs on the profiling GPU under these settings.
pub fn launch_run_spec(
    settings: &ProfilerSettings,
    launch: &LaunchSpec,
    timeout_secs: u64,
) -> RunSpec {
    RunSpec {
        program: launch.program.clone(),
        args: launch.args.clone(),
        env: runner::workload_environment(&settings.env_allowlist, &launch.env, settings.gpu_index),
        working_dir: launch.working_dir.clone(),
        timeout: Duration::from_secs(launch.timeout_secs.map_or(timeout_secs, u64::from)),
        output_limit: settings.output_limit_bytes,
    }
}

/// Where Nsight Compute is, if anywhere.
pub fn find_ncu(path: &str) -> Option<PathBuf> {
    runner::resolve_program(path)
}

/// Nsight Compute's version as `ncu --version` prints it (its last line), or "" when it
/// is not installed or does not answer within 10 s.
pub async fn ncu_version(path: &Path) -> String {
    let Some(ncu) = find_ncu(&path.to_string_lossy()) else {
        return String::new();
    };
    let asked = tokio::process::Command::new(ncu)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(10), asked).await {
        Ok(Ok(output)) if output.status.success() => String::from_utf8_lossy(&output.stdout)
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .chars()
            .take(128)
            .collect(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_named_to_climb_out_keeps_its_raw_measurements_inside_the_folder() {
        let base = tempfile::TempDir::new().unwrap();
        let keep = base.path().join("raw");
        std::fs::create_dir(&keep).unwrap();
        for name in ["../escaped", "a/../../b", "..", "./x", "models/bert:8"] {
            let workload = WorkloadName::parse("name", name).unwrap();
            let record = RawRecord::create(&keep, &workload).expect("created");
            assert_eq!(record.dir.parent(), Some(keep.as_path()), "{name}");
            record.write("probe.txt", b"1");
            assert!(record.dir.join("probe.txt").is_file(), "{name}");
        }
        let outside: Vec<_> = std::fs::read_dir(base.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(outside, vec![std::ffi::OsString::from("raw")]);
    }
}
