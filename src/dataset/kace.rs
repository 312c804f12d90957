//! Reading a KACE-format dataset: the layout of the published V100 measurements
//! (kernel_metrics.csv, system_metrics.csv, pairs.csv in one folder) or the public
//! KACE-artifact repository's own layout.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::domain::{KernelMetrics, SystemMetrics, WorkloadMode, WorkloadName};

/// One workload with both kernel and system metrics.
#[derive(Debug, Clone)]
pub struct KaceWorkload {
    pub name: WorkloadName,
    pub mode: WorkloadMode,
    pub model: String,
    pub batch_size: u32,
    pub kernel: KernelMetrics,
    pub system: SystemMetrics,
}

/// One measured colocated pair.
#[derive(Debug, Clone, PartialEq)]
pub struct KacePair {
    pub workload1: String,
    pub workload2: String,
    pub throughput1: f64,
    pub throughput2: f64,
}

impl KacePair {
    pub fn throughput_sum(&self) -> f64 {
        self.throughput1 + self.throughput2
    }
}

#[derive(Debug, Clone)]
pub struct KaceDataset {
    /// Sorted by name.
    pub workloads: Vec<KaceWorkload>,
    pub pairs: Vec<KacePair>,
    /// Workloads with only one of the two metric files.
    pub incomplete_workloads: Vec<String>,
}

/// A row of kernel_metrics.csv; the fields in the published file's column order (the
/// writer, `kace_write.rs`, writes them in this order).
#[derive(Deserialize, Serialize)]
pub(super) struct KernelRow {
    #[serde(rename = "Threads")]
    pub(super) threads: f64,
    #[serde(rename = "Compute (SM) Throughput")]
    pub(super) compute: f64,
    #[serde(rename = "DRAM Throughput")]
    pub(super) dram: f64,
    #[serde(rename = "Memory Throughput")]
    pub(super) memory: f64,
    #[serde(rename = "Registers")]
    pub(super) registers: f64,
    #[serde(rename = "Static Shared Memory")]
    pub(super) static_shared_memory: f64,
    #[serde(rename = "Type")]
    pub(super) name: String,
}

/// A row of system_metrics.csv. The published file also has `Exclusive50` (throughput
/// alone at 50 % MPS threads, sometimes empty); nothing here reads it, so files without it
/// (coloc's exports) read the same.
#[derive(Deserialize, Serialize)]
pub(super) struct SystemRow {
    #[serde(rename = "Type")]
    pub(super) name: String,
    #[serde(rename = "Exclusive100")]
    pub(super) exclusive_throughput: f64,
    #[serde(rename = "sm%")]
    pub(super) sm_busy: f64,
    #[serde(rename = "mem%")]
    pub(super) mem_busy: f64,
    pub(super) memcap: f64,
}

#[derive(Deserialize)]
struct PairRow {
    workload1: String,
    workload2: String,
    w1throughput: f64,
    w2throughput: f64,
}

struct Layout {
    kernel_files: Vec<PathBuf>,
    system_file: PathBuf,
    pairs_file: PathBuf,
}

fn find_layout(dir: &Path) -> anyhow::Result<Layout> {
    let flat = dir.join("kernel_metrics.csv");
    if flat.is_file() {
        return Ok(Layout {
            kernel_files: vec![flat],
            system_file: dir.join("system_metrics.csv"),
            pairs_file: dir.join("pairs.csv"),
        });
    }
    let kernel_dir = dir.join("profiling/kernel_metrics/output_KACE/kernel_total");
    if kernel_dir.is_dir() {
        let mut kernel_files: Vec<PathBuf> = fs::read_dir(&kernel_dir)
            .with_context(|| format!("cannot list {}", kernel_dir.display()))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "csv"))
            .collect();
        kernel_files.sort();
        return Ok(Layout {
            kernel_files,
            system_file: dir.join("profiling/system_metrics/KACE/baseline_labels.csv"),
            pairs_file: dir.join("output/dataset/MPS100/MPS100_kernel_labels_targetMPS100.csv"),
        });
    }
    bail!(
        "{} holds neither kernel_metrics.csv nor the KACE-artifact layout \
         (profiling/kernel_metrics/output_KACE/kernel_total/)",
        dir.display()
    )
}

/// A dataset file larger than this is refused (the public KACE files are under 1 MB).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// A line longer than this is refused (KACE lines are under 1 kB).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// The bytes of a dataset file: a regular file (a symlink is followed, to a regular file
/// only: never a device, a pipe or a folder), at most [`MAX_FILE_BYTES`], with no line
/// over [`MAX_LINE_BYTES`]. Hostile files (`/dev/zero`, one endless line) fail here with a
/// message instead of exhausting memory.
fn read_bounded(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !metadata.is_file() {
        anyhow::bail!("{} is not a regular file", path.display());
    }
    let mut bytes = Vec::with_capacity(metadata.len().min(MAX_FILE_BYTES) as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        anyhow::bail!(
            "{} is larger than {} MiB; a KACE-format dataset file is far smaller",
            path.display(),
            MAX_FILE_BYTES >> 20
        );
    }
    if let Some(line) = bytes
        .split(|b| *b == b'\n')
        .position(|line| line.len() > MAX_LINE_BYTES)
    {
        anyhow::bail!(
            "{}: line {} is longer than {MAX_LINE_BYTES} bytes",
            path.display(),
            line + 1
        );
    }
    Ok(bytes)
}

fn read_rows<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<Vec<T>> {
    let bytes = read_bounded(path)?;
    let mut reader = csv::Reader::from_reader(bytes.as_slice());
    reader
        .deserialize()
        .enumerate()
        .map(|(i, row)| row.with_context(|| format!("{}: bad row {}", path.display(), i + 2)))
        .collect()
}

/// Splits `<model>_batch<N>-<train|inf>` into its parts; other names keep the whole name as
/// the model, batch size 0, and a mode guessed from the name.
pub fn parse_workload_name(name: &str) -> (String, u32, WorkloadMode) {
    let mode = if name.contains("train") {
        WorkloadMode::Training
    } else {
        WorkloadMode::Inference
    };
    if let Some((model, rest)) = name.rsplit_once("_batch") {
        if let Some((batch, _)) = rest.split_once('-') {
            if let Ok(batch) = batch.parse() {
                return (model.to_string(), batch, mode);
            }
        }
    }
    (name.to_string(), 0, mode)
}

impl KaceDataset {
    /// Each workload's model features, by name.
    pub fn features(&self) -> std::collections::HashMap<String, crate::model::Features> {
        self.workloads
            .iter()
            .map(|w| {
                (
                    w.name.to_string(),
                    crate::model::Features::from_metrics(&w.kernel, &w.system),
                )
            })
            .collect()
    }

    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let layout = find_layout(dir)?;
        let mut kernel = BTreeMap::new();
        for file in &layout.kernel_files {
            for row in read_rows::<KernelRow>(file)? {
                kernel.insert(row.name.clone(), row);
            }
        }
        let system: BTreeMap<String, SystemRow> = read_rows::<SystemRow>(&layout.system_file)?
            .into_iter()
            .map(|row| (row.name.clone(), row))
            .collect();

        let mut workloads = Vec::new();
        let mut incomplete_workloads = Vec::new();
        for (name, k) in &kernel {
            let Some(s) = system.get(name) else {
                incomplete_workloads.push(name.clone());
                continue;
            };
            let (model, batch_size, mode) = parse_workload_name(name);
            workloads.push(KaceWorkload {
                name: WorkloadName::parse("workload", name)?,
                mode,
                model,
                batch_size,
                kernel: KernelMetrics {
                    threads: k.threads,
                    compute_throughput_pct: k.compute,
                    dram_throughput_pct: k.dram,
                    memory_throughput_pct: k.memory,
                    registers: k.registers,
                    static_shared_memory_bytes: k.static_shared_memory,
                },
                system: SystemMetrics {
                    exclusive_throughput: s.exclusive_throughput,
                    throughput_unit: String::new(),
                    sm_busy_pct: s.sm_busy,
                    mem_busy_pct: s.mem_busy,
                    memory_gb: s.memcap,
                },
            });
        }
        incomplete_workloads.extend(system.keys().filter(|n| !kernel.contains_key(*n)).cloned());
        incomplete_workloads.sort();

        let pairs = read_rows::<PairRow>(&layout.pairs_file)?
            .into_iter()
            .map(|row| KacePair {
                workload1: row.workload1,
                workload2: row.workload2,
                throughput1: row.w1throughput,
                throughput2: row.w2throughput,
            })
            .collect();
        Ok(Self {
            workloads,
            pairs,
            incomplete_workloads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kace_names_split_into_model_batch_and_mode() {
        assert_eq!(
            parse_workload_name("vit_h_14_batch16-train"),
            ("vit_h_14".to_string(), 16, WorkloadMode::Training)
        );
        assert_eq!(
            parse_workload_name("bert-base-cased_batch2-inf"),
            ("bert-base-cased".to_string(), 2, WorkloadMode::Inference)
        );
        assert_eq!(
            parse_workload_name("custom"),
            ("custom".to_string(), 0, WorkloadMode::Inference)
        );
    }
}
