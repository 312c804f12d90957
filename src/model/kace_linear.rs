//! KACE's model: ordinary least squares (linfa-linear) from the summed member features to
//! the set's colocated throughput sum.

use linfa::prelude::*;
use linfa_linear::LinearRegression;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use super::{Features, FitError, SetPrediction, TrainingRow, NUM_FEATURES};

/// The fitted model in raw feature units: sum = intercept + coefficients · summed features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KaceLinear {
    pub intercept: f64,
    pub coefficients: Vec<f64>,
}

impl KaceLinear {
    /// Fits on the rows. Columns are standardised before the solve (the raw metrics span
    /// eight orders of magnitude, from percentages to register counts) and the solution is
    /// mapped back to raw units; a column that does not vary gets coefficient 0.
    pub(crate) fn fit(rows: &[TrainingRow]) -> Result<Self, FitError> {
        Self::fit_refs(&rows.iter().collect::<Vec<_>>())
    }

    /// [`Self::fit`] on borrowed rows (a selection of a store's rows, without copying them).
    pub(crate) fn fit_refs(rows: &[&TrainingRow]) -> Result<Self, FitError> {
        let n = rows.len();
        let mut x = Array2::<f64>::zeros((n, NUM_FEATURES));
        let mut y = Array1::<f64>::zeros(n);
        for (i, row) in rows.iter().enumerate() {
            let summed = Features::sum(&row.members);
            for j in 0..NUM_FEATURES {
                x[[i, j]] = summed.0[j];
            }
            y[i] = row.throughput_sum();
        }

        let mut means = [0.0; NUM_FEATURES];
        let mut scales = [0.0; NUM_FEATURES];
        let mut varying = Vec::with_capacity(NUM_FEATURES);
        for j in 0..NUM_FEATURES {
            let column = x.column(j);
            let mean = column.sum() / n as f64;
            let variance = column.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
            means[j] = mean;
            scales[j] = variance.sqrt();
            // Relative test: a column that is constant up to rounding carries no information.
            if scales[j] > 1e-12 * mean.abs().max(1.0) {
                varying.push(j);
            }
        }

        let mut standardized = Array2::<f64>::zeros((n, varying.len()));
        for (k, &j) in varying.iter().enumerate() {
            for i in 0..n {
                standardized[[i, k]] = (x[[i, j]] - means[j]) / scales[j];
            }
        }

        let fitted = LinearRegression::default()
            .fit(&Dataset::new(standardized, y))
            .map_err(|e| FitError::Solver(e.to_string()))?;

        let mut coefficients = vec![0.0; NUM_FEATURES];
        let mut intercept = fitted.intercept();
        for (k, &j) in varying.iter().enumerate() {
            let raw = fitted.params()[k] / scales[j];
            coefficients[j] = raw;
            intercept -= raw * means[j];
        }
        let model = Self {
            intercept,
            coefficients,
        };
        if !model.is_finite() {
            return Err(FitError::NotFinite);
        }
        Ok(model)
    }

    pub(crate) fn is_finite(&self) -> bool {
        self.intercept.is_finite() && self.coefficients.iter().all(|c| c.is_finite())
    }

    pub(crate) fn has_expected_shape(&self) -> bool {
        self.coefficients.len() == NUM_FEATURES
    }

    fn dot(&self, features: &Features) -> f64 {
        self.coefficients
            .iter()
            .zip(features.0)
            .map(|(c, v)| c * v)
            .sum()
    }

    /// Summed left to right from the intercept, the same order as [`Self::predict_pairs`],
    /// so Predict and Rank give bit-identical sums for the same pair.
    pub(crate) fn predict_set(&self, members: &[&Features]) -> SetPrediction {
        let sum = members
            .iter()
            .fold(self.intercept, |acc, m| acc + self.dot(m));
        SetPrediction::sum_only(sum)
    }

    /// The model is linear in the summed features, so the target's part is computed once
    /// and each candidate costs one dot product.
    pub(crate) fn predict_pairs(
        &self,
        target: &Features,
        candidates: &[&Features],
    ) -> Vec<SetPrediction> {
        let base = self.intercept + self.dot(target);
        candidates
            .iter()
            .map(|c| SetPrediction::sum_only(base + self.dot(c)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic pseudo-random sequence, so the test needs no extra crate.
    fn lcg(state: &mut u64) -> f64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    fn random_features(state: &mut u64) -> Features {
        // Scales like the real metrics: threads ~1e5..1e6, registers ~1e7, percentages.
        let scales = [1e6, 100.0, 100.0, 100.0, 1e8, 3e4, 100.0, 100.0, 50.0, 16.0];
        let mut f = [0.0; NUM_FEATURES];
        for (v, s) in f.iter_mut().zip(scales) {
            *v = lcg(state) * s;
        }
        Features(f)
    }

    #[test]
    fn fit_recovers_known_coefficients_from_noise_free_pairs() {
        let truth = KaceLinear {
            intercept: 12.5,
            coefficients: vec![2e-6, 0.3, -0.2, 0.1, 1e-7, -4e-4, 0.8, -0.05, 0.02, -1.5],
        };
        let mut state = 42;
        let rows: Vec<TrainingRow> = (0..60)
            .map(|_| {
                let members = vec![random_features(&mut state), random_features(&mut state)];
                let refs: Vec<&Features> = members.iter().collect();
                let sum = truth.predict_set(&refs).sum;
                // Split the sum between members arbitrarily; only the sum is the label.
                TrainingRow {
                    members,
                    throughputs: vec![sum * 0.25, sum * 0.75],
                }
            })
            .collect();

        let fitted = KaceLinear::fit(&rows).unwrap();

        assert!(
            (fitted.intercept - truth.intercept).abs() < 1e-6,
            "{fitted:?}"
        );
        for (got, want) in fitted.coefficients.iter().zip(&truth.coefficients) {
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1e-9),
                "{got} vs {want}"
            );
        }
    }

    #[test]
    fn a_constant_feature_gets_a_zero_coefficient_instead_of_breaking_the_fit() {
        let mut state = 7;
        let rows: Vec<TrainingRow> = (0..30)
            .map(|_| {
                let mut a = random_features(&mut state);
                let mut b = random_features(&mut state);
                a.0[9] = 1.0;
                b.0[9] = 1.0;
                let label = 3.0 + 0.5 * (a.0[6] + b.0[6]);
                TrainingRow {
                    members: vec![a, b],
                    throughputs: vec![label, 0.0],
                }
            })
            .collect();
        let fitted = KaceLinear::fit(&rows).unwrap();
        assert_eq!(fitted.coefficients[9], 0.0);
        assert!((fitted.coefficients[6] - 0.5).abs() < 1e-9);
    }

    #[test]
    fn pair_batch_scoring_equals_scoring_each_set() {
        let model = KaceLinear {
            intercept: 1.0,
            coefficients: (1..=10).map(f64::from).collect(),
        };
        let mut state = 3;
        let target = random_features(&mut state);
        let candidates: Vec<Features> = (0..5).map(|_| random_features(&mut state)).collect();
        let refs: Vec<&Features> = candidates.iter().collect();
        for (batch, c) in model.predict_pairs(&target, &refs).iter().zip(&candidates) {
            assert_eq!(batch.sum, model.predict_set(&[&target, c]).sum);
        }
    }
}
