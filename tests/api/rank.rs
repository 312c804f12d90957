//! Rank through the generated client: ordering by predicted sum, top_k, the memory guard,
//! skipped candidates and why, objectives, target slowdown caps, and bad requests (with the
//! field named in a BadRequest detail).

use coloc::proto as pb;
use tonic::Code;

use crate::helpers::{
    expect_code, profile, register_request, seed_workloads_and_runs, slowdown_app, spawn_app,
    trained_app, trained_app_with, true_kept_fraction, true_sum, GPU, GPU_MEMORY_GB,
};

/// The KACE paper's ranking, every candidate included: by predicted throughput sum, with
/// candidates predicted below break-even kept (the defaults are tested on their own).
fn rank(target: &str) -> pb::RankRequest {
    pb::RankRequest {
        target: target.into(),
        objective: Some(pb::Objective::ThroughputSum as i32),
        include_below_break_even: true,
        policy: Some(crate::helpers::open_policy()),
        ..Default::default()
    }
}

#[tokio::test]
async fn rank_before_any_model_is_failed_precondition() {
    let mut app = spawn_app().await;
    seed_workloads_and_runs(&mut app, 3).await;
    let message = expect_code(app.client.rank(rank("w00")).await, Code::FailedPrecondition);
    assert!(message.contains("Train"), "{message}");
}

#[tokio::test]
async fn rank_orders_every_fitting_candidate_by_predicted_sum_and_includes_the_target_itself() {
    // w00..w07 use 1..8 GB; with w03 (4 GB) every pair fits in 16 GB. The runs follow a
    // linear truth, which the linear kind reproduces exactly.
    let (mut app, workloads) = trained_app_with(8, "kace-linear").await;
    let response = app.client.rank(rank("w03")).await.unwrap().into_inner();
    assert_eq!(response.gpu, GPU);
    assert_eq!(response.gpu_memory_gb, GPU_MEMORY_GB);
    assert_eq!(response.model_version, 1);
    assert_eq!(response.ranked.len(), 8);
    assert!(response.skipped.is_empty());
    assert!(response.ranked.iter().any(|c| c.workload == "w03"));
    for pair in response.ranked.windows(2) {
        assert!(pair[0].predicted_throughput_sum >= pair[1].predicted_throughput_sum);
    }
    // The runs follow a linear truth exactly, so the model reproduces it.
    let target = &workloads[3].1;
    for candidate in &response.ranked {
        let (_, p) = workloads
            .iter()
            .find(|(n, _)| *n == candidate.workload)
            .unwrap();
        let truth = true_sum(target, p);
        assert!(
            (candidate.predicted_throughput_sum - truth).abs() < 1e-6 * truth.abs(),
            "{candidate:?}"
        );
        assert_eq!(candidate.members.len(), 2);
        assert_eq!(candidate.members[0].workload, "w03");
        assert_eq!(candidate.members[1].workload, candidate.workload);
        assert!(candidate.fits_memory);
    }
}

#[tokio::test]
async fn top_k_keeps_the_best_entries() {
    let (mut app, _) = trained_app(8).await;
    let all = app.client.rank(rank("w01")).await.unwrap().into_inner();
    let top = app
        .client
        .rank(pb::RankRequest {
            top_k: 3,
            ..rank("w01")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(top.ranked, all.ranked[..3]);
}

#[tokio::test]
async fn candidates_that_do_not_fit_in_gpu_memory_are_skipped_unless_asked_for() {
    // w07 uses 8 GB and w08..w09 use 9 and 10 GB: with w07, 9 + 8 and 10 + 8 exceed 16 GB.
    let (mut app, _) = trained_app(10).await;
    let response = app.client.rank(rank("w07")).await.unwrap().into_inner();
    let ranked: Vec<&str> = response
        .ranked
        .iter()
        .map(|c| c.workload.as_str())
        .collect();
    assert_eq!(ranked.len(), 8);
    assert!(!ranked.contains(&"w08") && !ranked.contains(&"w09"));
    let skipped: Vec<(&str, pb::SkipReason)> = response
        .skipped
        .iter()
        .map(|s| (s.workload.as_str(), s.code()))
        .collect();
    assert_eq!(skipped.len(), 2);
    assert!(skipped.contains(&("w08", pb::SkipReason::ExceedsGpuMemory)));
    assert!(skipped.contains(&("w09", pb::SkipReason::ExceedsGpuMemory)));

    let oversubscribed = app
        .client
        .rank(pb::RankRequest {
            include_oversubscribed: true,
            ..rank("w07")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(oversubscribed.ranked.len(), 10);
    let flagged: Vec<&str> = oversubscribed
        .ranked
        .iter()
        .filter(|c| !c.fits_memory)
        .map(|c| c.workload.as_str())
        .collect();
    assert_eq!(flagged.len(), 2);
    assert!(flagged.contains(&"w08") && flagged.contains(&"w09"));

    // A smaller limit from the request: 8 + 1 fits in 10 GB, 8 + 3 does not.
    let limited = app
        .client
        .rank(pb::RankRequest {
            gpu_memory_gb: 10.0,
            ..rank("w07")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(limited.gpu_memory_gb, 10.0);
    let names: Vec<&str> = limited.ranked.iter().map(|c| c.workload.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"w00") && names.contains(&"w01"));
}

#[tokio::test]
async fn named_candidates_that_are_unknown_or_unprofiled_are_reported_as_skipped() {
    let (mut app, _) = trained_app(6).await;
    app.client
        .register_workload(register_request("pending", None))
        .await
        .unwrap();
    let response = app
        .client
        .rank(pb::RankRequest {
            candidates: vec!["w02".into(), "ghost".into(), "pending".into(), "w00".into()],
            ..rank("w01")
        })
        .await
        .unwrap()
        .into_inner();
    let mut ranked: Vec<&str> = response
        .ranked
        .iter()
        .map(|c| c.workload.as_str())
        .collect();
    ranked.sort();
    assert_eq!(ranked, ["w00", "w02"]);
    let skipped: Vec<(&str, pb::SkipReason)> = response
        .skipped
        .iter()
        .map(|s| (s.workload.as_str(), s.code()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("ghost", pb::SkipReason::UnknownWorkload),
            ("pending", pb::SkipReason::NotProfiledOnGpu)
        ]
    );
    assert!(response.skipped.iter().all(|s| !s.reason.is_empty()));
}

#[tokio::test]
async fn rank_rejects_bad_requests_with_the_right_code() {
    let (mut app, _) = trained_app(6).await;
    app.client
        .register_workload(register_request("pending", None))
        .await
        .unwrap();
    let many: Vec<String> = (0..100_001).map(|i| format!("c{i}")).collect();
    let cases: Vec<(&str, pb::RankRequest, Code)> = vec![
        ("unknown target", rank("ghost"), Code::NotFound),
        (
            "unprofiled target",
            rank("pending"),
            Code::FailedPrecondition,
        ),
        ("empty target", rank(""), Code::InvalidArgument),
        (
            "negative top_k",
            pb::RankRequest {
                top_k: -1,
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "absurd top_k",
            pb::RankRequest {
                top_k: 2_000_000_000,
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "invalid candidate name",
            pb::RankRequest {
                candidates: vec!["bad name".into()],
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "too many candidates",
            pb::RankRequest {
                candidates: many,
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "NaN memory",
            pb::RankRequest {
                gpu_memory_gb: f64::NAN,
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "negative memory",
            pb::RankRequest {
                gpu_memory_gb: -1.0,
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "unknown objective",
            pb::RankRequest {
                objective: Some(99),
                ..rank("w00")
            },
            Code::InvalidArgument,
        ),
        (
            "GPU model without a model",
            pb::RankRequest {
                gpu: "Never Seen GPU".into(),
                ..rank("w00")
            },
            Code::FailedPrecondition,
        ),
    ];
    for (what, request, code) in cases {
        let result = app.client.rank(request).await;
        assert!(
            matches!(&result, Err(s) if s.code() == code),
            "{what}: {result:?}"
        );
    }
}

#[tokio::test]
async fn rank_needs_a_gpu_name_when_several_gpu_models_are_known() {
    // Two GPU models, neither with a trained model: which one is meant is ambiguous.
    let mut fresh = spawn_app().await;
    for (name, gpu) in [("a", GPU), ("b", "Other GPU")] {
        let mut p = profile(1, 1.0);
        p.gpu = gpu.into();
        fresh
            .client
            .register_workload(register_request(name, Some(p)))
            .await
            .unwrap();
    }
    let message = expect_code(fresh.client.rank(rank("a")).await, Code::InvalidArgument);
    assert!(message.contains("gpu"), "{message}");

    // A profile of a new GPU model leaves the one GPU model with a trained model serving.
    let (mut app, _) = trained_app(6).await;
    let mut other = profile(1, 1.0);
    other.gpu = "Other GPU".into();
    app.client
        .register_workload(register_request("elsewhere", Some(other)))
        .await
        .unwrap();
    let unnamed = app.client.rank(rank("w00")).await.unwrap().into_inner();
    assert_eq!(unnamed.gpu, GPU);
    let named = app
        .client
        .rank(pb::RankRequest {
            gpu: GPU.into(),
            ..rank("w00")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(named.ranked.len(), 6);
    assert_eq!(unnamed.ranked.len(), 6);
}

#[tokio::test]
async fn normalized_sum_ranks_by_the_members_predicted_share_of_their_exclusive_throughput() {
    let (mut app, _) = slowdown_app(8).await;
    let response = app
        .client
        .rank(pb::RankRequest {
            objective: Some(pb::Objective::NormalizedSum as i32),
            ..rank("w03")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.ranked.len(), 8);
    let mut previous = f64::INFINITY;
    for candidate in &response.ranked {
        let members = &candidate.members;
        assert_eq!(members.len(), 2);
        let mut normalized = 0.0;
        let mut sum = 0.0;
        for member in members {
            let predicted = member.predicted_throughput.expect("per-member prediction");
            let slowdown = member
                .predicted_speed_fraction
                .expect("per-member fraction");
            assert!((slowdown - predicted / member.exclusive_throughput).abs() < 1e-12);
            normalized += slowdown;
            sum += predicted;
        }
        let reported = candidate.predicted_normalized_sum.expect("normalized sum");
        assert!(
            (reported - normalized).abs() < 1e-12,
            "{reported} vs {normalized}"
        );
        assert!((candidate.predicted_throughput_sum - sum).abs() < 1e-9 * sum);
        assert!(reported <= previous, "not in descending normalized order");
        previous = reported;
    }
}

#[tokio::test]
async fn max_target_slowdown_skips_exactly_the_candidates_that_would_slow_the_target_too_much() {
    let (mut app, workloads) = slowdown_app(8).await;
    let unlimited = app.client.rank(rank("w03")).await.unwrap().into_inner();
    let kept: Vec<(String, f64)> = unlimited
        .ranked
        .iter()
        .map(|c| {
            (
                c.workload.clone(),
                c.members[0].predicted_speed_fraction.unwrap(),
            )
        })
        .collect();
    let mut fractions: Vec<f64> = kept.iter().map(|k| k.1).collect();
    fractions.sort_by(f64::total_cmp);
    // A limit between the predictions, so that some candidates pass and some do not.
    let limit = (fractions[3] + fractions[4]) / 2.0;
    assert!(limit > 0.0 && limit <= 1.0, "{limit}");

    let limited = app
        .client
        .rank(pb::RankRequest {
            min_target_speed_fraction: limit,
            ..rank("w03")
        })
        .await
        .unwrap()
        .into_inner();
    let mut passed: Vec<&str> = limited.ranked.iter().map(|c| c.workload.as_str()).collect();
    let mut expected: Vec<&str> = kept
        .iter()
        .filter(|k| k.1 >= limit)
        .map(|k| k.0.as_str())
        .collect();
    passed.sort();
    expected.sort();
    assert_eq!(passed, expected);
    let mut skipped: Vec<&str> = limited
        .skipped
        .iter()
        .filter(|s| s.code() == pb::SkipReason::TargetSlowdown)
        .map(|s| s.workload.as_str())
        .collect();
    let mut expected_skipped: Vec<&str> = kept
        .iter()
        .filter(|k| k.1 < limit)
        .map(|k| k.0.as_str())
        .collect();
    skipped.sort();
    expected_skipped.sort();
    assert_eq!(skipped, expected_skipped);
    assert_eq!(skipped.len(), 4);

    // The predictions behind the limit follow the interference law the runs came from.
    let target = &workloads[3].1;
    for (name, predicted) in &kept {
        let (_, other) = workloads.iter().find(|(n, _)| n == name).unwrap();
        let truth = true_kept_fraction(target, other);
        assert!(
            (predicted - truth).abs() < 0.1,
            "{name}: {predicted} vs {truth}"
        );
    }
}

#[tokio::test]
async fn a_sum_only_model_answers_per_member_requests_with_members_estimated_from_exclusive_throughputs(
) {
    let (mut app, workloads) = trained_app_with(6, "kace-linear").await;
    let normalized = app
        .client
        .rank(pb::RankRequest {
            objective: Some(pb::Objective::NormalizedSum as i32),
            min_target_speed_fraction: 0.01,
            ..rank("w00")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(normalized.members_estimated);
    assert!(!normalized.ranked.is_empty());
    let exclusive = |name: &str| {
        let (_, p) = workloads.iter().find(|(n, _)| n == name).unwrap();
        p.system.as_ref().unwrap().exclusive_throughput
    };
    for c in &normalized.ranked {
        // The sum split in proportion to the exclusive throughputs: both members keep the
        // same fraction of their speed, sum / (sum of exclusives).
        // (The exclusive throughputs the answer states: a suspect profile's corrected one.)
        let fraction = c.predicted_throughput_sum
            / c.members
                .iter()
                .map(|m| m.exclusive_throughput)
                .sum::<f64>();
        assert!(c.members[0].profile_exclusive_throughput == exclusive("w00"));
        for m in &c.members {
            let kept = m.predicted_speed_fraction.unwrap();
            assert!((kept - fraction).abs() < 1e-9, "{c:?}");
            #[allow(deprecated)]
            let old = m.predicted_slowdown;
            assert_eq!(
                old,
                Some(kept),
                "the deprecated name carries the same value"
            );
        }
        assert!((c.predicted_normalized_sum.unwrap() - 2.0 * fraction).abs() < 1e-9);
    }
}

#[tokio::test]
#[allow(deprecated)]
async fn target_speed_fractions_outside_zero_to_one_are_invalid_under_either_name() {
    let (mut app, _) = trained_app(6).await;
    for limit in [1.5, -0.2, f64::NAN, f64::INFINITY] {
        for request in [
            pb::RankRequest {
                max_target_slowdown: limit,
                ..rank("w00")
            },
            pb::RankRequest {
                min_target_speed_fraction: limit,
                ..rank("w00")
            },
        ] {
            let result = app.client.rank(request).await;
            assert!(
                matches!(&result, Err(s) if s.code() == Code::InvalidArgument),
                "{limit}: {result:?}"
            );
        }
    }
    // Both names at once must agree.
    let result = app
        .client
        .rank(pb::RankRequest {
            max_target_slowdown: 0.5,
            min_target_speed_fraction: 0.6,
            ..rank("w00")
        })
        .await;
    assert!(matches!(&result, Err(s) if s.code() == Code::InvalidArgument));
    for (min_benefit, include) in [(-0.1, false), (f64::NAN, false), (0.2, true)] {
        let result = app
            .client
            .rank(pb::RankRequest {
                min_benefit,
                include_below_break_even: include,
                ..rank("w00")
            })
            .await;
        assert!(
            matches!(&result, Err(s) if s.code() == Code::InvalidArgument),
            "{min_benefit} {include}: {result:?}"
        );
    }
}

#[tokio::test]
async fn an_invalid_argument_names_the_bad_field_in_a_bad_request_detail() {
    use tonic_types::StatusExt;
    let mut app = spawn_app().await;
    let cases = [
        (
            pb::RankRequest {
                target: "w00".into(),
                top_k: -1,
                ..Default::default()
            },
            "top_k",
        ),
        (rank("bad name with spaces"), "target"),
        #[allow(deprecated)]
        (
            pb::RankRequest {
                target: "w00".into(),
                max_target_slowdown: 1.5,
                ..Default::default()
            },
            "max_target_slowdown",
        ),
        (
            pb::RankRequest {
                target: "w00".into(),
                min_target_speed_fraction: 1.5,
                ..Default::default()
            },
            "min_target_speed_fraction",
        ),
    ];
    for (request, field) in cases {
        let status = app.client.rank(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let violations = status
            .get_details_bad_request()
            .unwrap_or_else(|| panic!("no BadRequest detail in {status:?}"))
            .field_violations;
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].field, field, "{status:?}");
        // The human message is still the status message.
        assert_eq!(violations[0].description, status.message());
    }
    // A report with a bad member names the member's field.
    let status = app
        .client
        .report_colocation(pb::ReportColocationRequest {
            gpu_id: String::new(),
            gpu: GPU.into(),
            members: vec![
                pb::ColocatedMember {
                    workload: "w00".into(),
                    throughput: 1.0,
                    ..Default::default()
                },
                pb::ColocatedMember {
                    workload: "w01".into(),
                    throughput: -1.0,
                    ..Default::default()
                },
            ],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let violations = status.get_details_bad_request().unwrap().field_violations;
    assert_eq!(violations[0].field, "members[1].throughput");
}

#[tokio::test]
async fn cautious_min_target_speed_fraction_holds_for_the_low_end_of_the_targets_interval() {
    let (mut app, _) = slowdown_app(8).await;
    let unlimited = app.client.rank(rank("w03")).await.unwrap().into_inner();
    // Every ranked member carries its 80 % interval around the prediction.
    let mut low_ends: Vec<(String, f64)> = Vec::new();
    for c in &unlimited.ranked {
        for m in &c.members {
            let (lo, t, hi) = (
                m.predicted_throughput_low.unwrap(),
                m.predicted_throughput.unwrap(),
                m.predicted_throughput_high.unwrap(),
            );
            assert!(lo <= t && t <= hi && lo < hi, "{lo} {t} {hi}");
        }
        low_ends.push((
            c.workload.clone(),
            c.members[0].predicted_speed_fraction_low.unwrap(),
        ));
    }
    let mut fractions: Vec<f64> = low_ends.iter().map(|k| k.1).collect();
    fractions.sort_by(f64::total_cmp);
    let limit = (fractions[3] + fractions[4]) / 2.0;
    let cautious = app
        .client
        .rank(pb::RankRequest {
            min_target_speed_fraction: limit,
            cautious: true,
            ..rank("w03")
        })
        .await
        .unwrap()
        .into_inner();
    let mut passed: Vec<&str> = cautious
        .ranked
        .iter()
        .map(|c| c.workload.as_str())
        .collect();
    let mut expected: Vec<&str> = low_ends
        .iter()
        .filter(|k| k.1 >= limit)
        .map(|k| k.0.as_str())
        .collect();
    passed.sort();
    expected.sort();
    assert_eq!(passed, expected);
    // The plain limit keeps at least as many: the prediction is above its low end.
    let plain = app
        .client
        .rank(pb::RankRequest {
            min_target_speed_fraction: limit,
            ..rank("w03")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        plain.ranked.len() > cautious.ranked.len(),
        "{} vs {}",
        plain.ranked.len(),
        cautious.ranked.len()
    );
    let reason = &cautious
        .skipped
        .iter()
        .find(|s| s.code() == pb::SkipReason::TargetSlowdown)
        .unwrap()
        .reason;
    assert!(reason.contains("low end of its 80 % interval"), "{reason}");

    // A model without intervals (kace-linear) answers with the point prediction.
    let (mut app, _) = trained_app_with(6, "kace-linear").await;
    let answer = app
        .client
        .rank(pb::RankRequest {
            min_target_speed_fraction: 0.01,
            cautious: true,
            include_below_break_even: true,
            ..rank("w00")
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!answer.ranked.is_empty());
    assert!(answer.ranked[0].members[0]
        .predicted_throughput_low
        .is_none());
}

/// `w03`'s profile as NVML alone measures it: the same system metrics, the kernel metrics
/// missing (what a cluster that forbids performance counters can profile).
fn nvml_only(profile: &pb::Profile) -> pb::Profile {
    pb::Profile {
        kernel: None,
        kernel_missing: true,
        ..profile.clone()
    }
}

/// The log width of an 80 % interval (high / low), the way its width scales.
fn log_width(member: &pb::MemberPrediction) -> f64 {
    let (low, high) = (
        member.predicted_throughput_low.expect("an interval"),
        member.predicted_throughput_high.expect("an interval"),
    );
    (high / low).ln()
}

/// A workload profiled by NVML alone is ranked, as target and as candidate, by the model's
/// NVML-only twin: every member of its pairs says PROFILE_LEVEL_NVML_ONLY, its interval is
/// wider than the same workload's with its full profile (the runs' truth reads kernel
/// metrics the twin never sees), and Rank, Predict and Place give the pair one prediction.
#[tokio::test]
async fn rank_answers_an_nvml_only_workload_by_the_twin_with_wider_intervals() {
    let (mut app, workloads) = trained_app(10).await;
    app.client
        .register_workload(register_request(
            "w03-nvml",
            Some(nvml_only(&workloads[3].1)),
        ))
        .await
        .unwrap();
    let rank_pair = |target: &str, candidate: &str| pb::RankRequest {
        candidates: vec![candidate.into()],
        ..rank(target)
    };
    let full = app
        .client
        .rank(rank_pair("w03", "w05"))
        .await
        .unwrap()
        .into_inner();
    let nvml = app
        .client
        .rank(rank_pair("w03-nvml", "w05"))
        .await
        .unwrap()
        .into_inner();
    let (full, nvml) = (&full.ranked[0], &nvml.ranked[0]);
    for member in &full.members {
        assert_eq!(member.profile_level(), pb::ProfileLevel::Full, "{member:?}");
    }
    // The whole pair is answered from NVML metrics, the full partner too.
    for member in &nvml.members {
        assert_eq!(
            member.profile_level(),
            pb::ProfileLevel::NvmlOnly,
            "{member:?}"
        );
    }
    for i in 0..2 {
        assert!(
            log_width(&nvml.members[i]) > log_width(&full.members[i]),
            "member {i}: NVML-only {:?} against full {:?}",
            nvml.members[i],
            full.members[i]
        );
    }

    // As a candidate of a full target, with the rest of the pool still full.
    let all = app.client.rank(rank("w05")).await.unwrap().into_inner();
    assert!(all.skipped.is_empty(), "{:?}", all.skipped);
    for candidate in &all.ranked {
        let level = if candidate.workload == "w03-nvml" {
            pb::ProfileLevel::NvmlOnly
        } else {
            pb::ProfileLevel::Full
        };
        assert!(
            candidate.members.iter().all(|m| m.profile_level() == level),
            "{candidate:?}"
        );
    }

    // One prediction per set: Predict and Place say what Rank said.
    let predicted = app
        .client
        .predict(pb::PredictRequest {
            workloads: vec!["w03-nvml".into(), "w05".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(predicted.members, nvml.members);
    assert_eq!(
        predicted.predicted_throughput_sum,
        nvml.predicted_throughput_sum
    );
    let placed = app
        .client
        .place(crate::place::place(
            "w03-nvml",
            vec![crate::place::gpu("a", &["w05"])],
        ))
        .await
        .unwrap()
        .into_inner();
    let members = &placed.placements[0].members;
    assert_eq!(members.len(), 2);
    for (placed, ranked) in members.iter().zip(&nvml.members) {
        assert_eq!(placed.profile_level(), pb::ProfileLevel::NvmlOnly);
        assert_eq!(placed.predicted_throughput, ranked.predicted_throughput);
    }
}

/// Bad input about an NVML-only workload still gets its code and changes nothing: a
/// profile with kernel_missing but an impossible NVML metric is INVALID_ARGUMENT (nothing
/// registered), and under a model without an NVML-only twin (kace-linear) the NVML-only
/// target is FAILED_PRECONDITION and the candidate is skipped as missing kernel metrics.
#[tokio::test]
async fn rank_refuses_bad_nvml_only_input_with_its_code() {
    let (mut app, workloads) = trained_app_with(8, "kace-linear").await;
    let mut bad = nvml_only(&workloads[3].1);
    bad.system.as_mut().unwrap().sm_busy_pct = -1.0;
    expect_code(
        app.client
            .register_workload(register_request("w03-bad", Some(bad)))
            .await,
        Code::InvalidArgument,
    );
    expect_code(app.client.rank(rank("w03-bad")).await, Code::NotFound);

    app.client
        .register_workload(register_request(
            "w03-nvml",
            Some(nvml_only(&workloads[3].1)),
        ))
        .await
        .unwrap();
    let message = expect_code(
        app.client.rank(rank("w03-nvml")).await,
        Code::FailedPrecondition,
    );
    assert!(message.contains("w03-nvml"), "{message}");
    let answer = app.client.rank(rank("w05")).await.unwrap().into_inner();
    assert!(answer.ranked.iter().all(|c| c.workload != "w03-nvml"));
    let skipped: Vec<_> = answer
        .skipped
        .iter()
        .filter(|s| s.workload == "w03-nvml")
        .collect();
    assert_eq!(skipped.len(), 1, "{:?}", answer.skipped);
    assert_eq!(skipped[0].code(), pb::SkipReason::KernelMetricsMissing);
    assert!(
        skipped[0].reason.contains("no NVML-only twin"),
        "{skipped:?}"
    );
}
