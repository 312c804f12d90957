//! Tests of `member-ridge-gbt`'s fit and predictions; the intervals' in [`calibrate`].

mod calibrate;

use super::{calibrate::profile_folds, fit::tree_sample, *};
use crate::model::{
    intervals::{self, Calibration, Intervals},
    member_terms::{EXCLUSIVE_THROUGHPUT, RIDGE_FEATURES},
    ridge, ModelParams, TrainingRow,
};

fn splitmix(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn workload(state: &mut u64) -> Features {
    let scales = [4e6, 90.0, 60.0, 90.0, 9e7, 3e4, 100.0, 95.0, 40.0, 12.0];
    let mut f = [0.0; NUM_FEATURES];
    for (v, s) in f.iter_mut().zip(scales) {
        *v = (0.1 + 0.9 * splitmix(state)) * s;
    }
    Features(f)
}

/// A known interference law: a member keeps less of its throughput the busier the
/// GPU's SMs are in total (sm_busy of the set), and never more than all of it.
fn true_ratio(own: &Features, others: &Features) -> f64 {
    let busy = (own.0[7] + others.0[7]) / 100.0;
    (1.2 - 0.45 * busy).clamp(0.2, 1.0)
}

fn rows(workloads: &[Features]) -> Vec<TrainingRow> {
    let mut rows = Vec::new();
    for (i, a) in workloads.iter().enumerate() {
        for b in &workloads[i..] {
            rows.push(TrainingRow {
                members: vec![*a, *b],
                throughputs: vec![a.0[6] * true_ratio(a, b), b.0[6] * true_ratio(b, a)],
            });
        }
    }
    rows
}

#[test]
fn fit_learns_a_known_per_member_slowdown_and_predicts_unseen_pairs() {
    let mut state = 11;
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit(&rows(&seen)).unwrap();
    let unseen: Vec<Features> = (0..6).map(|_| workload(&mut state)).collect();
    let mut worst: f64 = 0.0;
    for a in &unseen {
        for b in &seen {
            let predicted = model.predict_set(&[a, b]);
            let members = predicted.members.unwrap();
            for (m, (own, other)) in members.iter().zip([(a, b), (b, a)]) {
                let truth = own.0[6] * true_ratio(own, other);
                worst = worst.max((m - truth).abs() / truth);
            }
        }
    }
    assert!(worst < 0.15, "worst relative error {worst}");
}

#[test]
fn the_trees_sample_is_distinct_ordered_and_fixed() {
    assert_eq!(tree_sample(100, 100), None);
    let sample = tree_sample(1_000, 300).unwrap();
    assert_eq!(sample.len(), 300);
    assert!(
        sample.windows(2).all(|w| w[0] < w[1]),
        "sorted and distinct"
    );
    assert!(*sample.last().unwrap() < 1_000);
    assert_eq!(tree_sample(1_000, 300).unwrap(), sample);
    // Drawn from the whole range, not its head.
    assert!(sample.iter().filter(|&&i| i >= 500).count() > 100);
}

#[test]
fn trees_grown_on_a_sample_of_the_member_rows_still_learn_the_law() {
    let mut state = 11;
    let seen: Vec<Features> = (0..24).map(|_| workload(&mut state)).collect();
    let training = rows(&seen);
    let member_rows: usize = training.iter().map(|r| r.members.len()).sum();
    assert_eq!(member_rows, 600);
    let options = MemberOptions::CHOSEN;
    let full = MemberRidgeGbt::fit_with(&training, options).unwrap();
    let sampled = MemberRidgeGbt::fit_sampling(&training, options, 200).unwrap();
    let again = MemberRidgeGbt::fit_sampling(&training, options, 200).unwrap();
    let unseen: Vec<Features> = (0..6).map(|_| workload(&mut state)).collect();
    // Mean relative error of each model's members on the unseen workloads' pairs.
    let (mut full_error, mut sampled_error, mut count) = (0.0, 0.0, 0.0);
    let mut differs = false;
    for a in &unseen {
        for b in &seen {
            let predicted = sampled.predict_set(&[a, b]);
            assert_eq!(
                predicted,
                again.predict_set(&[a, b]),
                "a refit is the same model"
            );
            let reference = full.predict_set(&[a, b]);
            differs |= predicted != reference;
            let pairs = predicted
                .members
                .unwrap()
                .into_iter()
                .zip(reference.members.unwrap());
            for ((s, f), (own, other)) in pairs.zip([(a, b), (b, a)]) {
                let truth = own.0[6] * true_ratio(own, other);
                sampled_error += (s - truth).abs() / truth;
                full_error += (f - truth).abs() / truth;
                count += 1.0;
            }
        }
    }
    let (full_error, sampled_error) = (full_error / count, sampled_error / count);
    // A third of the rows: the trees saw a sample (their answers differ from the
    // full-batch fit's), and every feature row met its own target: the sample learns
    // the law about as well as every row does (3.2 % against 3.0 % when written; a
    // misaligned sample would not learn it).
    assert!(differs);
    assert!(
        full_error < 0.05,
        "full-batch mean relative error {full_error}"
    );
    assert!(
        sampled_error < 1.5 * full_error,
        "sampled {sampled_error} against full-batch {full_error}"
    );
}

#[test]
fn pair_batches_match_single_sets_and_members_sum_to_the_set() {
    let mut state = 5;
    let seen: Vec<Features> = (0..12).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit(&rows(&seen)).unwrap();
    let refs: Vec<&Features> = seen.iter().collect();
    let batch = model.predict_pairs_reference(&seen[0], &refs);
    for (prediction, c) in batch.iter().zip(&seen) {
        let single = model.predict_set(&[&seen[0], c]);
        assert_eq!(prediction, &single);
        let members = single.members.unwrap();
        assert_eq!(single.sum, members[0] + members[1]);
    }
    // Three members: each one's "others" is the sum of the two others.
    let three = model.predict_set(&[&seen[0], &seen[1], &seen[2]]);
    assert_eq!(three.members.as_ref().unwrap().len(), 3);
    assert!(three.sum.is_finite() && three.sum > 0.0);
}

#[test]
fn set_batches_equal_each_set_predicted_alone_to_the_bit() {
    let mut state = 9;
    let seen: Vec<Features> = (0..12).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit(&mixed_rows(&seen)).unwrap();
    // 1,000+ sets of 2 to 5 members (more than one chunk of the batch).
    let sets: Vec<Vec<&Features>> = (0..1_100)
        .map(|k| {
            (0..2 + k % 4)
                .map(|j| &seen[(k * 7 + j * 5) % seen.len()])
                .collect()
        })
        .collect();
    let batch = model.predict(&sets);
    assert_eq!(batch.len(), sets.len());
    for (set, predicted) in sets.iter().zip(&batch) {
        assert_eq!(predicted.prediction, model.predict_set(set));
        assert_eq!(predicted.difficulty, model.difficulty(set));
    }
}

#[test]
fn the_pair_scorer_matches_walking_every_tree_even_on_split_thresholds() {
    let mut state = 3;
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit(&rows(&seen)).unwrap();
    let scorer = model.pair_scorer().expect("depth-2 trees compile");
    // Fresh draws, the training workloads, and copies with one metric moved exactly
    // onto a split threshold (where `<` against `<=` would pick the other leaf).
    let mut probes: Vec<Features> = (0..40).map(|_| workload(&mut state)).collect();
    probes.extend(&seen);
    let mut on_threshold = 0;
    for tree in &model.booster.0.trees {
        for node in tree.nodes.iter().filter(|n| !n.is_leaf) {
            let mut f = seen[on_threshold % seen.len()];
            f.0[node.split_feature % NUM_FEATURES] = node.split_value;
            probes.push(f);
            on_threshold += 1;
        }
    }
    assert!(on_threshold > 1000, "{on_threshold}");
    let refs: Vec<&Features> = probes.iter().collect();
    let mut compared = 0;
    // Targets that differ in one metric follow each other (distinct cached tables), and
    // the second round is served from the scorer's table cache.
    let targets: Vec<&Features> = probes.iter().skip(56).step_by(97).collect();
    assert!(targets.len() > 10, "{}", targets.len());
    for target in targets.iter().chain(&targets).copied() {
        let fast = scorer.predict_pairs(target, &refs);
        let reference = model.predict_pairs_reference(target, &refs);
        for (a, b) in fast.iter().zip(&reference) {
            let (a, b) = (a.members.as_ref().unwrap(), b.members.as_ref().unwrap());
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() <= 1e-12 * y.abs(), "{x} vs {y}");
                compared += 1;
            }
        }
    }
    assert!(compared > 10_000, "{compared}");
}

/// Pairs and triples under the same interference law: trees that split on the number of
/// co-runners and on the others' largest metrics.
fn mixed_rows(workloads: &[Features]) -> Vec<TrainingRow> {
    let mut rows = rows(workloads);
    for (i, a) in workloads.iter().enumerate() {
        for (b, c) in workloads[i..].iter().zip(workloads[i..].iter().skip(1)) {
            let members = vec![*a, *b, *c];
            let throughputs = (0..3)
                .map(|k| {
                    let others = Features::sum(
                        members
                            .iter()
                            .enumerate()
                            .filter(|(j, _)| *j != k)
                            .map(|(_, m)| m),
                    );
                    members[k].0[6] * true_ratio(&members[k], &others)
                })
                .collect();
            rows.push(TrainingRow {
                members,
                throughputs,
            });
        }
    }
    rows
}

#[test]
fn with_crowding_features_the_pair_scorer_still_matches_walking_every_tree() {
    let mut state = 21;
    let seen: Vec<Features> = (0..14).map(|_| workload(&mut state)).collect();
    let model = MemberRidgeGbt::fit_with(&mixed_rows(&seen), MemberOptions::CHOSEN).unwrap();
    let crowding_splits = model
        .booster
        .0
        .trees
        .iter()
        .flat_map(|t| &t.nodes)
        .filter(|n| !n.is_leaf && n.split_feature >= 2 * NUM_FEATURES)
        .count();
    assert!(crowding_splits > 0, "no tree uses the crowding features");
    let scorer = model.pair_scorer().expect("depth-2 trees compile");
    let probes: Vec<Features> = (0..30)
        .map(|_| workload(&mut state))
        .chain(seen.clone())
        .collect();
    let refs: Vec<&Features> = probes.iter().collect();
    for target in probes.iter().step_by(5) {
        let fast = scorer.predict_pairs(target, &refs);
        let reference = model.predict_pairs_reference(target, &refs);
        for (a, b) in fast.iter().zip(&reference) {
            assert!(
                (a.sum - b.sum).abs() <= 1e-12 * b.sum.abs(),
                "{} vs {}",
                a.sum,
                b.sum
            );
        }
        // And the general path agrees: a pair is a set of two.
        let set = model.predict_set(&[target, &probes[0]]);
        let pair = model.predict_pairs_reference(target, &[&probes[0]]);
        assert!((set.sum - pair[0].sum).abs() <= 1e-12 * set.sum.abs());
    }
}

const CROWDING: MemberOptions = MemberOptions {
    crowding: true,
    stacked: false,
    weighted: false,
    weighted_crowded: false,
    set_linear: false,
    set_linear_bounded: false,
    set_linear_shrink: 0,
    members_capped: false,
    time_share: false,
    time_share_crowded: false,
    set_linear_ratio: false,
    law_blend: 0,
    law_blend_always: false,
    pair_composition: 0,
};

#[test]
fn the_time_sharing_law_is_one_over_the_sets_summed_sm_busy_share() {
    let with_sm = |sm: f64| {
        let mut f = Features::default();
        f.0[7] = sm;
        f
    };
    // Four jobs busy 28 % of the time each: 112 % of demand, each keeps 100 / 112.
    let law = time_share_log_ratio(&with_sm(28.0), &with_sm(84.0));
    assert!((law - (100.0_f64 / 112.0).ln()).abs() < 1e-12, "{law}");
    // Four busy 96 %: each keeps about a quarter.
    let busy = time_share_log_ratio(&with_sm(96.0), &with_sm(288.0)).exp();
    assert!((busy - 100.0 / 384.0).abs() < 1e-12, "{busy}");
    // Under 100 % together: nobody waits.
    assert_eq!(time_share_log_ratio(&with_sm(30.0), &with_sm(40.0)), 0.0);
}

#[test]
fn the_time_sharing_offset_needs_as_many_crowded_sets_as_the_set_model_and_spares_pairs() {
    let mut state = 23;
    // 16 workloads: 120 triples, enough for the crowded parts.
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let mixed = mixed_rows(&seen);
    let without = MemberOptions {
        time_share_crowded: false,
        ..MemberOptions::CHOSEN
    };
    const { assert!(MemberOptions::CHOSEN.time_share_crowded) };
    let model = MemberRidgeGbt::fit_with(&mixed, MemberOptions::CHOSEN).unwrap();
    assert!(model.options.time_share_crowded);
    let plain = MemberRidgeGbt::fit_with(&mixed, without).unwrap();
    let triple = [&seen[0], &seen[5], &seen[9]];
    assert_ne!(model.predict_set(&triple), plain.predict_set(&triple));
    // Pairs are answered by the pair scorer as by walking the trees: no offset there.
    let scorer = model
        .pair_scorer()
        .expect("the pair scorer serves this model");
    let refs: Vec<&Features> = seen.iter().collect();
    let fast = scorer.predict_pairs(&seen[3], &refs);
    let walked = model.predict_pairs_reference(&seen[3], &refs);
    for (a, b) in fast.iter().zip(&walked) {
        assert!(
            (a.sum - b.sum).abs() <= 1e-9 * b.sum.abs(),
            "{} vs {}",
            a.sum,
            b.sum
        );
    }
    // One crowded set fewer than the set-level model needs: no offset, the model
    // fitted without the option, bit for bit.
    let triples = mixed.iter().filter(|r| r.members.len() == 3);
    let few: Vec<TrainingRow> = mixed
        .iter()
        .filter(|r| r.members.len() == 2)
        .chain(triples.take(SET_LINEAR_MIN_SETS - 1))
        .cloned()
        .collect();
    let fitted = MemberRidgeGbt::fit_with(&few, MemberOptions::CHOSEN).unwrap();
    assert!(!fitted.options.time_share_crowded);
    assert_eq!(fitted, MemberRidgeGbt::fit_with(&few, without).unwrap());
}

#[test]
fn the_law_blend_moves_each_crowded_member_a_tenth_of_the_way_to_the_law_and_spares_pairs() {
    let mut state = 29;
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let mixed = mixed_rows(&seen);
    const { assert!(MemberOptions::CHOSEN.law_blend == 10) };
    let without = MemberOptions {
        law_blend: 0,
        ..MemberOptions::CHOSEN
    };
    // `blended`'s members are `plain`'s moved a tenth of the way to the law, by hand:
    // min(1, 100 / the summed sm busy %, metric 7) x the exclusive throughput.
    let check_blend = |blended: &MemberRidgeGbt, plain: &MemberRidgeGbt, set: &[&Features]| {
        let law = (100.0 / set.iter().map(|m| m.0[7]).sum::<f64>()).min(1.0);
        let blended = blended.predict_set(set).members.unwrap();
        let members = plain.predict_set(set).members.unwrap();
        for ((b, m), features) in blended.iter().zip(&members).zip(set) {
            let expected = 0.9 * m + 0.1 * features.0[EXCLUSIVE_THROUGHPUT] * law;
            assert!((b - expected).abs() <= 1e-9 * expected, "{b} vs {expected}");
            assert!(*b <= features.0[EXCLUSIVE_THROUGHPUT] + 1e-9);
        }
        assert_ne!(blended, members);
    };
    let model = MemberRidgeGbt::fit_with(&mixed, MemberOptions::CHOSEN).unwrap();
    let plain = MemberRidgeGbt::fit_with(&mixed, without).unwrap();
    check_blend(&model, &plain, &[&seen[0], &seen[5], &seen[9]]);
    check_blend(&model, &plain, &[&seen[1], &seen[2], &seen[3], &seen[4]]);
    // Pairs are the members alone.
    let pair = [&seen[2], &seen[7]];
    assert_eq!(model.predict_set(&pair), plain.predict_set(&pair));
    // Too few crowded sets to learn them around the law: without `law_blend_always`, no
    // blend either; with it (the default since the simulation chose it), the
    // pair-learned members are blended.
    let few: Vec<TrainingRow> = mixed
        .iter()
        .filter(|r| r.members.len() == 2)
        .chain(mixed.iter().filter(|r| r.members.len() == 3).take(3))
        .cloned()
        .collect();
    const { assert!(MemberOptions::CHOSEN.law_blend_always) };
    let crowded_fits_only = MemberOptions {
        law_blend_always: false,
        ..MemberOptions::CHOSEN
    };
    let unblended = MemberRidgeGbt::fit_with(&few, without).unwrap();
    let triple = [&seen[0], &seen[5], &seen[9]];
    assert_eq!(
        MemberRidgeGbt::fit_with(&few, crowded_fits_only)
            .unwrap()
            .predict_set(&triple),
        unblended.predict_set(&triple)
    );
    let always = MemberRidgeGbt::fit_with(&few, MemberOptions::CHOSEN).unwrap();
    assert!(!always.options.time_share_crowded);
    check_blend(&always, &unblended, &triple);
    // Pairs stay the members alone there too.
    assert_eq!(always.predict_set(&pair), unblended.predict_set(&pair));
}

#[test]
fn crowded_members_of_a_pairs_only_model_move_halfway_to_their_composition_from_its_pairs() {
    let mut state = 31;
    let seen: Vec<Features> = (0..12).map(|_| workload(&mut state)).collect();
    let pairs = rows(&seen);
    const { assert!(MemberOptions::CHOSEN.pair_composition == 50) };
    // The law blend off in both, so that the composition is all that differs.
    let composed = MemberOptions {
        law_blend: 0,
        ..MemberOptions::CHOSEN
    };
    let plain = MemberOptions {
        pair_composition: 0,
        ..composed
    };
    let model = MemberRidgeGbt::fit_with(&pairs, composed).unwrap();
    let plain = MemberRidgeGbt::fit_with(&pairs, plain).unwrap();
    assert_eq!(model.options.pair_composition, 50);
    // By hand: a member of exclusive throughput x whose pair answers beside its co-runners
    // are q_j keeps x / (1 + Σ max(0, x / q_j - 1)); the model's answer is halfway between
    // that and the plain model's.
    let check = |set: &[&Features]| {
        let members = model.predict_set(set).members.unwrap();
        let trees = plain.predict_set(set).members.unwrap();
        for (i, own) in set.iter().enumerate() {
            let x = own.0[EXCLUSIVE_THROUGHPUT];
            let slowdown: f64 = (0..set.len())
                .filter(|&j| j != i)
                .map(|j| {
                    let q = plain.predict_set(&[own, set[j]]).members.unwrap()[0];
                    (x / q - 1.0).max(0.0)
                })
                .sum();
            let expected = 0.5 * trees[i] + 0.5 * x / (1.0 + slowdown);
            assert!(
                (members[i] - expected).abs() <= 1e-9 * expected,
                "member {i}: {} vs {expected}",
                members[i]
            );
        }
        assert_ne!(members, trees);
    };
    check(&[&seen[0], &seen[5], &seen[9]]);
    check(&[&seen[1], &seen[2], &seen[3], &seen[4]]);
    check(&[&seen[6], &seen[6], &seen[7]]);
    // Pairs are untouched.
    let pair = [&seen[2], &seen[7]];
    assert_eq!(model.predict_set(&pair), plain.predict_set(&pair));
    // Slowdowns add as under time-sharing; a co-runner answered harmless adds none; an
    // answer of nothing stops the member.
    let own = Features([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0]);
    assert_eq!(super::predict::added_slowdown(&own, 5.0), 1.0);
    assert_eq!(super::predict::added_slowdown(&own, 10.0), 0.0);
    assert_eq!(super::predict::added_slowdown(&own, 12.0), 0.0);
    assert_eq!(super::predict::added_slowdown(&own, 0.0), f64::INFINITY);
    // A model fitted on any crowded run answers crowded sets from them: no composition,
    // which would pull what it learned back towards the pairs.
    let one_triple: Vec<TrainingRow> = mixed_rows(&seen)
        .into_iter()
        .filter(|r| r.members.len() == 2)
        .chain(mixed_rows(&seen).into_iter().find(|r| r.members.len() == 3))
        .collect();
    let learned = MemberRidgeGbt::fit_with(&one_triple, composed).unwrap();
    assert_eq!(learned.options.pair_composition, 0);
}

#[test]
fn weighing_crowded_rows_leaves_a_model_fitted_on_pairs_alone_as_it_was() {
    let mut state = 17;
    let seen: Vec<Features> = (0..14).map(|_| workload(&mut state)).collect();
    let crowded_weights = MemberOptions {
        weighted_crowded: true,
        ..CROWDING
    };
    let all_weights = MemberOptions {
        weighted: true,
        ..CROWDING
    };
    let probes = [
        vec![&seen[0], &seen[5]],
        vec![&seen[1], &seen[2], &seen[3]],
        vec![&seen[4], &seen[6], &seen[8], &seen[9]],
    ];
    let predict = |rows: &[TrainingRow], options| {
        let model = MemberRidgeGbt::fit_with(rows, options).unwrap();
        probes
            .iter()
            .map(|p| model.predict_set(p))
            .collect::<Vec<_>>()
    };
    let pairs = rows(&seen);
    let unweighted = predict(&pairs, CROWDING);
    assert_eq!(predict(&pairs, crowded_weights), unweighted);
    // Weighing the pair rows too moves the answers: the comparison above can fail.
    assert_ne!(predict(&pairs, all_weights), unweighted);
    // With triples in the training, their rows are weighed.
    let mixed = mixed_rows(&seen);
    assert_ne!(predict(&mixed, crowded_weights), predict(&mixed, CROWDING));
}

#[test]
fn capped_members_never_exceed_their_exclusive_throughput_and_ridge_shrinks_the_set_model() {
    let mut state = 29;
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let mixed = mixed_rows(&seen);
    let linear = MemberOptions {
        set_linear: true,
        ..CROWDING
    };
    let capped = MemberOptions {
        members_capped: true,
        ..linear
    };
    let mut uncapped_model = MemberRidgeGbt::fit_with(&mixed, linear).unwrap();
    let mut capped_model = MemberRidgeGbt::fit_with(&mixed, capped).unwrap();
    let fitted_set_model = uncapped_model.set_linear.clone();
    let sets: Vec<Vec<Features>> = (3..=8)
        .map(|size| (0..size).map(|_| workload(&mut state)).collect())
        .collect();
    let check = |free: &MemberRidgeGbt, held: &MemberRidgeGbt| {
        let mut lifted = 0;
        for fresh in &sets {
            let set: Vec<&Features> = fresh.iter().collect();
            let free = free.predict_set(&set).members.unwrap();
            let held = held.predict_set(&set).members.unwrap();
            for ((f, h), m) in free.iter().zip(&held).zip(fresh) {
                let exclusive = m.0[EXCLUSIVE_THROUGHPUT];
                assert!(*h <= exclusive, "{h} above {exclusive}");
                if *f > exclusive {
                    lifted += 1;
                    assert_eq!(*h, exclusive);
                } else {
                    assert!((h - f).abs() <= 1e-12 * f.abs(), "{h} vs {f}");
                }
            }
        }
        lifted
    };
    check(&uncapped_model, &capped_model);
    // A set-level model that extrapolates far above the members (as least squares does
    // for sets unlike the trained ones): the blend's common factor lifts members above
    // what they do alone, and the cap holds them there.
    let wild = KaceLinear {
        intercept: 1e4,
        coefficients: vec![0.0; NUM_FEATURES],
    };
    uncapped_model.set_linear = Some(wild.clone());
    capped_model.set_linear = Some(wild);
    assert!(
        check(&uncapped_model, &capped_model) > 0,
        "nothing was lifted"
    );

    // With shrink, the set-level model is ridge with alpha = sets x shrink / 10.
    let shrunk = MemberRidgeGbt::fit_with(
        &mixed,
        MemberOptions {
            set_linear_shrink: 10,
            ..linear
        },
    )
    .unwrap();
    let crowded: Vec<&TrainingRow> = mixed.iter().filter(|r| r.members.len() >= 3).collect();
    let ridge = ridge::fit(crowded.len() as f64, || {
        crowded
            .iter()
            .map(|row| (Features::sum(&row.members).0, row.throughput_sum()))
    })
    .unwrap();
    let set_model = shrunk.set_linear.as_ref().unwrap();
    assert_eq!(set_model.intercept, ridge.intercept);
    assert_eq!(set_model.coefficients, ridge.coefficients);
    assert_ne!(Some(set_model), fitted_set_model.as_ref());
}

#[test]
fn the_efficiency_candidate_fits_the_set_model_on_summed_colocated_over_summed_exclusive() {
    let mut state = 37;
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let mixed = mixed_rows(&seen);
    let options = MemberOptions {
        set_linear: true,
        set_linear_shrink: 1,
        set_linear_ratio: true,
        ..CROWDING
    };
    let model = MemberRidgeGbt::fit_with(&mixed, options).unwrap();
    let on_sums = MemberRidgeGbt::fit_with(
        &mixed,
        MemberOptions {
            set_linear_ratio: false,
            ..options
        },
    )
    .unwrap();
    // The set-level ridge of the efficiencies, alpha = sets x 0.1.
    let crowded: Vec<&TrainingRow> = mixed.iter().filter(|r| r.members.len() >= 3).collect();
    let efficiency = |row: &TrainingRow| {
        let exclusive: f64 = row.members.iter().map(|m| m.0[EXCLUSIVE_THROUGHPUT]).sum();
        row.throughputs.iter().sum::<f64>() / exclusive
    };
    let ridge = ridge::fit(crowded.len() as f64 * 0.1, || {
        crowded
            .iter()
            .map(|row| (Features::sum(&row.members).0, efficiency(row)))
    })
    .unwrap();
    let set_model = model.set_linear.as_ref().unwrap();
    assert_eq!(
        (set_model.intercept, &set_model.coefficients),
        (ridge.intercept, &ridge.coefficients)
    );
    // The sets' efficiencies are below 1.5 here, their sums far above: the fitted
    // intercept is on the efficiencies' scale, not the sums'.
    assert!(crowded.iter().all(|r| efficiency(r) < 1.5));
    assert!(on_sums.set_linear.as_ref().unwrap().intercept.abs() > 10.0 * ridge.intercept.abs());
    // A prediction: the members' sum averaged with efficiency x summed exclusive
    // throughput (members unchanged by the ratio option, the trees and ridge half equal).
    let fresh: Vec<Features> = (0..4).map(|_| workload(&mut state)).collect();
    let set: Vec<&Features> = fresh.iter().collect();
    let members_sum: f64 = MemberRidgeGbt::fit_with(&mixed, CROWDING)
        .unwrap()
        .predict_set(&set)
        .sum;
    let exclusive: f64 = fresh.iter().map(|m| m.0[EXCLUSIVE_THROUGHPUT]).sum();
    let linear_sum = (set_model.predict_set(&set).sum * exclusive).max(0.0);
    let expected = 0.5 * (members_sum + linear_sum);
    let blended = model.predict_set(&set).sum;
    assert!(
        (blended - expected).abs() <= 1e-9 * expected,
        "{blended} vs {expected}"
    );
}

#[test]
fn set_linear_averages_the_sum_of_crowded_sets_with_a_linear_model_of_those_sets() {
    let mut state = 23;
    // 16 workloads: 120 triples, enough for the linear part.
    let seen: Vec<Features> = (0..16).map(|_| workload(&mut state)).collect();
    let with_linear = MemberOptions {
        set_linear: true,
        ..CROWDING
    };
    let mixed = mixed_rows(&seen);
    let model = MemberRidgeGbt::fit_with(&mixed, with_linear).unwrap();
    let members_only = MemberRidgeGbt::fit_with(&mixed, CROWDING).unwrap();
    let triples: Vec<TrainingRow> = mixed
        .iter()
        .filter(|r| r.members.len() == 3)
        .cloned()
        .collect();
    assert!(triples.len() >= SET_LINEAR_MIN_SETS, "{}", triples.len());
    let linear = KaceLinear::fit(&triples).unwrap();
    assert_eq!(model.set_linear.as_ref(), Some(&linear));
    // One crowded set fewer than the linear part needs: the members alone.
    let few: Vec<TrainingRow> = mixed
        .iter()
        .filter(|r| r.members.len() == 2)
        .chain(triples.iter().take(SET_LINEAR_MIN_SETS - 1))
        .cloned()
        .collect();
    let fitted = MemberRidgeGbt::fit_with(&few, with_linear).unwrap();
    assert!(fitted.set_linear.is_none());
    assert_eq!(
        fitted,
        MemberRidgeGbt::fit_with(&few, CROWDING)
            .map(|m| MemberRidgeGbt {
                options: with_linear,
                ..m
            })
            .unwrap()
    );

    let fresh: Vec<Features> = (0..6).map(|_| workload(&mut state)).collect();
    let sets: Vec<Vec<&Features>> = vec![
        vec![&fresh[0], &fresh[1], &fresh[2]],
        vec![&seen[3], &fresh[4], &seen[7], &fresh[5]],
        vec![&seen[1], &seen[2], &seen[3]],
    ];
    for set in &sets {
        let blended = model.predict_set(set);
        let alone = members_only.predict_set(set);
        let linear_sum = linear.predict_set(set).sum.max(0.0);
        let expected = 0.5 * (alone.sum + linear_sum);
        assert!(
            (blended.sum - expected).abs() <= 1e-9 * expected,
            "{} vs {expected}",
            blended.sum
        );
        // Every member scaled by the same factor.
        let scale = expected / alone.sum;
        for (b, a) in blended.members.unwrap().iter().zip(alone.members.unwrap()) {
            assert!(
                (b - a * scale).abs() <= 1e-9 * b.abs(),
                "{b} vs {}",
                a * scale
            );
        }
    }
    // The batch paths blend as the single-set path does, and give each set the
    // difficulty its interval is scaled by (what Place reads instead of predicting the
    // set again).
    for (set, predicted) in sets.iter().zip(model.predict(&sets)) {
        let (predicted, difficulty) = (&predicted.prediction, &predicted.difficulty);
        assert_eq!(predicted, &model.predict_set(set));
        assert_eq!(*difficulty, model.difficulty(set));
        let expected = (predicted.sum / members_only.predict_set(set).sum)
            .ln()
            .abs();
        assert!(
            (difficulty - expected).abs() <= 1e-9,
            "{difficulty} vs {expected}"
        );
    }
    // Pairs are answered by the members alone.
    let pair = [&fresh[0], &seen[2]];
    assert_eq!(model.predict_set(&pair), members_only.predict_set(&pair));
    // Stored and read back, the linear part comes with the model.
    let back: MemberRidgeGbt =
        serde_json::from_str(&serde_json::to_string(&model).unwrap()).unwrap();
    assert_eq!(back, model);
    assert_eq!(back.predict_set(&sets[1]), model.predict_set(&sets[1]));
    // Trained on pairs alone there is no linear part, and the model is the one without it.
    let on_pairs = MemberRidgeGbt::fit_with(&rows(&seen), with_linear).unwrap();
    assert!(on_pairs.set_linear.is_none());
    let on_pairs_without = MemberRidgeGbt::fit_with(&rows(&seen), CROWDING).unwrap();
    assert_eq!(
        on_pairs.predict_set(&sets[0]),
        on_pairs_without.predict_set(&sets[0])
    );
}
