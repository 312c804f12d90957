//! Judging a challenger fairly: k-fold cross-validation of two fitting procedures on the
//! same observations and the same folds, scored with the Rank metric (actual throughput
//! sum of the best-predicted partner / the best actual sum, per target) and the MSE of the
//! predicted sums; and flagging outliers with a robust bound before anything is fitted.

use std::collections::BTreeMap;

use super::{fit_point, Features, FitError, ModelKind, ModelParams, TrainingRow};

/// A stored run ready for training: its id, member names and training row.
#[derive(Debug, Clone)]
pub struct LabelledRow {
    pub id: i64,
    pub members: Vec<String>,
    pub row: TrainingRow,
}

/// A procedure: a model kind fitted on the runs with id up to `last_id`.
#[derive(Debug, Clone, Copy)]
pub struct Procedure {
    pub kind: ModelKind,
    pub last_id: i64,
}

/// Cross-validated figures of one procedure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean over (fold, target) of actual sum of the pick / best actual sum.
    pub score: f64,
    pub mse: f64,
}

/// Scores predictions of a fold's test runs: per workload that appears in at least two of
/// them, the run with the best predicted sum against the best actual one.
fn rank_scores(test: &[&LabelledRow], predicted: &[f64], scores: &mut Vec<f64>) {
    let mut by_target: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for (row, &p) in test.iter().zip(predicted) {
        let mut seen: Vec<&str> = Vec::new();
        for member in &row.members {
            if !seen.contains(&member.as_str()) {
                seen.push(member);
                by_target
                    .entry(member)
                    .or_default()
                    .push((p, row.row.throughput_sum()));
            }
        }
    }
    for candidates in by_target.values().filter(|c| c.len() >= 2) {
        let oracle = candidates.iter().map(|c| c.1).fold(f64::MIN, f64::max);
        let pick = candidates
            .iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .expect("at least two candidates");
        if oracle > 0.0 {
            scores.push(pick.1 / oracle);
        }
    }
}

/// One procedure's result on one fold: rank scores, summed squared error, runs.
type FoldTotal = (Vec<f64>, f64, usize);

/// Scores a fitted model on a fold's test runs.
fn fold_total(params: &ModelParams, test: &[&LabelledRow]) -> FoldTotal {
    let sets: Vec<Vec<&Features>> = test
        .iter()
        .map(|r| r.row.members.iter().collect())
        .collect();
    let predicted: Vec<f64> = params
        .predict(&sets)
        .into_iter()
        .map(|p| p.prediction.sum)
        .collect();
    let mut scores = Vec::new();
    rank_scores(test, &predicted, &mut scores);
    let squared = test
        .iter()
        .zip(&predicted)
        .map(|(r, p)| (r.row.throughput_sum() - p).powi(2))
        .sum::<f64>();
    (scores, squared, test.len())
}

/// Runs a comparison cross-validates on at most: the comparison judges two procedures on
/// the same folds, and 10,000 runs estimate the difference of their rank scores and MSEs
/// well within the promotion tolerances (0.005 and 5 %), while ten fits on a million runs
/// would cost minutes and gigabytes.
pub const COMPARISON_RUNS: usize = 10_000;

/// The runs a comparison of `folds` folds is made on: all of them up to
/// [`COMPARISON_RUNS`], else every k-th (k coprime to `folds`, so that runs with
/// consecutive ids still fall into every fold).
pub fn comparison_sample(rows: &[LabelledRow], folds: usize) -> Vec<LabelledRow> {
    let mut stride = rows.len().div_ceil(COMPARISON_RUNS).max(1);
    while stride > 1 && gcd(stride, folds.max(1)) != 1 {
        stride += 1;
    }
    rows.iter().step_by(stride).cloned().collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Cross-validates `challenger` and `champion` on `folds` folds (a run's fold is its id
/// modulo `folds`). The champion's procedure trains only on runs it could have seen.
/// Folds on which either cannot be fitted are left out; `None` when none is left.
pub fn compare(
    rows: &[LabelledRow],
    folds: usize,
    challenger: Procedure,
    champion: Procedure,
) -> Option<(Evaluation, Evaluation)> {
    use rayon::prelude::*;
    // Every (fold, procedure) fit runs on the caller's rayon pool; the results are summed
    // in fold order afterwards, so the outcome does not depend on the number of threads.
    let per_fold: Vec<Option<Vec<FoldTotal>>> = (0..folds as i64)
        .into_par_iter()
        .map(|fold| {
            let (test, train): (Vec<&LabelledRow>, Vec<&LabelledRow>) = rows
                .iter()
                .partition(|r| r.id.rem_euclid(folds as i64) == fold);
            if test.is_empty() {
                return None;
            }
            [challenger, champion]
                .par_iter()
                .map(|procedure| {
                    let training: Vec<TrainingRow> = train
                        .iter()
                        .filter(|r| r.id <= procedure.last_id)
                        .map(|r| r.row.clone())
                        .collect();
                    // Point predictions are what is judged: no interval calibration.
                    let params = fit_point(procedure.kind, &training)?;
                    Ok::<_, FitError>(fold_total(&params, &test))
                })
                .collect::<Result<Vec<_>, _>>()
                .ok()
        })
        .collect();
    let mut totals = [(Vec::new(), 0.0, 0usize), (Vec::new(), 0.0, 0usize)];
    for fitted in per_fold.into_iter().flatten() {
        for (fold, total) in fitted.into_iter().zip(totals.iter_mut()) {
            total.0.extend(fold.0);
            total.1 += fold.1;
            total.2 += fold.2;
        }
    }
    let evaluation = |(scores, squared, n): &(Vec<f64>, f64, usize)| Evaluation {
        score: if scores.is_empty() {
            0.0
        } else {
            scores.iter().sum::<f64>() / scores.len() as f64
        },
        mse: squared / *n as f64,
    };
    (totals[0].2 > 0).then(|| (evaluation(&totals[0]), evaluation(&totals[1])))
}

/// How close (in ln of the speed fraction: within about 15 %) another run of the same set
/// must have measured a member for an extreme value to count as confirmed.
const CONFIRMED_LN: f64 = 0.14;

/// Runs with a member whose ln(colocated / exclusive throughput) lies more than
/// `threshold` robust standard deviations (1.4826 x MAD) from the median of all members:
/// (index into `rows`, why). An extreme value that another run of the same set (the same
/// workloads) confirms, within [`CONFIRMED_LN`], is the pairing's behaviour, not a glitch,
/// and is kept: on the H100 a matmul hog measured its partners at 0.08-0.10x of their
/// speed in two passes, and those runs are exactly what a model must learn.
pub fn outliers(rows: &[LabelledRow], threshold: f64) -> Vec<(usize, String)> {
    let log_ratio = |row: &TrainingRow, i: usize| {
        let ratio = row.throughputs[i] / row.members[i].exclusive_throughput();
        ratio.max(1e-6).ln()
    };
    let mut values: Vec<f64> = rows
        .iter()
        .flat_map(|r| (0..r.row.members.len()).map(move |i| log_ratio(&r.row, i)))
        .collect();
    if values.len() < 3 {
        return Vec::new();
    }
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    let mut deviations: Vec<f64> = values.iter().map(|v| (v - median).abs()).collect();
    deviations.sort_by(f64::total_cmp);
    let spread = 1.4826 * deviations[deviations.len() / 2];
    if spread <= 0.0 {
        return Vec::new();
    }
    let set_of = |r: &LabelledRow| {
        let mut names = r.members.clone();
        names.sort();
        names
    };
    let mut by_set: std::collections::HashMap<Vec<String>, Vec<usize>> =
        std::collections::HashMap::new();
    for (index, r) in rows.iter().enumerate() {
        by_set.entry(set_of(r)).or_default().push(index);
    }
    let confirmed = |index: usize, i: usize| {
        let r = &rows[index];
        let value = log_ratio(&r.row, i);
        by_set[&set_of(r)].iter().any(|&other| {
            other != index
                && (0..rows[other].members.len()).any(|j| {
                    rows[other].members[j] == r.members[i]
                        && (log_ratio(&rows[other].row, j) - value).abs() <= CONFIRMED_LN
                })
        })
    };
    rows.iter()
        .enumerate()
        .filter_map(|(index, r)| {
            (0..r.row.members.len()).find_map(|i| {
                let z = (log_ratio(&r.row, i) - median) / spread;
                (z.abs() > threshold && !confirmed(index, i)).then(|| {
                    (
                        index,
                        format!(
                            "{} ran at {:.3}x its exclusive throughput, {:.1} robust deviations \
                             from the median {:.3}x",
                            r.members[i],
                            log_ratio(&r.row, i).exp(),
                            z.abs(),
                            median.exp()
                        ),
                    )
                })
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(exclusive: f64, seed: f64) -> Features {
        let mut f = Features([
            seed,
            50.0,
            30.0,
            60.0,
            seed * 10.0,
            1000.0,
            exclusive,
            80.0,
            20.0,
            2.0,
        ]);
        f.0[1] += seed % 7.0;
        f
    }

    fn run(id: i64, names: [&str; 2], kept: [f64; 2]) -> LabelledRow {
        let members = vec![member(100.0, id as f64), member(50.0, 3.0 * id as f64)];
        LabelledRow {
            id,
            members: names.iter().map(|n| n.to_string()).collect(),
            row: TrainingRow {
                members: members.clone(),
                throughputs: vec![100.0 * kept[0], 50.0 * kept[1]],
            },
        }
    }

    #[test]
    fn an_extreme_value_that_a_repeat_of_the_set_confirms_is_kept() {
        let typical = |i: i64| {
            let i_ = i as f64;
            run(
                i,
                ["a", "b"],
                [0.6 + 0.01 * (i_ % 5.0), 0.45 + 0.02 * (i_ % 4.0)],
            )
        };
        // Once: flagged. Twice, within 15 %: the pairing's behaviour, kept. Repeated far
        // from it (at an ordinary 0.5): the extreme run is still flagged. A copy of the
        // same workload in the same run confirms nothing.
        let cases: [(&[(&str, f64)], usize); 4] = [
            (&[("x", 0.08)], 1),
            (&[("x", 0.08), ("x", 0.09)], 0),
            (&[("x", 0.08), ("x", 0.5)], 1),
            (&[("a", 0.08)], 1),
        ];
        for (extremes, flagged) in cases {
            let mut rows: Vec<LabelledRow> = (0..20).map(typical).collect();
            for (k, (partner, kept)) in extremes.iter().enumerate() {
                rows.push(run(100 + k as i64, ["a", partner], [*kept, 0.5]));
            }
            let found = outliers(&rows, 6.0);
            assert_eq!(found.len(), flagged, "{extremes:?}: {found:?}");
        }
    }

    #[test]
    fn a_member_far_outside_the_others_is_flagged_with_a_reason() {
        let mut rows: Vec<LabelledRow> = (0..20)
            .map(|i| run(i, ["a", "b"], [0.6 + 0.01 * (i % 5) as f64, 0.5]))
            .collect();
        rows.push(run(99, ["a", "x"], [0.6, 40.0]));
        let flagged = outliers(&rows, 6.0);
        assert_eq!(flagged.len(), 1, "{flagged:?}");
        assert_eq!(flagged[0].0, 20);
        assert!(
            flagged[0].1.contains("x ran at 40.000x"),
            "{}",
            flagged[0].1
        );
    }

    #[test]
    fn cross_validation_gives_the_same_figures_on_one_thread_and_on_several() {
        let names = ["t", "a", "b", "c", "d"];
        let rows: Vec<LabelledRow> = (0..80)
            .map(|i| {
                let pair = [names[i as usize % 2], names[2 + i as usize % 3]];
                run(i, pair, [0.4 + 0.005 * i as f64, 0.9 - 0.004 * i as f64])
            })
            .collect();
        let challenger = Procedure {
            kind: ModelKind::MemberRidgeGbt,
            last_id: 79,
        };
        let champion = Procedure {
            kind: ModelKind::KaceLinear,
            last_id: 60,
        };
        let on = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| compare(&rows, 5, challenger, champion))
        };
        let one = on(1).expect("every fold fits");
        assert!(one.0.mse > 0.0 && one.1.mse > 0.0, "{one:?}");
        assert_ne!(one.0, one.1, "two procedures, two sets of figures");
        assert_eq!(on(4), Some(one));
    }

    #[test]
    fn the_rank_score_picks_the_best_predicted_run_per_target() {
        let rows = [
            run(1, ["t", "a"], [0.5, 0.5]),
            run(2, ["t", "b"], [0.9, 0.9]),
            run(3, ["c", "d"], [1.0, 1.0]),
        ];
        let refs: Vec<&LabelledRow> = rows.iter().collect();
        let mut scores = Vec::new();
        // Predicting ta above tb picks the worse run for t: 75 / 135.
        rank_scores(&refs, &[10.0, 5.0, 1.0], &mut scores);
        assert_eq!(scores.len(), 1, "only t has two candidates");
        assert!((scores[0] - 75.0 / 135.0).abs() < 1e-12, "{scores:?}");
    }

    #[test]
    fn a_large_comparison_is_made_on_a_bounded_sample_that_fills_every_fold() {
        let rows: Vec<LabelledRow> = (1..=100_000)
            .map(|id| run(id, ["a", "b"], [0.5, 0.5]))
            .collect();
        let sample = comparison_sample(&rows, 5);
        assert!(sample.len() <= COMPARISON_RUNS, "{}", sample.len());
        assert!(sample.len() >= COMPARISON_RUNS * 4 / 5, "{}", sample.len());
        // A stride of 100,000 / 10,000 = 10, a multiple of five, would put every sampled id
        // in one fold of five.
        let mut per_fold = [0usize; 5];
        for row in &sample {
            per_fold[row.id.rem_euclid(5) as usize] += 1;
        }
        assert!(
            per_fold.iter().all(|&n| n * 6 >= sample.len()),
            "{per_fold:?}"
        );
        // Small stores are compared on every run.
        assert_eq!(comparison_sample(&rows[..181], 5).len(), 181);
    }
}
