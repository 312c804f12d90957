//! Answers a scheduler can trust with the defaults, on the published KACE data: no pair
//! predicted to lose is ranked unless asked for, every documented request is answered
//! whichever model kind serves (pinned or promoted), and replicas may be listed.

use std::sync::Arc;

use coloc::{
    advisor::BREAK_EVEN_NORMALIZED_SUM,
    domain::GpuName,
    import::{import_kace, KACE_GPU, KACE_GPU_MEMORY_GB},
    proto as pb,
};
use tempfile::TempDir;

use crate::helpers::{kace_dir, spawn_app_in, trained_app_with, TestApp};

async fn kace_app() -> TestApp {
    let app = spawn_app_in(Arc::new(TempDir::new().unwrap())).await;
    let gpu = GpuName::parse("gpu", KACE_GPU).unwrap();
    import_kace(&app.advisor, &kace_dir(), &gpu, KACE_GPU_MEMORY_GB)
        .await
        .unwrap();
    app
}

async fn targets(app: &mut TestApp) -> Vec<String> {
    crate::helpers::all_workloads(&mut app.client, pb::WorkloadState::Profiled as i32)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.name)
        .collect()
}

fn request(target: &str) -> pb::RankRequest {
    pb::RankRequest {
        target: target.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_default_ranking_of_every_kace_target_ranks_no_pair_predicted_to_lose() {
    let mut app = kace_app().await;
    let targets = targets(&mut app).await;
    assert_eq!(targets.len(), 29);
    let (mut losing_kace_picks, mut below_break_even_skips) = (0, 0);
    for target in &targets {
        let answer = app.client.rank(request(target)).await.unwrap().into_inner();
        assert_eq!(answer.objective(), pb::Objective::NormalizedSum, "{target}");
        assert!(!answer.members_estimated);
        for candidate in &answer.ranked {
            let normalized = candidate.predicted_normalized_sum.unwrap();
            assert!(
                normalized >= BREAK_EVEN_NORMALIZED_SUM,
                "{target} + {}: {normalized}",
                candidate.workload
            );
        }
        // The cautious default orders by the low end of the normalized sum, where the
        // model has intervals.
        let score = |c: &pb::RankedCandidate| {
            c.predicted_normalized_sum_low
                .or(c.predicted_normalized_sum)
        };
        for pair in answer.ranked.windows(2) {
            assert!(score(&pair[0]) >= score(&pair[1]));
        }
        for skipped in &answer.skipped {
            if skipped.code() == pb::SkipReason::BelowBreakEven {
                below_break_even_skips += 1;
                assert!(
                    skipped.reason.contains("predicted normalized sum 0."),
                    "{skipped:?}"
                );
            }
            if skipped.code() == pb::SkipReason::RuleRefused {
                // The default rule comes first: a pair below break-even leaves a member
                // below half its speed.
                below_break_even_skips += 1;
                assert!(
                    skipped.reason.contains("below its fair share"),
                    "{skipped:?}"
                );
            }
        }

        // The paper's ordering, losers included, as the old default answered.
        let kace = app
            .client
            .rank(pb::RankRequest {
                objective: Some(pb::Objective::ThroughputSum as i32),
                include_below_break_even: true,
                top_k: 1,
                policy: Some(crate::helpers::open_policy()),
                ..request(target)
            })
            .await
            .unwrap()
            .into_inner();
        if let Some(top) = kace.ranked.first() {
            losing_kace_picks +=
                usize::from(top.predicted_normalized_sum.unwrap() < BREAK_EVEN_NORMALIZED_SUM);
            // Each pair skipped by default is ranked when asked for.
            let below: Vec<&str> = answer
                .skipped
                .iter()
                .filter(|s| s.code() == pb::SkipReason::BelowBreakEven)
                .map(|s| s.workload.as_str())
                .collect();
            let everything = app
                .client
                .rank(pb::RankRequest {
                    include_below_break_even: true,
                    policy: Some(crate::helpers::open_policy()),
                    ..request(target)
                })
                .await
                .unwrap()
                .into_inner();
            for name in below {
                assert!(everything.ranked.iter().any(|c| c.workload == name));
            }
        }
    }
    // Without the rule, the paper's objective picks a predicted loss for some targets:
    // the rule has something to do on this data.
    assert!(losing_kace_picks > 0, "{losing_kace_picks}");
    assert!(below_break_even_skips > 0);

    // whisper-large-v2 batch 16 loses with every measured partner (normalized sums 0.18 to
    // 0.68 in pairs.csv): by default it gets no partner at all.
    let whisper = app
        .client
        .rank(request("whisper-large-v2_batch16-inf"))
        .await
        .unwrap()
        .into_inner();
    assert!(whisper.ranked.is_empty(), "{:?}", whisper.ranked);

    // A minimum benefit: every ranked pair predicted at least 1 + min_benefit.
    let demanding = app
        .client
        .rank(pb::RankRequest {
            min_benefit: 0.5,
            ..request("bert-base-cased_batch16-train")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!demanding.ranked.is_empty());
    for c in &demanding.ranked {
        assert!(c.predicted_normalized_sum.unwrap() >= 1.5, "{c:?}");
    }
    assert!(demanding
        .skipped
        .iter()
        .any(|s| s.code() == pb::SkipReason::BelowBreakEven && s.reason.contains("asked for")));
}

/// Every Rank and Predict request README documents.
fn documented_requests() -> Vec<pb::RankRequest> {
    #[allow(deprecated)]
    let old_name = pb::RankRequest {
        objective: Some(pb::Objective::NormalizedSum as i32),
        max_target_slowdown: 0.6,
        top_k: 3,
        ..request("bert-base-cased_batch16-train")
    };
    vec![
        request("whisper-large-v2_batch16-inf"),
        pb::RankRequest {
            top_k: 3,
            ..request("bert-base-cased_batch16-train")
        },
        old_name,
        pb::RankRequest {
            min_target_speed_fraction: 0.6,
            top_k: 3,
            ..request("bert-base-cased_batch16-train")
        },
        pb::RankRequest {
            objective: Some(pb::Objective::ThroughputSum as i32),
            ..request("bert-base-cased_batch16-train")
        },
        pb::RankRequest {
            min_benefit: 0.2,
            ..request("vit-base-patch16-224_batch2-inf")
        },
        pb::RankRequest {
            include_below_break_even: true,
            ..request("whisper-large-v2_batch16-inf")
        },
        pb::RankRequest {
            // Replicas of one workload.
            candidates: vec![
                "bert-base-cased_batch8-inf".into(),
                "bert-base-cased_batch8-inf".into(),
                "vit-base-patch16-224_batch1-inf".into(),
            ],
            include_below_break_even: true,
            ..request("bert-base-cased_batch16-train")
        },
    ]
}

async fn answer_every_documented_request(app: &mut TestApp, estimated: bool) {
    for rank in documented_requests() {
        let answer = app
            .client
            .rank(rank.clone())
            .await
            .unwrap_or_else(|s| panic!("{rank:?}: {s:?}"))
            .into_inner();
        assert_eq!(answer.members_estimated, estimated);
        for c in &answer.ranked {
            let sum: f64 = c
                .members
                .iter()
                .map(|m| m.predicted_throughput.unwrap())
                .sum();
            assert!((sum - c.predicted_throughput_sum).abs() < 1e-9 * sum.max(1.0));
            assert!(c.predicted_normalized_sum.is_some());
        }
    }
    for workloads in [
        vec![
            "bert-base-cased_batch8-inf",
            "vit-base-patch16-224_batch1-inf",
        ],
        vec![
            "bert-base-cased_batch8-inf",
            "bert-base-cased_batch8-inf",
            "vit-base-patch16-224_batch1-inf",
        ],
    ] {
        let answer = app
            .client
            .predict(pb::PredictRequest {
                workloads: workloads.iter().map(|w| w.to_string()).collect(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.members_estimated, estimated);
        assert!(answer.predicted_normalized_sum.is_some());
        assert!(answer
            .members
            .iter()
            .all(|m| m.predicted_speed_fraction.is_some()));
    }
}

#[tokio::test]
async fn every_documented_request_is_answered_under_each_model_kind_pinned_or_promoted() {
    let mut app = kace_app().await;
    // Promoted: member-ridge-gbt serves (version 2).
    answer_every_documented_request(&mut app, false).await;
    // Pinned: the KACE baseline, which predicts only sums (version 1).
    let pinned = app
        .client
        .pin_model(pb::PinModelRequest {
            gpu: String::new(),
            version: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pinned.kind, "kace-linear");
    answer_every_documented_request(&mut app, true).await;

    // Promoted as the first model of a GPU model: kace-linear on synthetic runs.
    let (mut linear, _) = trained_app_with(6, "kace-linear").await;
    let answer = linear
        .client
        .rank(pb::RankRequest {
            min_target_speed_fraction: 0.01,
            include_below_break_even: true,
            ..request("w00")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.members_estimated);
    assert_eq!(answer.ranked.len(), 6);
}

#[tokio::test]
async fn replicas_among_the_candidates_are_answered_once_per_distinct_workload() {
    let mut app = kace_app().await;
    let answer = app
        .client
        .rank(pb::RankRequest {
            candidates: vec![
                "vit-base-patch16-224_batch1-inf".into(),
                "bert-base-cased_batch8-inf".into(),
                "vit-base-patch16-224_batch1-inf".into(),
                "ghost".into(),
                "ghost".into(),
            ],
            include_below_break_even: true,
            ..request("bert-base-cased_batch16-train")
        })
        .await
        .unwrap()
        .into_inner();
    let mut ranked: Vec<&str> = answer.ranked.iter().map(|c| c.workload.as_str()).collect();
    ranked.sort();
    assert_eq!(
        ranked,
        [
            "bert-base-cased_batch8-inf",
            "vit-base-patch16-224_batch1-inf"
        ]
    );
    assert_eq!(answer.skipped.len(), 1, "{:?}", answer.skipped);
    assert_eq!(answer.skipped[0].code(), pb::SkipReason::UnknownWorkload);
}
