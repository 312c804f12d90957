//! Place through the generated client: GPUs ranked by the predicted gain of adding the job,
//! an empty GPU worth the job's exclusive throughput, a one-resident GPU worth the pair's
//! prediction minus the resident alone, every GPU left out named with its reason (a cap, a
//! resident's own floor, the request's rule), and bad requests refused without touching
//! the store.

use coloc::proto as pb;
use tonic::Code;
use tonic_types::StatusExt;

use crate::helpers::{
    expect_code, register_request, slowdown_app, slowdown_app_with_config, GPU, GPU_MEMORY_GB,
};

pub fn gpu(id: &str, residents: &[&str]) -> pb::GpuState {
    pb::GpuState {
        id: id.into(),
        node: format!("node-{id}"),
        gpu: String::new(),
        memory_gb: 0.0,
        residents: residents.iter().map(|r| r.to_string()).collect(),
        ..Default::default()
    }
}

/// Place as it answered before policies: THROUGHPUT_SUM, no rule, point predictions,
/// losses listed (the defaults are tested on their own).
pub fn place(workload: &str, gpus: Vec<pb::GpuState>) -> pb::PlaceRequest {
    pb::PlaceRequest {
        workload: workload.into(),
        gpus,
        objective: Some(pb::Objective::ThroughputSum as i32),
        policy: Some(crate::helpers::open_policy()),
        ..Default::default()
    }
}

fn exclusive(p: &pb::Profile) -> f64 {
    p.system.as_ref().unwrap().exclusive_throughput
}

async fn pair_sum(app: &mut crate::helpers::TestApp, a: &str, b: &str) -> pb::PredictResponse {
    app.client
        .predict(pb::PredictRequest {
            workloads: vec![a.into(), b.into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn place_scores_each_gpu_by_the_gain_and_orders_them_best_first() {
    let (mut app, workloads) = slowdown_app(6).await;
    let job = &workloads[0];
    let answer = app
        .client
        .place(place(
            "w00",
            vec![
                gpu("a", &["w01"]),
                gpu("b", &[]),
                gpu("c", &["w02"]),
                gpu("d", &["w03", "w04"]),
                gpu("e", &["w05", "w05"]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.skipped.is_empty(), "{:?}", answer.skipped);
    assert_eq!(answer.placements.len(), 5);
    assert_eq!(answer.models.len(), 1);
    assert_eq!(answer.models[0].gpu, GPU);
    assert_eq!(answer.models[0].kind, "member-ridge-gbt");
    for pair in answer.placements.windows(2) {
        assert!(pair[0].gain >= pair[1].gain, "{answer:?}");
    }
    let by_id = |id: &str| answer.placements.iter().find(|p| p.gpu_id == id).unwrap();

    // An empty GPU is worth the job's exclusive throughput, and the job keeps all of it.
    let empty = by_id("b");
    assert_eq!(empty.value_before, 0.0);
    assert_eq!(empty.gain, exclusive(&job.1));
    assert_eq!(empty.members.len(), 1);
    assert_eq!(empty.members[0].predicted_speed_fraction, Some(1.0));
    assert_eq!(empty.node, "node-b");
    assert_eq!(empty.memory_gb, 1.0);
    assert_eq!(empty.gpu_memory_gb, GPU_MEMORY_GB);

    // One resident: the pair's prediction minus the resident alone.
    for (id, resident) in [("a", 1), ("c", 2)] {
        let placed = by_id(id);
        let predicted = pair_sum(&mut app, "w00", &format!("w0{resident}")).await;
        let alone = exclusive(&workloads[resident].1);
        assert_eq!(placed.value_before, alone);
        let expected = predicted.predicted_throughput_sum - alone;
        assert!(
            (placed.gain - expected).abs() <= 1e-9 * expected.abs().max(1.0),
            "{placed:?} vs {predicted:?}"
        );
        assert_eq!(placed.members[0].workload, "w00");
        assert_eq!(placed.members[1].workload, format!("w0{resident}"));
        assert_eq!(placed.model_version, predicted.model_version);
    }

    // Residents are listed in the order given, copies included, after the job.
    let copies = by_id("e");
    let names: Vec<&str> = copies.members.iter().map(|m| m.workload.as_str()).collect();
    assert_eq!(names, ["w00", "w05", "w05"]);
    assert_eq!(
        copies.members[1].predicted_throughput,
        copies.members[2].predicted_throughput
    );
    for placement in &answer.placements {
        assert_eq!(
            placement.value_after - placement.value_before,
            placement.gain
        );
        let sum: f64 = placement
            .members
            .iter()
            .map(|m| m.predicted_throughput.unwrap())
            .sum();
        assert!(
            (sum - placement.value_after).abs() < 1e-9 * sum,
            "{placement:?}"
        );
    }

    // top_k keeps the best ones.
    let mut request = place(
        "w00",
        vec![gpu("a", &["w01"]), gpu("b", &[]), gpu("c", &["w02"])],
    );
    request.top_k = 1;
    let best = app.client.place(request).await.unwrap().into_inner();
    assert_eq!(best.placements.len(), 1);
    let expected = answer
        .placements
        .iter()
        .find(|p| ["a", "b", "c"].contains(&p.gpu_id.as_str()))
        .unwrap();
    assert_eq!(best.placements[0].gpu_id, expected.gpu_id);
}

#[tokio::test]
async fn gpus_that_cannot_take_the_job_are_skipped_with_the_reason() {
    let (mut app, _) = slowdown_app(6).await;
    // Registered, but never profiled.
    app.client
        .register_workload(register_request("pending", None))
        .await
        .unwrap();
    // w04 and w05 use 5 and 6 GB: three copies of w05 and w04 do not fit in 16 GB.
    let mut request = place(
        "w04",
        vec![
            gpu("full", &["w01", "w02", "w03", "w01"]),
            gpu("ghost", &["nobody"]),
            gpu("unprofiled", &["pending"]),
            gpu("big", &["w05", "w05"]),
            gpu("other-model", &[]),
            gpu("fine", &["w01"]),
        ],
    );
    request.gpus[4].gpu = "Other GPU 80GB".into();
    let answer = app
        .client
        .place(request.clone())
        .await
        .unwrap()
        .into_inner();
    let placed: Vec<&str> = answer
        .placements
        .iter()
        .map(|p| p.gpu_id.as_str())
        .collect();
    assert_eq!(placed, ["fine"]);
    let skipped: Vec<(&str, pb::PlaceSkipReason, &str)> = answer
        .skipped
        .iter()
        .map(|s| (s.gpu_id.as_str(), s.code(), s.workload.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("full", pb::PlaceSkipReason::PlaceTooManyJobs, ""),
            ("ghost", pb::PlaceSkipReason::PlaceUnknownWorkload, "nobody"),
            (
                "unprofiled",
                pb::PlaceSkipReason::PlaceResidentNotProfiled,
                "pending"
            ),
            ("big", pb::PlaceSkipReason::PlaceExceedsGpuMemory, ""),
            ("other-model", pb::PlaceSkipReason::PlaceNoModel, ""),
        ]
    );
    let big = &answer.skipped[3];
    assert!(big.reason.contains("17.0 GB"), "{}", big.reason);

    // Asked for, the overflowing GPU is ranked, marked as not fitting; a fifth job is still
    // too many unless allowed.
    request.include_oversubscribed = true;
    request.max_jobs_per_gpu = 5;
    let answer = app.client.place(request).await.unwrap().into_inner();
    let big = answer
        .placements
        .iter()
        .find(|p| p.gpu_id == "big")
        .unwrap();
    assert!(!big.fits_memory);
    assert_eq!(big.memory_gb, 17.0);
    assert!(answer.placements.iter().any(|p| p.gpu_id == "full"));
}

#[tokio::test]
async fn slowdown_caps_skip_exactly_the_gpus_that_would_break_them_and_say_who_and_by_how_much() {
    let (mut app, _) = slowdown_app(8).await;
    let gpus: Vec<pb::GpuState> = (1..8)
        .map(|i| gpu(&format!("g{i}"), &[&format!("w0{i}")]))
        .chain([
            gpu("g8", &["w01", "w02"]),
            gpu("g9", &["w03", "w06", "w07"]),
        ])
        .collect();
    let free = app
        .client
        .place(place("w00", gpus.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(free.placements.len(), 9);
    for (job_cap, resident_cap) in [(0.6, 0.0), (0.0, 0.6), (0.7, 0.7), (0.9, 0.5)] {
        let mut request = place("w00", gpus.clone());
        request.min_job_fraction = job_cap;
        request.min_resident_fraction = resident_cap;
        let answer = app.client.place(request).await.unwrap().into_inner();
        for unconstrained in &free.placements {
            let job_kept = unconstrained.members[0].predicted_speed_fraction.unwrap();
            let worst_resident = unconstrained.members[1..]
                .iter()
                .map(|m| m.predicted_speed_fraction.unwrap())
                .fold(f64::INFINITY, f64::min);
            let placed = answer
                .placements
                .iter()
                .any(|p| p.gpu_id == unconstrained.gpu_id);
            let skip = answer
                .skipped
                .iter()
                .find(|s| s.gpu_id == unconstrained.gpu_id);
            if job_kept < job_cap {
                let skip = skip.expect("the job's cap is broken");
                assert_eq!(skip.code(), pb::PlaceSkipReason::PlaceJobSlowdown);
                assert_eq!(skip.workload, "w00");
                assert_eq!(skip.predicted_fraction, Some(job_kept));
            } else if worst_resident < resident_cap {
                let skip = skip.expect("a resident's cap is broken");
                assert_eq!(skip.code(), pb::PlaceSkipReason::PlaceResidentSlowdown);
                assert_eq!(skip.predicted_fraction, Some(worst_resident));
                let named = unconstrained
                    .members
                    .iter()
                    .find(|m| m.workload == skip.workload)
                    .unwrap();
                assert_eq!(named.predicted_speed_fraction, Some(worst_resident));
                assert!(skip.reason.contains(&skip.workload), "{}", skip.reason);
            } else {
                assert!(placed, "{} wrongly skipped: {skip:?}", unconstrained.gpu_id);
            }
        }
    }
}

#[tokio::test]
async fn members_carry_intervals_and_cautious_checks_the_caps_on_their_low_ends() {
    let (mut app, _) = slowdown_app(8).await;
    let gpus: Vec<pb::GpuState> = (1..8)
        .map(|i| gpu(&format!("g{i}"), &[&format!("w0{i}")]))
        .chain([gpu("g8", &["w01", "w02"]), gpu("g9", &[])])
        .collect();
    let point = app
        .client
        .place(place("w00", gpus.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(point.placements.len(), 9, "{:?}", point.skipped);
    for placement in &point.placements {
        for member in &placement.members {
            let kept = member.predicted_speed_fraction.unwrap();
            let (low, high) = (
                member.predicted_speed_fraction_low.expect("an interval"),
                member.predicted_speed_fraction_high.expect("an interval"),
            );
            assert!(low <= kept && kept <= high, "{member:?}");
            if placement.members.len() == 1 {
                // Alone, the job runs at its exclusive throughput: no uncertainty.
                assert_eq!((low, high), (1.0, 1.0));
            } else {
                assert!(
                    low < kept,
                    "a colocated member's interval has width: {member:?}"
                );
            }
        }
    }
    // A cap between the low end and the point prediction of the job on the first
    // one-resident GPU: met by the point, broken by the low end.
    let first = point.placements.iter().find(|p| p.gpu_id == "g1").unwrap();
    let job = &first.members[0];
    let cap =
        (job.predicted_speed_fraction_low.unwrap() + job.predicted_speed_fraction.unwrap()) / 2.0;
    let mut request = place("w00", gpus.clone());
    request.min_job_fraction = cap;
    let plain = app
        .client
        .place(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(
        plain.placements.iter().any(|p| p.gpu_id == "g1"),
        "{plain:?}"
    );
    request.cautious = true;
    let cautious = app.client.place(request).await.unwrap().into_inner();
    for unconstrained in &point.placements {
        let low = unconstrained.members[0]
            .predicted_speed_fraction_low
            .unwrap();
        let skip = cautious
            .skipped
            .iter()
            .find(|s| s.gpu_id == unconstrained.gpu_id);
        if low < cap {
            let skip = skip.expect("the job's cap is broken at the low end");
            assert_eq!(skip.code(), pb::PlaceSkipReason::PlaceJobSlowdown);
            assert_eq!(skip.predicted_fraction, Some(low));
            assert!(skip.reason.contains("low end"), "{}", skip.reason);
        } else {
            assert!(skip.is_none(), "{skip:?}");
        }
    }
    assert!(cautious.skipped.iter().any(|s| s.gpu_id == "g1"));
    assert!(cautious.placements.iter().any(|p| p.gpu_id == "g9"));
}

#[tokio::test]
async fn set_predictions_kept_across_requests_follow_a_changed_profile() {
    let (mut app, workloads) = slowdown_app(6).await;
    let gpus = || vec![gpu("a", &["w01"]), gpu("b", &["w02", "w03"])];
    let ask = |app: &mut crate::helpers::TestApp| {
        let mut client = app.client.clone();
        async move {
            client
                .place(place("w00", gpus()))
                .await
                .unwrap()
                .into_inner()
        }
    };
    let gain = |answer: &pb::PlaceResponse, id: &str| {
        answer
            .placements
            .iter()
            .find(|p| p.gpu_id == id)
            .unwrap()
            .gain
    };
    let first = ask(&mut app).await;
    // Asked again, the kept predictions give the same answer to the bit.
    let again = ask(&mut app).await;
    assert_eq!(first, again);

    // w01's profile changes: its pair with the job must be predicted afresh.
    let mut profile = workloads[1].1.clone();
    let kernel = profile.kernel.as_mut().unwrap();
    kernel.compute_throughput_pct = (kernel.compute_throughput_pct * 0.3).max(1.0);
    kernel.dram_throughput_pct = (kernel.dram_throughput_pct * 0.3).max(1.0);
    profile.system.as_mut().unwrap().sm_busy_pct = 5.0;
    app.client
        .put_profile(pb::PutProfileRequest {
            name: "w01".into(),
            profile: Some(profile),
        })
        .await
        .unwrap();
    let after = ask(&mut app).await;
    let predicted = pair_sum(&mut app, "w00", "w01").await;
    let expected: f64 = predicted
        .members
        .iter()
        .map(|m| m.predicted_throughput.unwrap().min(m.exclusive_throughput))
        .sum::<f64>()
        - predicted.members[1].exclusive_throughput;
    assert!(
        (gain(&after, "a") - expected).abs() <= 1e-9 * expected.abs().max(1.0),
        "{} vs {expected}",
        gain(&after, "a")
    );
    assert_ne!(gain(&after, "a"), gain(&first, "a"), "a stale prediction");
    assert_eq!(gain(&after, "b"), gain(&first, "b"));
}

#[tokio::test]
async fn normalized_sum_scores_by_the_members_share_of_their_exclusive_throughput() {
    let (mut app, _) = slowdown_app(6).await;
    let mut request = place(
        "w00",
        vec![gpu("a", &[]), gpu("b", &["w01"]), gpu("c", &["w02", "w03"])],
    );
    request.objective = Some(pb::Objective::NormalizedSum as i32);
    let answer = app.client.place(request).await.unwrap().into_inner();
    for placement in &answer.placements {
        let after: f64 = placement
            .members
            .iter()
            .map(|m| m.predicted_speed_fraction.unwrap())
            .sum();
        assert!(
            (placement.value_after - after).abs() < 1e-12,
            "{placement:?}"
        );
    }
    let empty = answer.placements.iter().find(|p| p.gpu_id == "a").unwrap();
    assert_eq!((empty.value_before, empty.gain), (0.0, 1.0));
    let one = answer.placements.iter().find(|p| p.gpu_id == "b").unwrap();
    assert_eq!(one.value_before, 1.0);
}

#[tokio::test]
async fn under_a_sum_only_model_caps_and_normalized_sum_use_members_estimated_from_the_sum() {
    // Pairs that slow each other down, fitted by the KACE model (sums only).
    let (mut app, _) = slowdown_app_with_config(6, "[model]\nkind = \"kace-linear\"\n").await;
    let plain = app
        .client
        .place(place("w00", vec![gpu("a", &["w01"]), gpu("b", &[])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.placements.len(), 2);
    assert_eq!(plain.models[0].kind, "kace-linear");
    assert!(
        plain.models[0].members_estimated,
        "every answer estimates the members of a sum-only model (one prediction)"
    );
    // The pair's sum split in proportion to the exclusive throughputs gives both members
    // the same share of their speed: sum / (e0 + e1), at most 1 (never sped up).
    let predicted = pair_sum(&mut app, "w00", "w01").await;
    let exclusive: f64 = predicted
        .members
        .iter()
        .map(|m| m.exclusive_throughput)
        .sum();
    let share = (predicted.predicted_throughput_sum / exclusive).min(1.0);
    let mut request = place("w00", vec![gpu("a", &["w01"]), gpu("b", &[])]);
    request.objective = Some(pb::Objective::NormalizedSum as i32);
    let answer = app.client.place(request).await.unwrap().into_inner();
    assert!(answer.models[0].members_estimated);
    assert!(answer.skipped.is_empty(), "{:?}", answer.skipped);
    let busy = answer.placements.iter().find(|p| p.gpu_id == "a").unwrap();
    for member in &busy.members {
        let kept = member.predicted_speed_fraction.unwrap();
        assert!((kept - share).abs() < 1e-12, "{member:?} vs {share}");
    }
    assert!((busy.value_before - 1.0).abs() < 1e-12);
    assert!((busy.value_after - 2.0 * share).abs() < 1e-12, "{busy:?}");
    // A cap on the job is checked on the estimate: broken exactly when the share is below.
    let mut capped = 0;
    for resident in ["w01", "w02", "w03", "w04"] {
        let predicted = pair_sum(&mut app, "w00", resident).await;
        let exclusive: f64 = predicted
            .members
            .iter()
            .map(|m| m.exclusive_throughput)
            .sum();
        let share = (predicted.predicted_throughput_sum / exclusive).min(1.0);
        for cap in [share - 0.01, share + 0.01]
            .into_iter()
            .filter(|c| *c > 0.0 && *c <= 1.0)
        {
            let mut request = place("w00", vec![gpu("a", &[resident])]);
            request.min_job_fraction = cap;
            let answer = app.client.place(request).await.unwrap().into_inner();
            if share < cap {
                assert_eq!(
                    answer.skipped[0].code(),
                    pb::PlaceSkipReason::PlaceJobSlowdown
                );
                capped += 1;
            } else {
                assert_eq!(answer.placements.len(), 1, "{answer:?}");
            }
        }
    }
    assert!(
        capped > 0,
        "no pair predicted below its exclusive throughputs"
    );
}

#[tokio::test]
async fn place_refuses_bad_requests_with_the_right_code_and_changes_nothing() {
    let (mut app, _) = slowdown_app(5).await;
    let before = app.dump_store().await;
    let unknown = expect_code(
        app.client.place(place("nobody", vec![gpu("a", &[])])).await,
        Code::NotFound,
    );
    assert!(unknown.contains("nobody"), "{unknown}");

    let floored = |residents: &[&str], floors: &[f64]| pb::GpuState {
        resident_min_fractions: floors.to_vec(),
        ..gpu("a", residents)
    };
    let cases: Vec<(pb::PlaceRequest, &str)> = vec![
        (
            place("w00", vec![gpu("a", &[]), gpu("a", &["w01"])]),
            "gpus[1].id",
        ),
        (place("w00", vec![gpu("", &[])]), "gpus[0].id"),
        (
            place("w00", vec![gpu("a", &["bad name"])]),
            "gpus[0].residents[0]",
        ),
        (place("", vec![gpu("a", &[])]), "workload"),
        (
            pb::PlaceRequest {
                max_jobs_per_gpu: 9,
                ..place("w00", vec![gpu("a", &[])])
            },
            "max_jobs_per_gpu",
        ),
        (
            pb::PlaceRequest {
                min_job_fraction: 1.5,
                ..place("w00", vec![gpu("a", &[])])
            },
            "min_job_fraction",
        ),
        (
            pb::PlaceRequest {
                min_resident_fraction: f64::NAN,
                ..place("w00", vec![gpu("a", &[])])
            },
            "min_resident_fraction",
        ),
        (
            pb::PlaceRequest {
                top_k: -1,
                ..place("w00", vec![gpu("a", &[])])
            },
            "top_k",
        ),
        (
            pb::PlaceRequest {
                objective: Some(7),
                ..place("w00", vec![gpu("a", &[])])
            },
            "objective",
        ),
        (
            pb::PlaceRequest {
                gpus: vec![pb::GpuState {
                    memory_gb: -1.0,
                    ..gpu("a", &[])
                }],
                ..place("w00", vec![])
            },
            "gpus[0].memory_gb",
        ),
        (
            place("w00", vec![gpu("a", &["w01"; 17])]),
            "gpus[0].residents",
        ),
        (
            pb::PlaceRequest {
                rule: 9,
                ..place("w00", vec![gpu("a", &[])])
            },
            "rule",
        ),
        (
            place("w00", vec![floored(&["w01"], &[1.5])]),
            "gpus[0].resident_min_fractions[0]",
        ),
        (
            place("w00", vec![floored(&["w01", "w02"], &[0.5, -0.1])]),
            "gpus[0].resident_min_fractions[1]",
        ),
        (
            place("w00", vec![floored(&["w01"], &[f64::NAN])]),
            "gpus[0].resident_min_fractions[0]",
        ),
        (
            place("w00", vec![floored(&["w01"], &[0.5, 0.5])]),
            "gpus[0].resident_min_fractions",
        ),
    ];
    for (request, field) in cases {
        let status = app.client.place(request.clone()).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{request:?}: {status:?}"
        );
        let violations = status.get_details_bad_request().unwrap().field_violations;
        assert_eq!(violations[0].field, field, "{}", status.message());
    }
    assert_eq!(app.dump_store().await, before);
}

#[tokio::test]
async fn a_gpu_may_bring_its_own_memory_limit_and_gpu_model() {
    let (mut app, _) = slowdown_app(5).await;
    // w03 uses 4 GB, w02 3 GB: 7 GB.
    let mut small = gpu("small", &["w02"]);
    small.memory_gb = 6.0;
    let mut named = gpu("named", &["w02"]);
    named.gpu = GPU.into();
    let answer = app
        .client
        .place(place("w03", vec![small, named]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.placements.len(), 1);
    assert_eq!(answer.placements[0].gpu_id, "named");
    assert_eq!(answer.placements[0].gpu, GPU);
    assert_eq!(
        answer.skipped[0].code(),
        pb::PlaceSkipReason::PlaceExceedsGpuMemory
    );
}

/// For every measured KACE pair (a, b), in both orders: placing a onto GPUs that each run
/// one of a's measured partners ranks them exactly as Predict scores the pairs: gain = the
/// pair's predicted sum minus the resident alone. Under the default model, a member
/// predicted above its exclusive throughput counts at its exclusive throughput (a co-runner
/// never speeds a job up); the KACE baseline predicts only sums, which are used as they are.
#[tokio::test]
async fn on_the_kace_pairs_place_ranks_one_resident_gpus_as_predict_scores_the_pairs() {
    use std::collections::BTreeMap;

    let dir = std::sync::Arc::new(tempfile::TempDir::new().unwrap());
    crate::kace::import(&dir);
    let mut app = crate::helpers::spawn_app_in(dir).await;
    let dataset = coloc::dataset::KaceDataset::read(&crate::helpers::kace_dir()).unwrap();
    let mut partners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in &dataset.pairs {
        partners
            .entry(pair.workload1.clone())
            .or_default()
            .push(pair.workload2.clone());
        if pair.workload1 != pair.workload2 {
            partners
                .entry(pair.workload2.clone())
                .or_default()
                .push(pair.workload1.clone());
        }
    }
    // Version 1 is the KACE baseline (sums only), version 2 the default model.
    for version in [1, 2] {
        app.client
            .pin_model(pb::PinModelRequest {
                gpu: String::new(),
                version,
            })
            .await
            .unwrap();
        let (mut pairs, mut clamped) = (0, 0);
        for (job, residents) in &partners {
            let mut request = place(
                job,
                residents.iter().map(|r| gpu(r, &[r.as_str()])).collect(),
            );
            request.include_oversubscribed = true;
            let answer = app.client.place(request).await.unwrap().into_inner();
            assert!(answer.skipped.is_empty(), "{:?}", answer.skipped);
            assert_eq!(answer.models[0].version, version);
            let mut expected: Vec<(f64, String)> = Vec::new();
            for resident in residents {
                let predicted = pair_sum(&mut app, job, resident).await;
                let alone = predicted.members[1].exclusive_throughput;
                let sum = if predicted.members[0].predicted_throughput.is_some() {
                    predicted
                        .members
                        .iter()
                        .map(|m| {
                            let t = m.predicted_throughput.unwrap();
                            clamped += usize::from(t > m.exclusive_throughput);
                            t.min(m.exclusive_throughput)
                        })
                        .sum()
                } else {
                    predicted.predicted_throughput_sum
                };
                expected.push((sum - alone, resident.clone()));
                pairs += 1;
            }
            expected.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let got: Vec<(f64, &str)> = answer
                .placements
                .iter()
                .map(|p| (p.gain, p.gpu_id.as_str()))
                .collect();
            assert_eq!(got.len(), expected.len());
            for ((gain, id), (expected_gain, expected_id)) in got.iter().zip(&expected) {
                assert_eq!(id, expected_id, "{job} (model version {version}): {got:?}");
                assert!(
                    (gain - expected_gain).abs() <= 1e-9 * expected_gain.abs().max(1.0),
                    "{job} on {id}: {gain} vs {expected_gain}"
                );
            }
        }
        let orders: usize = dataset
            .pairs
            .iter()
            .map(|p| if p.workload1 == p.workload2 { 1 } else { 2 })
            .sum();
        assert_eq!(pairs, orders);
        eprintln!(
            "model version {version}: {pairs} placements checked, {clamped} member predictions \
             above exclusive"
        );
    }
}

/// Each member's share of its exclusive throughput in the pair (`job`, `resident`), by the
/// Predict RPC (a member never keeps more than alone): (job's, resident's). The pair is
/// asked in the order the workloads were registered, as Place asks it.
async fn pair_shares(app: &mut crate::helpers::TestApp, job: &str, resident: &str) -> (f64, f64) {
    let (first, second) = if job < resident {
        (job, resident)
    } else {
        (resident, job)
    };
    let predicted = pair_sum(app, first, second).await;
    let share = |m: &pb::MemberPrediction| {
        (m.predicted_throughput.unwrap() / m.exclusive_throughput).min(1.0)
    };
    let (first, second) = (share(&predicted.members[0]), share(&predicted.members[1]));
    if job < resident {
        (first, second)
    } else {
        (second, first)
    }
}

#[tokio::test]
async fn a_fair_share_request_refuses_the_gpus_where_a_member_keeps_less_than_half_and_takes_the_rest(
) {
    let (mut app, _) = slowdown_app(8).await;
    let (mut refused, mut accepted) = (0, 0);
    for job in 0..8 {
        let job = format!("w0{job}");
        let residents: Vec<String> = (0..8)
            .map(|r| format!("w0{r}"))
            .filter(|r| *r != job)
            .collect();
        let mut request = place(
            &job,
            residents.iter().map(|r| gpu(r, &[r.as_str()])).collect(),
        );
        request.objective = Some(pb::Objective::NormalizedSum as i32);
        request.rule = pb::PlaceRule::FairShare as i32;
        let answer = app.client.place(request).await.unwrap().into_inner();
        for resident in &residents {
            let (job_share, resident_share) = pair_shares(&mut app, &job, resident).await;
            // Two jobs share the GPU: each must keep at least half of its speed.
            let (worst, worst_share) = if resident_share < job_share {
                (resident, resident_share)
            } else {
                (&job, job_share)
            };
            if (worst_share - 0.5).abs() < 1e-6 {
                continue; // too close to the line to say which side the model is on
            }
            let placed = answer.placements.iter().find(|p| &p.gpu_id == resident);
            let skipped = answer.skipped.iter().find(|s| &s.gpu_id == resident);
            if worst_share < 0.5 {
                refused += 1;
                assert!(placed.is_none(), "{job} beside {resident}: {placed:?}");
                let skipped = skipped.expect("refused by fair share");
                assert_eq!(skipped.code(), pb::PlaceSkipReason::PlaceRuleRefused);
                assert_eq!(&skipped.workload, worst, "{skipped:?}");
                assert!(
                    (skipped.predicted_fraction.unwrap() - worst_share).abs() < 1e-9,
                    "{skipped:?} vs {worst_share}"
                );
                assert!(skipped.reason.contains("fair share"), "{}", skipped.reason);
            } else {
                accepted += 1;
                assert!(skipped.is_none(), "{job} beside {resident}: {skipped:?}");
                let placed = placed.expect("fair share admits it");
                let expected_gain = job_share + resident_share - 1.0;
                assert!(
                    (placed.gain - expected_gain).abs() < 1e-9,
                    "{placed:?} vs {expected_gain}"
                );
            }
        }
    }
    assert!(
        refused > 0 && accepted > 0,
        "{refused} refused, {accepted} accepted"
    );
}

#[tokio::test]
async fn a_residents_own_floor_skips_the_gpu_that_would_break_it_and_names_it() {
    let (mut app, _) = slowdown_app(6).await;
    let (_, kept) = pair_shares(&mut app, "w00", "w01").await;
    assert!(kept < 0.99, "w01 must lose some speed beside w00: {kept}");
    let floored = |id: &str, residents: &[&str], floors: &[f64]| pb::GpuState {
        resident_min_fractions: floors.to_vec(),
        ..gpu(id, residents)
    };
    let answer = app
        .client
        .place(place(
            "w00",
            vec![
                // w01 asks for more than it keeps beside w00 (less still with w02 too);
                // w02 asks for nothing.
                floored("held", &["w02", "w01"], &[0.0, kept + 0.01]),
                floored("pair", &["w01"], &[kept + 0.01]),
                floored("kept", &["w01"], &[kept - 0.01]),
                gpu("free", &["w01"]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    let placed: Vec<&str> = answer
        .placements
        .iter()
        .map(|p| p.gpu_id.as_str())
        .collect();
    assert_eq!(placed.len(), 2, "{answer:?}");
    assert!(
        placed.contains(&"kept") && placed.contains(&"free"),
        "{placed:?}"
    );
    for id in ["held", "pair"] {
        let skipped = answer.skipped.iter().find(|s| s.gpu_id == id).unwrap();
        assert_eq!(skipped.code(), pb::PlaceSkipReason::PlaceResidentSlowdown);
        assert_eq!(skipped.workload, "w01");
        assert_eq!(skipped.floor, Some(kept + 0.01));
        assert!(!skipped.on_low_end);
        let fraction = skipped.predicted_fraction.unwrap();
        assert!(fraction < kept + 0.01, "{skipped:?}");
        assert!(
            skipped.reason.contains("w01") && skipped.reason.contains("own floor"),
            "{}",
            skipped.reason
        );
        if id == "pair" {
            assert!((fraction - kept).abs() < 1e-9, "{skipped:?} vs {kept}");
        }
    }
}
