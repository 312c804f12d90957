//! `coloc calibrate`: gives a GPU model training data without any scheduler, by running
//! pairs of profiled workloads together on this node's GPU and handing what each one
//! achieved to a [`CalibrationTarget`] (the service, through the agents' API: see
//! `agent::calibrate`), which stores it as a `calibrated` run. Under MPS when
//! `nvidia-cuda-mps-control` is available (the sharing coloc advises on), else plain
//! time-sliced sharing; the run records which (its sharing mode, `time-slicing` without
//! MPS), and so do the member job ids (`calibrate-mps-0`, `calibrate-shared-1`, ...).

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{bail, Context};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::{launch_run_spec, runner};
use crate::{
    domain::{
        now_ms, AllowedPrograms, ColocatedMember, GpuName, LaunchSpec, Observation, WorkloadName,
    },
    settings::ProfilerSettings,
};

/// Where calibration learns which workloads to pair and hands each measured pair.
#[tonic::async_trait]
pub trait CalibrationTarget: Send + Sync {
    /// Every workload with a launch spec and a complete profile on `gpu`, by name.
    async fn workloads(&self, gpu: &GpuName) -> anyhow::Result<Vec<(WorkloadName, LaunchSpec)>>;
    /// Stores one measured run (a run of `gpu`, as `calibrated`). `Ok(Some(why))` when
    /// the target refused this run (e.g. a member was deleted meanwhile): the others go
    /// on. An error stops the calibration.
    async fn store(&self, run: &Observation) -> anyhow::Result<Option<String>>;
}

const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// A start line for the members of a run: each member gets a fresh folder in
/// `COLOC_START_DIR` and the number of members in `COLOC_START_COUNT`. A workload that
/// honours them (the examples do) writes a file into the folder once warmed up and starts
/// its timed window when the folder holds one file per member, so the members measure the
/// same stretch of time together rather than their start-up and each other's absence. A
/// workload that ignores them still runs; its window is then only as shared as its timing.
pub const START_DIR_VAR: &str = "COLOC_START_DIR";
pub const START_COUNT_VAR: &str = "COLOC_START_COUNT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    Mps,
    Shared,
}

impl Sharing {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mps => "mps",
            Self::Shared => "shared",
        }
    }

    /// The run's sharing mode: without MPS, the processes' contexts take turns.
    pub fn mode(self) -> crate::domain::SharingMode {
        match self {
            Self::Mps => crate::domain::SharingMode::Mps,
            Self::Shared => crate::domain::SharingMode::TimeSlicing,
        }
    }
}

#[derive(Debug)]
pub struct CalibrationSummary {
    pub gpu: GpuName,
    pub sharing: Sharing,
    /// (workload, workload, each one's throughput) per stored pair.
    pub measured: Vec<(String, String, f64, f64)>,
    /// Pairs that failed, with why.
    pub failed: Vec<(String, String, String)>,
}

/// The MPS control daemon for the profiling GPU, stopped on drop of the run.
struct Mps {
    control: PathBuf,
    env: BTreeMap<String, String>,
}

impl Mps {
    async fn start(control: PathBuf, settings: &ProfilerSettings) -> anyhow::Result<Self> {
        let base = std::env::temp_dir().join(format!("coloc-mps-{}", std::process::id()));
        let env: BTreeMap<String, String> = [
            ("CUDA_VISIBLE_DEVICES", settings.gpu_index.to_string()),
            (
                "CUDA_MPS_PIPE_DIRECTORY",
                base.join("pipe").display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY",
                base.join("log").display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        std::fs::create_dir_all(base.join("pipe"))?;
        std::fs::create_dir_all(base.join("log"))?;
        let status = tokio::process::Command::new(&control)
            .arg("-d")
            .env_clear()
            .envs(&env)
            .status()
            .await
            .context("cannot start the MPS control daemon")?;
        if !status.success() {
            bail!("the MPS control daemon did not start: {status}");
        }
        Ok(Self { control, env })
    }

    async fn stop(self) {
        let child = tokio::process::Command::new(&self.control)
            .env_clear()
            .envs(&self.env)
            .stdin(std::process::Stdio::piped())
            .spawn();
        if let Ok(mut child) = child {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(b"quit\n").await;
            }
            let _ = child.wait().await;
        }
    }
}

/// Which pairs a calibration runs, and how they share the GPU.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// At most this many pairs.
    pub max_pairs: usize,
    /// Only pairs with one of these workloads in them; empty = every pair.
    pub with: Vec<WorkloadName>,
    /// `None` = MPS when its control program is installed, else plain sharing.
    pub sharing: Option<Sharing>,
}

/// Runs up to `plan.max_pairs` pairs (in name order, a workload with itself included; only
/// those with a member in `plan.with` unless it is empty) of the workloads `target` names
/// (a launch spec and a complete profile on `gpu`, the model of this node's GPU), and hands
/// each measured pair to `target`.
pub async fn calibrate(
    target: &dyn CalibrationTarget,
    gpu: &GpuName,
    settings: &ProfilerSettings,
    plan: &Plan,
    cancel: &CancellationToken,
) -> anyhow::Result<CalibrationSummary> {
    let gpu = gpu.clone();
    let workloads = target.workloads(&gpu).await?;
    if let Some(unknown) = plan
        .with
        .iter()
        .find(|w| !workloads.iter().any(|(name, _)| name == *w))
    {
        bail!(
            "{unknown} has no launch spec and complete profile on {gpu}: it cannot be calibrated"
        );
    }
    // Checked here, on the node that runs them, right before the runs: the service named
    // the programs, this node's profiler.allowed_programs decides (as for profiling).
    let allowed = AllowedPrograms::new(&settings.allowed_programs)
        .map_err(|e| anyhow::anyhow!("setting profiler.allowed_programs is invalid: {e}"))?;
    if workloads.is_empty() {
        bail!("no workload has both a launch spec and a profile on {gpu}: profile some first");
    }
    let pairs = pairs_to_run(&workloads, plan);

    let mps = match (plan.sharing, runner::resolve_program(MPS_CONTROL)) {
        (Some(Sharing::Shared), _) => None,
        (_, Some(control)) => Some(Mps::start(control, settings).await?),
        (Some(Sharing::Mps), None) => {
            bail!("MPS sharing was asked for, but {MPS_CONTROL} is not in PATH")
        }
        (None, None) => None,
    };
    let sharing = if mps.is_some() {
        Sharing::Mps
    } else {
        Sharing::Shared
    };
    tracing::info!(%gpu, sharing = sharing.as_str(), pairs = pairs.len(), "calibrating");

    let mut summary = CalibrationSummary {
        gpu,
        sharing,
        measured: Vec::new(),
        failed: Vec::new(),
    };
    let calibration = Calibration {
        target,
        settings,
        allowed: &allowed,
        mps: mps.as_ref(),
        cancel,
    };
    // The MPS daemon stops whether the pairs all ran or one failed the calibration.
    let ran = calibration.run_pairs(&workloads, pairs, &mut summary).await;
    if let Some(mps) = mps {
        mps.stop().await;
    }
    ran.map(|()| summary)
}

/// The pairs of `workloads` (indices, in order, a workload with itself included) that
/// `plan` asks for.
fn pairs_to_run(workloads: &[(WorkloadName, LaunchSpec)], plan: &Plan) -> Vec<(usize, usize)> {
    let with = &plan.with;
    (0..workloads.len())
        .flat_map(|i| (i..workloads.len()).map(move |j| (i, j)))
        .filter(|&(i, j)| {
            with.is_empty() || with.contains(&workloads[i].0) || with.contains(&workloads[j].0)
        })
        .take(plan.max_pairs)
        .collect()
}

/// What every pair of one calibration runs with.
struct Calibration<'a> {
    target: &'a dyn CalibrationTarget,
    settings: &'a ProfilerSettings,
    allowed: &'a AllowedPrograms,
    mps: Option<&'a Mps>,
    cancel: &'a CancellationToken,
}

impl Calibration<'_> {
    /// Runs the pairs one after another, noting each in `summary`, until they are done or
    /// the calibration is cancelled. An error (a start folder not made, a pair the target
    /// could not store) stops the calibration.
    async fn run_pairs(
        &self,
        workloads: &[(WorkloadName, LaunchSpec)],
        pairs: Vec<(usize, usize)>,
        summary: &mut CalibrationSummary,
    ) -> anyhow::Result<()> {
        let progress = crate::progress::bar(pairs.len() as u64, "pairs");
        for (i, j) in pairs {
            progress.inc(1);
            let (a, launch_a) = &workloads[i];
            let (b, launch_b) = &workloads[j];
            let (launch_a, launch_b) = match self.resolve(launch_a, launch_b) {
                Ok(launches) => launches,
                Err(why) => {
                    tracing::warn!(workload1 = %a, workload2 = %b, %why, "pair not run");
                    summary.failed.push((a.to_string(), b.to_string(), why));
                    continue;
                }
            };
            let started = std::time::Instant::now();
            match self.run_pair(&launch_a, &launch_b).await? {
                Ok((ta, tb)) => {
                    let sharing = summary.sharing;
                    let member = |w: &WorkloadName, t: f64, k: usize| ColocatedMember {
                        workload: w.clone(),
                        throughput: t,
                        job_id: format!("calibrate-{}-{k}", sharing.as_str()),
                    };
                    let mut observation = Observation::new(
                        summary.gpu.clone(),
                        vec![member(a, ta, 0), member(b, tb, 1)],
                        now_ms(),
                    )?;
                    observation.sharing_mode = sharing.mode();
                    match self
                        .target
                        .store(&observation)
                        .await
                        .with_context(|| format!("storing the pair {a} + {b}"))?
                    {
                        None => {
                            tracing::info!(
                                workload1 = %a, workload2 = %b, throughput1 = ta, throughput2 = tb,
                                secs = started.elapsed().as_secs_f64(), "pair measured"
                            );
                            summary
                                .measured
                                .push((a.to_string(), b.to_string(), ta, tb))
                        }
                        Some(why) => {
                            tracing::warn!(workload1 = %a, workload2 = %b, %why, "pair refused");
                            summary.failed.push((a.to_string(), b.to_string(), why));
                        }
                    }
                }
                Err(why) => {
                    tracing::warn!(workload1 = %a, workload2 = %b, %why, "pair failed");
                    summary.failed.push((a.to_string(), b.to_string(), why));
                }
            }
            if self.cancel.is_cancelled() {
                break;
            }
        }
        Ok(())
    }

    /// Both members' launch specs with their programs resolved through
    /// profiler.allowed_programs, or why either may not run.
    fn resolve(
        &self,
        launch_a: &LaunchSpec,
        launch_b: &LaunchSpec,
    ) -> Result<(LaunchSpec, LaunchSpec), String> {
        let resolved = |launch: &LaunchSpec| {
            self.allowed
                .resolve(&launch.program)
                .map(|program| LaunchSpec {
                    program: program.to_string_lossy().into_owned(),
                    ..launch.clone()
                })
                .map_err(|reason| {
                    format!(
                        "program {:?} is not allowed by profiler.allowed_programs: {reason}",
                        launch.program
                    )
                })
        };
        match (resolved(launch_a), resolved(launch_b)) {
            (Ok(launch_a), Ok(launch_b)) => Ok((launch_a, launch_b)),
            (a_result, b_result) => Err(both_reasons(a_result.err(), b_result.err())),
        }
    }

    /// Runs the two members together from one start line: each one's throughput, or why
    /// the pair failed. The error is the calibration's own (no start folder).
    async fn run_pair(
        &self,
        launch_a: &LaunchSpec,
        launch_b: &LaunchSpec,
    ) -> anyhow::Result<Result<(f64, f64), String>> {
        let settings = self.settings;
        let mut spec_a = launch_run_spec(settings, launch_a, settings.system_timeout_secs);
        let mut spec_b = launch_run_spec(settings, launch_b, settings.system_timeout_secs);
        if let Some(mps) = self.mps {
            for spec in [&mut spec_a, &mut spec_b] {
                spec.env
                    .extend(mps.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        // The start line (see [`START_DIR_VAR`]): both members time the same window.
        let start_dir = tempfile::Builder::new()
            .prefix("coloc-start-")
            .tempdir()
            .context("cannot make the pair's start folder")?;
        for spec in [&mut spec_a, &mut spec_b] {
            spec.env.insert(
                START_DIR_VAR.into(),
                start_dir.path().to_string_lossy().into_owned(),
            );
            spec.env.insert(START_COUNT_VAR.into(), "2".into());
        }
        let (out_a, out_b) = tokio::join!(
            runner::run(&spec_a, self.cancel, |_| {}),
            runner::run(&spec_b, self.cancel, |_| {})
        );
        let throughput = |out: Result<runner::RunOutput, runner::RunError>, launch: &LaunchSpec| {
            let out = out.map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("exited with {}", out.status));
            }
            runner::parse_throughput(&out.stdout, launch.throughput_regex.as_deref()).map(|t| t.0)
        };
        Ok(
            match (throughput(out_a, launch_a), throughput(out_b, launch_b)) {
                (Ok(ta), Ok(tb)) => Ok((ta, tb)),
                (a_result, b_result) => Err(both_reasons(a_result.err(), b_result.err())),
            },
        )
    }
}

/// Why a pair failed: each member's reason, joined.
fn both_reasons(a: Option<String>, b: Option<String>) -> String {
    [a, b].into_iter().flatten().collect::<Vec<_>>().join("; ")
}
