//! Predict on explicit sets: the same sum as Rank for a pair, copies and larger sets, the
//! memory check, and bad sets refused with INVALID_ARGUMENT.

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{expect_code, register_request, trained_app, trained_app_with, true_sum, GPU};

fn predict(names: &[&str]) -> pb::PredictRequest {
    pb::PredictRequest {
        workloads: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn predict_gives_the_same_sum_as_rank_for_the_same_pair() {
    let (mut app, workloads) = trained_app_with(6, "kace-linear").await;
    let predicted = app
        .client
        .predict(predict(&["w01", "w04"]))
        .await
        .unwrap()
        .into_inner();
    let ranked = app
        .client
        .rank(pb::RankRequest {
            target: "w01".into(),
            candidates: vec!["w04".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        predicted.predicted_throughput_sum,
        ranked.ranked[0].predicted_throughput_sum
    );
    let truth = true_sum(&workloads[1].1, &workloads[4].1);
    assert!((predicted.predicted_throughput_sum - truth).abs() < 1e-6 * truth);
    assert_eq!(predicted.gpu, GPU);
    assert_eq!(predicted.model_version, 1);
    assert_eq!(predicted.memory_gb, 2.0 + 5.0);
    assert!(predicted.fits_memory);
    let members: Vec<&str> = predicted
        .members
        .iter()
        .map(|m| m.workload.as_str())
        .collect();
    assert_eq!(members, ["w01", "w04"]);
}

#[tokio::test]
async fn predict_accepts_copies_and_larger_sets_and_checks_memory() {
    let (mut app, _) = trained_app(6).await;
    let copies = app
        .client
        .predict(predict(&["w02", "w02"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(copies.members.len(), 2);
    let three = app
        .client
        .predict(predict(&["w03", "w04", "w05"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(three.memory_gb, 4.0 + 5.0 + 6.0);
    assert!(three.fits_memory);
    let four = app
        .client
        .predict(predict(&["w03", "w04", "w05", "w05"]))
        .await
        .unwrap()
        .into_inner();
    assert!(!four.fits_memory, "21 GB on a 16 GB GPU");
}

#[tokio::test]
async fn predict_carries_80_percent_intervals_around_the_sum_and_every_member() {
    let (mut app, _) = trained_app(8).await;
    for set in [&["w01", "w04"][..], &["w03", "w04", "w05"]] {
        let answer = app.client.predict(predict(set)).await.unwrap().into_inner();
        let (lo, hi) = (
            answer.predicted_throughput_sum_low.expect("a sum interval"),
            answer
                .predicted_throughput_sum_high
                .expect("a sum interval"),
        );
        let sum = answer.predicted_throughput_sum;
        assert!(lo <= sum && sum <= hi && lo < hi, "{lo} {sum} {hi}");
        for m in &answer.members {
            let t = m.predicted_throughput.unwrap();
            let (lo, hi) = (
                m.predicted_throughput_low.unwrap(),
                m.predicted_throughput_high.unwrap(),
            );
            assert!(lo <= t && t <= hi, "{lo} {t} {hi}");
            let s = m.predicted_speed_fraction.unwrap();
            let (slo, shi) = (
                m.predicted_speed_fraction_low.unwrap(),
                m.predicted_speed_fraction_high.unwrap(),
            );
            assert!((slo - lo / m.exclusive_throughput).abs() < 1e-12 && slo <= s && s <= shi);
        }
    }
    // kace-linear carries no intervals: the fields stay absent.
    let (mut app, _) = trained_app_with(6, "kace-linear").await;
    let answer = app
        .client
        .predict(predict(&["w01", "w04"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.predicted_throughput_sum_low, None);
    assert_eq!(answer.members[0].predicted_throughput_low, None);
}

#[tokio::test]
async fn predict_rejects_bad_sets() {
    let (mut app, _) = trained_app(6).await;
    app.client
        .register_workload(register_request("pending", None))
        .await
        .unwrap();
    expect_code(
        app.client.predict(predict(&["w01"])).await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client.predict(predict(&[])).await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client.predict(predict(&["w01"; 17])).await,
        Code::InvalidArgument,
    );
    expect_code(
        app.client.predict(predict(&["w01", "ghost"])).await,
        Code::NotFound,
    );
    expect_code(
        app.client.predict(predict(&["w01", "pending"])).await,
        Code::FailedPrecondition,
    );
    expect_code(
        app.client.predict(predict(&["w01", "not valid"])).await,
        Code::InvalidArgument,
    );
}
