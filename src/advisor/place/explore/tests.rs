//! Exploration's safety and budget, on hand-made answers.

use std::sync::Arc;

use super::*;
use crate::{
    advisor::{Evidence, GpuState, MemberPrediction},
    domain::{GpuName, WorkloadName},
};

/// A member with exclusive throughput 100 and the interval (low, high) around a point
/// halfway.
fn member(name: &str, low: f64, high: f64) -> MemberPrediction {
    MemberPrediction {
        workload: WorkloadName::parse("workload", name).unwrap(),
        exclusive_throughput: 100.0,
        throughput_unit: Arc::from("samples/s"),
        predicted_throughput: Some((low + high) / 2.0),
        predicted_interval: Some((low, high)),
        evidence: Evidence::ProfileOnly,
        profile_exclusive_throughput: 100.0,
        profile_level: crate::model::ProfileLevel::Full,
    }
}

/// A placement on GPU `id`: the job's interval first, then each resident's.
fn placement(id: &str, members: &[(f64, f64)]) -> Placement {
    Placement {
        gpu_id: id.into(),
        node: String::new(),
        gpu: GpuName::parse("gpu", "V100").unwrap(),
        gain: 0.5,
        gain_low: 0.4,
        value_before: 1.0,
        value_after: 1.5,
        members: members
            .iter()
            .enumerate()
            .map(|(i, &(low, high))| member(&format!("w{i}"), low, high))
            .collect(),
        fits_memory: true,
        memory_gb: 8.0,
        gpu_memory_gb: 32.0,
        model_version: 1,
        explored: false,
    }
}

fn gpu(id: &str, floors: &[Option<f64>]) -> GpuState {
    GpuState {
        id: id.into(),
        node: String::new(),
        gpu: None,
        memory_gb: None,
        residents: (0..floors.len()).map(|i| format!("w{}", i + 1)).collect(),
        resident_floors: floors.to_vec(),
    }
}

fn query(gpus: Vec<GpuState>, job_floor: Option<f64>, partner_floor: Option<f64>) -> PlaceQuery {
    let mut query = PlaceQuery::new(WorkloadName::parse("workload", "w0").unwrap(), gpus);
    query.policy.min_job_fraction = job_floor;
    query.policy.min_partner_fraction = partner_floor;
    query
}

/// An answer: "a" narrow (Place's first), "b" wide and safe, "c" widest but its resident's
/// low end (0.40) below the resident's own floor of 0.5.
fn answer() -> (Vec<Placement>, PlaceQuery) {
    let placements = vec![
        placement("a", &[(70.0, 72.0), (70.0, 72.0)]),
        placement("b", &[(60.0, 80.0), (55.0, 75.0)]),
        placement("c", &[(60.0, 95.0), (40.0, 90.0)]),
    ];
    let gpus = vec![
        gpu("a", &[None]),
        gpu("b", &[Some(0.5)]),
        gpu("c", &[Some(0.5)]),
    ];
    (placements, query(gpus, Some(0.5), None))
}

#[test]
fn the_widest_set_whose_low_ends_keep_every_floor_is_the_candidate() {
    let (placements, query) = answer();
    // "c" is wider (0.85) than "b" (0.40), but its resident's low end breaks its floor.
    assert_eq!(candidate(&placements, &query), Some(1));
    // A partner floor of 0.6 for every resident: "b"'s resident (0.55) breaks it too.
    let mut strict = query.clone();
    strict.policy.min_partner_fraction = Some(0.6);
    assert_eq!(candidate(&placements, &strict), None);
    // A job floor of 0.65: "b"'s job (low end 0.60) breaks it.
    let mut strict = query.clone();
    strict.policy.min_job_fraction = Some(0.65);
    assert_eq!(candidate(&placements, &strict), None);
    // Without floors "c" is the widest and safe.
    let free = self::query(
        vec![gpu("a", &[None]), gpu("b", &[None]), gpu("c", &[None])],
        None,
        None,
    );
    assert_eq!(candidate(&placements, &free), Some(2));
}

#[test]
fn nothing_is_explored_when_no_set_is_wider_than_places_first_or_one_lacks_intervals() {
    let (mut placements, query) = answer();
    placements[0] = placement("a", &[(50.0, 99.0), (50.0, 99.0)]);
    assert_eq!(candidate(&placements, &query), None);
    let (mut placements, query) = answer();
    placements[1].members[1].predicted_interval = None;
    assert_eq!(candidate(&placements, &query), None);
    assert_eq!(candidate(&[], &query), None);
}

#[test]
fn a_budget_of_zero_never_explores() {
    let exploration = Exploration::new(0.0);
    for _ in 0..1000 {
        let (mut placements, query) = answer();
        exploration.apply(&mut placements, &query);
        assert_eq!(placements[0].gpu_id, "a");
        assert!(placements.iter().all(|p| !p.explored));
    }
    assert_eq!(exploration.counts(), (1000, 0));
}

#[test]
fn the_explored_share_never_passes_the_budget_and_refusals_do_not_count() {
    let exploration = Exploration::new(0.05);
    let mut explored = 0u64;
    for n in 1..=1000u64 {
        let (mut placements, query) = answer();
        exploration.apply(&mut placements, &query);
        if placements[0].explored {
            explored += 1;
            assert_eq!(placements[0].gpu_id, "b");
            assert_eq!(placements.len(), 3);
        } else {
            assert_eq!(placements[0].gpu_id, "a");
        }
        // 5 % of n, rounded down: every 20th placement explores.
        assert_eq!(explored, n / 20, "after {n} placements");
        // A refused request (no GPU offered) is no placement.
        exploration.apply(&mut Vec::new(), &query);
    }
    assert_eq!(exploration.counts(), (1000, 50));
}

/// A SplitMix64 step, for reproducible made-up answers.
fn next(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as f64 / u64::MAX as f64
}

#[test]
fn an_explored_set_never_has_a_low_end_below_a_cap_or_floor() {
    let exploration = Exploration::new(1.0);
    let mut state = 7u64;
    let mut explored = 0;
    for _ in 0..2000 {
        let mut placements = Vec::new();
        let mut gpus = Vec::new();
        for g in 0..4 {
            let id = format!("g{g}");
            let members: Vec<(f64, f64)> = (0..1 + g % 3)
                .map(|_| {
                    let low = 20.0 + 60.0 * next(&mut state);
                    (low, low + 30.0 * next(&mut state))
                })
                .collect();
            let floors: Vec<Option<f64>> = (1..members.len())
                .map(|_| (next(&mut state) < 0.5).then_some(0.5))
                .collect();
            placements.push(placement(&id, &members));
            gpus.push(gpu(&id, &floors));
        }
        let query = query(gpus, Some(0.4), Some(0.3));
        exploration.apply(&mut placements, &query);
        if !placements[0].explored {
            continue;
        }
        explored += 1;
        let chosen = &placements[0];
        let floors = &query.gpus.iter().find(|g| g.id == chosen.gpu_id).unwrap();
        // Each member's low end over its exclusive 100, against its floor written out.
        assert!(chosen.members[0].predicted_interval.unwrap().0 / 100.0 >= 0.4);
        for (k, resident) in chosen.members[1..].iter().enumerate() {
            let floor = floors.resident_floors[k].unwrap_or(0.3).max(0.3);
            assert!(resident.predicted_interval.unwrap().0 / 100.0 >= floor);
        }
    }
    // The made-up answers leave room to explore: the test checks something.
    assert!(explored > 100, "{explored} explored");
}
