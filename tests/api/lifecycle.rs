//! The model lifecycle: challengers judged against the champion, versions with verdicts,
//! pins, failed fits, outliers, drift, restarts, and retraining from reported runs of the
//! published KACE data. The retraining task is driven through `Trainer::run_once`.

use std::{sync::Arc, time::Duration};

use coloc::{
    advisor::Trigger,
    domain::GpuName,
    import::{import_kace, KaceDataset, KacePair, KACE_GPU, KACE_GPU_MEMORY_GB},
    proto as pb,
    trainer::{Trainer, TrainerOutcome},
};
use tempfile::TempDir;
use tonic::Code;

use crate::helpers::{
    expect_code, kace_dir, seed_workloads_and_runs, spawn_app_with_config, TestApp, GPU,
};

/// A server whose own retraining task is off (the tests drive one), with a short drift
/// window.
async fn app() -> TestApp {
    spawn_app_with_config(
        Arc::new(TempDir::new().unwrap()),
        "[trainer]\ninterval_secs = 0\nmin_new_observations = 20\ndrift_window = 5\n",
    )
    .await
}

fn trainer(app: &TestApp) -> Trainer {
    Trainer::new(
        app.advisor.clone(),
        app.advisor.store().clone(),
        Duration::from_secs(3600),
    )
}

async fn kace_app() -> TestApp {
    let app = app().await;
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&app.advisor, &kace_dir(), &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    app
}

async fn model(app: &mut TestApp, gpu: &str, version: u64) -> pb::Model {
    app.client
        .get_model(pb::GetModelRequest {
            gpu: gpu.into(),
            version,
        })
        .await
        .unwrap()
        .into_inner()
}

async fn serving_version(app: &mut TestApp, target: &str) -> u64 {
    app.client
        .rank(pb::RankRequest {
            target: target.into(),
            top_k: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .model_version
}

/// A run of workloads k and k+1 (of the first seven) that went three times faster than
/// the linear truth behind the seeded runs, at a time after them.
fn drifting_report(workloads: &[(String, pb::Profile)], k: usize) -> pb::ReportColocationRequest {
    let (name, profile) = &workloads[k % 7];
    let (other, other_profile) = &workloads[k % 7 + 1];
    let sum = crate::helpers::true_sum(profile, other_profile) * 3.0;
    let member = |workload: &String| pb::ColocatedMember {
        workload: workload.clone(),
        throughput: sum / 2.0,
        job_id: String::new(),
    };
    pb::ReportColocationRequest {
        sharing_mode: None,
        gpu_id: String::new(),
        gpu: GPU.into(),
        members: vec![member(name), member(other)],
        observed_at: Some(prost_types::Timestamp {
            seconds: 1_800_000_000 + k as i64,
            nanos: 0,
        }),
    }
}

#[tokio::test]
async fn a_better_challenger_is_promoted_and_a_worse_one_rejected() {
    let mut app = kace_app().await;
    // The import fits the KACE baseline (first model), then the per-member model, which
    // cross-validates better and is promoted.
    let better = model(&mut app, KACE_GPU, 2).await;
    assert_eq!(
        better.status(),
        pb::ModelStatus::Promoted,
        "{}",
        better.reason
    );
    assert!(
        better.cv_score.unwrap() > better.champion_cv_score.unwrap(),
        "{}",
        better.reason
    );
    assert!(
        better.cv_mse.unwrap() < better.champion_cv_mse.unwrap(),
        "{}",
        better.reason
    );

    // The KACE baseline again, now as a challenger to the per-member champion: worse.
    let response = app
        .client
        .train(pb::TrainRequest {
            gpu: KACE_GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let worse = response.model.unwrap();
    assert!(!response.promoted);
    assert_eq!(
        (worse.version, worse.status()),
        (3, pb::ModelStatus::Rejected)
    );
    assert!(
        worse.reason.starts_with("worse than the champion"),
        "{}",
        worse.reason
    );
    assert_eq!(response.champion_version, 2);
    assert_eq!(
        serving_version(&mut app, "bert-base-cased_batch8-inf").await,
        2
    );

    let listed = app
        .client
        .list_models(pb::ListModelsRequest {
            gpu: KACE_GPU.into(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .models;
    let summary: Vec<(u64, pb::ModelStatus, bool)> = listed
        .iter()
        .map(|m| (m.version, m.status(), m.serving))
        .collect();
    assert_eq!(
        summary,
        [
            (3, pb::ModelStatus::Rejected, false),
            (2, pb::ModelStatus::Promoted, true),
            (1, pb::ModelStatus::Promoted, false)
        ]
    );
}

#[tokio::test]
async fn an_operator_pin_overrides_training_until_unpinned() {
    let mut app = kace_app().await;
    let pinned = app
        .client
        .pin_model(pb::PinModelRequest {
            gpu: KACE_GPU.into(),
            version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(pinned.pinned && pinned.serving);
    assert_eq!(
        serving_version(&mut app, "bert-base-cased_batch8-inf").await,
        1
    );

    // A promoted challenger is stored but does not replace a pinned model.
    let trained = app
        .client
        .train(pb::TrainRequest {
            gpu: KACE_GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(trained.promoted, "{}", trained.model.unwrap().reason);
    assert_eq!(
        serving_version(&mut app, "bert-base-cased_batch8-inf").await,
        1
    );

    let unpinned = app
        .client
        .unpin_model(pb::UnpinModelRequest {
            gpu: KACE_GPU.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (unpinned.version, unpinned.pinned, unpinned.serving),
        (3, false, true)
    );
    assert_eq!(
        serving_version(&mut app, "bert-base-cased_batch8-inf").await,
        3
    );

    let pin = |version| pb::PinModelRequest {
        gpu: KACE_GPU.into(),
        version,
    };
    expect_code(app.client.pin_model(pin(99)).await, Code::NotFound);
    expect_code(app.client.pin_model(pin(0)).await, Code::InvalidArgument);
    expect_code(
        app.client
            .unpin_model(pb::UnpinModelRequest {
                gpu: KACE_GPU.into(),
            })
            .await,
        Code::FailedPrecondition,
    );
}

#[tokio::test]
async fn a_failed_fit_keeps_the_champion_and_says_why() {
    let mut app = app().await;
    seed_workloads_and_runs(&mut app, 8).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    for i in 2..8 {
        app.client
            .delete_workload(pb::DeleteWorkloadRequest {
                name: format!("w{i:02}"),
            })
            .await
            .unwrap();
    }
    // Three usable runs are left (w00 and w01 with each other and themselves).
    let message = expect_code(
        app.client
            .train(pb::TrainRequest {
                gpu: GPU.into(),
                kind: String::new(),
            })
            .await,
        Code::FailedPrecondition,
    );
    assert!(message.contains("the champion stays"), "{message}");
    let champion = model(&mut app, GPU, 0).await;
    assert_eq!((champion.version, champion.serving), (1, true));
    assert_eq!(serving_version(&mut app, "w00").await, 1);
    assert_eq!(
        app.query_i64("SELECT COUNT(*) FROM training_runs WHERE outcome = 'failed'")
            .await,
        1
    );
}

#[tokio::test]
async fn outliers_are_flagged_kept_and_left_out_of_training() {
    let mut app = app().await;
    seed_workloads_and_runs(&mut app, 8).await;
    let exclusive = |w: &pb::Workload| w.profiles[0].system.as_ref().unwrap().exclusive_throughput;
    let w0 = app
        .client
        .get_workload(pb::GetWorkloadRequest { name: "w00".into() })
        .await
        .unwrap()
        .into_inner();
    let w1 = app
        .client
        .get_workload(pb::GetWorkloadRequest { name: "w01".into() })
        .await
        .unwrap()
        .into_inner();
    app.client
        .report_colocation(pb::ReportColocationRequest {
            sharing_mode: None,
            gpu_id: String::new(),
            gpu: GPU.into(),
            members: vec![
                pb::ColocatedMember {
                    workload: "w00".into(),
                    throughput: exclusive(&w0) * 500.0,
                    job_id: String::new(),
                },
                pb::ColocatedMember {
                    workload: "w01".into(),
                    throughput: exclusive(&w1) * 0.5,
                    job_id: String::new(),
                },
            ],
            observed_at: None,
        })
        .await
        .unwrap();
    let trained = app
        .client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    assert_eq!(trained.excluded_outliers, 1);
    assert_eq!(
        trained.observations, 36,
        "37 runs stored, the outlier left out"
    );
    let flagged = app
        .query_i64("SELECT COUNT(*) FROM observations WHERE outlier_reason LIKE 'w00 ran at 500%'")
        .await;
    assert_eq!(flagged, 1);
    assert_eq!(app.count("observations").await, 37, "kept, not dropped");
}

#[tokio::test]
async fn drift_in_the_champions_errors_triggers_an_early_retrain() {
    let mut app = app().await;
    let workloads = seed_workloads_and_runs(&mut app, 8).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap();
    let trainer = trainer(&app);
    assert!(
        trainer.run_once().await.unwrap().is_empty(),
        "nothing new, nothing due"
    );

    // Five runs that go three times faster than the champion predicts: too few for a
    // scheduled retrain (20), enough to fill the drift window (5).
    for k in 0..5 {
        app.client
            .report_colocation(drifting_report(&workloads, k))
            .await
            .unwrap();
    }
    let champion = model(&mut app, GPU, 0).await;
    assert_eq!(champion.rolling_error_samples, 5);
    assert!(
        (champion.rolling_error.unwrap() - 2.0 / 3.0).abs() < 1e-6,
        "{:?}",
        champion.rolling_error
    );

    let outcomes = trainer.run_once().await.unwrap();
    assert_eq!(outcomes.len(), 1);
    assert!(
        matches!(
            &outcomes[0],
            TrainerOutcome::Trained {
                trigger: Trigger::Drift,
                ..
            }
        ),
        "{outcomes:?}"
    );
    assert!(
        trainer.run_once().await.unwrap().is_empty(),
        "no new runs since that retrain"
    );
}

#[tokio::test]
async fn a_restart_keeps_the_champion_the_history_and_the_pin() {
    let mut app = kace_app().await;
    app.client
        .train(pb::TrainRequest {
            gpu: KACE_GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap();
    app.client
        .pin_model(pb::PinModelRequest {
            gpu: KACE_GPU.into(),
            version: 2,
        })
        .await
        .unwrap();
    let before = model(&mut app, KACE_GPU, 0).await;
    let dir = app.stop().await;

    let mut restarted = spawn_app_with_config(dir, "[trainer]\ninterval_secs = 0\n").await;
    let after = model(&mut restarted, KACE_GPU, 0).await;
    assert_eq!(after, before);
    assert_eq!((after.version, after.pinned), (2, true));
    let statuses: Vec<pb::ModelStatus> = after.history.iter().map(|m| m.status()).collect();
    assert_eq!(
        statuses,
        [
            pb::ModelStatus::Rejected,
            pb::ModelStatus::Promoted,
            pb::ModelStatus::Promoted
        ]
    );
}

/// Registers the KACE workloads with their published profiles (no run yet).
async fn register_kace_workloads(app: &mut TestApp, dataset: &KaceDataset) {
    for w in &dataset.workloads {
        let profile = pb::Profile {
            gpu: KACE_GPU.into(),
            kernel: Some(pb::KernelMetrics {
                threads: w.kernel.threads,
                compute_throughput_pct: w.kernel.compute_throughput_pct,
                dram_throughput_pct: w.kernel.dram_throughput_pct,
                memory_throughput_pct: w.kernel.memory_throughput_pct,
                registers: w.kernel.registers,
                static_shared_memory_bytes: w.kernel.static_shared_memory_bytes,
            }),
            system: Some(pb::SystemMetrics {
                exclusive_throughput: w.system.exclusive_throughput,
                throughput_unit: String::new(),
                sm_busy_pct: w.system.sm_busy_pct,
                mem_busy_pct: w.system.mem_busy_pct,
                memory_gb: w.system.memory_gb,
            }),
            gpu_memory_gb: KACE_GPU_MEMORY_GB,
            ..Default::default()
        };
        app.client
            .register_workload(pb::RegisterWorkloadRequest {
                name: w.name.to_string(),
                mode: pb::WorkloadMode::Inference as i32,
                model: w.model.clone(),
                batch_size: w.batch_size,
                profile: Some(profile),
                ..Default::default()
            })
            .await
            .unwrap();
    }
}

/// A run of two KACE workloads with the given throughputs, observed at `at` (s).
fn kace_run(
    (first, first_throughput): (&str, f64),
    (second, second_throughput): (&str, f64),
    at: i64,
) -> pb::ReportColocationRequest {
    let member = |workload: &str, throughput: f64| pb::ColocatedMember {
        workload: workload.into(),
        throughput,
        job_id: String::new(),
    };
    pb::ReportColocationRequest {
        sharing_mode: None,
        gpu_id: String::new(),
        gpu: KACE_GPU.into(),
        members: vec![
            member(first, first_throughput),
            member(second, second_throughput),
        ],
        observed_at: Some(prost_types::Timestamp {
            seconds: at,
            nanos: 0,
        }),
    }
}

/// The served model's rank quality on measured pairs it was never given: per target with
/// at least two held-out partners, the measured throughput sum of the partner with the
/// best predicted sum over the best measured sum; the mean over targets.
async fn held_out_rank_quality(app: &mut TestApp, held_out: &[&KacePair]) -> f64 {
    let mut by_target: std::collections::BTreeMap<&str, Vec<(f64, f64)>> = Default::default();
    for pair in held_out {
        let predicted = app
            .client
            .predict(pb::PredictRequest {
                sharing_mode: None,
                workloads: vec![pair.workload1.clone(), pair.workload2.clone()],
                gpu: KACE_GPU.into(),
                gpu_memory_gb: 0.0,
            })
            .await
            .unwrap()
            .into_inner()
            .predicted_throughput_sum;
        for target in [&pair.workload1, &pair.workload2] {
            by_target
                .entry(target)
                .or_default()
                .push((predicted, pair.throughput_sum()));
        }
    }
    let scores: Vec<f64> = by_target
        .values()
        .filter(|candidates| candidates.len() >= 2)
        .map(|candidates| {
            let best = candidates.iter().map(|c| c.1).fold(f64::MIN, f64::max);
            let pick = candidates
                .iter()
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap();
            pick.1 / best
        })
        .collect();
    assert!(scores.len() >= 10, "{} targets", scores.len());
    scores.iter().sum::<f64>() / scores.len() as f64
}

/// The champion trained on two thirds of the measured KACE pairs; the KACE baseline
/// (`kace-linear`) trained on the same runs as a challenger. Whether the challenger is
/// worse is measured here, outside the judge: both models serve in turn (the challenger
/// pinned) and rank the held-out third of the measured pairs, which neither was trained
/// or judged on. The worse one must be rejected, and the champion stays the one served.
#[tokio::test]
async fn a_challenger_worse_on_held_out_measured_pairs_is_never_promoted() {
    let mut app = app().await;
    let dataset = KaceDataset::read(&kace_dir()).unwrap();
    register_kace_workloads(&mut app, &dataset).await;
    type Indexed<'a> = Vec<(usize, &'a KacePair)>;
    let (held_out, reported): (Indexed, Indexed) = dataset
        .pairs
        .iter()
        .enumerate()
        .partition(|(i, _)| i % 3 == 0);
    let held_out: Vec<&KacePair> = held_out.into_iter().map(|(_, p)| p).collect();
    for (i, pair) in &reported {
        let run = kace_run(
            (&pair.workload1, pair.throughput1),
            (&pair.workload2, pair.throughput2),
            1_700_000_000 + *i as i64,
        );
        app.client.report_colocation(run).await.unwrap();
    }
    let first = trainer(&app).run_once().await.unwrap();
    assert!(
        matches!(&first[..], [TrainerOutcome::Trained { outcome, .. }] if outcome.promoted),
        "{first:?}"
    );
    let champion = model(&mut app, KACE_GPU, 0).await;
    let target = dataset.pairs[0].workload1.clone();
    assert_eq!(serving_version(&mut app, &target).await, champion.version);
    let champion_quality = held_out_rank_quality(&mut app, &held_out).await;

    let response = app
        .client
        .train(pb::TrainRequest {
            gpu: KACE_GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let challenger = response.model.unwrap();
    assert_eq!(challenger.observations, reported.len() as u64);
    app.client
        .pin_model(pb::PinModelRequest {
            gpu: KACE_GPU.into(),
            version: challenger.version,
        })
        .await
        .unwrap();
    assert_eq!(serving_version(&mut app, &target).await, challenger.version);
    let challenger_quality = held_out_rank_quality(&mut app, &held_out).await;
    app.client
        .unpin_model(pb::UnpinModelRequest {
            gpu: KACE_GPU.into(),
        })
        .await
        .unwrap();
    eprintln!(
        "held-out rank quality: champion v{} {champion_quality:.4}, challenger v{} \
         {challenger_quality:.4}",
        champion.version, challenger.version
    );
    // The premise, measured: the challenger is clearly worse where neither has looked.
    assert!(
        challenger_quality < champion_quality - 0.01,
        "challenger {challenger_quality} vs champion {champion_quality}"
    );
    assert!(!response.promoted, "{}", challenger.reason);
    assert_eq!(challenger.status(), pb::ModelStatus::Rejected);
    assert_eq!(response.champion_version, champion.version);
    assert_eq!(model(&mut app, KACE_GPU, 0).await.version, champion.version);
    assert_eq!(serving_version(&mut app, &target).await, champion.version);
}

#[tokio::test]
async fn drift_does_not_retrain_again_until_a_new_window_of_runs_arrives() {
    let mut app = app().await;
    let workloads = seed_workloads_and_runs(&mut app, 8).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: "kace-linear".into(),
        })
        .await
        .unwrap();
    // Pinned, the drifting champion stays whatever the retrains decide.
    app.client
        .pin_model(pb::PinModelRequest {
            gpu: GPU.into(),
            version: 1,
        })
        .await
        .unwrap();
    let trainer = trainer(&app);
    let mut retrains = Vec::new();
    for k in 0..11 {
        app.client
            .report_colocation(drifting_report(&workloads, k))
            .await
            .unwrap();
        retrains.push(trainer.run_once().await.unwrap().len());
    }
    // A window is 5 runs: retrains after the 5th and the 10th run only.
    assert_eq!(retrains, [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]);
    assert_eq!(serving_version(&mut app, "w00").await, 1);
}

/// Reported runs retrain in batches: the first 60 KACE pairs train a model, every further
/// batch of 30 retrains (each challenger judged against a champion), and a batch smaller
/// than `min_new_observations` (20) does not, so the newest model holds the first 180.
#[tokio::test]
async fn reported_runs_retrain_batch_by_batch_and_never_on_fewer_than_the_minimum() {
    let mut app = app().await;
    let dataset = KaceDataset::read(&kace_dir()).unwrap();
    register_kace_workloads(&mut app, &dataset).await;
    let report = |i: usize| {
        let pair = &dataset.pairs[i];
        kace_run(
            (&pair.workload1, pair.throughput1),
            (&pair.workload2, pair.throughput2),
            1_700_000_000 + i as i64,
        )
    };
    for i in 0..60 {
        app.client.report_colocation(report(i)).await.unwrap();
    }
    let trainer = trainer(&app);
    let first = trainer.run_once().await.unwrap();
    assert!(
        matches!(&first[..], [TrainerOutcome::Trained { .. }]),
        "{first:?}"
    );
    let mut judged = 0;
    for batch in (60..dataset.pairs.len()).collect::<Vec<_>>().chunks(30) {
        for &i in batch {
            app.client.report_colocation(report(i)).await.unwrap();
        }
        for outcome in trainer.run_once().await.unwrap() {
            match outcome {
                TrainerOutcome::Trained { outcome, .. } => {
                    assert!(outcome.model.comparison.is_some(), "not judged");
                    judged += 1;
                }
                TrainerOutcome::Failed { error, .. } => panic!("retraining failed: {error}"),
            }
        }
    }
    // 181 pairs: batches of 30 from 60 to 180 retrain four times; the last holds one run.
    assert_eq!(dataset.pairs.len(), 181);
    assert_eq!(judged, 4);
    let newest = app
        .query_i64(
            "SELECT observations + excluded_outliers FROM models ORDER BY version DESC LIMIT 1",
        )
        .await;
    assert_eq!(newest, 180);
    assert!(trainer.run_once().await.unwrap().is_empty());
}
