//! `coloc export`: what a store holds for one GPU model, written as a dataset in a format
//! that others (and `coloc import`) read: the way out that `import` is the way in.
//!
//! [`export_kace`] reads the store through `store::snapshot` (read-only and consistent,
//! safe beside a running `coloc serve`), keeps what the KACE format can hold, and writes it
//! with the `dataset` writer: every workload with a complete profile on the GPU model (its
//! kernel and system metrics), and every stored run of exactly two of them (measured,
//! calibrated, reported or imported) as a pair, and `gpu.json` naming the GPU model and its
//! memory, so that an import files it back under the same GPU. What the format cannot hold is counted,
//! never dropped silently: runs of three or more members, pairs with a member that has
//! no complete profile on the GPU model, and runs measured under time-slicing (KACE's runs
//! are MPS runs, and `coloc import` records them as such).

use std::path::{Path, PathBuf};

use crate::{
    dataset::{
        parse_workload_name, DatasetGpu, KaceDataset, KacePair, KaceWorkload, Overwrite, GPU_FILE,
    },
    domain::{GpuName, SharingMode},
    store::{
        snapshot::{self, SnapshotError},
        StoreError,
    },
};

pub use crate::dataset::KaceWriteError;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("no workload has a profile on GPU model {gpu:?}; {}", known_gpus(.known))]
    UnknownGpu { gpu: String, known: Vec<GpuName> },
    #[error(
        "no workload has a complete profile on GPU model {gpu:?} ({profiles} profiles, all \
         without kernel metrics): nothing to export"
    )]
    NoCompleteProfile { gpu: String, profiles: usize },
    #[error(transparent)]
    Store(#[from] SnapshotError),
    #[error("cannot write the dataset")]
    Write(#[from] KaceWriteError),
    #[error("{} exists (--force replaces it)", .0.display())]
    GpuFileExists(PathBuf),
    #[error("cannot write the dataset's {GPU_FILE}")]
    GpuFile(#[source] std::io::Error),
    #[error("the export's writer stopped before answering")]
    WriterStopped(#[source] tokio::task::JoinError),
}

fn known_gpus(known: &[GpuName]) -> String {
    if known.is_empty() {
        return "the store has no profile on any GPU model".to_string();
    }
    let names: Vec<String> = known.iter().map(|g| format!("{:?}", g.as_str())).collect();
    format!("the store has profiles on: {}", names.join(", "))
}

/// What an export wrote, and what it left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    pub gpu: GpuName,
    pub dir: PathBuf,
    pub workloads: usize,
    pub pairs: usize,
    /// Profiles on the GPU model without kernel metrics: not exported.
    pub incomplete_workloads: usize,
    /// Stored runs of 3 or more members: the KACE pair format has no place for them.
    pub crowded_runs: usize,
    /// Stored runs of 2 members of which one has no complete profile on the GPU model.
    pub pairs_without_profiles: usize,
    /// Stored runs not measured under MPS: the format has no field for the mode, and an
    /// import would record them as MPS runs.
    pub time_sliced_runs: usize,
}

/// Writes `gpu`'s complete profiles and pairs from the database at `database_url` into
/// `dir` as a KACE-format dataset (see the module's header). Workloads are sorted by name,
/// pairs are the stored runs oldest first.
pub async fn export_kace(
    database_url: &str,
    gpu: &GpuName,
    dir: &Path,
    overwrite: Overwrite,
) -> Result<ExportSummary, ExportError> {
    let snapshot = snapshot::read_gpu(database_url, gpu).await?;
    if snapshot.profiles.is_empty() {
        return Err(ExportError::UnknownGpu {
            gpu: gpu.to_string(),
            known: snapshot.profiled_gpus,
        });
    }
    let profiles = snapshot.profiles.len();
    let gpu_memory_gb = snapshot
        .profiles
        .iter()
        .find_map(|(_, profile)| profile.gpu_memory_gb);
    let workloads: Vec<KaceWorkload> = snapshot
        .profiles
        .into_iter()
        .filter(|(_, profile)| !profile.kernel_missing)
        .map(|(name, profile)| {
            // The format keeps only the name; the reader derives these from it the same way.
            let (model, batch_size, mode) = parse_workload_name(name.as_str());
            KaceWorkload {
                name,
                mode,
                model,
                batch_size,
                kernel: profile.kernel,
                system: profile.system,
            }
        })
        .collect();
    if workloads.is_empty() {
        return Err(ExportError::NoCompleteProfile {
            gpu: gpu.to_string(),
            profiles,
        });
    }
    let exported: std::collections::HashSet<&str> =
        workloads.iter().map(|w| w.name.as_str()).collect();
    let mut pairs = Vec::new();
    let mut crowded_runs = 0;
    let mut pairs_without_profiles = 0;
    let mut time_sliced_runs = 0;
    for run in &snapshot.runs {
        if run.sharing_mode != SharingMode::Mps {
            time_sliced_runs += 1;
            continue;
        }
        match run.members.as_slice() {
            [(workload1, throughput1), (workload2, throughput2)] => {
                if exported.contains(workload1.as_str()) && exported.contains(workload2.as_str()) {
                    pairs.push(KacePair {
                        workload1: workload1.clone(),
                        workload2: workload2.clone(),
                        throughput1: *throughput1,
                        throughput2: *throughput2,
                    });
                } else {
                    pairs_without_profiles += 1;
                }
            }
            members if members.len() >= 3 => crowded_runs += 1,
            members => {
                return Err(SnapshotError::Read(StoreError::Corrupt(format!(
                    "run {} has {} members",
                    run.id,
                    members.len()
                )))
                .into())
            }
        }
    }
    let dataset = KaceDataset {
        incomplete_workloads: Vec::new(),
        workloads,
        pairs,
    };
    let recorded_gpu = gpu_memory_gb.map(|gpu_memory_gb| DatasetGpu {
        gpu: gpu.to_string(),
        gpu_memory_gb,
    });
    if overwrite == Overwrite::Refuse && dir.join(GPU_FILE).exists() {
        return Err(ExportError::GpuFileExists(dir.join(GPU_FILE)));
    }
    let target = dir.to_path_buf();
    // Blocking file writes and syncs, off the async threads.
    let written = tokio::task::spawn_blocking(move || {
        let written = dataset.write(&target, overwrite)?;
        if let Some(recorded_gpu) = recorded_gpu {
            recorded_gpu.write(&target).map_err(ExportError::GpuFile)?;
        }
        Ok::<_, ExportError>(written)
    })
    .await
    .map_err(ExportError::WriterStopped)??;
    Ok(ExportSummary {
        gpu: gpu.clone(),
        dir: dir.to_path_buf(),
        workloads: written.workloads,
        pairs: written.pairs,
        incomplete_workloads: profiles - written.workloads,
        crowded_runs,
        pairs_without_profiles,
        time_sliced_runs,
    })
}
