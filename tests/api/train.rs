//! Train and GetModel: too few runs, coefficients recovered from a known linear truth,
//! default kinds, stored versions, runs without profiles left out, bad requests, and
//! reported runs of three members reaching training (and GetModel showing the sum-level
//! linear model fitted on them).

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{
    expect_code, features, seed_workloads_and_runs, spawn_app, GPU, TRUE_COEFFICIENTS,
    TRUE_INTERCEPT,
};

fn train(kind: &str) -> pb::TrainRequest {
    pb::TrainRequest {
        gpu: GPU.into(),
        kind: kind.into(),
    }
}

fn get_model(version: u64) -> pb::GetModelRequest {
    pb::GetModelRequest {
        gpu: GPU.into(),
        version,
    }
}

#[tokio::test]
async fn get_model_before_training_is_failed_precondition() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 2).await;
    expect_code(
        app.client.get_model(get_model(0)).await,
        Code::FailedPrecondition,
    );
}

#[tokio::test]
async fn train_with_too_few_runs_is_failed_precondition_and_records_why_without_a_model() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 3).await; // 6 runs
    for kind in ["", "kace-linear"] {
        let message = expect_code(
            app.client.train(train(kind)).await,
            Code::FailedPrecondition,
        );
        assert!(message.contains("at least"), "{message}");
    }
    // No model, but each failed attempt is recorded with why.
    assert_eq!(app.count("models").await, 0);
    let failed = app
        .query_i64("SELECT COUNT(*) FROM training_runs WHERE outcome = 'failed' AND reason LIKE '%at least 12%'")
        .await;
    assert_eq!(failed, 2);
}

#[tokio::test]
async fn the_linear_kind_recovers_the_coefficients_behind_the_runs_and_get_model_shows_them() {
    let mut app = spawn_app().await;
    // Pair sums of n workloads span at most n dimensions: 12 workloads identify the 10
    // coefficients and the intercept.
    seed_workloads_and_runs(&mut app, 12).await; // 78 runs
    let trained = app
        .client
        .train(train("kace-linear"))
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    let mut model = app
        .client
        .get_model(get_model(0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        model.history,
        std::slice::from_ref(&trained),
        "GetModel shows the history"
    );
    model.history.clear();
    assert_eq!(model, trained);
    assert_eq!(model.status(), pb::ModelStatus::Promoted);
    assert_eq!(model.reason, "the first model of this GPU model");
    assert!(model.serving);
    assert_eq!(model.gpu, GPU);
    assert_eq!(model.version, 1);
    assert_eq!(model.kind, "kace-linear");
    assert_eq!(model.observations, 78);
    assert!(model.r2 > 0.999_999, "{}", model.r2);
    assert!(model.mse < 1e-12, "{}", model.mse);
    assert!((model.intercept - TRUE_INTERCEPT).abs() < 1e-6, "{model:?}");
    assert_eq!(
        model.set_linear, None,
        "kace-linear has no second linear part"
    );
    let names: Vec<&str> = model
        .coefficients
        .iter()
        .map(|c| c.feature.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "threads",
            "compute_throughput_pct",
            "dram_throughput_pct",
            "memory_throughput_pct",
            "registers",
            "static_shared_memory_bytes",
            "exclusive_throughput",
            "sm_busy_pct",
            "mem_busy_pct",
            "memory_gb",
        ]
    );
    for (got, want) in model.coefficients.iter().zip(TRUE_COEFFICIENTS) {
        assert!(
            (got.value - want).abs() <= 1e-6 * want.abs(),
            "{}: {} vs {want}",
            got.feature,
            got.value
        );
    }
}

#[tokio::test]
async fn train_fits_the_default_kind_unless_told_and_every_version_stays_readable() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 8).await;
    let first = app
        .client
        .train(train(""))
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    assert_eq!(first.kind, "member-ridge-gbt");
    assert_eq!(first.version, 1);
    assert_eq!(
        first.coefficients.len(),
        20,
        "the ridge half's coefficients"
    );
    assert!(first.coefficients.iter().all(|c| c.value.is_finite()));
    assert_eq!(
        first.set_linear, None,
        "fitted on pairs alone: no sum-level part"
    );
    let second = app
        .client
        .train(train("kace-linear"))
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    assert_eq!((second.version, second.kind.as_str()), (2, "kace-linear"));

    // The newest version serves; older ones stay readable.
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: "w00".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // On runs that follow a linear truth the linear kind cross-validates better: promoted.
    assert_eq!(ranked.model_version, 2);
    assert_eq!(
        second.status(),
        pb::ModelStatus::Promoted,
        "{}",
        second.reason
    );
    assert!(second.cv_score.unwrap() >= second.champion_cv_score.unwrap() - 0.005);
    let older = app
        .client
        .get_model(get_model(1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (older.version, older.kind.as_str(), older.serving),
        (1, "member-ridge-gbt", false)
    );
    assert_eq!(older.coefficients, first.coefficients);
    let serving = app
        .client
        .get_model(get_model(0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((serving.version, serving.serving), (2, true));
    let versions: Vec<u64> = serving.history.iter().map(|m| m.version).collect();
    assert_eq!(versions, [2, 1]);
    expect_code(app.client.get_model(get_model(3)).await, Code::NotFound);
}

#[tokio::test]
async fn runs_whose_members_lack_a_profile_are_left_out_of_training() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 8).await;
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: "w07".into() })
        .await
        .unwrap();
    let response = app.client.train(train("")).await.unwrap().into_inner();
    // 36 runs, of which the 8 that involve w07 no longer have a profile for it.
    assert_eq!(response.model.unwrap().observations, 28);
    assert_eq!(response.unusable_observations, 8);
}

#[tokio::test]
async fn train_rejects_an_invalid_gpu_name_or_an_unknown_kind() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 6).await;
    let before = app.dump_store().await;
    expect_code(
        app.client
            .train(pb::TrainRequest {
                gpu: " padded".into(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    let message = expect_code(
        app.client.train(train("random-forest")).await,
        Code::InvalidArgument,
    );
    assert!(message.contains("member-ridge-gbt"), "{message}");
    assert_eq!(app.dump_store().await, before);
}

/// Every triple of distinct workloads among the first `n`, in order.
fn triples_of(n: usize) -> Vec<[usize; 3]> {
    let mut triples = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            for l in j + 1..n {
                triples.push([i, j, l]);
            }
        }
    }
    triples
}

/// Reports one run of `members` (workload, colocated throughput), the `k`-th of a test's,
/// each at its own time.
async fn report_run(app: &mut crate::helpers::TestApp, members: Vec<(&String, f64)>, k: usize) {
    let members = members
        .into_iter()
        .map(|(workload, throughput)| pb::ColocatedMember {
            workload: workload.clone(),
            throughput,
            job_id: String::new(),
        })
        .collect();
    app.client
        .report_colocation(pb::ReportColocationRequest {
            sharing_mode: None,
            gpu: GPU.into(),
            members,
            observed_at: Some(prost_types::Timestamp {
                seconds: 1_800_000_000 + k as i64,
                nanos: 0,
            }),
            gpu_id: String::new(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn reported_runs_of_three_members_reach_training_and_move_the_models_answers() {
    let (mut app, workloads) = crate::helpers::slowdown_app(8).await;
    let pairs_only = app
        .client
        .get_model(pb::GetModelRequest {
            gpu: GPU.into(),
            version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pairs_only.observations, 36,
        "8 workloads: 36 pairs, self-pairs included"
    );

    // Every triple of distinct workloads, each member keeping 20 % of its speed: below
    // anything the pairs teach (the pair law keeps 30-95 %).
    let exclusive = |p: &pb::Profile| p.system.as_ref().unwrap().exclusive_throughput;
    let triples = triples_of(8);
    for (k, triple) in triples.iter().enumerate() {
        let members = triple
            .iter()
            .map(|&i| (&workloads[i].0, 0.2 * exclusive(&workloads[i].1)))
            .collect();
        report_run(&mut app, members, k).await;
    }
    let trained = app.client.train(train("")).await.unwrap().into_inner();
    let with_triples = trained.model.unwrap();
    assert_eq!(
        with_triples.observations,
        36 + 56,
        "every triple reached training"
    );

    // The triples' predicted speed fractions move towards what was reported.
    let mean_fraction = |app: &mut crate::helpers::TestApp, version: u64| {
        let mut client = app.client.clone();
        let triples = triples.clone();
        let names: Vec<String> = workloads.iter().map(|w| w.0.clone()).collect();
        async move {
            client
                .pin_model(pb::PinModelRequest {
                    gpu: GPU.into(),
                    version,
                })
                .await
                .unwrap();
            let mut sum = 0.0;
            for triple in &triples {
                let answer = client
                    .predict(pb::PredictRequest {
                        workloads: triple.iter().map(|&i| names[i].clone()).collect(),
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                sum += answer
                    .members
                    .iter()
                    .map(|m| m.predicted_speed_fraction.unwrap())
                    .sum::<f64>()
                    / 3.0;
            }
            sum / triples.len() as f64
        }
    };
    let before = mean_fraction(&mut app, pairs_only.version).await;
    let after = mean_fraction(&mut app, with_triples.version).await;
    assert!(
        (after - 0.2).abs() < (before - 0.2).abs() / 2.0,
        "mean predicted fraction of the reported triples: {before:.3} before, {after:.3} after"
    );
}

#[tokio::test]
async fn get_model_shows_the_sum_level_linear_model_fitted_on_runs_of_three() {
    let mut app = spawn_app().await;
    // 78 pairs. Every triple of distinct workloads, its sum following the known linear truth
    // of the summed metrics (thirds to each member): the sum-level model, a ridge fit (its
    // penalty shrinks the coefficients, so they are not the truth's to the digit), must
    // read the triples' sums as the truth does.
    let workloads = seed_workloads_and_runs(&mut app, 12).await;
    let triples = triples_of(12);
    let mut true_sums = Vec::new();
    for (k, triple) in triples.iter().enumerate() {
        let sum = TRUE_INTERCEPT
            + (0..10)
                .map(|f| {
                    TRUE_COEFFICIENTS[f]
                        * triple
                            .iter()
                            .map(|&w| features(&workloads[w].1)[f])
                            .sum::<f64>()
                })
                .sum::<f64>();
        let members = triple
            .iter()
            .map(|&w| (&workloads[w].0, sum / 3.0))
            .collect();
        report_run(&mut app, members, k).await;
        true_sums.push(sum);
    }
    let trained = app
        .client
        .train(train(""))
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    assert_eq!(
        (trained.kind.as_str(), trained.observations),
        ("member-ridge-gbt", 78 + 220)
    );
    let model = app
        .client
        .get_model(get_model(trained.version))
        .await
        .unwrap()
        .into_inner();
    let linear = model
        .set_linear
        .expect("fitted on triples: a sum-level part");
    let names: Vec<&str> = linear
        .coefficients
        .iter()
        .map(|c| c.feature.as_str())
        .collect();
    assert_eq!(names[0], "threads");
    assert_eq!(names[9], "memory_gb");
    assert_eq!(linear.coefficients.len(), 10);
    // The shown intercept and coefficients, applied to each triple's summed metrics, give
    // the triples' sums: R^2 against the truth >= 0.95 (coefficients shown in another
    // order, or of another fit, would not).
    let shown: Vec<f64> = triples
        .iter()
        .map(|triple| {
            linear.intercept
                + linear
                    .coefficients
                    .iter()
                    .enumerate()
                    .map(|(f, c)| {
                        c.value
                            * triple
                                .iter()
                                .map(|&w| features(&workloads[w].1)[f])
                                .sum::<f64>()
                    })
                    .sum::<f64>()
        })
        .collect();
    let mean = true_sums.iter().sum::<f64>() / true_sums.len() as f64;
    let total: f64 = true_sums.iter().map(|y| (y - mean).powi(2)).sum();
    let residual: f64 = true_sums
        .iter()
        .zip(&shown)
        .map(|(y, p)| (y - p).powi(2))
        .sum();
    let r2 = 1.0 - residual / total;
    assert!(
        r2 >= 0.95,
        "R^2 {r2:.4} of the shown linear part: {linear:?}"
    );
    // The coefficient of the dominant term (exclusive throughput, 0.9 in the truth) keeps
    // its sign and size.
    let exclusive = &linear.coefficients[6];
    assert_eq!(exclusive.feature, "exclusive_throughput");
    assert!(
        (exclusive.value - TRUE_COEFFICIENTS[6]).abs() < 0.5 * TRUE_COEFFICIENTS[6],
        "{exclusive:?}"
    );
}
