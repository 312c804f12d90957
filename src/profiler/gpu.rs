//! The GPU side of the system phase, behind [`GpuSampler`]: NVML on a real GPU
//! ([`NvmlSampler`]), or samples recorded to a file ([`RecordedSampler`], for tests and for
//! replaying a measurement without the GPU). The sampling loop and the aggregation into
//! KACE's system metrics do not know which one they talk to.

use std::{collections::VecDeque, path::Path, sync::Mutex};

use serde::{Deserialize, Serialize};

use crate::{domain::gb_from_bytes, sync::Unpoisoned};

/// The GPU model and its memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub name: String,
    pub total_memory_bytes: u64,
}

/// One NVML reading while the workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// utilization.gpu, %.
    pub gpu_util_pct: f64,
    /// utilization.memory, %.
    pub mem_util_pct: f64,
    /// GPU memory used by the workload's processes, bytes.
    pub process_memory_bytes: u64,
}

pub trait GpuSampler: Send + Sync {
    fn info(&self) -> Result<GpuInfo, String>;
    /// A reading; `process_group` is the workload's process group, whose processes' memory
    /// is summed.
    fn sample(&self, process_group: u32) -> Result<GpuSample, String>;
}

/// NVML through nvml-wrapper. The library is loaded at run time: without a driver,
/// [`NvmlSampler::init`] returns an error instead of failing the build or the start.
pub struct NvmlSampler {
    nvml: nvml_wrapper::Nvml,
    index: u32,
}

impl NvmlSampler {
    pub fn init(index: u32) -> Result<Self, String> {
        let nvml =
            nvml_wrapper::Nvml::init().map_err(|e| format!("NVML cannot initialise: {e}"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        if index >= count {
            return Err(format!(
                "profiler.gpu_index is {index} but NVML sees {count} GPU(s)"
            ));
        }
        Ok(Self { nvml, index })
    }

    fn device(&self) -> Result<nvml_wrapper::Device<'_>, String> {
        self.nvml
            .device_by_index(self.index)
            .map_err(|e| format!("NVML device {}: {e}", self.index))
    }
}

/// The process group of `pid`, when it still exists.
fn process_group_of(pid: u32) -> Option<u32> {
    nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid as i32)))
        .ok()
        .map(|g| g.as_raw() as u32)
}

impl GpuSampler for NvmlSampler {
    fn info(&self) -> Result<GpuInfo, String> {
        let device = self.device()?;
        Ok(GpuInfo {
            name: device.name().map_err(|e| format!("NVML name: {e}"))?,
            total_memory_bytes: device
                .memory_info()
                .map_err(|e| format!("NVML memory: {e}"))?
                .total,
        })
    }

    fn sample(&self, process_group: u32) -> Result<GpuSample, String> {
        let device = self.device()?;
        let utilization = device
            .utilization_rates()
            .map_err(|e| format!("NVML utilization: {e}"))?;
        let processes = device
            .running_compute_processes()
            .map_err(|e| format!("NVML processes: {e}"))?;
        let process_memory_bytes = processes
            .iter()
            .filter(|p| process_group_of(p.pid) == Some(process_group))
            .map(|p| match p.used_gpu_memory {
                nvml_wrapper::enums::device::UsedGpuMemory::Used(bytes) => bytes,
                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
            })
            .sum();
        Ok(GpuSample {
            gpu_util_pct: f64::from(utilization.gpu),
            mem_util_pct: f64::from(utilization.memory),
            process_memory_bytes,
        })
    }
}

/// A recording: the GPU's info, then one sample per line (JSON lines), served in order
/// (the last one repeats when the run outlasts the recording).
pub struct RecordedSampler {
    info: GpuInfo,
    samples: Mutex<VecDeque<GpuSample>>,
    last: Mutex<Option<GpuSample>>,
}

impl RecordedSampler {
    pub fn new(info: GpuInfo, samples: Vec<GpuSample>) -> Self {
        Self {
            info,
            samples: Mutex::new(samples.into()),
            last: Mutex::new(None),
        }
    }

    /// Reads a recording ([`read_recording`]).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let (info, samples) = read_recording(path)?;
        Ok(Self::new(info, samples))
    }
}

/// Reads a recording: the first line is a [`GpuInfo`], every other line a [`GpuSample`]
/// (JSON lines; blank lines are skipped). The format of `profiler.nvml_recording`, of
/// what the nvml backend keeps under `profiler.keep_raw_dir`, and of an uploaded profile's
/// NVML file (docs/profiling.md, "Bring your own profile").
pub fn read_recording(path: &Path) -> Result<(GpuInfo, Vec<GpuSample>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let info: GpuInfo = serde_json::from_str(lines.next().ok_or("an empty recording")?)
        .map_err(|e| format!("{}: GPU info (line 1): {e}", path.display()))?;
    let samples = lines
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| format!("{}: sample {}: {e}", path.display(), i + 1))
        })
        .collect::<Result<Vec<GpuSample>, String>>()?;
    Ok((info, samples))
}

impl GpuSampler for RecordedSampler {
    fn info(&self) -> Result<GpuInfo, String> {
        Ok(self.info.clone())
    }

    fn sample(&self, _process_group: u32) -> Result<GpuSample, String> {
        let next = self.samples.lock().unpoisoned().pop_front();
        let mut last = self.last.lock().unpoisoned();
        if let Some(sample) = next {
            *last = Some(sample);
        }
        last.ok_or_else(|| "the recording holds no samples".to_string())
    }
}

/// KACE's system metrics from the samples of one run: mean GPU and memory utilization over
/// the run's steady window, and the peak memory of its processes in GB (GiB, converted by
/// [`gb_from_bytes`]). The steady window runs from the first to the last sample whose GPU
/// utilization reaches half the run's highest: start-up before the first kernels, the
/// tail after the last, and a stray reading left over from the GPU's previous work (NVML
/// averages utilization over its own sample period, which can reach back before the run)
/// are not the workload's steady state. On the H100, bert's recording began with one such
/// reading at 6 %, then 22 idle ones, and the old rule (from the first busy reading on)
/// put it at 71 % instead of 99 %.
pub fn summarize(samples: &[GpuSample]) -> Result<(f64, f64, f64), String> {
    let highest = samples
        .iter()
        .map(|s| s.gpu_util_pct)
        .fold(0.0_f64, f64::max);
    if highest <= 0.0 {
        return Err(format!(
            "the GPU showed no activity in {} samples: did the workload use GPU {}?",
            samples.len(),
            "profiler.gpu_index"
        ));
    }
    let steady = |s: &&GpuSample| s.gpu_util_pct >= highest / 2.0;
    let first = samples.iter().position(|s| steady(&s)).unwrap_or(0);
    let last = samples.iter().rposition(|s| steady(&s)).unwrap_or(first);
    let window = &samples[first..=last];
    let n = window.len() as f64;
    let sm_busy = window.iter().map(|s| s.gpu_util_pct).sum::<f64>() / n;
    let mem_busy = window.iter().map(|s| s.mem_util_pct).sum::<f64>() / n;
    let peak = samples
        .iter()
        .map(|s| s.process_memory_bytes)
        .max()
        .unwrap_or(0);
    Ok((sm_busy, mem_busy, gb_from_bytes(peak)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gpu: f64, mem: f64, bytes: u64) -> GpuSample {
        GpuSample {
            gpu_util_pct: gpu,
            mem_util_pct: mem,
            process_memory_bytes: bytes,
        }
    }

    #[test]
    fn summary_skips_start_up_and_takes_the_memory_peak() {
        let samples = [
            sample(0.0, 0.0, 0),
            sample(0.0, 0.0, 1 << 29),
            sample(90.0, 30.0, 3 << 30),
            sample(70.0, 50.0, 2 << 30),
        ];
        let (sm, mem, gb) = summarize(&samples).unwrap();
        assert_eq!((sm, mem, gb), (80.0, 40.0, 3.0));
    }

    #[test]
    fn a_stray_reading_before_start_up_and_the_idle_tail_are_left_out() {
        let samples = [
            sample(6.0, 1.0, 0),
            sample(0.0, 0.0, 0),
            sample(0.0, 0.0, 1 << 29),
            sample(30.0, 2.0, 1 << 30),
            sample(100.0, 10.0, 2 << 30),
            sample(90.0, 20.0, 2 << 30),
            sample(40.0, 5.0, 2 << 30),
            sample(80.0, 30.0, 2 << 30),
            sample(0.0, 0.0, 0),
        ];
        // From 100 (the first at half of the highest, 100) to 80 (the last): the dip to 40
        // inside the window counts.
        let (sm, mem, gb) = summarize(&samples).unwrap();
        assert_eq!((sm, mem, gb), (77.5, 16.25, 2.0));
    }

    #[test]
    fn a_run_without_gpu_activity_is_an_error() {
        assert!(summarize(&[sample(0.0, 0.0, 0); 5]).is_err());
        assert!(summarize(&[]).is_err());
    }

    #[test]
    fn a_recording_is_served_in_order_and_its_last_sample_repeats() {
        let info = GpuInfo {
            name: "Test GPU".into(),
            total_memory_bytes: 16 << 30,
        };
        let sampler =
            RecordedSampler::new(info.clone(), vec![sample(1.0, 1.0, 1), sample(2.0, 2.0, 2)]);
        assert_eq!(sampler.info().unwrap(), info);
        assert_eq!(sampler.sample(0).unwrap().gpu_util_pct, 1.0);
        assert_eq!(sampler.sample(0).unwrap().gpu_util_pct, 2.0);
        assert_eq!(sampler.sample(0).unwrap().gpu_util_pct, 2.0);
    }
}
