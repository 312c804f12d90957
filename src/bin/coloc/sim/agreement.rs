//! One prediction, one verdict: on every measured KACE V100 pair, asked as (job, the GPU's
//! only resident), Predict, Rank, Place, the scheduler extender's Place query and the
//! simulation's placer read the same members to the bit, bounded by the exclusive
//! throughputs, and Rank, Place, the extender and the simulation admit or refuse the pair
//! alike under the default policy (fair share, cautious; the simulation's own rule and
//! caps are the same for pairs).

use std::{collections::HashMap, path::Path, sync::Arc};

use coloc::{
    advisor::{
        place_in, predict_in, rank_in, Catalog, GpuState, Objective, PlaceQuery, PlaceRule, Policy,
        PredictQuery, RankQuery,
    },
    dataset::{KaceDataset, KACE_GPU_MEMORY_GB},
    domain::{GpuName, WorkloadName},
    extender::{decide::SlotOutcome, placer},
    model::{fit, ModelKind},
    store::StoredModel,
};

use super::{
    place::{CapCheck, PlaceGpu, PlaceRequest, Placer, ServicePlacer},
    truth::Truth,
};

fn name(raw: &str) -> WorkloadName {
    WorkloadName::parse("workload", raw).unwrap()
}

#[test]
fn every_caller_reads_the_same_members_and_gives_the_same_verdict_on_every_kace_pair() {
    let data = Path::new("../shared/data");
    let truth = Truth::shared_data();
    let dataset = KaceDataset::read(&data.join("kace-v100")).unwrap();
    let rows = super::training_rows(&dataset, &[]).unwrap();
    let (params, metrics) = fit(ModelKind::DEFAULT, &rows).unwrap();
    let placer = |params, metrics| {
        ServicePlacer::new(
            &dataset,
            &truth.workloads,
            params,
            metrics,
            CapCheck::Cautious,
            PlaceRule::FairShare,
        )
        .unwrap()
    };
    // The simulation's placer, and a second one built alike whose catalog and model the
    // other callers read (placing borrows the first mutably).
    let mut sim = placer(params.clone(), metrics);
    let view = placer(params, metrics);
    let names: Vec<String> = truth.workloads.iter().map(|w| w.name.clone()).collect();
    let (catalog, models) = view.fixed().unwrap();
    let index = |n: &str| names.iter().position(|x| x == n).unwrap() as u8;
    let (mut admitted, mut refused) = (0, 0);
    // The simulation's workloads (the pairs' workloads it has profiles of).
    let simulated = |n: &str| names.iter().any(|x| x == n);
    for pair in dataset
        .pairs
        .iter()
        .filter(|p| simulated(&p.workload1) && simulated(&p.workload2))
    {
        for (job, resident) in [
            (&pair.workload1, &pair.workload2),
            (&pair.workload2, &pair.workload1),
        ] {
            let (by_place, gain, fits) = ask_every_caller(catalog, models, job, resident);
            let by_simulation = sim
                .place(&PlaceRequest {
                    job: index(job),
                    job_cap: None,
                    gpus: vec![PlaceGpu {
                        residents: vec![(index(resident), None)],
                    }],
                })
                .unwrap();
            // The simulation never overfills a GPU's memory.
            assert_eq!(
                by_place && fits,
                by_simulation.is_some(),
                "{job} + {resident}: the simulation disagrees"
            );
            if let (Some(decision), Some(gain)) = (by_simulation, gain) {
                assert_eq!(decision.gain.to_bits(), gain.to_bits());
            }
            if by_place {
                admitted += 1;
            } else {
                refused += 1;
            }
        }
    }
    // Both verdicts occur: the comparison could fail either way.
    assert!(
        admitted > 20 && refused > 20,
        "{admitted} admitted, {refused} refused"
    );
}

/// Asks Predict, Rank, Place and the extender's Place query about `job` beside `resident`:
/// asserts that they read the same members to the bit, bounded, and that Rank, Place and
/// the extender agree under the default policy. Returns Place's verdict, the gain it
/// listed, and whether the pair fits in memory.
fn ask_every_caller(
    catalog: &Catalog,
    models: &HashMap<GpuName, Arc<StoredModel>>,
    job: &str,
    resident: &str,
) -> (bool, Option<f64>, bool) {
    let model = models.values().next().unwrap().clone();
    let gpu = model.gpu.clone();
    let predicted = predict_in(
        catalog,
        &model,
        PredictQuery {
            workloads: vec![name(job), name(resident)],
            gpu: Some(gpu.clone()),
            gpu_memory_gb: Some(KACE_GPU_MEMORY_GB),
        },
    )
    .unwrap();
    let rank = |policy: Policy| {
        rank_in(
            catalog,
            &model,
            RankQuery {
                target: name(job),
                candidates: vec![resident.to_string()],
                top_k: 0,
                gpu: Some(gpu.clone()),
                gpu_memory_gb: Some(KACE_GPU_MEMORY_GB),
                include_oversubscribed: true,
                policy,
                min_benefit: 0.0,
            },
        )
        .unwrap()
    };
    let gpus = vec![GpuState {
        id: "0".into(),
        node: String::new(),
        gpu: Some(gpu.clone()),
        memory_gb: Some(KACE_GPU_MEMORY_GB),
        residents: vec![resident.to_string()],
        resident_floors: Vec::new(),
    }];
    let place = |policy: Policy| {
        let mut query = PlaceQuery::new(name(job), gpus.clone());
        query.policy = policy;
        query.include_oversubscribed = true;
        place_in(catalog, models, None, query).unwrap()
    };

    // The members, to the bit, through every caller (no policy refuses here).
    let open = Policy::unrestricted(Objective::NormalizedSum);
    let ranked = rank(open);
    let placed = place(open);
    let through_rank = &ranked.ranked[0].members;
    let through_place = &placed.placements[0].members;
    for (k, member) in predicted.members.iter().enumerate() {
        let bits = |m: &coloc::advisor::MemberPrediction| {
            (
                m.predicted_throughput.map(f64::to_bits),
                m.predicted_interval
                    .map(|(a, b)| (a.to_bits(), b.to_bits())),
                m.exclusive_throughput.to_bits(),
            )
        };
        assert_eq!(bits(member), bits(&through_rank[k]), "{job} + {resident}");
        assert_eq!(bits(member), bits(&through_place[k]), "{job} + {resident}");
        let throughput = member.predicted_throughput.unwrap();
        assert!(
            throughput <= member.exclusive_throughput,
            "{job} + {resident}: {} predicted above its exclusive throughput",
            member.workload
        );
    }
    assert_eq!(
        predicted.predicted_throughput_sum.to_bits(),
        ranked.ranked[0].predicted_throughput_sum.to_bits()
    );

    // The verdict under the default policy.
    let by_rank = !rank(Policy::default()).ranked.is_empty();
    let answer = place(Policy::default());
    let by_place = !answer.placements.is_empty();
    let extender_query = placer::placement_query(name(job), gpus.clone(), Policy::default(), None);
    let extender_answer = place_in(
        catalog,
        models,
        None,
        PlaceQuery {
            include_oversubscribed: true,
            ..extender_query
        },
    )
    .unwrap();
    let by_extender = matches!(
        placer::outcome_of(&extender_answer, "0"),
        Some(SlotOutcome::Fits { .. })
    );
    assert_eq!(
        by_rank, by_place,
        "{job} + {resident}: Rank and Place disagree"
    );
    assert_eq!(
        by_place, by_extender,
        "{job} + {resident}: the extender disagrees"
    );
    (
        by_place,
        answer.placements.first().map(|p| p.gain),
        predicted.fits_memory,
    )
}
