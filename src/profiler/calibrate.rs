//! `coloc calibrate`: gives a GPU model training data without any scheduler, by running
//! pairs of profiled workloads together on the profiling GPU and storing what each one
//! achieved as an observation. Under MPS when `nvidia-cuda-mps-control` is available (the
//! sharing coloc advises on), else plain time-sliced sharing; the member job ids record
//! which (`calibrate-mps-0`, `calibrate-shared-1`, ...).

use std::{collections::BTreeMap, path::PathBuf};

use anyhow::{bail, Context};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::{launch_run_spec, runner, GpuSampler};
use crate::{
    domain::{now_ms, ColocatedMember, GpuName, LaunchSpec, Observation, WorkloadName},
    settings::ProfilerSettings,
    store::{ObservationSource, Store},
};

const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

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

/// Runs up to `max_pairs` pairs (in name order, a workload with itself included) of the
/// workloads that have a launch spec and a profile on the profiling GPU's model.
pub async fn calibrate(
    store: &Store,
    sampler: &dyn GpuSampler,
    settings: &ProfilerSettings,
    max_pairs: usize,
    cancel: &CancellationToken,
) -> anyhow::Result<CalibrationSummary> {
    let info = sampler.info().map_err(|e| anyhow::anyhow!(e))?;
    let gpu = GpuName::parse("gpu", info.name.trim()).map_err(|e| anyhow::anyhow!(e.message))?;
    let mut workloads: Vec<(WorkloadName, LaunchSpec)> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.list_workloads(after.as_deref(), 1000, None).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.name.to_string());
        workloads.extend(page.into_iter().filter_map(|w| {
            let profiled_here = w.profiles.iter().any(|p| p.gpu == gpu && !p.kernel_missing);
            match (w.launch, profiled_here) {
                (Some(launch), true) => Some((w.name, launch)),
                _ => None,
            }
        }));
    }
    if workloads.is_empty() {
        bail!("no workload has both a launch spec and a profile on {gpu}: profile some first");
    }
    let pairs: Vec<(usize, usize)> = (0..workloads.len())
        .flat_map(|i| (i..workloads.len()).map(move |j| (i, j)))
        .take(max_pairs)
        .collect();

    let mps = match runner::resolve_program(MPS_CONTROL) {
        Some(control) => Some(Mps::start(control, settings).await?),
        None => None,
    };
    let sharing = if mps.is_some() {
        Sharing::Mps
    } else {
        Sharing::Shared
    };
    tracing::info!(%gpu, sharing = sharing.as_str(), pairs = pairs.len(), "calibrating");

    let mut summary = CalibrationSummary {
        gpu: gpu.clone(),
        sharing,
        measured: Vec::new(),
        failed: Vec::new(),
    };
    let progress = crate::progress::bar(pairs.len() as u64, "pairs");
    for (i, j) in pairs {
        progress.inc(1);
        let (a, launch_a) = &workloads[i];
        let (b, launch_b) = &workloads[j];
        let mut spec_a = launch_run_spec(settings, launch_a, settings.system_timeout_secs);
        let mut spec_b = launch_run_spec(settings, launch_b, settings.system_timeout_secs);
        if let Some(mps) = &mps {
            for spec in [&mut spec_a, &mut spec_b] {
                spec.env
                    .extend(mps.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        let (out_a, out_b) = tokio::join!(
            runner::run(&spec_a, cancel, |_| {}),
            runner::run(&spec_b, cancel, |_| {})
        );
        let throughput = |out: Result<runner::RunOutput, runner::RunError>, launch: &LaunchSpec| {
            let out = out.map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("exited with {}", out.status));
            }
            runner::parse_throughput(&out.stdout, launch.throughput_regex.as_deref()).map(|t| t.0)
        };
        match (throughput(out_a, launch_a), throughput(out_b, launch_b)) {
            (Ok(ta), Ok(tb)) => {
                let member = |w: &WorkloadName, t: f64, k: usize| ColocatedMember {
                    workload: w.clone(),
                    throughput: t,
                    job_id: format!("calibrate-{}-{k}", sharing.as_str()),
                };
                let observation = Observation::new(
                    gpu.clone(),
                    vec![member(a, ta, 0), member(b, tb, 1)],
                    now_ms(),
                )?;
                store
                    .insert_observation(&observation, ObservationSource::Calibrated, None, now_ms())
                    .await?;
                summary
                    .measured
                    .push((a.to_string(), b.to_string(), ta, tb));
            }
            (a_result, b_result) => {
                let why = [a_result.err(), b_result.err()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::warn!(workload1 = %a, workload2 = %b, %why, "pair failed");
                summary.failed.push((a.to_string(), b.to_string(), why));
            }
        }
        if cancel.is_cancelled() {
            break;
        }
    }
    if let Some(mps) = mps {
        mps.stop().await;
    }
    Ok(summary)
}
