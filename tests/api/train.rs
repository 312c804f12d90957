use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{
    expect_code, seed_workloads_and_runs, spawn_app, GPU, TRUE_COEFFICIENTS, TRUE_INTERCEPT,
};

#[tokio::test]
async fn get_model_before_training_is_failed_precondition() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 2).await;
    expect_code(
        app.client
            .get_model(pb::GetModelRequest { gpu: GPU.into() })
            .await,
        Code::FailedPrecondition,
    );
}

#[tokio::test]
async fn train_with_too_few_runs_is_failed_precondition_and_stores_no_model() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 3).await; // 6 runs
    let before = app.dump_store().await;
    let message = expect_code(
        app.client.train(pb::TrainRequest { gpu: GPU.into() }).await,
        Code::FailedPrecondition,
    );
    assert!(message.contains("at least"), "{message}");
    assert_eq!(app.dump_store().await, before);
}

#[tokio::test]
async fn train_recovers_the_coefficients_behind_the_runs_and_get_model_shows_them() {
    let mut app = spawn_app().await;
    // Pair sums of n workloads span at most n dimensions: 12 workloads identify the 10
    // coefficients and the intercept.
    seed_workloads_and_runs(&mut app, 12).await; // 78 runs
    let trained = app
        .client
        .train(pb::TrainRequest { gpu: String::new() })
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    let model = app
        .client
        .get_model(pb::GetModelRequest { gpu: GPU.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(model, trained);
    assert_eq!(model.gpu, GPU);
    assert_eq!(model.version, 1);
    assert_eq!(model.kind, "kace-linear");
    assert_eq!(model.observations, 78);
    assert!(model.r2 > 0.999_999, "{}", model.r2);
    assert!(model.mse < 1e-12, "{}", model.mse);
    assert!((model.intercept - TRUE_INTERCEPT).abs() < 1e-6, "{model:?}");
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

    let again = app
        .client
        .train(pb::TrainRequest { gpu: GPU.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.model.unwrap().version, 2);
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: "w00".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ranked.model_version, 2);
}

#[tokio::test]
async fn runs_whose_members_lack_a_profile_are_left_out_of_training() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 8).await;
    app.client
        .delete_workload(pb::DeleteWorkloadRequest { name: "w07".into() })
        .await
        .unwrap();
    let model = app
        .client
        .train(pb::TrainRequest { gpu: GPU.into() })
        .await
        .unwrap()
        .into_inner()
        .model
        .unwrap();
    // 36 runs, of which the 8 that involve w07 no longer have a profile for it.
    assert_eq!(model.observations, 28);
}

#[tokio::test]
async fn train_for_an_invalid_gpu_name_is_invalid_argument() {
    let mut app = spawn_app().await;
    expect_code(
        app.client
            .train(pb::TrainRequest {
                gpu: " padded".into(),
            })
            .await,
        Code::InvalidArgument,
    );
}
