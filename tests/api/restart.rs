//! A restart on the same SQLite file: workloads, profiles, runs and the served model are
//! all still there.

use coloc::proto as pb;

use crate::helpers::{
    profile, register_request, seed_workloads_and_runs, spawn_app, spawn_app_in, GPU,
};

#[tokio::test]
async fn workloads_profiles_runs_and_the_model_survive_a_restart() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .register_workload(register_request("pending", None))
        .await
        .unwrap();
    app.client
        .register_workload(register_request("late", Some(profile(42, 2.0))))
        .await
        .unwrap();
    let model = app
        .client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .model;
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: "w02".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let dir = app.stop().await;

    let mut restarted = spawn_app_in(dir).await;
    let pending = restarted
        .client
        .get_workload(pb::GetWorkloadRequest {
            name: "pending".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pending.state(), pb::WorkloadState::PendingProfile);
    let mut reloaded = restarted
        .client
        .get_model(pb::GetModelRequest {
            gpu: GPU.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reloaded.history.len(), 1, "the history survives too");
    reloaded.history.clear();
    assert_eq!(Some(reloaded), model);
    let ranked_again = restarted
        .client
        .rank(pb::RankRequest {
            target: "w02".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ranked_again, ranked);
    assert_eq!(restarted.count("observations").await, 21);
}
