//! Tests of the intervals: bands, their calibration and answers, and the folds.

use super::*;

#[test]
fn group_folds_hold_out_every_row_with_the_group() {
    let groups = vec![vec!["a", "b"], vec!["b", "b"], vec!["c", "a"]];
    assert_eq!(
        folds_by_group(&groups),
        vec![vec![0, 2], vec![0, 1], vec![2]]
    );
    assert_eq!(
        k_folds(7),
        vec![vec![0, 5], vec![1, 6], vec![2], vec![3], vec![4]]
    );
}

#[test]
fn a_band_needs_enough_runs_for_both_ranks_and_a_smaller_one_borrows_its_neighbour() {
    // The ranks exist from n = 9: floor(10 x 0.1) = 1 and ceil(10 x 0.9) = 9 <= 9; at
    // n = 8, floor(9 x 0.1) = 0.
    assert_eq!(((MIN_BAND_RUNS + 1) as f64 * LOWER).floor(), 1.0);
    assert!(((MIN_BAND_RUNS + 1) as f64 * UPPER).ceil() <= MIN_BAND_RUNS as f64);
    assert_eq!((MIN_BAND_RUNS as f64 * LOWER).floor(), 0.0);
    let pair = |actual: f64| {
        held(
            &[actual / 2.0; 2],
            SetPrediction {
                sum: 10.0,
                members: Some(vec![5.0, 5.0]),
            },
            0.0,
        )
    };
    // Pairs under-predicted by 0.5-2x; three triples all predicted at half their sum.
    let triple = |_| {
        held(
            &[10.0; 3],
            SetPrediction {
                sum: 15.0,
                members: Some(vec![5.0; 3]),
            },
            0.0,
        )
    };
    let mut held_out: Vec<HeldOut> = (0..19).map(|i| pair(5.0 + i as f64 * 0.8)).collect();
    held_out.extend((0..MIN_BAND_RUNS - 1).map(triple));
    let intervals = Intervals::calibrate(&held_out);
    assert!(intervals.bands[1].is_none());
    // A triple's interval is the pairs' band: it reaches below the prediction.
    let prediction = SetPrediction {
        sum: 15.0,
        members: Some(vec![5.0; 3]),
    };
    let borrowed = intervals.apply(3, &prediction, 0.0).unwrap();
    assert!(borrowed.sum.0 < 15.0, "{borrowed:?}");
    assert_eq!(borrowed, intervals.apply(2, &prediction, 0.0).unwrap());
    // With one more triple the band is its own: every residual ln 2, low end above.
    held_out.push(triple(0));
    let intervals = Intervals::calibrate(&held_out);
    assert_eq!(intervals.bands[1].unwrap().runs, MIN_BAND_RUNS);
    let own = intervals.apply(3, &prediction, 0.0).unwrap();
    assert!((own.sum.0 - 30.0).abs() < 1e-9, "{own:?}");
}

#[test]
fn bands_at_other_levels_read_their_own_ranks_and_need_enough_runs_for_them() {
    // 39 pairs predicted at 10 (members 5 each) with actual sums 1..=39: at 2.5 % and
    // 97.5 % the ranks are floor(40 x 0.025) = 1 and ceil(40 x 0.975) = 39.
    let pairs = |n: usize| -> Vec<HeldOut> {
        (1..=n)
            .map(|a| {
                held(
                    &[a as f64 / 2.0; 2],
                    SetPrediction {
                        sum: 10.0,
                        members: Some(vec![5.0, 5.0]),
                    },
                    0.0,
                )
            })
            .collect()
    };
    let wide = Intervals::calibrate_at(&pairs(39), (0.025, 0.975));
    let band = wide.bands[0].unwrap();
    assert!(
        (band.sum.0 - (1.0f64 / 10.0).ln()).abs() < 1e-12,
        "{band:?}"
    );
    assert!(
        (band.sum.1 - (39.0f64 / 10.0).ln()).abs() < 1e-12,
        "{band:?}"
    );
    // At 10 % and 90 % the same runs give ranks 4 and 36, as `calibrate` does.
    let narrow = Intervals::calibrate_at(&pairs(39), (LOWER, UPPER));
    assert_eq!(narrow, Intervals::calibrate(&pairs(39)));
    assert!((narrow.bands[0].unwrap().sum.0 - (4.0f64 / 10.0).ln()).abs() < 1e-12);
    // 38 runs are too few for the 2.5 % rank (floor(39 x 0.025) = 0): no band.
    assert!(Intervals::calibrate_at(&pairs(38), (0.025, 0.975)).bands[0].is_none());
}

#[test]
fn conformal_quantiles_follow_the_finite_sample_ranks() {
    // n = 9: lower rank floor(10 * 0.1) = 1, upper rank ceil(10 * 0.9) = 9.
    let mut v: Vec<f64> = (1..=9).rev().map(f64::from).collect();
    assert_eq!(conformal(&mut v, LOWER, false), 1.0);
    assert_eq!(conformal(&mut v, UPPER, true), 9.0);
    // n = 19: ranks 2 and 18.
    let mut v: Vec<f64> = (1..=19).map(f64::from).collect();
    assert_eq!(conformal(&mut v, LOWER, false), 2.0);
    assert_eq!(conformal(&mut v, UPPER, true), 18.0);
}

fn held(throughputs: &[f64], prediction: SetPrediction, difficulty: f64) -> HeldOut {
    HeldOut {
        throughputs: throughputs.to_vec(),
        prediction,
        difficulty,
    }
}

#[test]
fn intervals_scale_the_prediction_by_the_residual_quantiles_of_its_size() {
    // Pairs predicted at 10 with actual sums 5..=23 (members half each); no triples;
    // quads predicted exactly.
    let held_out: Vec<HeldOut> = (5..=23)
        .map(|a| {
            held(
                &[a as f64 / 2.0; 2],
                SetPrediction {
                    sum: 10.0,
                    members: Some(vec![5.0, 5.0]),
                },
                0.0,
            )
        })
        .chain((0..9).map(|_| held(&[2.5; 4], SetPrediction::sum_only(10.0), 0.0)))
        .collect();
    let intervals = Intervals::calibrate(&held_out);
    let pair = intervals
        .apply(
            2,
            &SetPrediction {
                sum: 20.0,
                members: Some(vec![8.0, 12.0]),
            },
            0.0,
        )
        .unwrap();
    // 19 pair sums 5..=23 over 10: ranks 2 and 18 are 6/10 and 22/10.
    assert!((pair.sum.0 - 12.0).abs() < 1e-9 && (pair.sum.1 - 44.0).abs() < 1e-9);
    let members = pair.members.unwrap();
    assert!((members[0].0 - 8.0 * 0.6).abs() < 1e-9 && (members[1].1 - 12.0 * 2.2).abs() < 1e-9);
    // Four members: exact predictions, a zero-width interval and no member interval.
    let quad = intervals
        .apply(4, &SetPrediction::sum_only(7.0), 0.0)
        .unwrap();
    assert!((quad.sum.0 - 7.0).abs() < 1e-12 && (quad.sum.1 - 7.0).abs() < 1e-12);
    // Three members borrow the larger neighbour's band (four members) on a tie.
    let three = intervals
        .apply(3, &SetPrediction::sum_only(7.0), 0.0)
        .unwrap();
    assert_eq!(three.sum, quad.sum);
    // Sixteen members use the four-or-more band.
    assert_eq!(
        intervals
            .apply(16, &SetPrediction::sum_only(7.0), 0.0)
            .unwrap()
            .sum,
        quad.sum
    );
}

/// Nine triples predicted at 1 (each member at 1/3) whose actual sums are e^r for the
/// log residuals r below, with the difficulties d below; and nine pairs.
fn triples_and_pairs() -> Vec<HeldOut> {
    let residuals = [0.4, -0.2, 0.1, -0.6, 0.3, 0.05, -0.1, 0.9, -0.3];
    let difficulties = [0.3, 0.1, 0.0, 0.5, 0.2, 0.4, 0.1, 0.8, 0.2];
    let triples = residuals.iter().zip(difficulties).map(|(r, d)| {
        let actual = f64::exp(*r);
        held(
            &[actual / 3.0; 3],
            SetPrediction {
                sum: 1.0,
                members: Some(vec![1.0 / 3.0; 3]),
            },
            d,
        )
    });
    let pairs = [-0.5, -0.3, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.6]
        .into_iter()
        .map(|r: f64| {
            held(
                &[r.exp(), r.exp()],
                SetPrediction {
                    sum: 2.0,
                    members: Some(vec![1.0, 1.0]),
                },
                // A pair's difficulty is 0; a wrong one must not reach the pairs' band.
                1.0,
            )
        });
    triples.chain(pairs).collect()
}

#[test]
fn scaled_bands_take_the_quantiles_of_the_residual_over_floor_plus_difficulty() {
    let held_out = triples_and_pairs();
    // Floor 0.1: the scores r / (0.1 + d) are, in order of the runs,
    // 0.4/0.4 = 1, -0.2/0.2 = -1, 0.1/0.1 = 1, -0.6/0.6 = -1, 0.3/0.3 = 1,
    // 0.05/0.5 = 0.1, -0.1/0.2 = -0.5, 0.9/0.9 = 1, -0.3/0.3 = -1. Sorted:
    // -1, -1, -1, -0.5, 0.1, 1, 1, 1, 1; n = 9: ranks 1 and 9, so (-1, 1).
    let fixed = Intervals::calibrate_scaled(&held_out, Scale::Fixed(0.1));
    let triple = fixed.bands[1].unwrap();
    assert_eq!(triple.floor, Some(0.1));
    assert!((triple.sum.0 + 1.0).abs() < 1e-12 && (triple.sum.1 - 1.0).abs() < 1e-12);
    // Members (each 1/3 of its set, so the same residual three times): the same ends.
    let (lo, hi) = triple.member.unwrap();
    assert!((lo + 1.0).abs() < 1e-12 && (hi - 1.0).abs() < 1e-12);
    // The median floor: the difficulties sorted are 0, 0.1, 0.1, 0.2, 0.2, 0.3, 0.4,
    // 0.5, 0.8; the 5th is 0.2. Scores r / (0.2 + d): 0.4/0.5 = 0.8, -0.2/0.3,
    // 0.1/0.2 = 0.5, -0.6/0.7, 0.3/0.4 = 0.75, 0.05/0.6, -0.1/0.3, 0.9/1.0 = 0.9,
    // -0.3/0.4 = -0.75: smallest -6/7, largest 0.9.
    let median = Intervals::calibrate_scaled(&held_out, Scale::Median);
    let triple = median.bands[1].unwrap();
    assert_eq!(triple.floor, Some(0.2));
    assert!((triple.sum.0 + 6.0 / 7.0).abs() < 1e-12, "{:?}", triple.sum);
    assert!((triple.sum.1 - 0.9).abs() < 1e-12, "{:?}", triple.sum);
    // The pairs' band is plain whatever the crowded bands' scale: ranks 1 and 9 of the
    // log residuals -0.5..0.6 (predicted 2, actual 2 e^r).
    for intervals in [&fixed, &median] {
        let pair = intervals.bands[0].unwrap();
        assert_eq!(pair.floor, None);
        assert!((pair.sum.0 + 0.5).abs() < 1e-12 && (pair.sum.1 - 0.6).abs() < 1e-12);
        assert_eq!(Some(pair), Intervals::calibrate(&held_out).bands[0]);
    }
    // A median difficulty of 0 (no set-level part) leaves the band plain.
    let flat: Vec<HeldOut> = held_out
        .iter()
        .map(|h| HeldOut {
            difficulty: 0.0,
            ..h.clone()
        })
        .collect();
    assert_eq!(
        Intervals::calibrate_scaled(&flat, Scale::Median),
        Intervals::calibrate(&flat)
    );
}

#[test]
fn a_scaled_band_widens_a_crowded_interval_with_the_difficulty() {
    let intervals = Intervals::calibrate_scaled(&triples_and_pairs(), Scale::Fixed(0.1));
    assert!(intervals.needs_difficulty(3) && intervals.needs_difficulty(5));
    assert!(!intervals.needs_difficulty(2));
    let prediction = SetPrediction {
        sum: 30.0,
        members: Some(vec![10.0, 5.0, 15.0]),
    };
    // Quantiles (-1, 1) times 0.1 + 0.4: the prediction times e^-0.5 and e^0.5.
    let interval = intervals.apply(3, &prediction, 0.4).unwrap();
    let (lo, hi) = (f64::exp(-0.5), f64::exp(0.5));
    assert!((interval.sum.0 - 30.0 * lo).abs() < 1e-12);
    assert!((interval.sum.1 - 30.0 * hi).abs() < 1e-12);
    let members = interval.members.unwrap();
    assert!((members[1].0 - 5.0 * lo).abs() < 1e-12);
    assert!((members[2].1 - 15.0 * hi).abs() < 1e-12);
    // Where the halves agree, only the floor: e^-0.1 and e^0.1.
    let agreed = intervals.apply(3, &prediction, 0.0).unwrap();
    assert!((agreed.sum.0 - 30.0 * f64::exp(-0.1)).abs() < 1e-12);
    // A pair ignores the difficulty: its plain quantiles (-0.5, 0.6).
    let pair = SetPrediction {
        sum: 4.0,
        members: Some(vec![1.0, 3.0]),
    };
    for difficulty in [0.0, 2.0] {
        let interval = intervals.apply(2, &pair, difficulty).unwrap();
        assert!((interval.sum.0 - 4.0 * f64::exp(-0.5)).abs() < 1e-12);
        assert!((interval.sum.1 - 4.0 * f64::exp(0.6)).abs() < 1e-12);
    }
}

#[test]
fn crowded_sums_come_from_the_other_calibration_where_its_band_reads_the_same_floor() {
    let held_out = triples_and_pairs();
    let plain = Intervals::calibrate(&held_out);
    // Other sums: every triple's actual sum doubled, members unchanged.
    let doubled: Vec<HeldOut> = held_out
        .iter()
        .map(|h| {
            if h.throughputs.len() < 3 {
                return h.clone();
            }
            HeldOut {
                throughputs: h.throughputs.iter().map(|t| t * 2.0).collect(),
                ..h.clone()
            }
        })
        .collect();
    let other = Intervals::calibrate(&doubled);
    let merged = plain.clone().with_crowded_sums_from(&other);
    let (own, theirs, got) = (
        plain.bands[1].unwrap(),
        other.bands[1].unwrap(),
        merged.bands[1].unwrap(),
    );
    assert!((theirs.sum.0 - own.sum.0 - 2f64.ln()).abs() < 1e-12);
    assert_eq!((got.member, got.sum), (own.member, theirs.sum));
    // The pairs' band is never touched.
    assert_eq!(merged.bands[0], plain.bands[0]);
    // A scaled band (floor 0.1) takes no plain band's sums.
    let scaled = Intervals::calibrate_scaled(&held_out, Scale::Fixed(0.1));
    assert_eq!(scaled.clone().with_crowded_sums_from(&other), scaled);
}

#[test]
fn intervals_round_trip_through_json_and_old_ones_read_as_plain() {
    let intervals = Intervals::calibrate_scaled(&triples_and_pairs(), Scale::Fixed(0.1));
    let json = serde_json::to_string(&intervals).unwrap();
    assert!(json.contains("\"floor\":0.1"), "{json}");
    assert_eq!(serde_json::from_str::<Intervals>(&json).unwrap(), intervals);
    // As stored before scaled bands: no floor field.
    let old = r#"{"bands":[{"runs":9,"member":[-0.5,0.6],"sum":[-0.5,0.6]},null,
        {"runs":4,"member":null,"sum":[-0.25,0.5]}]}"#;
    let read: Intervals = serde_json::from_str(old).unwrap();
    assert!(read.bands.iter().flatten().all(|b| b.floor.is_none()));
    assert!(!read.needs_difficulty(4));
    let quad = read.apply(4, &SetPrediction::sum_only(8.0), 3.0).unwrap();
    assert!((quad.sum.0 - 8.0 * f64::exp(-0.25)).abs() < 1e-12);
    assert!((quad.sum.1 - 8.0 * f64::exp(0.5)).abs() < 1e-12);
}
