//! `coloc import`: loading datasets measured elsewhere into the store, through the same
//! advisor operations the RPCs use, then training. [`prepare`] reads and validates a
//! dataset into what gets written; [`import_kace`] writes it into a database file directly
//! (no server may hold it), and `client::import_kace` sends the same through a running
//! server's API.

use std::path::Path;

use anyhow::Context;

pub use crate::dataset::{
    parse_workload_name, KaceDataset, KacePair, KaceWorkload, KACE_GPU, KACE_GPU_MEMORY_GB,
};

use crate::{
    advisor::{Advisor, Error as AdvisorError, TrainOutcome, Trigger},
    domain::{
        now_ms, ColocatedMember, GpuName, NewWorkload, Observation, Profile, ProfileSource,
        WorkloadName,
    },
    model::ModelKind,
    store::ObservationSource,
};

#[derive(Debug)]
pub struct ImportSummary {
    pub workloads_registered: usize,
    pub workloads_updated: usize,
    pub workloads_unchanged: usize,
    pub incomplete_workloads: Vec<String>,
    pub observations_new: usize,
    /// The import batch of the new runs (when they were stored), which `coloc runs delete
    /// --import-batch` takes; `None` when no run was new, or the runs went through
    /// ReportColocation (`import --addr`: they are reported runs).
    pub import_batch: Option<i64>,
    pub observations_total: usize,
    pub pairs_skipped: usize,
    /// The models fitted after the import, the one served last; or the one kept.
    pub models: Vec<Result<ModelLine, String>>,
}

/// One model version, as the import summary shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelLine {
    pub version: u64,
    pub kind: String,
    pub observations: u64,
    pub r2: f64,
    pub mse: f64,
    pub status: String,
    pub reason: String,
}

impl From<&TrainOutcome> for ModelLine {
    fn from(outcome: &TrainOutcome) -> Self {
        let model = &outcome.model;
        Self {
            version: model.version,
            kind: model.params.kind().as_str().to_string(),
            observations: model.metrics.observations as u64,
            r2: model.metrics.r2,
            mse: model.metrics.mse,
            status: model.status.as_str().to_string(),
            reason: model.reason.clone(),
        }
    }
}

/// A dataset read, checked and turned into what an import writes.
#[derive(Debug)]
pub struct Prepared {
    /// Each with its profile on the import's GPU model.
    pub workloads: Vec<NewWorkload>,
    /// Every pair of two imported workloads, at time 0 (so that a repeated import, by
    /// either path, is recognised run by run).
    pub observations: Vec<Observation>,
    pub pairs_skipped: usize,
    pub incomplete_workloads: Vec<String>,
}

/// Reads the KACE-format dataset in `dir` for `gpu` and validates everything, writing nothing.
pub fn prepare(dir: &Path, gpu: &GpuName, gpu_memory_gb: f64) -> anyhow::Result<Prepared> {
    let dataset = KaceDataset::read(dir)?;
    let measured_at_ms = now_ms();
    let mut workloads = Vec::with_capacity(dataset.workloads.len());
    for w in &dataset.workloads {
        let profile = Profile {
            gpu: gpu.clone(),
            kernel: w.kernel,
            system: w.system.clone(),
            source: ProfileSource::Imported,
            gpu_memory_gb: Some(gpu_memory_gb),
            measured_at_ms,
            kernel_missing: false,
        };
        profile
            .validate()
            .with_context(|| format!("workload {} has invalid metrics", w.name))?;
        workloads.push(NewWorkload {
            name: w.name.clone(),
            mode: w.mode,
            model: w.model.clone(),
            batch_size: w.batch_size,
            labels: [("source".to_string(), "kace".to_string())].into(),
            profile: Some(profile),
            launch: None,
            profile_on: Vec::new(),
        });
    }
    let imported: std::collections::HashSet<&str> =
        dataset.workloads.iter().map(|w| w.name.as_str()).collect();
    let mut observations = Vec::new();
    let mut pairs_skipped = 0;
    for pair in &dataset.pairs {
        if !imported.contains(pair.workload1.as_str())
            || !imported.contains(pair.workload2.as_str())
        {
            pairs_skipped += 1;
            continue;
        }
        let member = |name: &str, throughput: f64| -> anyhow::Result<ColocatedMember> {
            Ok(ColocatedMember {
                workload: WorkloadName::parse("workload", name)?,
                throughput,
                job_id: String::new(),
            })
        };
        observations.push(Observation::new(
            gpu.clone(),
            vec![
                member(&pair.workload1, pair.throughput1)?,
                member(&pair.workload2, pair.throughput2)?,
            ],
            0,
        )?);
    }

    Ok(Prepared {
        workloads,
        observations,
        pairs_skipped,
        incomplete_workloads: dataset.incomplete_workloads,
    })
}

/// Refuses an import that gives a GPU model the store already knows another memory size:
/// data of another GPU under this one's name (an import never changes a GPU's memory).
async fn check_gpu_memory(advisor: &Advisor, gpu: &GpuName, memory_gb: f64) -> anyhow::Result<()> {
    let known = advisor.store().gpus().await?;
    let stored = known
        .iter()
        .find(|(name, _)| name == gpu)
        .and_then(|(_, memory)| *memory);
    if let Some(stored) = stored {
        if (stored - memory_gb).abs() > 0.01 * stored.max(memory_gb) {
            anyhow::bail!(
                "the store knows GPU model {gpu} with {stored} GB of memory, and this import \
                 says {memory_gb} GB: is the data from another GPU model? Nothing was imported"
            );
        }
    }
    Ok(())
}

/// Imports a KACE-format dataset on `gpu`: every complete workload (registered, or its
/// profile replaced), every pair of two imported workloads as an observation (a repeated
/// import adds nothing), then trains. Everything is read and validated before anything is
/// written.
pub async fn import_kace(
    advisor: &Advisor,
    dir: &Path,
    gpu: &GpuName,
    gpu_memory_gb: f64,
) -> anyhow::Result<ImportSummary> {
    let Prepared {
        workloads,
        observations,
        pairs_skipped,
        incomplete_workloads,
    } = prepare(dir, gpu, gpu_memory_gb)?;
    check_gpu_memory(advisor, gpu, gpu_memory_gb).await?;
    let mut registered = 0;
    let mut updated = 0;
    let mut unchanged = 0;
    let progress = crate::progress::bar(workloads.len() as u64, "workloads");
    for workload in workloads {
        progress.inc(1);
        let name = workload.name.clone();
        let profile = workload
            .profile
            .clone()
            .expect("imported workloads carry a profile");
        match advisor.register(workload).await {
            Ok(_) => registered += 1,
            Err(AdvisorError::WorkloadExists(_)) => {
                let stored = advisor.get(&name).await?;
                let same = stored.profiles.iter().any(|p| {
                    p.gpu == profile.gpu && p.kernel == profile.kernel && p.system == profile.system
                });
                if same {
                    unchanged += 1;
                } else {
                    advisor.put_profile(&name, profile).await?;
                    updated += 1;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    progress.finish_and_clear();
    let batch = now_ms();
    let observations_new = advisor
        .store()
        .insert_observations(&observations, ObservationSource::Imported, batch)
        .await?;
    // A repeated import changes nothing, so it keeps the current model instead of adding
    // versions identical to it. Otherwise the KACE baseline is fitted first (kept as a
    // version for comparison), then the server's model kind, which is the one served.
    let nothing_changed = registered == 0 && updated == 0 && observations_new == 0;
    let models = match advisor.current_model(gpu) {
        Ok(current) if nothing_changed => vec![Ok(ModelLine::from(&TrainOutcome {
            model: current,
            promoted: true,
            unusable_observations: 0,
        }))],
        _ => {
            let training = crate::progress::spinner("training models");
            let mut models = Vec::new();
            if advisor.default_kind() != ModelKind::KaceLinear {
                let baseline = advisor
                    .train(gpu, Some(ModelKind::KaceLinear), Trigger::Import)
                    .await;
                models.push(
                    baseline
                        .as_ref()
                        .map(ModelLine::from)
                        .map_err(|e| e.to_string()),
                );
            }
            let served = advisor.train(gpu, None, Trigger::Import).await;
            models.push(
                served
                    .as_ref()
                    .map(ModelLine::from)
                    .map_err(|e| e.to_string()),
            );
            training.finish_and_clear();
            models
        }
    };
    Ok(ImportSummary {
        workloads_registered: registered,
        workloads_updated: updated,
        workloads_unchanged: unchanged,
        incomplete_workloads,
        observations_new,
        import_batch: (observations_new > 0).then_some(batch),
        observations_total: observations.len(),
        pairs_skipped,
        models,
    })
}
