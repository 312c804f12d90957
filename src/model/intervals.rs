//! Uncertainty on a prediction: split-conformal intervals from held-out residuals, by set
//! size. A residual is ln(actual / predicted), for each member's throughput and for the
//! set's sum; the interval of a new prediction is the prediction times e^q for the lower
//! and upper conformal quantiles of the residuals of runs of its size (2, 3, 4 or more
//! members; a size without residuals borrows the nearest size that has them). Residuals
//! must come from runs the model did not fit: [`cross_validated`] gets them by k-fold.

use serde::{Deserialize, Serialize};

use super::{Features, FitError, ModelParams, SetPrediction, TrainingRow};

/// The central 80 %: the 10th and 90th percentiles.
pub const LOWER: f64 = 0.1;
pub const UPPER: f64 = 0.9;
/// Folds of [`cross_validated`].
pub const FOLDS: usize = 5;

/// Set sizes with their own quantiles: 2, 3, and 4 or more.
const BANDS: usize = 3;

fn band(size: usize) -> usize {
    size.clamp(2, BANDS + 1) - 2
}

/// The log-residual quantiles of one set size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub runs: usize,
    /// (lower, upper) quantile of member residuals; `None` for kinds that predict only sums.
    pub member: Option<(f64, f64)>,
    pub sum: (f64, f64),
}

/// Calibrated intervals for every set size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intervals {
    /// Index 0: pairs, 1: three members, 2: four or more; `None` where no run was held out.
    pub bands: Vec<Option<Band>>,
}

/// A prediction's interval: the set's sum and each member's throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct SetInterval {
    pub sum: (f64, f64),
    pub members: Option<Vec<(f64, f64)>>,
}

/// The conformal quantile at level `q` of `values` (sorted in place): the
/// ceil((n + 1) q)-th smallest for an upper quantile, the floor((n + 1) q)-th for a lower
/// one, clamped to the sample.
fn conformal(values: &mut [f64], q: f64, upper: bool) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let rank = if upper {
        ((n + 1) as f64 * q).ceil()
    } else {
        ((n + 1) as f64 * q).floor()
    };
    values[(rank as usize).clamp(1, n) - 1]
}

fn log_residual(actual: f64, predicted: f64) -> Option<f64> {
    (actual > 0.0 && predicted > 0.0).then(|| (actual / predicted).ln())
}

impl Intervals {
    /// Calibrates from held-out (row, prediction) pairs.
    pub fn calibrate<'a>(
        held_out: impl IntoIterator<Item = (&'a TrainingRow, SetPrediction)>,
    ) -> Self {
        let mut members: Vec<Vec<f64>> = vec![Vec::new(); BANDS];
        let mut sums: Vec<Vec<f64>> = vec![Vec::new(); BANDS];
        let mut runs = [0usize; BANDS];
        for (row, prediction) in held_out {
            let b = band(row.members.len());
            runs[b] += 1;
            if let Some(r) = log_residual(row.throughput_sum(), prediction.sum) {
                sums[b].push(r);
            }
            if let Some(predicted) = &prediction.members {
                members[b].extend(
                    row.throughputs
                        .iter()
                        .zip(predicted)
                        .filter_map(|(a, p)| log_residual(*a, *p)),
                );
            }
        }
        let bands = (0..BANDS)
            .map(|b| {
                (!sums[b].is_empty()).then(|| Band {
                    runs: runs[b],
                    member: (!members[b].is_empty()).then(|| {
                        (
                            conformal(&mut members[b], LOWER, false),
                            conformal(&mut members[b], UPPER, true),
                        )
                    }),
                    sum: (
                        conformal(&mut sums[b], LOWER, false),
                        conformal(&mut sums[b], UPPER, true),
                    ),
                })
            })
            .collect();
        Self { bands }
    }

    /// The band of a set size, or the nearest size that has one.
    fn band(&self, size: usize) -> Option<&Band> {
        let own = band(size);
        (0..BANDS)
            .filter_map(|b| {
                self.bands
                    .get(b)?
                    .as_ref()
                    .map(|band| (b.abs_diff(own), b, band))
            })
            .min_by_key(|(distance, b, _)| (*distance, std::cmp::Reverse(*b)))
            .map(|(_, _, band)| band)
    }

    /// The interval of `prediction` for a set of `size` members.
    pub fn apply(&self, size: usize, prediction: &SetPrediction) -> Option<SetInterval> {
        let band = self.band(size)?;
        let scale = |value: f64, (lo, hi): (f64, f64)| (value * lo.exp(), value * hi.exp());
        Some(SetInterval {
            sum: scale(prediction.sum, band.sum),
            members: match (&prediction.members, band.member) {
                (Some(members), Some(q)) => Some(members.iter().map(|m| scale(*m, q)).collect()),
                _ => None,
            },
        })
    }
}

/// Calibrates intervals for the procedure `fit` on `rows` by cross-validation over the
/// given folds (each the indices of its held-out rows; the model is fitted on the rest):
/// every residual comes from a model that did not see the row. Folds should hold out what
/// the answers will face: leaving whole workloads out when the intervals serve workloads
/// the model has not seen ([`folds_by_group`]), random folds otherwise ([`k_folds`]).
pub fn cross_validated(
    rows: &[TrainingRow],
    folds: &[Vec<usize>],
    fit: impl Fn(&[TrainingRow]) -> Result<ModelParams, FitError>,
) -> Result<Intervals, FitError> {
    let mut held_out: Vec<(&TrainingRow, SetPrediction)> = Vec::with_capacity(rows.len());
    for test in folds {
        let mut is_test = vec![false; rows.len()];
        for &i in test {
            is_test[i] = true;
        }
        let train: Vec<TrainingRow> = rows
            .iter()
            .zip(&is_test)
            .filter(|(_, t)| !**t)
            .map(|(r, _)| r.clone())
            .collect();
        if train.len() < super::MIN_TRAINING_ROWS {
            continue;
        }
        let params = fit(&train)?;
        for &i in test {
            let members: Vec<&Features> = rows[i].members.iter().collect();
            held_out.push((&rows[i], params.predict_set(&members)));
        }
    }
    Ok(Intervals::calibrate(held_out))
}

/// [`FOLDS`] folds, row i in fold i mod [`FOLDS`].
pub fn k_folds(rows: usize) -> Vec<Vec<usize>> {
    (0..FOLDS)
        .map(|f| (f..rows).step_by(FOLDS).collect())
        .collect()
}

/// One fold per group: the rows any of whose groups is that group (a row with members of
/// several groups is held out once for each).
pub fn folds_by_group<G: Ord + Clone>(row_groups: &[Vec<G>]) -> Vec<Vec<usize>> {
    let mut folds: std::collections::BTreeMap<G, Vec<usize>> = Default::default();
    for (i, groups) in row_groups.iter().enumerate() {
        let mut seen: Vec<&G> = Vec::new();
        for g in groups {
            if !seen.contains(&g) {
                seen.push(g);
                folds.entry(g.clone()).or_default().push(i);
            }
        }
    }
    folds.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(throughputs: &[f64]) -> TrainingRow {
        TrainingRow {
            members: vec![Features::default(); throughputs.len()],
            throughputs: throughputs.to_vec(),
        }
    }

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

    #[test]
    fn intervals_scale_the_prediction_by_the_residual_quantiles_of_its_size() {
        // Pairs predicted at 10 with actual sums 5..=14 (members half each); no triples;
        // quads predicted exactly.
        let pairs: Vec<TrainingRow> = (5..=23).map(|a| row(&[a as f64 / 2.0; 2])).collect();
        let quads: Vec<TrainingRow> = (0..9).map(|_| row(&[2.5; 4])).collect();
        let held_out = pairs
            .iter()
            .map(|r| {
                (
                    r,
                    SetPrediction {
                        sum: 10.0,
                        members: Some(vec![5.0, 5.0]),
                    },
                )
            })
            .chain(quads.iter().map(|r| (r, SetPrediction::sum_only(10.0))));
        let intervals = Intervals::calibrate(held_out);
        let pair = intervals
            .apply(
                2,
                &SetPrediction {
                    sum: 20.0,
                    members: Some(vec![8.0, 12.0]),
                },
            )
            .unwrap();
        // 19 pair sums 5..=23 over 10: ranks 2 and 18 are 6/10 and 22/10.
        assert!((pair.sum.0 - 12.0).abs() < 1e-9 && (pair.sum.1 - 44.0).abs() < 1e-9);
        let members = pair.members.unwrap();
        assert!(
            (members[0].0 - 8.0 * 0.6).abs() < 1e-9 && (members[1].1 - 12.0 * 2.2).abs() < 1e-9
        );
        // Four members: exact predictions, a zero-width interval and no member interval.
        let quad = intervals.apply(4, &SetPrediction::sum_only(7.0)).unwrap();
        assert!((quad.sum.0 - 7.0).abs() < 1e-12 && (quad.sum.1 - 7.0).abs() < 1e-12);
        // Three members borrow the larger neighbour's band (four members) on a tie.
        let three = intervals.apply(3, &SetPrediction::sum_only(7.0)).unwrap();
        assert_eq!(three.sum, quad.sum);
        // Sixteen members use the four-or-more band.
        assert_eq!(
            intervals
                .apply(16, &SetPrediction::sum_only(7.0))
                .unwrap()
                .sum,
            quad.sum
        );
    }
}
