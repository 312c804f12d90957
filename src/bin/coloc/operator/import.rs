//! `coloc import kace DIR --addr URL`: a KACE-format dataset loaded through a running
//! server's API.

use coloc::{
    domain::{GpuName, Profile, WorkloadMode},
    import::{prepare, ImportSummary, ModelLine},
    proto as pb,
};

use super::{status_error, Client};
use crate::args::Connection;

/// `coloc import kace DIR --addr URL`: the same import as the direct one, through a running
/// server's API, so that the server learns of everything at once. Workloads are registered
/// with their profiles (a taken name is compared and its profile replaced only when it
/// differs), pairs are reported as runs at time 0 (a repeated import, by either path, is
/// recognised run by run), and models are trained (the KACE baseline first, then the
/// server's default kind) only when something changed.
pub async fn import_kace(
    connection: &Connection,
    dir: &std::path::Path,
    gpu: &GpuName,
    gpu_memory_gb: f64,
) -> anyhow::Result<ImportSummary> {
    let prepared = prepare(dir, gpu, gpu_memory_gb)?;
    let mut client = connection.client().await?;
    let (mut registered, mut updated, mut unchanged) = (0, 0, 0);
    let progress = coloc::progress::bar(
        (prepared.workloads.len() + prepared.observations.len()) as u64,
        "import",
    );
    for workload in &prepared.workloads {
        progress.inc(1);
        let profile = workload
            .profile
            .as_ref()
            .expect("imported workloads carry a profile");
        let pb_profile = profile_pb(profile, gpu, gpu_memory_gb);
        let request = pb::RegisterWorkloadRequest {
            name: workload.name.to_string(),
            mode: match workload.mode {
                WorkloadMode::Training => pb::WorkloadMode::Training,
                WorkloadMode::Inference => pb::WorkloadMode::Inference,
            } as i32,
            model: workload.model.clone(),
            batch_size: workload.batch_size,
            labels: workload.labels.clone().into_iter().collect(),
            profile: Some(pb_profile.clone()),
            ..Default::default()
        };
        match register(&mut client, request, pb_profile).await? {
            Registered::New => registered += 1,
            Registered::Updated => updated += 1,
            Registered::Unchanged => unchanged += 1,
        }
    }
    let mut observations_new = 0;
    for run in &prepared.observations {
        progress.inc(1);
        let answer = client
            .report_colocation(pb::ReportColocationRequest {
                gpu: gpu.to_string(),
                members: run
                    .members
                    .iter()
                    .map(|m| pb::ColocatedMember {
                        workload: m.workload.to_string(),
                        throughput: m.throughput,
                        job_id: m.job_id.clone(),
                    })
                    .collect(),
                observed_at: Some(prost_types::Timestamp {
                    seconds: run.observed_at_ms / 1000,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
            .map_err(status_error)?
            .into_inner();
        observations_new += usize::from(answer.created);
    }
    progress.finish_and_clear();
    let nothing_changed = registered == 0 && updated == 0 && observations_new == 0;
    let models = train_after_import(&mut client, gpu, nothing_changed).await;
    Ok(ImportSummary {
        workloads_registered: registered,
        workloads_updated: updated,
        workloads_unchanged: unchanged,
        incomplete_workloads: prepared.incomplete_workloads,
        observations_new,
        import_batch: None,
        observations_total: prepared.observations.len(),
        pairs_skipped: prepared.pairs_skipped,
        models,
    })
}

/// An imported profile as the API carries it.
fn profile_pb(profile: &Profile, gpu: &GpuName, gpu_memory_gb: f64) -> pb::Profile {
    pb::Profile {
        gpu: gpu.to_string(),
        kernel: Some(pb::KernelMetrics {
            threads: profile.kernel.threads,
            compute_throughput_pct: profile.kernel.compute_throughput_pct,
            dram_throughput_pct: profile.kernel.dram_throughput_pct,
            memory_throughput_pct: profile.kernel.memory_throughput_pct,
            registers: profile.kernel.registers,
            static_shared_memory_bytes: profile.kernel.static_shared_memory_bytes,
        }),
        system: Some(pb::SystemMetrics {
            exclusive_throughput: profile.system.exclusive_throughput,
            throughput_unit: profile.system.throughput_unit.clone(),
            sm_busy_pct: profile.system.sm_busy_pct,
            mem_busy_pct: profile.system.mem_busy_pct,
            memory_gb: profile.system.memory_gb,
        }),
        source: pb::ProfileSource::Imported as i32,
        gpu_memory_gb,
        ..Default::default()
    }
}

/// What registering one imported workload came to.
enum Registered {
    New,
    /// The name was taken with another profile on this GPU, now replaced.
    Updated,
    /// The name was taken with this very profile.
    Unchanged,
}

/// Registers one imported workload; a taken name has its profile compared and replaced
/// only when it differs.
async fn register(
    client: &mut Client,
    request: pb::RegisterWorkloadRequest,
    pb_profile: pb::Profile,
) -> anyhow::Result<Registered> {
    let name = request.name.clone();
    match client.register_workload(request).await {
        Ok(_) => Ok(Registered::New),
        Err(status) if status.code() == tonic::Code::AlreadyExists => {
            let stored = client
                .get_workload(pb::GetWorkloadRequest { name: name.clone() })
                .await
                .map_err(status_error)?
                .into_inner();
            let same = stored.profiles.iter().any(|p| {
                p.gpu == pb_profile.gpu
                    && p.kernel == pb_profile.kernel
                    && p.system == pb_profile.system
            });
            if same {
                Ok(Registered::Unchanged)
            } else {
                client
                    .put_profile(pb::PutProfileRequest {
                        name,
                        profile: Some(pb_profile),
                    })
                    .await
                    .map_err(status_error)?;
                Ok(Registered::Updated)
            }
        }
        Err(status) => Err(status_error(status)),
    }
}

/// The models after an import: the current one when nothing changed, else the KACE
/// baseline and the server's default kind trained anew.
async fn train_after_import(
    client: &mut Client,
    gpu: &GpuName,
    nothing_changed: bool,
) -> Vec<Result<ModelLine, String>> {
    let current = client
        .get_model(pb::GetModelRequest {
            gpu: gpu.to_string(),
            version: 0,
        })
        .await;
    match current {
        Ok(current) if nothing_changed => vec![Ok(model_line(current.get_ref()))],
        _ => {
            let training = coloc::progress::spinner("training models");
            let mut models = Vec::new();
            for kind in ["kace-linear", ""] {
                let trained = client
                    .train(pb::TrainRequest {
                        gpu: gpu.to_string(),
                        kind: kind.into(),
                    })
                    .await;
                models.push(match trained {
                    Ok(answer) => Ok(model_line(
                        answer
                            .get_ref()
                            .model
                            .as_ref()
                            .unwrap_or(&pb::Model::default()),
                    )),
                    Err(status) => Err(status.message().to_string()),
                });
            }
            training.finish_and_clear();
            models
        }
    }
}

/// A model as the import summary prints it.
fn model_line(m: &pb::Model) -> ModelLine {
    ModelLine {
        version: m.version,
        kind: m.kind.clone(),
        observations: m.observations,
        r2: m.r2,
        mse: m.mse,
        status: match pb::ModelStatus::try_from(m.status) {
            Ok(pb::ModelStatus::Promoted) => "promoted",
            Ok(pb::ModelStatus::Rejected) => "rejected",
            _ => "unspecified",
        }
        .to_string(),
        reason: m.reason.clone(),
    }
}
