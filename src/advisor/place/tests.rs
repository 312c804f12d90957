//! Properties of Place on the published KACE V100 workloads with the default model
//! fitted on their measured pairs: adding a resident never raises anyone's predicted
//! throughput, a GPU whose memory would overflow is never ranked unless asked for, and
//! every cap, resident's own floor and rule is honoured. Expected values come from the
//! profiles (or Place's answer without the cap, floor or rule), not from the check itself.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, OnceLock},
};

use proptest::prelude::*;

use super::*;
use crate::{
    advisor::{Objective, Policy},
    dataset::KaceDataset,
    domain::{Profile, ProfileSource},
    model::{fit, FitMetrics, TrainingRow},
};

const V100: &str = "Tesla V100-SXM2-32GB";

struct Fixture {
    catalog: Catalog,
    models: HashMap<GpuName, Arc<StoredModel>>,
    /// Names and memory (GB) of the workloads, in the catalog's order.
    workloads: Vec<(String, f64)>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100");
        let dataset = KaceDataset::read(&dir).expect("the KACE data beside the repository");
        let features = dataset.features();
        let rows: Vec<TrainingRow> = dataset
            .pairs
            .iter()
            .filter_map(|p| {
                Some(TrainingRow {
                    members: vec![*features.get(&p.workload1)?, *features.get(&p.workload2)?],
                    throughputs: vec![p.throughput1, p.throughput2],
                })
            })
            .collect();
        let (params, metrics): (_, FitMetrics) =
            fit(ModelKind::MemberRidgeGbt, &rows).expect("the KACE data fits");
        let gpu = GpuName::parse("gpu", V100).unwrap();
        let model = Arc::new(StoredModel::fitted_in_process(
            gpu.clone(),
            params,
            metrics,
            String::new(),
        ));
        let mut catalog = Catalog::default();
        let mut workloads = Vec::new();
        for w in &dataset.workloads {
            let profile = Profile {
                gpu: gpu.clone(),
                kernel: w.kernel,
                system: w.system.clone(),
                source: ProfileSource::Imported,
                gpu_memory_gb: Some(32.0),
                measured_at_ms: 0,
                kernel_missing: false,
            };
            catalog.put_workload(&w.name, &[profile]);
            workloads.push((w.name.to_string(), w.system.memory_gb));
        }
        catalog.set_scoring_model(model.clone());
        Fixture {
            catalog,
            models: HashMap::from([(gpu, model)]),
            workloads,
        }
    })
}

fn gpu_state(id: usize, residents: &[usize], memory_gb: Option<f64>) -> GpuState {
    let workloads = &fixture().workloads;
    GpuState {
        id: format!("g{id:03}"),
        node: String::new(),
        gpu: Some(GpuName::parse("gpu", V100).unwrap()),
        memory_gb,
        residents: residents.iter().map(|&r| workloads[r].0.clone()).collect(),
        resident_floors: Vec::new(),
    }
}

fn place(query: PlaceQuery) -> PlaceAnswer {
    let f = fixture();
    place_in(&f.catalog, &f.models, None, query).unwrap()
}

fn job(index: usize) -> WorkloadName {
    WorkloadName::parse("workload", &fixture().workloads[index].0).unwrap()
}

fn workload_index() -> impl Strategy<Value = usize> {
    let n = fixture().workloads.len();
    0..n
}

fn predicted(placement: &Placement, name: &str) -> f64 {
    placement
        .members
        .iter()
        .find(|m| m.workload.as_str() == name)
        .and_then(|m| m.predicted_throughput)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn adding_a_resident_never_raises_the_others_predicted_throughput(
        job_index in workload_index(),
        residents in prop::collection::vec(workload_index(), 0..4),
        extra in workload_index(),
    ) {
        let mut grown = residents.clone();
        grown.push(extra);
        let mut query = PlaceQuery::new(
            job(job_index),
            vec![gpu_state(0, &residents, None), gpu_state(1, &grown, None)],
        );
        query.policy = Policy::unrestricted(Objective::ThroughputSum);
        query.include_oversubscribed = true;
        query.max_jobs_per_gpu = MAX_JOBS_PER_GPU;
        let answer = place(query);
        prop_assert_eq!(answer.placements.len(), 2);
        let small = answer.placements.iter().find(|p| p.gpu_id == "g000").unwrap();
        let large = answer.placements.iter().find(|p| p.gpu_id == "g001").unwrap();
        for member in &small.members {
            let before = member.predicted_throughput.unwrap();
            let after = predicted(large, member.workload.as_str());
            prop_assert!(after <= before, "{} rose from {before} to {after}", member.workload.as_str());
        }
        // The job never gets more than it does alone, nor a resident more than before.
        for placement in [small, large] {
            let job = &placement.members[0];
            prop_assert!(job.predicted_throughput.unwrap() <= job.exclusive_throughput);
        }
    }

    #[test]
    fn a_gpu_whose_memory_would_overflow_is_never_ranked_unless_asked_for(
        job_index in workload_index(),
        gpus in prop::collection::vec(
            (prop::collection::vec(workload_index(), 0..4), prop::option::of(4.0f64..40.0)),
            1..12,
        ),
        include_oversubscribed in any::<bool>(),
    ) {
        let f = fixture();
        let states: Vec<GpuState> = gpus
            .iter()
            .enumerate()
            .map(|(i, (residents, memory))| gpu_state(i, residents, *memory))
            .collect();
        let mut query = PlaceQuery::new(job(job_index), states);
        query.policy = Policy::unrestricted(Objective::ThroughputSum);
        query.include_oversubscribed = include_oversubscribed;
        let answer = place(query);
        prop_assert_eq!(answer.placements.len() + answer.skipped.len(), gpus.len());
        for (i, (residents, memory)) in gpus.iter().enumerate() {
            let id = format!("g{i:03}");
            let needed: f64 = f.workloads[job_index].1
                + residents.iter().map(|&r| f.workloads[r].1).sum::<f64>();
            let limit = memory.unwrap_or(32.0);
            let overflows = needed > limit;
            let placed = answer.placements.iter().find(|p| p.gpu_id == id);
            let skipped = answer.skipped.iter().find(|s| s.gpu_id == id);
            if residents.len() + 1 > DEFAULT_MAX_JOBS_PER_GPU {
                prop_assert_eq!(skipped.unwrap().code, PlaceSkipCode::TooManyJobs);
            } else if overflows && !include_oversubscribed {
                prop_assert!(placed.is_none(), "{id} needs {needed} GB of {limit}");
                prop_assert_eq!(skipped.unwrap().code, PlaceSkipCode::ExceedsGpuMemory);
            } else {
                let placed = placed.unwrap();
                prop_assert_eq!(placed.fits_memory, !overflows);
                prop_assert!((placed.memory_gb - needed).abs() < 1e-9);
            }
        }
    }

    #[test]
    fn every_cap_is_honoured_and_only_broken_caps_skip_a_gpu(
        job_index in workload_index(),
        gpus in prop::collection::vec(prop::collection::vec(workload_index(), 0..5), 1..12),
        job_cap in prop::option::of(0.05f64..1.0),
        resident_cap in prop::option::of(0.05f64..1.0),
        max_jobs in 1usize..=5,
    ) {
        let states: Vec<GpuState> = gpus
            .iter()
            .enumerate()
            .map(|(i, residents)| gpu_state(i, residents, None))
            .collect();
        let mut free = PlaceQuery::new(job(job_index), states.clone());
        free.policy = Policy::unrestricted(Objective::ThroughputSum);
        free.include_oversubscribed = true;
        free.max_jobs_per_gpu = MAX_JOBS_PER_GPU;
        let free = place(free);
        let mut query = PlaceQuery::new(job(job_index), states);
        query.policy = Policy::unrestricted(Objective::ThroughputSum);
        query.include_oversubscribed = true;
        query.policy.min_job_fraction = job_cap;
        query.policy.min_partner_fraction = resident_cap;
        query.max_jobs_per_gpu = max_jobs;
        let answer = place(query);
        for placement in &answer.placements {
            prop_assert!(placement.members.len() <= max_jobs);
            let job = &placement.members[0];
            if let Some(cap) = job_cap {
                prop_assert!(job.predicted_speed_fraction().unwrap() >= cap);
            }
            if let Some(cap) = resident_cap {
                for resident in &placement.members[1..] {
                    prop_assert!(resident.predicted_speed_fraction().unwrap() >= cap);
                }
            }
        }
        // A GPU is skipped only for a cap it would break (its uncapped prediction says
        // which), and then names the member and its predicted share.
        for skipped in &answer.skipped {
            let uncapped = free.placements.iter().find(|p| p.gpu_id == skipped.gpu_id).unwrap();
            match skipped.code {
                PlaceSkipCode::TooManyJobs => prop_assert!(uncapped.members.len() > max_jobs),
                PlaceSkipCode::JobSlowdown => {
                    let kept = uncapped.members[0].predicted_speed_fraction().unwrap();
                    prop_assert!(kept < job_cap.unwrap());
                    prop_assert_eq!(skipped.predicted_fraction, Some(kept));
                }
                PlaceSkipCode::ResidentSlowdown => {
                    let name = skipped.workload.as_ref().unwrap();
                    let member = uncapped.members[1..].iter().find(|m| &m.workload == name).unwrap();
                    let kept = member.predicted_speed_fraction().unwrap();
                    prop_assert!(kept < resident_cap.unwrap());
                    prop_assert_eq!(skipped.predicted_fraction, Some(kept));
                }
                other => prop_assert!(false, "unexpected skip {other:?}"),
            }
        }
        prop_assert_eq!(answer.placements.len() + answer.skipped.len(), gpus.len());
    }
}

/// Whether `rule` admits a new set whose members keep `shares` (the job first) and whose
/// value changes by `gain`, by the rule's definition.
fn admitted(rule: PlaceRule, gain: f64, shares: &[f64]) -> bool {
    let k = shares.len() as f64;
    match rule {
        PlaceRule::Gain => gain > 0.0,
        PlaceRule::FairShare => shares.iter().all(|s| *s >= 1.0 / k - 1e-9),
        PlaceRule::BreakEven => shares.iter().sum::<f64>() >= 1.0 - 1e-9,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn own_floors_and_the_rule_skip_exactly_the_gpus_that_break_them_and_say_why(
        job_index in workload_index(),
        gpus in prop::collection::vec(
            prop::collection::vec((workload_index(), prop::option::of(0.05f64..1.0)), 0..4),
            1..10,
        ),
        rule in prop::option::of(prop::sample::select(PlaceRule::ALL.to_vec())),
    ) {
        let states: Vec<GpuState> = gpus
            .iter()
            .enumerate()
            .map(|(i, residents)| {
                let indices: Vec<usize> = residents.iter().map(|r| r.0).collect();
                GpuState {
                    resident_floors: residents.iter().map(|r| r.1).collect(),
                    ..gpu_state(i, &indices, None)
                }
            })
            .collect();
        let query = |floors: bool, rule: Option<PlaceRule>| {
            let mut gpus = states.clone();
            if !floors {
                gpus.iter_mut().for_each(|g| g.resident_floors.clear());
            }
            let mut query = PlaceQuery::new(job(job_index), gpus);
        query.policy = Policy::unrestricted(Objective::ThroughputSum);
            query.policy.objective = Objective::NormalizedSum;
            query.include_oversubscribed = true;
            query.max_jobs_per_gpu = MAX_JOBS_PER_GPU;
            query.policy.rule = rule;
            query
        };
        let free = place(query(false, None));
        let answer = place(query(true, rule));
        prop_assert_eq!(free.placements.len(), gpus.len());
        prop_assert_eq!(answer.placements.len() + answer.skipped.len(), gpus.len());
        for (i, uncapped) in free.placements.iter().enumerate() {
            let id = &uncapped.gpu_id;
            let shares: Vec<f64> = uncapped
                .members
                .iter()
                .map(|m| m.predicted_speed_fraction().unwrap())
                .collect();
            let index: usize = id[1..].parse().unwrap();
            let floors = &gpus[index];
            let broken = floors
                .iter()
                .zip(&shares[1..])
                .position(|(r, share)| r.1.is_some_and(|floor| *share < floor));
            let skipped = answer.skipped.iter().find(|s| &s.gpu_id == id);
            let placed = answer.placements.iter().find(|p| &p.gpu_id == id);
            if let Some(k) = broken {
                let skipped = skipped.unwrap();
                prop_assert_eq!(skipped.code, PlaceSkipCode::ResidentSlowdown);
                prop_assert_eq!(skipped.workload.as_ref(), Some(&uncapped.members[1 + k].workload));
                prop_assert_eq!(skipped.predicted_fraction, Some(shares[1 + k]));
                prop_assert_eq!(skipped.floor, floors[k].1);
            } else if rule.is_some_and(|rule| {
                shares.len() > 1 && !admitted(rule, uncapped.gain, &shares)
            }) {
                let skipped = skipped.unwrap();
                prop_assert_eq!(skipped.code, PlaceSkipCode::RuleRefused, "{}", i);
            } else {
                prop_assert!(placed.is_some(), "{} wrongly skipped: {:?}", id, skipped);
                prop_assert_eq!(placed.unwrap().gain, uncapped.gain);
            }
        }
    }
}

#[test]
fn gpus_running_the_same_set_get_the_same_answer() {
    // 300 GPUs over 3 distinct resident sets (one predicted once per request, cached).
    let states: Vec<GpuState> = (0..300)
        .map(|i| gpu_state(i, &[[0, 1], [2, 2], [3, 4]][i % 3], None))
        .collect();
    let mut query = PlaceQuery::new(job(5), states);
    query.policy = Policy::unrestricted(Objective::ThroughputSum);
    query.include_oversubscribed = true;
    let answer = place(query);
    assert_eq!(answer.placements.len(), 300);
    for placement in &answer.placements {
        let twin = answer
            .placements
            .iter()
            .find(|p| p.gpu_id != placement.gpu_id && p.members == placement.members)
            .unwrap();
        assert_eq!(twin.gain, placement.gain);
    }
}

#[test]
fn an_answer_without_members_places_the_same_gpus_with_the_same_gains() {
    // GPUs of one to three residents, some of which the job overflows (32 GB each).
    let states: Vec<GpuState> = (0..60)
        .map(|i| {
            gpu_state(
                i,
                &[i % 7, (i * 3) % 11, (i * 5) % 13][..1 + i % 3],
                Some(32.0),
            )
        })
        .collect();
    let mut query = PlaceQuery::new(job(5), states);
    query.policy = Policy::unrestricted(Objective::NormalizedSum);
    let full = place(query.clone());
    query.with_members = false;
    let bare = place(query);
    assert!(!full.placements.is_empty());
    assert!(full.placements.iter().all(|p| !p.members.is_empty()));
    assert!(bare.placements.iter().all(|p| p.members.is_empty()));
    let gains = |a: &PlaceAnswer| -> Vec<(String, u64)> {
        a.placements
            .iter()
            .map(|p| (p.gpu_id.clone(), p.gain.to_bits()))
            .collect()
    };
    assert_eq!(gains(&full), gains(&bare));
    let skipped = |a: &PlaceAnswer| -> Vec<(String, PlaceSkipCode)> {
        a.skipped
            .iter()
            .map(|s| (s.gpu_id.clone(), s.code))
            .collect()
    };
    assert_eq!(skipped(&full), skipped(&bare));
}
