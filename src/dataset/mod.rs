//! Datasets measured elsewhere, as files: the KACE format (profiles of workloads running
//! alone and their measured colocated runs). It reads files into domain values (and the
//! model's features) and knows nothing of the store or the service, so that `import`, `eval`,
//! the profiler's replay backend and the benchmarks all read the same files the same way.

mod kace;

pub use kace::{parse_workload_name, KaceDataset, KacePair, KaceWorkload};

/// GPU model and memory of the published KACE measurements.
pub const KACE_GPU: &str = "Tesla V100-SXM2-32GB";
pub const KACE_GPU_MEMORY_GB: f64 = 32.0;
