//! Tests of `member-ridge-gbt`'s intervals: their calibration, seen bands, and answers.

use super::*;

#[test]
fn a_crowded_interval_widens_with_how_far_the_set_model_moves_the_members() {
    let mut state = 29;
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let mut model =
        MemberRidgeGbt::fit_with(&mixed_rows(&seen), MemberOptions::CHOSEN).expect("fits");
    let linear = model.set_linear.clone().expect("trained on triples");
    // The members before either blend (the difficulty is the set-level blend's alone).
    let members_only = MemberRidgeGbt {
        set_linear: None,
        options: MemberOptions {
            law_blend: 0,
            ..model.options
        },
        ..model.clone()
    };
    // Pairs plain; no band of three (a triple borrows the larger neighbour's); four
    // or more scaled with floor 0.1.
    model.intervals = Some(Intervals {
        bands: vec![
            Some(intervals::Band {
                runs: 9,
                member: Some((-0.5, 0.25)),
                sum: (-0.2, 0.4),
                floor: None,
            }),
            None,
            Some(intervals::Band {
                runs: 9,
                member: Some((-1.0, 2.0)),
                sum: (-0.5, 1.0),
                floor: Some(0.1),
            }),
        ],
    });
    let fresh: Vec<Features> = (0..4).map(|_| workload(&mut state)).collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-12);
    for set in [
        vec![&fresh[0], &seen[1], &fresh[2], &seen[3]],
        vec![&fresh[1], &fresh[3], &seen[5]],
    ] {
        // The difficulty by hand: |ln((members' sum + linear sum) / 2 / members' sum)|.
        let m = members_only.predict_set(&set).sum;
        let l = linear.predict_set(&set).sum.max(0.0);
        let d = (0.5 * (m + l) / m).ln().abs();
        assert!(d > 0.0);
        assert!(
            close(model.difficulty(&set), d),
            "{}",
            model.difficulty(&set)
        );
        let prediction = model.predict_set(&set);
        let interval = model
            .interval(&set, &prediction, model.difficulty(&set))
            .expect("has intervals");
        let width = 0.1 + d;
        assert!(close(interval.sum.0, prediction.sum * (-0.5 * width).exp()));
        assert!(close(interval.sum.1, prediction.sum * (1.0 * width).exp()));
        let members = prediction.members.as_ref().unwrap();
        for (bounds, p) in interval.members.unwrap().iter().zip(members) {
            assert!(close(bounds.0, p * (-width).exp()));
            assert!(close(bounds.1, p * (2.0 * width).exp()));
        }
    }
    // A pair: the plain band, whatever its members.
    let pair = [&fresh[0], &seen[2]];
    assert_eq!(model.difficulty(&pair), 0.0);
    let prediction = model.predict_set(&pair);
    let interval = model.interval(&pair, &prediction, 0.0).unwrap();
    assert!(close(interval.sum.0, prediction.sum * (-0.2f64).exp()));
    assert!(close(interval.sum.1, prediction.sum * 0.4f64.exp()));
    let params = ModelParams::MemberRidgeGbt(model);
    assert!(params.has_intervals());
    assert_eq!(params.interval(&pair, &prediction, 0.0), Some(interval));
}

#[test]
fn seen_bands_answer_sets_whose_every_member_was_trained_on_and_nothing_else() {
    let mut state = 37;
    let seen: Vec<Features> = (0..18).map(|_| workload(&mut state)).collect();
    // The first 16 in triples (120 of them: a crowded band needs 100 held out) and
    // pairs, the last two in pairs only.
    let mut mixed = mixed_rows(&seen[..16]);
    mixed.extend(
        rows(&seen)
            .into_iter()
            .filter(|r| r.members.iter().any(|m| *m == seen[16] || *m == seen[17])),
    );
    let mut model = MemberRidgeGbt::fit(&mixed).expect("fits");
    let bands = model.seen.clone().expect("a store of known workloads");
    let sorted = |workloads: &[Features]| {
        let mut prints: Vec<u64> = workloads.iter().map(Features::fingerprint).collect();
        prints.sort_unstable();
        prints
    };
    assert_eq!(bands.profiles, sorted(&seen));
    assert_eq!(bands.crowded_profiles, sorted(&seen[..16]));
    let pairs = bands.intervals.bands[0].expect("pairs held out");
    assert!(pairs.runs >= intervals::MIN_BAND_RUNS);
    let triples = bands.intervals.bands[1].expect("triples held out");
    assert!(triples.runs >= intervals::MIN_CROWDED_BAND_RUNS);
    // Chosen bands by hand, far apart, so that the test sees which one answered.
    let band = |member: (f64, f64), sum: (f64, f64)| intervals::Band {
        runs: 9,
        member: Some(member),
        sum,
        floor: None,
    };
    model.intervals = Some(Intervals {
        bands: vec![
            Some(band((-0.5, 0.25), (-0.2, 0.4))),
            Some(band((-1.0, 2.0), (-0.5, 1.0))),
            None,
        ],
    });
    model.seen = Some(SeenBands {
        intervals: Intervals {
            bands: vec![
                Some(band((-0.01, 0.01), (-0.07, 0.06))),
                Some(band((-0.05, 0.04), (-0.03, 0.02))),
                None,
            ],
        },
        ..bands.clone()
    });
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-12);
    let low_of = |model: &MemberRidgeGbt, set: &[&Features]| {
        let prediction = model.predict_set(set);
        let params = ModelParams::MemberRidgeGbt(model.clone());
        let predicted = params.predict(&[set]).remove(0);
        assert_eq!(predicted.prediction, prediction);
        assert_eq!(predicted.difficulty, model.difficulty(set));
        let interval = params
            .interval(set, &prediction, predicted.difficulty)
            .expect("has intervals");
        (interval.sum.0 / prediction.sum).ln()
    };
    let fresh = workload(&mut state);
    // Three workloads trained on in triples: the seen band of three.
    assert!(close(
        low_of(&model, &[&seen[0], &seen[4], &seen[7]]),
        -0.03
    ));
    // One workload never trained on, or one trained on in pairs only: the model's own
    // band of three.
    assert!(close(low_of(&model, &[&seen[0], &seen[4], &fresh]), -0.5));
    assert!(close(
        low_of(&model, &[&seen[0], &seen[4], &seen[17]]),
        -0.5
    ));
    // A pair of workloads trained on (in pairs is enough): the seen band of two; with a
    // new workload, the model's band of two.
    assert!(close(low_of(&model, &[&seen[0], &seen[17]]), -0.07));
    assert!(close(low_of(&model, &[&seen[0], &fresh]), -0.2));
    // Four trained workloads: no seen band of four, so the model's bands (its band of
    // three, the nearest), never the seen band of three.
    assert!(close(
        low_of(&model, &[&seen[0], &seen[4], &seen[7], &seen[9]]),
        -0.5
    ));
    // Without the band of two (--seen-bands crowded), pairs read the model's band.
    let crowded = MemberRidgeGbt {
        seen: model.seen.clone().and_then(SeenBands::crowded_only),
        ..model.clone()
    };
    assert!(close(low_of(&crowded, &[&seen[0], &seen[17]]), -0.2));
    assert!(close(
        low_of(&crowded, &[&seen[0], &seen[4], &seen[7]]),
        -0.03
    ));
    // A model stored before seen bands existed reads back without them.
    assert_eq!(stored_without(&model, "seen").seen, None);
}

#[test]
fn no_seen_band_and_no_refit_where_no_size_has_nine_runs_of_known_workloads() {
    let mut state = 41;
    let pool: Vec<Features> = (0..60).map(|_| workload(&mut state)).collect();
    // Pairs and triples each of workloads found in no other run: no held-out run has
    // its members in another fold's training.
    let mut training: Vec<TrainingRow> = pool[..30]
        .chunks(2)
        .map(|c| TrainingRow {
            members: c.to_vec(),
            throughputs: c.iter().map(|m| m.0[6] * 0.7).collect(),
        })
        .collect();
    for chunk in pool[30..].chunks(3) {
        training.push(TrainingRow {
            members: chunk.to_vec(),
            throughputs: chunk.iter().map(|m| m.0[6] * 0.5).collect(),
        });
    }
    assert!(SeenBands::folds(&training).is_none());
    assert_eq!(
        MemberRidgeGbt::calibrate_seen(&training, MemberOptions::CHOSEN).unwrap(),
        None
    );
    // Pairs of ten workloads: a band of two, nothing crowded.
    let pairs = MemberRidgeGbt::calibrate_seen(&rows(&pool[..10]), MemberOptions::CHOSEN)
        .unwrap()
        .expect("pairs of known workloads");
    assert!(pairs.intervals.bands[0].is_some());
    assert!(pairs.intervals.bands[1..].iter().all(Option::is_none));
    assert!(pairs.crowded_profiles.is_empty());
    assert_eq!(pairs.profiles.len(), 10);
}

/// Every way of calibrating the crowded bands: plain, scaled by a fixed floor or by the
/// median difficulty, on either folding, and the served split.
const CALIBRATIONS: [(&str, Calibration); 6] = {
    use intervals::{Folds, Scale};
    const fn way(folds: Folds, scale: Scale, sums: Option<Folds>) -> Calibration {
        Calibration { folds, scale, sums }
    }
    [
        ("profile-folds", way(Folds::Profiles, Scale::Plain, None)),
        (
            "profile-folds, scaled 0.1",
            way(Folds::Profiles, Scale::Fixed(0.1), None),
        ),
        (
            "profile-folds, scaled median",
            way(Folds::Profiles, Scale::Median, None),
        ),
        ("profile-out", way(Folds::ProfileOut, Scale::Plain, None)),
        (
            "profile-out, scaled 0.1",
            way(Folds::ProfileOut, Scale::Fixed(0.1), None),
        ),
        ("served", Calibration::CHOSEN),
    ]
};

#[test]
fn every_calibration_gives_pairs_the_plain_band_of_five_profile_folds() {
    let mut state = 31;
    // 24 workloads: 276 triples, so that every fold's model has its linear part.
    let seen: Vec<Features> = (0..24).map(|_| workload(&mut state)).collect();
    let mixed = mixed_rows(&seen);
    let options = MemberOptions::CHOSEN;
    let ways: Vec<Calibration> = CALIBRATIONS.iter().map(|(_, c)| *c).collect();
    let calibrated = MemberRidgeGbt::calibrate(&mixed, options, &ways).unwrap();
    // The calibration before crowded bands had choices: plain quantiles of the runs
    // held out by five folds of profiles, every band.
    let folds = profile_folds(&mixed, intervals::FOLDS);
    assert_eq!(folds.len(), intervals::FOLDS);
    let before = Intervals::calibrate(
        &intervals::held_out(&mixed, &folds, |train| {
            MemberRidgeGbt::fit_with(train, options).map(ModelParams::MemberRidgeGbt)
        })
        .unwrap(),
    );
    assert!(before.bands[0].is_some() && before.bands[1].is_some());
    for ((name, way), intervals) in CALIBRATIONS.iter().zip(&calibrated) {
        let intervals = intervals.as_ref().expect("calibrated");
        assert_eq!(intervals.bands[0], before.bands[0], "{name}");
        let crowded = intervals.bands[1].unwrap();
        assert_eq!(
            crowded.floor.is_some(),
            way.scale != intervals::Scale::Plain,
            "{name}"
        );
    }
    assert_eq!(calibrated[0].as_ref(), Some(&before));
    // The split candidate: each crowded band's member quantiles from one profile per
    // fold (candidate 4), its sum quantiles from the five profile folds (candidate 1).
    let (profile_folds_bands, profile_out_bands, split) = (
        calibrated[0].as_ref().unwrap(),
        calibrated[3].as_ref().unwrap(),
        calibrated[5].as_ref().unwrap(),
    );
    assert_eq!(CALIBRATIONS[5].1.sums, Some(intervals::Folds::Profiles));
    let (folds, out, split) = (
        profile_folds_bands.bands[1].unwrap(),
        profile_out_bands.bands[1].unwrap(),
        split.bands[1].unwrap(),
    );
    assert_eq!(split.member, out.member);
    assert_eq!(split.sum, folds.sum);
    assert_ne!(folds.sum, out.sum, "the two foldings must differ here");
    assert_eq!((split.runs, split.floor), (out.runs, None));
    // Trained on pairs alone, every calibration is the plain one.
    let pairs = rows(&seen);
    let on_pairs = MemberRidgeGbt::calibrate(&pairs, options, &ways).unwrap();
    assert!(on_pairs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn held_out_runs_and_calibrated_intervals_are_the_same_on_one_thread_and_on_several_fold_by_fold_or_side_by_side(
) {
    let mut state = 47;
    let seen: Vec<Features> = (0..10).map(|_| workload(&mut state)).collect();
    let mixed = mixed_rows(&seen);
    let options = MemberOptions::CHOSEN;
    let folds = profile_folds(&mixed, intervals::PROFILE_OUT_FOLDS);
    assert!(folds.len() > 2);
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let fit = |train: &[TrainingRow]| {
                MemberRidgeGbt::fit_with(train, options).map(ModelParams::MemberRidgeGbt)
            };
            let held_out = intervals::held_out(&mixed, &folds, fit).unwrap();
            let in_parallel = intervals::held_out_in_parallel(&mixed, &folds, fit).unwrap();
            let calibrated =
                MemberRidgeGbt::calibrate(&mixed, options, &[Calibration::CHOSEN]).unwrap();
            (held_out, in_parallel, calibrated)
        })
    };
    let ((one, one_parallel, one_calibrated), (several, several_parallel, several_calibrated)) =
        (on(1), on(3));
    assert_eq!(one.len(), several.len());
    assert_eq!(one.len(), folds.iter().map(Vec::len).sum::<usize>());
    assert_eq!(one.len(), one_parallel.len());
    assert_eq!(one.len(), several_parallel.len());
    let runs = one
        .iter()
        .zip(&several)
        .chain(one.iter().zip(&one_parallel));
    for (a, b) in runs.chain(one.iter().zip(&several_parallel)) {
        // Fold by fold, in the folds' order: the same runs and the same bits.
        assert_eq!(a.throughputs, b.throughputs);
        assert_eq!(a.prediction, b.prediction);
        assert_eq!(a.difficulty.to_bits(), b.difficulty.to_bits());
    }
    assert!(one_calibrated[0].is_some());
    assert_eq!(one_calibrated, several_calibrated);
}

#[test]
fn models_stored_before_the_options_read_as_the_plain_model() {
    let mut state = 9;
    let seen: Vec<Features> = (0..12).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit_with(&rows(&seen), MemberOptions::default()).unwrap();
    let mut json: serde_json::Value = serde_json::to_value(&model).unwrap();
    json.as_object_mut().unwrap().remove("options");
    let back: MemberRidgeGbt = serde_json::from_value(json).unwrap();
    assert_eq!(back.options, MemberOptions::default());
    let probe = [&seen[1], &seen[2], &seen[3]];
    assert_eq!(back.predict_set(&probe), model.predict_set(&probe));
}

#[test]
fn the_fitted_model_round_trips_through_json_exactly() {
    let mut state = 9;
    let seen: Vec<Features> = (0..12).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit(&rows(&seen)).unwrap();
    let json = serde_json::to_string(&model).unwrap();
    let back: MemberRidgeGbt = serde_json::from_str(&json).unwrap();
    assert_eq!(back, model);
    assert!(
        back.nvml_twin.is_some(),
        "the twin is stored with the model"
    );
    let probe = [&seen[3], &seen[7]];
    assert_eq!(back.predict_set(&probe), model.predict_set(&probe));
}

/// `Train`'s model carries its NVML-only twin: the fit of the same runs with the kernel
/// metrics withheld (to the bit), with no twin of its own; where the runs' law reads a
/// kernel metric (compute throughput here), the twin's calibrated pair band, from its own
/// held-out profiles, is wider than the full model's.
#[test]
fn the_nvml_only_twin_fits_the_withheld_runs_and_its_band_is_wider_where_kernels_matter() {
    let mut state = 41;
    let seen: Vec<Features> = (0..14).map(|_| workload(&mut state)).collect();
    let kept = |own: &Features, other: &Features| {
        (1.3 - 0.6 * (own.0[1] + other.0[1]) / 90.0).clamp(0.2, 1.0)
    };
    let mut runs = Vec::new();
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i..] {
            runs.push(TrainingRow {
                members: vec![*a, *b],
                throughputs: vec![a.0[6] * kept(a, b), b.0[6] * kept(b, a)],
            });
        }
    }
    let model = MemberRidgeGbt::fit(&runs).unwrap();
    let Some(ModelParams::MemberRidgeGbt(twin)) = model.nvml_twin.as_deref() else {
        panic!("no twin: {:?}", model.nvml_twin);
    };
    assert!(twin.nvml_twin.is_none());
    let withheld: Vec<TrainingRow> = runs.iter().map(TrainingRow::nvml_only).collect();
    let alone = MemberRidgeGbt::fit_with(&withheld, MemberOptions::TWIN).unwrap();
    let probe = [&seen[2].nvml_only(), &seen[5].nvml_only()];
    assert_eq!(twin.predict_set(&probe), alone.predict_set(&probe));
    let width = |m: &MemberRidgeGbt| {
        let band = m.intervals.as_ref().unwrap().bands[0].unwrap();
        let (low, high) = band.member.unwrap();
        high - low
    };
    assert!(
        width(twin) > width(&model),
        "twin {} against full {}",
        width(twin),
        width(&model)
    );
}

#[test]
fn ridge_feature_names_match_the_features() {
    assert_eq!(ridge_feature_names().len(), RIDGE_FEATURES);
}

/// Pairs of `workloads` whose throughputs are the law's times a noise factor of 0.8-1.2:
/// what no model fits exactly, so that some training members fall outside any band.
fn noisy_pairs(workloads: &[Features], state: &mut u64) -> Vec<TrainingRow> {
    let mut noisy = rows(workloads);
    for row in &mut noisy {
        for t in &mut row.throughputs {
            *t *= 0.8 + 0.4 * splitmix(state);
        }
    }
    noisy
}

#[test]
fn no_training_set_has_a_low_end_above_what_it_was_measured_at() {
    let mut state = 43;
    let seen: Vec<Features> = (0..14).map(|_| workload(&mut state)).collect();
    let training = noisy_pairs(&seen, &mut state);
    let model = MemberRidgeGbt::fit(&training).expect("fits");
    assert!(model.seen.is_some() && model.measured.is_some());
    // Each training member's low end against its measurement (every pair is run once).
    let above = |model: &MemberRidgeGbt| {
        let mut above = 0;
        for row in training.iter().filter(|r| r.members[0] != r.members[1]) {
            let set: Vec<&Features> = row.members.iter().collect();
            let prediction = model.predict_set(&set);
            let interval = model.interval(&set, &prediction, 0.0).expect("intervals");
            let members = interval.members.expect("per member");
            for ((low, _), measured) in members.iter().zip(&row.throughputs) {
                above += usize::from(*low > *measured);
            }
            above += usize::from(interval.sum.0 > row.throughput_sum());
        }
        above
    };
    // Without the measurements the band leaves some of them below its low end ...
    let unbounded = MemberRidgeGbt {
        measured: None,
        ..model.clone()
    };
    assert!(above(&unbounded) > 0);
    // ... and with them none.
    assert_eq!(above(&model), 0);
    // A set the model never ran is answered by its band alone.
    let fresh = workload(&mut state);
    let set = [&seen[0], &fresh];
    let prediction = model.predict_set(&set);
    assert_eq!(
        model.interval(&set, &prediction, 0.0),
        unbounded.interval(&set, &prediction, 0.0)
    );
    // A model stored before measured sets existed reads back without them.
    assert_eq!(stored_without(&model, "measured").measured, None);
}

#[test]
fn a_model_of_few_crowded_runs_keeps_only_its_seen_band_of_two() {
    let mut state = 47;
    let seen: Vec<Features> = (0..14).map(|_| workload(&mut state)).collect();
    let mut training = noisy_pairs(&seen, &mut state);
    // 13 triples of known workloads: between none and SET_LINEAR_MIN_SETS.
    let triples: Vec<TrainingRow> = mixed_rows(&seen)
        .into_iter()
        .filter(|r| r.members.len() == 3)
        .take(13)
        .collect();
    assert_eq!(triples.len(), 13);
    training.extend(triples);
    let model = MemberRidgeGbt::fit(&training).expect("fits");
    let bands = model.seen.expect("the band of two");
    assert!(bands.intervals.bands[0].is_some());
    assert!(bands.intervals.bands[1..].iter().all(Option::is_none));
    assert!(bands.crowded_profiles.is_empty());
    assert_eq!(bands.profiles.len(), seen.len());
}

/// `model` stored as JSON, the field `field` removed (as a model stored before that field
/// existed), and read back.
fn stored_without(model: &MemberRidgeGbt, field: &str) -> MemberRidgeGbt {
    let mut stored = serde_json::to_value(ModelParams::MemberRidgeGbt(model.clone())).unwrap();
    let fields = stored.as_object_mut().expect("a model is an object");
    assert!(fields.remove(field).is_some(), "{field} is stored");
    let ModelParams::MemberRidgeGbt(old) = serde_json::from_value(stored).unwrap() else {
        panic!("the same kind");
    };
    old
}
