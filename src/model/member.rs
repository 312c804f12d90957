//! coloc's default model kind, `member-ridge-gbt`: it predicts each member of a colocated
//! set, not only the set's sum. For a member it predicts ln(colocated / exclusive
//! throughput) from its own ten metrics and the element-wise sum of the other members'
//! metrics, twice — ridge regression (smartcore) on log-transformed features, and
//! gradient-boosted trees (forust-ml) on the raw metrics — and averages the two predicted
//! throughputs. The set's sum is the sum over members, so the same model serves pairs and
//! larger sets, and every answer carries each member's predicted slowdown.
//!
//! Chosen by `coloc eval kace` on the selection half of the data; see README, "Model quality".

use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use forust_ml::{data::Matrix, objective::ObjectiveType, GradientBooster};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smartcore::{
    linalg::basic::{arrays::Array, matrix::DenseMatrix},
    linear::ridge_regression::{
        RidgeRegression, RidgeRegressionParameters, RidgeRegressionSolverName,
    },
};

use super::{
    member_terms::{
        clamp_log_ratio, member_throughput, ridge_features, EXCLUSIVE_THROUGHPUT, RIDGE_FEATURES,
    },
    pair_scorer::{PairScorer, TreeNode},
    Features, FitError, SetPrediction, TrainingRow, NUM_FEATURES,
};

pub use super::member_terms::ridge_feature_names;

pub const RIDGE_ALPHA: f64 = 1.0;
pub const BOOSTER_TREES: usize = 500;
pub const BOOSTER_DEPTH: usize = 2;
pub const BOOSTER_LEARNING_RATE: f32 = 0.05;

const BOOSTER_FEATURES: usize = 2 * NUM_FEATURES;

/// Booster features of a member: its own metrics, then the others' summed metrics.
fn booster_features(own: &Features, others: &Features) -> [f64; BOOSTER_FEATURES] {
    let mut f = [0.0; BOOSTER_FEATURES];
    f[..NUM_FEATURES].copy_from_slice(&own.0);
    f[NUM_FEATURES..].copy_from_slice(&others.0);
    f
}

/// The fitted booster, shared and serialised through forust-ml's own serde support.
#[derive(Clone)]
pub struct Booster(Arc<GradientBooster>);

impl fmt::Debug for Booster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GradientBooster({} trees)", self.0.trees.len())
    }
}

impl PartialEq for Booster {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || serde_json::to_string(&*self.0).ok() == serde_json::to_string(&*other.0).ok()
    }
}

impl Serialize for Booster {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Booster {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        GradientBooster::deserialize(deserializer).map(|b| Self(Arc::new(b)))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRidgeGbt {
    /// The ridge part in raw feature units (see [`ridge_feature_names`]).
    pub ridge_intercept: f64,
    pub ridge_coefficients: Vec<f64>,
    pub booster: Booster,
    #[serde(skip)]
    scorer: LazyScorer,
}

/// The pair scorer, compiled on first use and shared by clones of the model.
#[derive(Clone, Default)]
struct LazyScorer(Arc<OnceLock<Option<PairScorer>>>);

impl fmt::Debug for LazyScorer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairScorer")
    }
}

impl PartialEq for LazyScorer {
    /// Derived from the parameters: equal models have equal scorers.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Column-major copy of row vectors, as forust-ml's `Matrix` expects.
fn column_major<const N: usize>(rows: &[[f64; N]]) -> Vec<f64> {
    let mut data = Vec::with_capacity(rows.len() * N);
    for j in 0..N {
        data.extend(rows.iter().map(|r| r[j]));
    }
    data
}

impl MemberRidgeGbt {
    /// Fits both learners on one row per member of every training set.
    pub fn fit(rows: &[TrainingRow]) -> Result<Self, FitError> {
        let mut ridge_x: Vec<[f64; RIDGE_FEATURES]> = Vec::new();
        let mut booster_x: Vec<[f64; BOOSTER_FEATURES]> = Vec::new();
        let mut y: Vec<f64> = Vec::new();
        for row in rows {
            for ((own, others), &throughput) in row
                .members
                .iter()
                .zip(others_of(&row.members))
                .zip(&row.throughputs)
            {
                ridge_x.push(ridge_features(own, &others));
                booster_x.push(booster_features(own, &others));
                let ratio = throughput / own.0[EXCLUSIVE_THROUGHPUT];
                y.push(clamp_log_ratio(ratio.max(f64::MIN_POSITIVE).ln()));
            }
        }

        let (ridge_intercept, ridge_coefficients) = fit_ridge(&ridge_x, &y)?;

        let data = column_major(&booster_x);
        let mut booster = GradientBooster::default()
            .set_objective_type(ObjectiveType::SquaredLoss)
            .set_iterations(BOOSTER_TREES)
            .set_learning_rate(BOOSTER_LEARNING_RATE)
            .set_max_depth(BOOSTER_DEPTH)
            .set_l2(0.0)
            .set_min_leaf_weight(1.0)
            .set_gamma(0.0)
            .set_initialize_base_score(true)
            .set_nbins(256)
            .set_parallel(false)
            .set_seed(0);
        booster
            .fit_unweighted(
                &Matrix::new(&data, booster_x.len(), BOOSTER_FEATURES),
                &y,
                None,
            )
            .map_err(|e| FitError::Solver(format!("gradient boosting: {e}")))?;
        let model = Self {
            ridge_intercept,
            ridge_coefficients,
            booster: Booster(Arc::new(booster)),
            scorer: LazyScorer::default(),
        };
        if !model.is_finite() {
            return Err(FitError::NotFinite);
        }
        Ok(model)
    }

    pub fn is_finite(&self) -> bool {
        self.ridge_intercept.is_finite() && self.ridge_coefficients.iter().all(|c| c.is_finite())
    }

    pub fn has_expected_shape(&self) -> bool {
        self.ridge_coefficients.len() == RIDGE_FEATURES
    }

    /// Predicted colocated throughput of each (own, others) member.
    fn predict_members(&self, members: &[(&Features, Features)]) -> Vec<f64> {
        let booster_x: Vec<[f64; BOOSTER_FEATURES]> = members
            .iter()
            .map(|(own, others)| booster_features(own, others))
            .collect();
        let data = column_major(&booster_x);
        let boosted = self.booster.0.predict(
            &Matrix::new(&data, booster_x.len(), BOOSTER_FEATURES),
            false,
        );
        members
            .iter()
            .zip(boosted)
            .map(|((own, others), boosted)| {
                let linear = ridge_features(own, others)
                    .iter()
                    .zip(&self.ridge_coefficients)
                    .fold(self.ridge_intercept, |acc, (x, c)| acc + x * c);
                member_throughput(linear, boosted, own)
            })
            .collect()
    }

    pub fn predict_set(&self, members: &[&Features]) -> SetPrediction {
        let owned: Vec<Features> = members.iter().map(|m| **m).collect();
        let inputs: Vec<(&Features, Features)> =
            members.iter().copied().zip(others_of(&owned)).collect();
        let predicted = self.predict_members(&inputs);
        SetPrediction {
            sum: predicted.iter().sum(),
            members: Some(predicted),
        }
    }

    /// The model compiled for scoring pairs (see [`PairScorer`]); `None` only for trees
    /// deeper than the ones this kind fits.
    pub fn pair_scorer(&self) -> Option<&PairScorer> {
        self.scorer
            .0
            .get_or_init(|| {
                let booster = &self.booster.0;
                let iterations = booster.prediction_iteration.unwrap_or(booster.trees.len());
                let trees: Vec<Vec<TreeNode>> = booster.trees[..iterations]
                    .iter()
                    .map(|tree| {
                        tree.nodes
                            .iter()
                            .map(|n| TreeNode {
                                is_leaf: n.is_leaf,
                                value: n.weight_value as f64,
                                feature: n.split_feature,
                                threshold: n.split_value,
                                left: n.left_child,
                                right: n.right_child,
                            })
                            .collect()
                    })
                    .collect();
                PairScorer::compile(
                    booster.base_score,
                    &trees,
                    self.ridge_intercept,
                    &self.ridge_coefficients,
                )
            })
            .as_ref()
    }

    /// Scores (target, candidate) pairs through the pair scorer.
    pub fn predict_pairs(&self, target: &Features, candidates: &[&Features]) -> Vec<SetPrediction> {
        match self.pair_scorer() {
            Some(scorer) => scorer.predict_pairs(target, candidates),
            None => self.predict_pairs_reference(target, candidates),
        }
    }

    /// Scores (target, candidate) pairs by walking every tree: one batch of 2 rows per
    /// candidate.
    pub fn predict_pairs_reference(
        &self,
        target: &Features,
        candidates: &[&Features],
    ) -> Vec<SetPrediction> {
        let mut inputs: Vec<(&Features, Features)> = Vec::with_capacity(2 * candidates.len());
        for candidate in candidates {
            inputs.push((target, **candidate));
            inputs.push((*candidate, *target));
        }
        let predicted = self.predict_members(&inputs);
        predicted
            .chunks_exact(2)
            .map(|pair| SetPrediction {
                sum: pair[0] + pair[1],
                members: Some(pair.to_vec()),
            })
            .collect()
    }
}

/// For each member, the element-wise sum of the other members' metrics. Summed directly
/// (not as total minus own) so that in a pair the "others" are exactly the partner.
fn others_of(members: &[Features]) -> Vec<Features> {
    (0..members.len())
        .map(|i| {
            Features::sum(
                members
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, m)| m),
            )
        })
        .collect()
}

/// Ridge regression (smartcore, standardised columns, Cholesky) on the columns that vary;
/// a constant column gets coefficient 0 instead of a division by a zero deviation.
fn fit_ridge(x: &[[f64; RIDGE_FEATURES]], y: &[f64]) -> Result<(f64, Vec<f64>), FitError> {
    let varying: Vec<usize> = (0..RIDGE_FEATURES)
        .filter(|&j| {
            let first = x[0][j];
            x.iter()
                .any(|row| (row[j] - first).abs() > 1e-12 * first.abs().max(1.0))
        })
        .collect();
    let rows: Vec<Vec<f64>> = x
        .iter()
        .map(|row| varying.iter().map(|&j| row[j]).collect())
        .collect();
    let matrix =
        DenseMatrix::from_2d_vec(&rows).map_err(|e| FitError::Solver(format!("ridge: {e}")))?;
    let parameters = RidgeRegressionParameters::default()
        .with_alpha(RIDGE_ALPHA)
        .with_normalize(true)
        .with_solver(RidgeRegressionSolverName::Cholesky);
    let fitted = RidgeRegression::fit(&matrix, &y.to_vec(), parameters)
        .map_err(|e| FitError::Solver(format!("ridge: {e}")))?;
    let mut coefficients = vec![0.0; RIDGE_FEATURES];
    for (k, &j) in varying.iter().enumerate() {
        coefficients[j] = *fitted.coefficients().get((k, 0));
    }
    Ok((*fitted.intercept(), coefficients))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_fitted_model_round_trips_through_json_exactly() {
        let mut state = 9;
        let seen: Vec<Features> = (0..12).map(|_| workload(&mut state)).collect();
        let model = MemberRidgeGbt::fit(&rows(&seen)).unwrap();
        let json = serde_json::to_string(&model).unwrap();
        let back: MemberRidgeGbt = serde_json::from_str(&json).unwrap();
        assert_eq!(back, model);
        let probe = [&seen[3], &seen[7]];
        assert_eq!(back.predict_set(&probe), model.predict_set(&probe));
    }

    #[test]
    fn ridge_feature_names_match_the_features() {
        assert_eq!(ridge_feature_names().len(), RIDGE_FEATURES);
    }
}
