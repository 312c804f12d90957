//! Datasets measured elsewhere, as files: the KACE format (profiles of workloads running
//! alone and their measured colocated runs). It reads files into domain values (and the
//! model's features), and writes them back in the same format (`coloc export`), knowing
//! nothing of the store or the service, so that `import`, `export`, `eval`, the profiler's
//! replay backend and the benchmarks all read and write the same files the same way.

mod gpu_file;
mod kace;
mod kace_write;

pub use gpu_file::{DatasetGpu, GPU_FILE};
pub use kace::{parse_workload_name, KaceDataset, KacePair, KaceWorkload};
pub use kace_write::{KaceWriteError, KaceWritten, Overwrite, KACE_FILES};

/// GPU model and memory of the published KACE measurements.
pub const KACE_GPU: &str = "Tesla V100-SXM2-32GB";
pub const KACE_GPU_MEMORY_GB: f64 = 32.0;
