//! PutProfile: a pending workload becomes rankable at once, a profile per GPU model is
//! replaced or kept, unknown names and bad metrics are refused.

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{expect_code, profile, register_request, spawn_app, trained_app, GPU};

#[tokio::test]
async fn put_profile_makes_a_pending_workload_profiled_and_rankable_without_restart() {
    let (mut app, _) = trained_app(6).await;
    app.client
        .register_workload(register_request("late", None))
        .await
        .unwrap();
    let rank = |target: &str| pb::RankRequest {
        target: target.into(),
        // Every candidate, whatever the default policy refuses.
        policy: Some(crate::helpers::open_policy()),
        ..Default::default()
    };
    expect_code(
        app.client.rank(rank("late")).await,
        Code::FailedPrecondition,
    );

    let workload = app
        .client
        .put_profile(pb::PutProfileRequest {
            name: "late".into(),
            profile: Some(profile(99, 1.0)),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(workload.state(), pb::WorkloadState::Profiled);
    assert_eq!(
        workload.profiles[0].source(),
        pb::ProfileSource::ClientSupplied
    );

    let ranked = app.client.rank(rank("late")).await.unwrap().into_inner();
    assert!(
        ranked.ranked.iter().any(|c| c.workload == "late"),
        "the target itself is a candidate"
    );
    assert_eq!(ranked.ranked.len(), 7);
}

#[tokio::test]
async fn put_profile_replaces_the_profile_of_that_gpu_model_and_keeps_others() {
    let mut app = spawn_app().await;
    app.client
        .register_workload(register_request("a", Some(profile(1, 1.0))))
        .await
        .unwrap();
    let mut other_gpu = profile(2, 3.0);
    other_gpu.gpu = "Other GPU".into();
    other_gpu.source = pb::ProfileSource::Measured as i32;
    app.client
        .put_profile(pb::PutProfileRequest {
            name: "a".into(),
            profile: Some(other_gpu),
        })
        .await
        .unwrap();
    let replaced = app
        .client
        .put_profile(pb::PutProfileRequest {
            name: "a".into(),
            profile: Some(profile(3, 5.0)),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replaced.profiles.len(), 2);
    let on = |gpu: &str| {
        replaced
            .profiles
            .iter()
            .find(|p| p.gpu == gpu)
            .unwrap()
            .clone()
    };
    assert_eq!(on(GPU).system.unwrap().memory_gb, 5.0);
    assert_eq!(on("Other GPU").system.unwrap().memory_gb, 3.0);
    assert_eq!(on("Other GPU").source(), pb::ProfileSource::Measured);
}

#[tokio::test]
async fn put_profile_for_an_unknown_workload_is_not_found_and_bad_metrics_are_invalid() {
    let mut app = spawn_app().await;
    app.client
        .register_workload(register_request("a", None))
        .await
        .unwrap();
    let before = app.dump_store().await;
    expect_code(
        app.client
            .put_profile(pb::PutProfileRequest {
                name: "ghost".into(),
                profile: Some(profile(1, 1.0)),
            })
            .await,
        Code::NotFound,
    );
    let mut bad = profile(1, 1.0);
    bad.system.as_mut().unwrap().mem_busy_pct = f64::NEG_INFINITY;
    expect_code(
        app.client
            .put_profile(pb::PutProfileRequest {
                name: "a".into(),
                profile: Some(bad),
            })
            .await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client
            .put_profile(pb::PutProfileRequest {
                name: "a".into(),
                profile: None,
            })
            .await,
        Code::InvalidArgument,
    );
    let mut absurd_gpu_memory = profile(1, 1.0);
    absurd_gpu_memory.gpu_memory_gb = -16.0;
    expect_code(
        app.client
            .put_profile(pb::PutProfileRequest {
                name: "a".into(),
                profile: Some(absurd_gpu_memory),
            })
            .await,
        Code::InvalidArgument,
    );
    assert_eq!(app.dump_store().await, before);
}

/// A profile of a new GPU model must say its memory, and afterwards clients that name no
/// GPU model keep being served by the one GPU model with a trained model.
#[tokio::test]
async fn a_new_gpu_model_needs_its_memory_and_default_gpu_clients_keep_working() {
    let mut app = spawn_app().await;
    crate::helpers::seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .train(pb::TrainRequest {
            gpu: crate::helpers::GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    let rank_default = || pb::RankRequest {
        target: "w00".into(),
        top_k: 3,
        ..Default::default()
    };
    app.client.rank(rank_default()).await.unwrap();

    let before = app.dump_store().await;
    let mut other = profile(7, 1.0);
    other.gpu = "Other GPU 80GB".into();
    other.gpu_memory_gb = 0.0;
    let message = crate::helpers::expect_code(
        app.client
            .put_profile(pb::PutProfileRequest {
                name: "w01".into(),
                profile: Some(other.clone()),
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(message.contains("gpu_memory_gb"), "{message}");
    assert_eq!(app.dump_store().await, before);

    other.gpu_memory_gb = 80.0;
    app.client
        .put_profile(pb::PutProfileRequest {
            name: "w01".into(),
            profile: Some(other.clone()),
        })
        .await
        .unwrap();
    // Later profiles of that GPU model may leave the memory out.
    other.gpu_memory_gb = 0.0;
    app.client
        .put_profile(pb::PutProfileRequest {
            name: "w02".into(),
            profile: Some(other),
        })
        .await
        .unwrap();
    let ranked = app.client.rank(rank_default()).await.unwrap().into_inner();
    assert_eq!(ranked.gpu, crate::helpers::GPU);
}
