//! `coloc eval nway --through-api`: the artifact's N-way protocol judged through the public
//! API of a real server instead of fitting models in-process. Per case (set, scope,
//! training, target) a fresh server is built on a loopback port 0 with a fresh SQLite file
//! in a temporary folder; the dataset's workloads are registered with their profiles, the
//! case's training rows (the training pairs first, then the training runs, in the order
//! the in-process evaluation fits them) are reported one run per `ReportColocation`, each
//! model kind is trained with `Train`, its version pinned with `PinModel` (so that a
//! challenger the champion comparison rejects still answers, and the verdict is recorded),
//! and every candidate run is answered by `Predict`. The picks and scores are
//! `nway::scored`'s, the same as in-process.
//!
//! The server gets the settings `coloc serve` would (a settings file and `COLOC__*`
//! variables), except where it listens, its database, no metrics endpoint, and no
//! retraining task (`trainer.interval_secs = 0`: only the `Train` calls here fit models).

use std::path::Path;

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::{
    nway::{self, NwayCase, NwayData, NwayResult},
    Policy,
};
use coloc::{
    api::convert::profile_to_pb,
    dataset::{KACE_GPU, KACE_GPU_MEMORY_GB},
    domain::{GpuName, Profile, ProfileSource, WorkloadMode},
    model::ModelKind,
    proto::{self as pb, colocation_advisor_client::ColocationAdvisorClient},
    settings::{Settings, SettingsSources},
    startup::App,
};

/// Predict calls in flight at once (answers do not depend on their order).
const PREDICTS_IN_FLIGHT: usize = 8;

/// What training decided in one case for one model kind, as the API answered.
#[derive(Debug, Clone, Serialize)]
pub struct ApiTraining {
    pub set: String,
    pub scope: &'static str,
    pub training: &'static str,
    pub target: String,
    pub kind: &'static str,
    /// Runs reported (training pairs and runs).
    pub reported: usize,
    /// Runs the model was fitted on (`Model.observations`).
    pub observations: u64,
    /// Runs flagged as outliers and left out (`Model.excluded_outliers`).
    pub excluded_outliers: u64,
    /// Whether the champion comparison promoted it (the first model always is).
    pub promoted: bool,
}

/// The evaluation of one run-set file through the API.
pub struct ApiEvaluation {
    /// One per case and model kind, as `nway::evaluate` returns them.
    pub results: Vec<NwayResult>,
    pub trainings: Vec<ApiTraining>,
    /// Servers started (one per case).
    pub servers: usize,
}

/// The settings each case's server runs with: `config` (a `coloc serve` settings file) and
/// the `COLOC__*` variables, with the listener, database, metrics and retraining fixed.
fn case_settings(config: Option<&Path>, database: &Path) -> anyhow::Result<Settings> {
    Ok(Settings::load(SettingsSources {
        file: config,
        environment: None,
        overrides: vec![
            ("server.listen", "127.0.0.1:0".into()),
            ("metrics.listen", String::new()),
            ("database.url", format!("sqlite://{}", database.display())),
            ("trainer.interval_secs", "0".into()),
        ],
    })?)
}

/// Runs every case of `data` for every model kind through a fresh server per case.
pub async fn evaluate(
    data: &NwayData,
    cases: &[NwayCase],
    kinds: &[ModelKind],
    config: Option<&Path>,
) -> anyhow::Result<ApiEvaluation> {
    let gpu = GpuName::parse("gpu", KACE_GPU)?;
    let registrations = registrations(data, &gpu)?;
    let progress = coloc::progress::bar(cases.len() as u64, &format!("api {}", data.label));
    let mut evaluation = ApiEvaluation {
        results: Vec::new(),
        trainings: Vec::new(),
        servers: 0,
    };
    for (c, case) in cases.iter().enumerate() {
        progress.inc(1);
        let folder = tempfile::TempDir::new().context("cannot make a temporary folder")?;
        let settings = case_settings(config, &folder.path().join("coloc.db"))?;
        let app = App::build(&settings)
            .await
            .context("cannot start a server")?;
        let addr = app.local_addr();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(app.run_until_stopped(shutdown.clone()));
        evaluation.servers += 1;
        let judged = async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
                .connect()
                .await
                .with_context(|| format!("cannot connect to the server at {addr}"))?;
            let mut client = ColocationAdvisorClient::new(channel);
            judge_case(&mut client, data, case, c, kinds, &gpu, &registrations).await
        }
        .await
        .with_context(|| {
            format!(
                "{} {} {} {} through the API",
                data.label,
                case.scope.as_str(),
                case.training.as_str(),
                case.target
            )
        });
        shutdown.cancel();
        server
            .await
            .context("the server task panicked")?
            .context("the server failed")?;
        let (results, trainings) = judged?;
        evaluation.results.extend(results);
        evaluation.trainings.extend(trainings);
    }
    progress.finish_and_clear();
    Ok(evaluation)
}

/// Every workload of the profile dataset as a RegisterWorkload request with its profile.
fn registrations(
    data: &NwayData,
    gpu: &GpuName,
) -> anyhow::Result<Vec<pb::RegisterWorkloadRequest>> {
    data.workloads
        .iter()
        .map(|w| {
            let profile = Profile {
                gpu: gpu.clone(),
                kernel: w.kernel,
                system: w.system.clone(),
                source: ProfileSource::ClientSupplied,
                gpu_memory_gb: Some(KACE_GPU_MEMORY_GB),
                measured_at_ms: 0,
                kernel_missing: false,
            };
            profile
                .validate()
                .with_context(|| format!("workload {} has invalid metrics", w.name))?;
            Ok(pb::RegisterWorkloadRequest {
                name: w.name.to_string(),
                mode: match w.mode {
                    WorkloadMode::Training => pb::WorkloadMode::Training,
                    WorkloadMode::Inference => pb::WorkloadMode::Inference,
                } as i32,
                model: w.model.clone(),
                batch_size: w.batch_size,
                profile: Some(profile_to_pb(&profile)),
                ..Default::default()
            })
        })
        .collect()
}

/// One case on one fresh server: register, report, then per kind train, pin and predict.
async fn judge_case(
    client: &mut ColocationAdvisorClient<Channel>,
    data: &NwayData,
    case: &NwayCase,
    c: usize,
    kinds: &[ModelKind],
    gpu: &GpuName,
    registrations: &[pb::RegisterWorkloadRequest],
) -> anyhow::Result<(Vec<NwayResult>, Vec<ApiTraining>)> {
    for request in registrations {
        client
            .register_workload(request.clone())
            .await
            .with_context(|| format!("RegisterWorkload {}", request.name))?;
    }
    // In the order the in-process evaluation fits them (pairs, then runs), one second
    // apart: distinct times keep two equal runs of the data two runs, as the fit sees them.
    let names = data.training_names(case);
    let rows = data.training_rows(case);
    for (k, (members, row)) in names.iter().zip(&rows).enumerate() {
        let answer = client
            .report_colocation(pb::ReportColocationRequest {
                sharing_mode: None,
                gpu: gpu.to_string(),
                members: members
                    .iter()
                    .zip(&row.throughputs)
                    .map(|(workload, &throughput)| pb::ColocatedMember {
                        workload: workload.clone(),
                        throughput,
                        job_id: String::new(),
                    })
                    .collect(),
                observed_at: Some(prost_types::Timestamp {
                    seconds: k as i64 + 1,
                    nanos: 0,
                }),
                gpu_id: String::new(),
            })
            .await
            .with_context(|| format!("ReportColocation of training row {k} ({members:?})"))?
            .into_inner();
        if !answer.created {
            bail!("training row {k} ({members:?}) was stored as a repeat of another");
        }
    }

    let mut results = Vec::new();
    let mut trainings = Vec::new();
    for &kind in kinds {
        let trained = client
            .train(pb::TrainRequest {
                gpu: gpu.to_string(),
                kind: kind.as_str().to_string(),
            })
            .await
            .with_context(|| format!("Train {}", kind.as_str()))?
            .into_inner();
        let model = trained
            .model
            .context("Train answered without the model it trained")?;
        // The version trained answers, whatever the verdict (a rejected challenger would
        // not serve in a deployment; the verdict is reported beside the figures).
        client
            .pin_model(pb::PinModelRequest {
                gpu: gpu.to_string(),
                version: model.version,
            })
            .await
            .with_context(|| format!("PinModel {}", model.version))?;
        trainings.push(ApiTraining {
            set: data.label.clone(),
            scope: case.scope.as_str(),
            training: case.training.as_str(),
            target: case.target.clone(),
            kind: kind.as_str(),
            reported: rows.len(),
            observations: model.observations,
            excluded_outliers: model.excluded_outliers,
            promoted: trained.promoted,
        });
        let predictions: Vec<f64> = futures::stream::iter(case.candidates.iter().map(|&i| {
            let mut client = client.clone();
            let run = &data.runs[i];
            let version = model.version;
            async move {
                let answer = client
                    .predict(pb::PredictRequest {
                        sharing_mode: None,
                        workloads: run.members.clone(),
                        gpu: gpu.to_string(),
                        gpu_memory_gb: 0.0,
                    })
                    .await
                    .with_context(|| format!("Predict run {} ({:?})", run.id, run.members))?
                    .into_inner();
                if answer.model_version != version {
                    bail!(
                        "Predict of run {} answered with version {}, not the pinned {version}",
                        run.id,
                        answer.model_version
                    );
                }
                Ok(answer.predicted_throughput_sum)
            }
        }))
        .buffered(PREDICTS_IN_FLIGHT)
        .try_collect()
        .await?;
        results.push(nway::scored(
            data,
            case,
            c,
            Policy::Model(kind),
            predictions,
        ));
    }
    Ok((results, trainings))
}
