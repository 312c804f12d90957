//! A workload's profile on one GPU model: the KACE method's six kernel metrics (Nsight
//! Compute, one step) and four system metrics (NVML, running alone).
//!
//! Memory is in **GB meaning GiB** (2^30 bytes) everywhere in coloc (`memory_gb`,
//! `gpu_memory_gb`), as in the KACE data: its `memcap` is nvidia-smi's `memory.used` (MiB)
//! divided by 1024 (KACE-artifact `utils/parse_util.py`, `convert_mib_to_gb`), and GPU
//! names count the same way (a "V100-SXM2-32GB" has 32 GiB). NVML reports bytes; they
//! become GB in one place, [`gb_from_bytes`].

use super::{GpuName, ValidationError};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelMetrics {
    pub threads: f64,
    pub compute_throughput_pct: f64,
    pub dram_throughput_pct: f64,
    pub memory_throughput_pct: f64,
    pub registers: f64,
    pub static_shared_memory_bytes: f64,
}

impl KernelMetrics {
    /// The kernel metrics of a profile that has none (`kernel_missing`, e.g. its kernel
    /// phase could not measure them): zeros, answered by the NVML-only twin.
    pub const MISSING: Self = Self {
        threads: 0.0,
        compute_throughput_pct: 0.0,
        dram_throughput_pct: 0.0,
        memory_throughput_pct: 0.0,
        registers: 0.0,
        static_shared_memory_bytes: 0.0,
    };
}

#[derive(Debug, Clone, PartialEq)]
pub struct SystemMetrics {
    pub exclusive_throughput: f64,
    pub throughput_unit: String,
    pub sm_busy_pct: f64,
    pub mem_busy_pct: f64,
    /// Peak GPU memory used, GiB (see the module header).
    pub memory_gb: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileSource {
    Imported,
    ClientSupplied,
    Measured,
    Replay,
}

impl ProfileSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Imported => "imported",
            Self::ClientSupplied => "client_supplied",
            Self::Measured => "measured",
            Self::Replay => "replay",
        }
    }

    pub fn from_db(raw: &str) -> Option<Self> {
        match raw {
            "imported" => Some(Self::Imported),
            "client_supplied" => Some(Self::ClientSupplied),
            "measured" => Some(Self::Measured),
            "replay" => Some(Self::Replay),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub gpu: GpuName,
    pub kernel: KernelMetrics,
    pub system: SystemMetrics,
    pub source: ProfileSource,
    /// Total memory of the GPU model, GiB, when the profile says it.
    pub gpu_memory_gb: Option<f64>,
    pub measured_at_ms: i64,
    /// True when Nsight Compute could not run: `kernel` is all zeros and the profile is
    /// kept for its system metrics and answered by the serving model's NVML-only twin
    /// (`model::ModelParams::at_level`).
    pub kernel_missing: bool,
}

/// Physical bounds every metric is checked against, in the RPCs and the importer alike: a
/// finite value past them is a unit mistake or an attack, and would take over the
/// models (one profile with 1e300 threads ranked first for every target).
///
/// No GPU has more memory than this (GiB; the largest of 2026 have 288).
pub const MAX_MEMORY_GB: f64 = 1024.0;
/// Threads per launch (block x grid): above the largest one-dimensional launch
/// (2^31 - 1 blocks of 1024 threads, 2.2e12).
pub const MAX_THREADS: f64 = 1e13;
/// Registers (threads x registers per thread, at most 255 each).
pub const MAX_REGISTERS: f64 = MAX_THREADS * 255.0;
/// Static shared memory in bytes (grid size x at most 48 KiB per block).
pub const MAX_STATIC_SHARED_MEMORY_BYTES: f64 = 2.2e9 * 49_152.0;
/// Throughputs (a workload's own unit per second): no workload runs a trillion steps a
/// second, and sums of bounded throughputs stay finite.
pub const MAX_THROUGHPUT: f64 = 1e12;
/// Percentages may pass 100 by this much (tools round).
pub const PERCENT_MARGIN: f64 = 0.1;
const MAX_UNIT_CHARS: usize = 32;

fn check_non_negative(field: &str, value: f64) -> Result<(), ValidationError> {
    if !value.is_finite() || value < 0.0 {
        return Err(ValidationError::new(
            field,
            format!("{field} must be a finite number >= 0, got {value}"),
        ));
    }
    Ok(())
}

/// Finite, >= 0 and at most `max`.
fn check_bounded(field: &str, value: f64, max: f64) -> Result<(), ValidationError> {
    check_non_negative(field, value)?;
    if value > max {
        return Err(ValidationError::new(
            field,
            format!("{field} = {value} is more than any GPU workload can have (at most {max:e})"),
        ));
    }
    Ok(())
}

/// A throughput: finite, > 0 and at most [`MAX_THROUGHPUT`] (`> 0` unless `zero_ok`).
pub fn check_throughput(field: &str, value: f64, zero_ok: bool) -> Result<(), ValidationError> {
    if !value.is_finite() || value < 0.0 || (value == 0.0 && !zero_ok) || value > MAX_THROUGHPUT {
        let lower = if zero_ok { ">= 0" } else { "> 0" };
        return Err(ValidationError::new(
            field,
            format!("{field} must be a finite number {lower} and at most {MAX_THROUGHPUT:e}, got {value}"),
        ));
    }
    Ok(())
}

fn check_percentage(field: &str, value: f64) -> Result<(), ValidationError> {
    if !value.is_finite() || !(0.0..=100.0 + PERCENT_MARGIN).contains(&value) {
        return Err(ValidationError::new(
            field,
            format!("{field} must be a percentage between 0 and 100, got {value}"),
        ));
    }
    Ok(())
}

impl KernelMetrics {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_bounded("kernel.threads", self.threads, MAX_THREADS)?;
        check_percentage("kernel.compute_throughput_pct", self.compute_throughput_pct)?;
        check_percentage("kernel.dram_throughput_pct", self.dram_throughput_pct)?;
        check_percentage("kernel.memory_throughput_pct", self.memory_throughput_pct)?;
        check_bounded("kernel.registers", self.registers, MAX_REGISTERS)?;
        check_bounded(
            "kernel.static_shared_memory_bytes",
            self.static_shared_memory_bytes,
            MAX_STATIC_SHARED_MEMORY_BYTES,
        )
    }
}

impl SystemMetrics {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_throughput(
            "system.exclusive_throughput",
            self.exclusive_throughput,
            false,
        )?;
        if self.throughput_unit.chars().count() > MAX_UNIT_CHARS
            || self.throughput_unit.chars().any(char::is_control)
        {
            return Err(ValidationError::new(
                "system.throughput_unit",
                format!(
                    "system.throughput_unit must be at most {MAX_UNIT_CHARS} printable characters"
                ),
            ));
        }
        check_percentage("system.sm_busy_pct", self.sm_busy_pct)?;
        check_percentage("system.mem_busy_pct", self.mem_busy_pct)?;
        check_memory_gb("system.memory_gb", self.memory_gb)
    }
}

/// Bytes in one of coloc's GB (a GiB; see the module header).
pub const BYTES_PER_GB: u64 = 1 << 30;

/// A memory size NVML reports in bytes, in coloc's GB (GiB).
pub fn gb_from_bytes(bytes: u64) -> f64 {
    bytes as f64 / BYTES_PER_GB as f64
}

/// A memory size in GB (GiB): finite, >= 0 and plausible for one GPU.
pub fn check_memory_gb(field: &str, value: f64) -> Result<(), ValidationError> {
    check_non_negative(field, value)?;
    if value > MAX_MEMORY_GB {
        return Err(ValidationError::new(
            field,
            format!("{field} = {value} GB is more than any GPU has; is the unit GB?"),
        ));
    }
    Ok(())
}

impl Profile {
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.kernel.validate()?;
        self.system.validate()?;
        if let Some(memory) = self.gpu_memory_gb {
            check_memory_gb("profile.gpu_memory_gb", memory)?;
            if memory == 0.0 {
                return Err(ValidationError::new(
                    "profile.gpu_memory_gb",
                    "profile.gpu_memory_gb must be > 0",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample_profile() -> Profile {
        Profile {
            gpu: GpuName::parse("gpu", "Tesla V100-SXM2-32GB").unwrap(),
            kernel: KernelMetrics {
                threads: 321_403.5,
                compute_throughput_pct: 68.9,
                dram_throughput_pct: 16.4,
                memory_throughput_pct: 69.2,
                registers: 16_463_690.9,
                static_shared_memory_bytes: 7_439.6,
            },
            system: SystemMetrics {
                exclusive_throughput: 98.3,
                throughput_unit: "samples/s".into(),
                sm_busy_pct: 96.0,
                mem_busy_pct: 38.0,
                memory_gb: 1.4,
            },
            source: ProfileSource::ClientSupplied,
            gpu_memory_gb: Some(32.0),
            measured_at_ms: 0,
            kernel_missing: false,
        }
    }

    #[test]
    fn a_measured_profile_is_valid() {
        sample_profile().validate().unwrap();
    }

    #[test]
    fn nan_infinite_negative_and_out_of_range_metrics_are_rejected() {
        type Mutation = fn(&mut Profile);
        let cases: [(&str, Mutation); 8] = [
            ("threads", |p| p.kernel.threads = f64::NAN),
            ("registers", |p| p.kernel.registers = -1.0),
            ("compute", |p| p.kernel.compute_throughput_pct = 100.5),
            ("throughput", |p| p.system.exclusive_throughput = 0.0),
            ("throughput inf", |p| {
                p.system.exclusive_throughput = f64::INFINITY
            }),
            ("sm busy", |p| p.system.sm_busy_pct = -0.1),
            ("memory", |p| p.system.memory_gb = 1e9),
            ("gpu memory", |p| p.gpu_memory_gb = Some(0.0)),
        ];
        for (what, mutate) in cases {
            let mut profile = sample_profile();
            mutate(&mut profile);
            assert!(profile.validate().is_err(), "{what} accepted");
        }
    }
}
