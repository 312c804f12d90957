//! Bounded requests and answers: Rank names at most 10 000 candidates, and an answer about
//! 10 000 unknown ones lists 100 and counts the rest, small enough for any client.

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{expect_code, seed_workloads_and_runs, spawn_app, GPU};

#[tokio::test]
async fn rank_bounds_its_candidates_and_summarises_the_skipped() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 6).await;
    app.client
        .train(pb::TrainRequest {
            gpu: GPU.into(),
            kind: String::new(),
        })
        .await
        .unwrap();
    let names = |n: usize| -> Vec<String> { (0..n).map(|i| format!("u-{i:0>120}")).collect() };
    let message = expect_code(
        app.client
            .rank(pb::RankRequest {
                target: "w00".into(),
                candidates: names(10_001),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
    );
    assert!(message.contains("at most 10000 candidates"), "{message}");

    // 10 000 unknown names (1.3 MB): 100 listed, all counted, the answer a few kB.
    let answer = app
        .client
        .rank(pb::RankRequest {
            target: "w00".into(),
            candidates: names(10_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.ranked.is_empty());
    assert_eq!(answer.skipped.len(), 100);
    assert_eq!(
        answer.skipped_counts,
        [pb::SkippedCount {
            code: pb::SkipReason::UnknownWorkload as i32,
            count: 10_000
        }]
    );
    assert_eq!(answer.ranked_not_listed, 0);
    assert!(
        prost::Message::encoded_len(&answer) < 64 * 1024,
        "{}",
        prost::Message::encoded_len(&answer)
    );
}
