//! Fitting `member-ridge-gbt` with given options: the ridge half from sums over the member
//! rows, the trees on (a sample of) the member rows, and the sum-level linear model of
//! crowded sets. No intervals here ([`super::calibrate`] adds them).

use forust_ml::{data::Matrix, objective::ObjectiveType, GradientBooster};
use rand::{rngs::StdRng, SeedableRng};

use super::{
    booster_features, prior, ridge_linear, views_of, Booster, LazyScorer, MemberRidgeGbt,
    MemberView, SET_LINEAR_MIN_SETS,
};
use crate::model::{
    member_terms::{
        clamp_log_ratio, ridge_features, MemberOptions, EXCLUSIVE_THROUGHPUT, RIDGE_FEATURES,
    },
    ridge, Features, FitError, KaceLinear, TrainingRow,
};

const RIDGE_ALPHA: f64 = 1.0;
const BOOSTER_TREES: usize = 500;
const BOOSTER_DEPTH: usize = 2;
const BOOSTER_LEARNING_RATE: f32 = 0.05;
/// Member rows the trees are grown on at most: above it, on one random sample of this size
/// (drawn once per fit with [`TREE_SAMPLE_SEED`], the same for every tree), so that a
/// million stored runs (2,000,000-2,500,000 member rows) fit in seconds and the trees'
/// matrix stays at this size; the ridge half still sums every row. Every store of KACE's
/// size, hundreds of rows, is fitted on every row by every tree.
const TREE_SAMPLE_ROWS: usize = 100_000;
/// The seed of the trees' sample ([`TREE_SAMPLE_ROWS`]): a refit on the same rows is the
/// same model.
const TREE_SAMPLE_SEED: u64 = 0x0063_6f6c_6f63;

/// The trees' training data: a column-major matrix of `rows` member rows, their targets,
/// and (when the options weigh rows) their weights.
struct TreeData {
    data: Vec<f64>,
    rows: usize,
    width: usize,
    target: Vec<f64>,
    weights: Vec<f64>,
    sampled: bool,
}

impl MemberRidgeGbt {
    /// Fits with `options`, without intervals (the evaluation's candidates, and the
    /// calibration's own refits).
    ///
    /// Memory and time stay bounded on large stores: the ridge half is fitted from sums
    /// over the member rows ([`crate::model::ridge`]), never a matrix of them; the trees'
    /// matrix is built column-major in place, and above [`TREE_SAMPLE_ROWS`] member rows
    /// it holds a random [`TREE_SAMPLE_ROWS`] of them, on which every tree is grown, on the
    /// caller's threads. Below it the fit is exactly the full-batch one.
    pub(crate) fn fit_with(rows: &[TrainingRow], options: MemberOptions) -> Result<Self, FitError> {
        Self::fit_sampling(rows, options, TREE_SAMPLE_ROWS)
    }

    /// [`Self::fit_with`], the trees grown on at most `tree_rows` member rows.
    pub(super) fn fit_sampling(
        rows: &[TrainingRow],
        options: MemberOptions,
        tree_rows: usize,
    ) -> Result<Self, FitError> {
        // The time-sharing offset of crowded sets, as the set-level model, only from
        // SET_LINEAR_MIN_SETS crowded training sets on: with fewer, the halves have learned
        // crowded sets from pairs (the full ratio, no offset), and an offset added to that
        // would count the crowding twice. The composition from pair answers only in a
        // model of no crowded set, whose crowded answers are all pair-learned: beside
        // crowded runs it would pull their answers back towards the pairs (decision 041).
        // The fitted model's options say which it has.
        let crowded_sets = rows.iter().filter(|r| r.members.len() >= 3).count();
        let options = MemberOptions {
            time_share_crowded: options.time_share_crowded && crowded_sets >= SET_LINEAR_MIN_SETS,
            pair_composition: if crowded_sets == 0 {
                options.pair_composition
            } else {
                0
            },
            ..options
        };
        let member_rows = || {
            rows.iter().flat_map(|row| {
                views_of(&row.members)
                    .into_iter()
                    .zip(row.throughputs.iter().copied())
                    .map(|(view, throughput)| (view, member_target(options, &view, throughput)))
                    .collect::<Vec<_>>()
            })
        };
        let ridge = ridge::fit(RIDGE_ALPHA, || {
            member_rows().map(|(view, y)| (ridge_features(view.own, &view.others), y))
        })?;
        let (ridge_intercept, ridge_coefficients) = (ridge.intercept, ridge.coefficients);
        let trees = tree_data(rows, options, tree_rows, |x| {
            ridge_linear(ridge_intercept, &ridge_coefficients, x)
        });
        let booster = fit_booster(&trees, options)?;
        let set_linear = if options.set_linear {
            fit_set_linear(rows, options)?
        } else {
            None
        };
        let model = Self {
            ridge_intercept,
            ridge_coefficients,
            booster: Booster::new(booster),
            options,
            intervals: None,
            seen: None,
            measured: None,
            set_linear,
            nvml_twin: None,
            scorer: LazyScorer::default(),
        };
        if !model.is_finite() {
            return Err(FitError::NotFinite);
        }
        Ok(model)
    }
}

/// What both halves learn for a member: its clamped log ratio, less the prior.
fn member_target(options: MemberOptions, view: &MemberView, throughput: f64) -> f64 {
    let ratio = throughput / view.own.0[EXCLUSIVE_THROUGHPUT];
    clamp_log_ratio(ratio.max(f64::MIN_POSITIVE).ln()) - prior(options, view)
}

/// The trees' matrix, targets and weights. Above `tree_rows` member rows the trees are
/// grown on a fixed random sample of them (the same sample for every tree), so that neither
/// the trees' matrix nor their per-iteration work grows with the store. `ridge` is the
/// fitted ridge half, whose residual the trees learn when stacked.
fn tree_data(
    rows: &[TrainingRow],
    options: MemberOptions,
    tree_rows: usize,
    ridge: impl Fn(&[f64; RIDGE_FEATURES]) -> f64,
) -> TreeData {
    let width = options.booster_features();
    let n: usize = rows.iter().map(|r| r.members.len()).sum();
    let sample = tree_sample(n, tree_rows);
    let m = sample.as_ref().map_or(n, Vec::len);
    let mut next_chosen = sample.as_ref().map(|s| s.iter().copied().peekable());
    let mut data = vec![0.0; m * width];
    let mut target = Vec::with_capacity(m);
    let mut weights = Vec::with_capacity(if options.weighs_rows() { m } else { 0 });
    let mut member_index = 0;
    for row in rows {
        let weighted = options.weighted || (options.weighted_crowded && row.members.len() >= 3);
        let set_exclusive: f64 = row.members.iter().map(|m| m.0[EXCLUSIVE_THROUGHPUT]).sum();
        for (view, throughput) in views_of(&row.members).into_iter().zip(&row.throughputs) {
            let index = member_index;
            member_index += 1;
            if let Some(chosen) = next_chosen.as_mut() {
                if chosen.next_if_eq(&index).is_none() {
                    continue;
                }
            }
            let i = target.len();
            for (j, value) in booster_features(&view, options)[..width].iter().enumerate() {
                data[j * m + i] = *value;
            }
            if options.weighs_rows() {
                let exclusive = view.own.0[EXCLUSIVE_THROUGHPUT];
                weights.push(if weighted && set_exclusive > 0.0 {
                    exclusive / set_exclusive * row.members.len() as f64
                } else {
                    1.0
                });
            }
            let y = member_target(options, &view, *throughput);
            target.push(if options.stacked {
                y - ridge(&ridge_features(view.own, &view.others))
            } else {
                y
            });
        }
    }
    debug_assert_eq!(target.len(), m);
    TreeData {
        data,
        rows: m,
        width,
        target,
        weights,
        sampled: sample.is_some(),
    }
}

/// The boosted trees grown on `trees` (on the caller's threads when sampled).
fn fit_booster(trees: &TreeData, options: MemberOptions) -> Result<GradientBooster, FitError> {
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
        .set_parallel(trees.sampled)
        .set_seed(0);
    let matrix = Matrix::new(&trees.data, trees.rows, trees.width);
    if options.weighs_rows() {
        booster.fit(&matrix, &trees.target, &trees.weights, None)
    } else {
        booster.fit_unweighted(&matrix, &trees.target, None)
    }
    .map_err(|e| FitError::Solver(format!("gradient boosting: {e}")))?;
    Ok(booster)
}

/// The sum-level linear model of the crowded training sets ([`MemberOptions::set_linear`]):
/// `None` with fewer than [`SET_LINEAR_MIN_SETS`] of them.
fn fit_set_linear(
    rows: &[TrainingRow],
    options: MemberOptions,
) -> Result<Option<KaceLinear>, FitError> {
    let crowded: Vec<&TrainingRow> = rows.iter().filter(|r| r.members.len() >= 3).collect();
    (crowded.len() >= SET_LINEAR_MIN_SETS)
        .then(|| match options.set_linear_shrink {
            0 => KaceLinear::fit_refs(&crowded),
            shrink => {
                let alpha = crowded.len() as f64 * f64::from(shrink) / 10.0;
                let ratio = options.set_linear_ratio;
                let fit = ridge::fit(alpha, || {
                    crowded.iter().filter_map(move |row| {
                        let summed = Features::sum(&row.members).0;
                        let sum = row.throughput_sum();
                        if !ratio {
                            return Some((summed, sum));
                        }
                        let exclusive = summed[EXCLUSIVE_THROUGHPUT];
                        (exclusive > 0.0).then(|| (summed, sum / exclusive))
                    })
                })?;
                Ok(KaceLinear {
                    intercept: fit.intercept,
                    coefficients: fit.coefficients,
                })
            }
        })
        .transpose()
}

/// The member rows (indices in order, distinct) the trees are grown on when there are more
/// than `at_most` of `n`: a random `at_most` of them, the same for the same `n`.
pub(super) fn tree_sample(n: usize, at_most: usize) -> Option<Vec<usize>> {
    (n > at_most).then(|| {
        let mut rng = StdRng::seed_from_u64(TREE_SAMPLE_SEED);
        let mut chosen = rand::seq::index::sample(&mut rng, n, at_most).into_vec();
        chosen.sort_unstable();
        chosen
    })
}
