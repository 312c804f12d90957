//! Bring your own profile (docs/profiling.md, "Bring your own profile"): a profile measured
//! elsewhere, built from its two recordings as coloc's own profiler builds one. The
//! Nsight Compute CSV is read and checked exactly as `coloc ncu` checks it (the same
//! parser, the same duration-weighted means, the same error for a missing metric); the
//! NVML recording (JSON lines: the GPU, then one reading per line) is summarized by the
//! nvml backend's rule (means over the steady window, peak memory). The recording names
//! the GPU model and its memory; the exclusive throughput is the operator's figure.

use std::path::Path;

use super::gpu::{read_recording, summarize};
use crate::domain::{
    gb_from_bytes, GpuName, KernelMetrics, Profile, ProfileSource, SystemMetrics, ValidationError,
};

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The ncu CSV cannot give a complete kernel profile (what `coloc ncu` says).
    #[error("{file}: {reason} (`coloc ncu {file}` shows what was read)")]
    Ncu { file: String, reason: String },
    /// The NVML recording is unreadable or shows no activity.
    #[error("{0}")]
    Nvml(String),
    /// `--gpu` names another GPU model than the recording was made on.
    #[error("the NVML recording was made on {recorded:?}, not on {named:?} (--gpu); a profile belongs to the GPU model it was measured on")]
    GpuMismatch { recorded: String, named: String },
    /// A value out of its physical bounds (the RPCs' own checks).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
}

/// The kernel metrics of an ncu CSV, checked as `coloc ncu` checks it.
pub fn kernel_metrics(ncu_csv: &Path) -> Result<KernelMetrics, UploadError> {
    let file = ncu_csv.display().to_string();
    let failed = |reason: String| UploadError::Ncu {
        file: file.clone(),
        reason,
    };
    let text = super::ncu::read_output_file(ncu_csv).map_err(|e| failed(e.to_string()))?;
    let table = super::ncu::parse(&text).map_err(|e| failed(e.to_string()))?;
    table.kernel_metrics().map_err(|e| failed(e.to_string()))
}

/// A profile from an ncu CSV, an NVML recording and the workload's exclusive throughput
/// (`throughput` per second, in `unit`). `gpu`, when given, must be the recording's GPU.
pub fn profile_from_files(
    ncu_csv: &Path,
    nvml_recording: &Path,
    throughput: f64,
    unit: &str,
    gpu: Option<&GpuName>,
    now_ms: i64,
) -> Result<Profile, UploadError> {
    let kernel = kernel_metrics(ncu_csv)?;
    let (info, samples) = read_recording(nvml_recording).map_err(UploadError::Nvml)?;
    let recorded = GpuName::parse("nvml recording's name", &info.name)?;
    if let Some(named) = gpu {
        if *named != recorded {
            return Err(UploadError::GpuMismatch {
                recorded: info.name,
                named: named.as_str().to_string(),
            });
        }
    }
    let (sm_busy_pct, mem_busy_pct, memory_gb) = summarize(&samples)
        .map_err(|e| UploadError::Nvml(format!("{}: {e}", nvml_recording.display())))?;
    let profile = Profile {
        gpu: recorded,
        kernel,
        system: SystemMetrics {
            exclusive_throughput: throughput,
            throughput_unit: unit.to_string(),
            sm_busy_pct,
            mem_busy_pct,
            memory_gb,
        },
        source: ProfileSource::ClientSupplied,
        gpu_memory_gb: Some(gb_from_bytes(info.total_memory_bytes)),
        measured_at_ms: now_ms,
        kernel_missing: false,
    };
    profile.validate()?;
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(path: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(path)
    }

    /// The H100 bmm run, kernel and system phase, as recorded on the GPU: the figures
    /// `tests/fixtures/nvml/expected.py` computes apart from this code.
    #[test]
    fn the_real_h100_recordings_make_the_profile_the_worker_would() {
        let profile = profile_from_files(
            &fixture("ncu/h100_bmm_nvtx_details.csv"),
            &fixture("nvml/h100_bmm_samples.jsonl"),
            371.335,
            "iterations/s",
            Some(&GpuName::parse("gpu", "NVIDIA H100 80GB HBM3").unwrap()),
            1,
        )
        .unwrap();
        assert_eq!(profile.gpu.as_str(), "NVIDIA H100 80GB HBM3");
        assert!((profile.system.sm_busy_pct - 10844.0 / 109.0).abs() < 1e-9);
        assert!((profile.system.mem_busy_pct - 866.0 / 109.0).abs() < 1e-9);
        assert!((profile.system.memory_gb - 0.978515625).abs() < 1e-12);
        assert!((profile.gpu_memory_gb.unwrap() - 79.6474609375).abs() < 1e-9);
        assert!(profile.kernel.threads > 0.0);
        assert_eq!(profile.source, ProfileSource::ClientSupplied);
    }

    #[test]
    fn another_gpu_an_incomplete_csv_and_an_idle_recording_are_refused() {
        let v100 = GpuName::parse("gpu", "Tesla V100-SXM2-32GB").unwrap();
        let mismatch = profile_from_files(
            &fixture("ncu/h100_bmm_nvtx_details.csv"),
            &fixture("nvml/h100_bmm_samples.jsonl"),
            1.0,
            "it/s",
            Some(&v100),
            1,
        )
        .unwrap_err();
        assert!(
            matches!(mismatch, UploadError::GpuMismatch { .. }),
            "{mismatch}"
        );
        let no_kernels = profile_from_files(
            &fixture("ncu/real_no_kernels_profiled.csv"),
            &fixture("nvml/h100_bmm_samples.jsonl"),
            1.0,
            "it/s",
            None,
            1,
        )
        .unwrap_err();
        assert!(
            matches!(no_kernels, UploadError::Ncu { .. }),
            "{no_kernels}"
        );
        let dir = tempfile::TempDir::new().unwrap();
        let idle = dir.path().join("idle.jsonl");
        std::fs::write(
            &idle,
            "{\"name\":\"G\",\"total_memory_bytes\":1000000000}\n\
             {\"gpu_util_pct\":0,\"mem_util_pct\":0,\"process_memory_bytes\":0}\n",
        )
        .unwrap();
        let idle = profile_from_files(
            &fixture("ncu/h100_bmm_nvtx_details.csv"),
            &idle,
            1.0,
            "it/s",
            None,
            1,
        )
        .unwrap_err();
        assert!(idle.to_string().contains("no activity"), "{idle}");
    }
}
