//! The flags of a profile measured elsewhere (`coloc workloads register --ncu --nvml
//! --throughput`, `coloc workloads submit-profile`; docs/profiling.md, "Bring your own
//! profile").

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args, Clone)]
pub struct ProfileFiles {
    /// The workload's Nsight Compute CSV (one step, alone on the GPU), checked as `coloc ncu`
    /// checks it.
    #[arg(long, requires_all = ["nvml", "throughput"])]
    pub ncu: Option<PathBuf>,
    /// The workload's NVML recording (JSON lines: the GPU, then one reading per line; see
    /// docs/profiling.md).
    #[arg(long, requires = "ncu")]
    pub nvml: Option<PathBuf>,
    /// Its exclusive throughput, measured alone (per second).
    #[arg(long, requires = "ncu")]
    pub throughput: Option<f64>,
    /// The throughput's unit, e.g. samples/s.
    #[arg(long, default_value = "")]
    pub throughput_unit: String,
    /// The GPU model it was measured on; refused unless it is the NVML recording's (which
    /// names the model when this is left out).
    #[arg(long = "gpu")]
    pub gpu: Option<String>,
}
