//! coloc's default model kind, `member-ridge-gbt`: it predicts each member of a colocated
//! set, not only the set's sum. For a member it predicts ln(colocated / exclusive
//! throughput) from its own ten metrics and the element-wise sum of the other members'
//! metrics, twice — ridge regression on log-transformed features ([`super::ridge`]), and
//! gradient-boosted trees (forust-ml) on the raw metrics — and averages the two predicted
//! throughputs. The set's sum is the sum over members, so the same model serves pairs and
//! larger sets, and every answer carries each member's predicted slowdown. For sets of
//! three or more members, both halves learn each member around the time-sharing law, ln
//! min(1, 100 / the set's summed SM-busy %) ([`MemberOptions::time_share_crowded`]), and
//! the sum is averaged with a sum-level linear model of the training sets of that size,
//! fitted by ridge ([`MemberOptions::set_linear`], [`MemberOptions::set_linear_shrink`]):
//! linear terms extrapolate to unseen workloads in crowded sets where the trees cannot, and
//! the penalty keeps them from extrapolating wildly; last, each crowded member is moved a
//! tenth of the way to the time-sharing law itself ([`MemberOptions::law_blend`]), which
//! learns nothing from busy workloads and so reads sets of light ones it has never seen
//! where they run. Pairs are answered by the members alone.
//!
//! Chosen by `coloc eval kace` on the selection half of the data; see README, "Model quality";
//! the options by `coloc eval nway --candidates`, README, "N-way".

use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use forust_ml::{data::Matrix, objective::ObjectiveType, GradientBooster};
use rand::{rngs::StdRng, SeedableRng};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    intervals::{self, Calibration, Intervals, SeenBands, SetInterval},
    member_terms::{
        clamp_log_ratio, member_throughput, ridge_features, time_share_law, time_share_log_ratio,
        MemberOptions, EXCLUSIVE_THROUGHPUT, MAX_BOOSTER_FEATURES, RIDGE_FEATURES,
    },
    pair_scorer::{PairScorer, TreeNode},
    ridge, Features, FitError, KaceLinear, ModelParams, SetPrediction, TrainingRow, NUM_FEATURES,
};

pub use super::member_terms::ridge_feature_names;

pub const RIDGE_ALPHA: f64 = 1.0;
pub const BOOSTER_TREES: usize = 500;
pub const BOOSTER_DEPTH: usize = 2;
pub const BOOSTER_LEARNING_RATE: f32 = 0.05;
/// Member rows the trees are grown on at most: above it, on one random sample of this size
/// (drawn once per fit with [`TREE_SAMPLE_SEED`], the same for every tree), so that a
/// million stored runs (2,000,000-2,500,000 member rows) fit in seconds and the trees'
/// matrix stays at this size; the ridge half still sums every row. Every store of KACE's
/// size, hundreds of rows, is fitted on every row by every tree.
pub const TREE_SAMPLE_ROWS: usize = 100_000;
/// The seed of the trees' sample ([`TREE_SAMPLE_ROWS`]): a refit on the same rows is the
/// same model.
const TREE_SAMPLE_SEED: u64 = 0x0063_6f6c_6f63;

/// Candidates compared by `coloc eval nway --candidates` (README, "N-way").
pub const CANDIDATES: [(&str, MemberOptions); 26] = {
    const fn o(crowding: bool, stacked: bool, weighted: bool) -> MemberOptions {
        MemberOptions {
            crowding,
            stacked,
            weighted,
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
        }
    }
    const fn c(crowding: bool, weighted_crowded: bool, set_linear: bool) -> MemberOptions {
        MemberOptions {
            crowding,
            stacked: false,
            weighted: false,
            weighted_crowded,
            set_linear,
            set_linear_bounded: false,
            set_linear_shrink: 0,
            members_capped: false,
            time_share: false,
            time_share_crowded: false,
            set_linear_ratio: false,
            law_blend: 0,
            law_blend_always: false,
        }
    }
    const fn linear(shrink: u8, members_capped: bool) -> MemberOptions {
        MemberOptions {
            set_linear_shrink: shrink,
            members_capped,
            ..c(true, false, true)
        }
    }
    [
        ("plain", o(false, false, false)),
        ("crowding", o(true, false, false)),
        ("stacked", o(false, true, false)),
        ("weighted", o(false, false, true)),
        ("crowding+stacked", o(true, true, false)),
        ("crowding+weighted", o(true, false, true)),
        ("crowding+stacked+weighted", o(true, true, true)),
        ("crowding+weighted-crowded", c(true, true, false)),
        ("set-linear", c(false, false, true)),
        ("crowding+set-linear", c(true, false, true)),
        ("crowding+weighted-crowded+set-linear", c(true, true, true)),
        (
            "crowding+set-linear-bounded",
            MemberOptions {
                set_linear_bounded: true,
                ..c(true, false, true)
            },
        ),
        ("crowding+set-linear+capped", linear(0, true)),
        ("crowding+set-ridge-0.1", linear(1, false)),
        ("crowding+set-ridge-1", linear(10, false)),
        ("crowding+set-ridge-0.1+capped", linear(1, true)),
        ("crowding+set-ridge-1+capped", linear(10, true)),
        (
            "crowding+set-linear+capped+time-share",
            MemberOptions {
                time_share: true,
                ..linear(0, true)
            },
        ),
        (
            "crowding+set-linear+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                ..linear(0, true)
            },
        ),
        (
            "crowding+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                ..o(true, false, false)
            },
        ),
        (
            "crowding+set-linear-bounded+capped+time-share-crowded",
            MemberOptions {
                set_linear_bounded: true,
                time_share_crowded: true,
                ..linear(0, true)
            },
        ),
        (
            "crowding+set-ridge-0.1+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                ..linear(1, true)
            },
        ),
        (
            "crowding+set-ratio-ridge-0.1+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                set_linear_ratio: true,
                ..linear(1, true)
            },
        ),
        (
            "crowding+set-ratio-ridge-1+capped+time-share-crowded",
            MemberOptions {
                time_share_crowded: true,
                set_linear_ratio: true,
                ..linear(10, true)
            },
        ),
        (
            "crowding+set-ridge-0.1+capped+time-share-crowded+law-0.1",
            MemberOptions {
                time_share_crowded: true,
                law_blend: 10,
                ..linear(1, true)
            },
        ),
        (
            "crowding+set-ridge-0.1+capped+time-share-crowded+law-0.25",
            MemberOptions {
                time_share_crowded: true,
                law_blend: 25,
                ..linear(1, true)
            },
        ),
    ]
};

/// A member's view of its set: its own metrics, the others' sum and largest, their number.
#[derive(Debug, Clone, Copy)]
struct MemberView<'a> {
    own: &'a Features,
    others: Features,
    others_max: Features,
    n_others: usize,
}

/// Booster features of a member: its own metrics, then the others' summed metrics, then
/// (crowding) their number and largest metrics.
fn booster_features(view: &MemberView, options: MemberOptions) -> [f64; MAX_BOOSTER_FEATURES] {
    let mut f = [0.0; MAX_BOOSTER_FEATURES];
    f[..NUM_FEATURES].copy_from_slice(&view.own.0);
    f[NUM_FEATURES..2 * NUM_FEATURES].copy_from_slice(&view.others.0);
    if options.crowding {
        f[2 * NUM_FEATURES] = view.n_others as f64;
        f[2 * NUM_FEATURES + 1..].copy_from_slice(&view.others_max.0);
    }
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
    #[serde(default)]
    pub options: MemberOptions,
    /// 80 % intervals calibrated at fit time on held-out profiles (models stored before
    /// intervals existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intervals: Option<Intervals>,
    /// Narrower bands for sets of workloads the model was trained on ([`SeenBands`]; none
    /// for models trained on 1 to 109 crowded runs, which learned crowded sets from a few
    /// runs: README, "N-way", "Seen bands in a model that learned from a few crowded
    /// runs"; none for models stored before they existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<SeenBands>,
    /// With [`MemberOptions::set_linear`], the sum-level linear model of sets of three or
    /// more members (none when the training held fewer than [`SET_LINEAR_MIN_SETS`] of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_linear: Option<KaceLinear>,
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

/// Column-major copy of the first `width` columns of row vectors, as forust-ml's `Matrix`
/// expects.
fn column_major<const N: usize>(rows: &[[f64; N]], width: usize) -> Vec<f64> {
    let mut data = Vec::with_capacity(rows.len() * width);
    for j in 0..width {
        data.extend(rows.iter().map(|r| r[j]));
    }
    data
}

impl MemberRidgeGbt {
    /// Fits both learners on one row per member of every training set.
    /// What `Train` fits: the chosen options, with calibrated intervals.
    pub fn fit(rows: &[TrainingRow]) -> Result<Self, FitError> {
        Self::fit_calibrated(rows, MemberOptions::CHOSEN)
    }

    /// Fits with `options`, and calibrates the model's intervals as [`Self::calibrate`]
    /// does with [`Calibration::CHOSEN`].
    ///
    /// One after the other, not side by side: on a large store the fit's matrices are most
    /// of the memory, and the calibration's refits would add to them.
    pub fn fit_calibrated(rows: &[TrainingRow], options: MemberOptions) -> Result<Self, FitError> {
        let mut model = Self::fit_with(rows, options)?;
        model.intervals = Self::calibrate(rows, options, &[Calibration::CHOSEN])?
            .pop()
            .flatten();
        // Seen bands only where the model learned crowded sets from none or from enough
        // (README, "N-way", "Seen bands in a model that learned from a few crowded runs").
        let crowded = rows.iter().filter(|r| r.members.len() >= 3).count();
        if model.intervals.is_some() && (crowded == 0 || crowded >= SET_LINEAR_MIN_SETS) {
            model.seen = Self::calibrate_seen(rows, options)?;
        }
        Ok(model)
    }

    /// The seen bands of the model fitted with `options` on `rows` ([`SeenBands`]): five
    /// folds of whole sets of at most [`SEEN_CALIBRATION_ROWS`] rows (evenly strided), each
    /// fold's runs of known workloads scored by the model fitted on the other folds (each
    /// fold its own task on the caller's rayon pool). No refit at all when no size could
    /// reach its band's fewest scored runs.
    pub fn calibrate_seen(
        rows: &[TrainingRow],
        options: MemberOptions,
    ) -> Result<Option<SeenBands>, FitError> {
        let sample = strided(rows, SEEN_CALIBRATION_ROWS);
        let Some(folds) = SeenBands::folds(&sample) else {
            return Ok(None);
        };
        let held_out = intervals::held_out_scored_in_parallel(
            &sample,
            &folds.folds,
            |fold, row| folds.scored[fold][row],
            |train| Self::fit_with(train, options).map(ModelParams::MemberRidgeGbt),
        )?;
        Ok(SeenBands::calibrate(&held_out, rows))
    }

    /// The intervals of the model fitted with `options` on `rows`, calibrated each way of
    /// `calibrations` (the held-out runs of each way of folding computed once), by
    /// cross-validation with whole profiles held out, so the residuals are those of
    /// workloads the fold's model never saw: the pairs' band from [`intervals::FOLDS`]
    /// folds of profiles, the crowded bands' from the calibration's folds. At most
    /// [`CALIBRATION_ROWS`] rows, evenly strided, take part, and at most
    /// [`PROFILE_OUT_CALIBRATION_ROWS`] of them in the one-profile-per-fold refits, beside
    /// the profile folds' on the caller's rayon pool. `None` where nothing could be held out.
    pub fn calibrate(
        rows: &[TrainingRow],
        options: MemberOptions,
        calibrations: &[Calibration],
    ) -> Result<Vec<Option<Intervals>>, FitError> {
        let sample = strided(rows, CALIBRATION_ROWS);
        let fit =
            |train: &[TrainingRow]| Self::fit_with(train, options).map(ModelParams::MemberRidgeGbt);
        let crowded_rows = sample.iter().any(|r| r.members.len() >= 3);
        let profile_out = crowded_rows
            && calibrations
                .iter()
                .any(|c| c.uses(intervals::Folds::ProfileOut));
        // The two ways of folding fit side by side. The five profile folds fit fold after
        // fold (on a store of pairs the calibration runs as it always has, beside the
        // champion comparison); the one-profile-per-fold refits, many and small, each as
        // its own task, so that they take whichever core the rest leaves idle.
        let (by_profiles, by_profile_out) = rayon::join(
            || {
                let folds = profile_folds(&sample, intervals::FOLDS);
                (folds.len() > 1)
                    .then(|| intervals::held_out(&sample, &folds, fit))
                    .transpose()
            },
            || {
                if !profile_out {
                    return Ok(None);
                }
                let rows = strided(&sample, PROFILE_OUT_CALIBRATION_ROWS);
                let folds = profile_folds(&rows, intervals::PROFILE_OUT_FOLDS);
                (folds.len() > 1)
                    .then(|| intervals::held_out_in_parallel(&rows, &folds, fit))
                    .transpose()
            },
        );
        let (by_profiles, by_profile_out) = (by_profiles?, by_profile_out?);
        Ok(calibrations
            .iter()
            .map(|calibration| {
                let pairs = Intervals::calibrate(by_profiles.as_deref()?);
                let runs_of = |folds| match folds {
                    intervals::Folds::Profiles => by_profiles.as_deref(),
                    intervals::Folds::ProfileOut => by_profile_out.as_deref(),
                };
                let crowded = runs_of(calibration.folds)
                    .map(|runs| Intervals::calibrate_scaled(runs, calibration.scale));
                let crowded = match (crowded, calibration.sums.and_then(runs_of)) {
                    (Some(crowded), Some(sum_runs)) => Some(crowded.with_crowded_sums_from(
                        &Intervals::calibrate_scaled(sum_runs, calibration.scale),
                    )),
                    (crowded, _) => crowded,
                };
                let intervals = match crowded {
                    Some(crowded) => pairs.with_crowded_from(
                        crowded.with_crowded_bands_from_at_least(intervals::MIN_CROWDED_BAND_RUNS),
                    ),
                    None => pairs,
                };
                intervals
                    .bands
                    .iter()
                    .any(Option::is_some)
                    .then_some(intervals)
            })
            .collect())
    }

    /// The interval of a prediction of this model for the set `members`: its seen band
    /// where [`SeenBands`] covers the set, else its band for the set's size.
    pub fn interval(
        &self,
        members: &[&Features],
        prediction: &SetPrediction,
    ) -> Option<SetInterval> {
        let needs_difficulty = self
            .intervals
            .as_ref()
            .is_some_and(|i| i.needs_difficulty(members.len()));
        let difficulty = || {
            if needs_difficulty {
                self.difficulty(members)
            } else {
                0.0
            }
        };
        self.interval_with(members, prediction, difficulty)
    }

    /// [`Self::interval`] with the prediction's difficulty known.
    pub fn interval_with_difficulty(
        &self,
        members: &[&Features],
        prediction: &SetPrediction,
        difficulty: f64,
    ) -> Option<SetInterval> {
        self.interval_with(members, prediction, || difficulty)
    }

    fn interval_with(
        &self,
        members: &[&Features],
        prediction: &SetPrediction,
        difficulty: impl FnOnce() -> f64,
    ) -> Option<SetInterval> {
        if let Some(seen) = self
            .seen
            .as_ref()
            .and_then(|s| s.apply(members, prediction))
        {
            return Some(seen);
        }
        self.intervals
            .as_ref()?
            .apply(members.len(), prediction, difficulty())
    }

    /// How far the set-level linear model moves the set's members' sum:
    /// |ln(blended sum / members' sum)|, the blend's factor before the cap (0 for pairs and
    /// for models without the linear part). Large where the two halves of the blend
    /// disagree: what scaled interval bands widen with.
    pub fn difficulty(&self, members: &[&Features]) -> f64 {
        if self.set_linear.is_none() || members.len() < 3 {
            return 0.0;
        }
        self.predict_set_with_difficulty(members).1
    }

    /// Fits with `options`, without intervals (the evaluation's candidates, and the
    /// calibration's own refits).
    ///
    /// Memory and time stay bounded on large stores: the ridge half is fitted from sums
    /// over the member rows ([`super::ridge`]), never a matrix of them; the trees' matrix
    /// is built column-major in place, and above [`TREE_SAMPLE_ROWS`] member rows it holds
    /// a random [`TREE_SAMPLE_ROWS`] of them, on which every tree is grown, on the caller's
    /// threads. Below it the fit is exactly the full-batch one.
    pub fn fit_with(rows: &[TrainingRow], options: MemberOptions) -> Result<Self, FitError> {
        Self::fit_sampling(rows, options, TREE_SAMPLE_ROWS)
    }

    /// [`Self::fit_with`], the trees grown on at most `tree_rows` member rows.
    fn fit_sampling(
        rows: &[TrainingRow],
        options: MemberOptions,
        tree_rows: usize,
    ) -> Result<Self, FitError> {
        // The time-sharing offset of crowded sets, as the set-level model, only from
        // SET_LINEAR_MIN_SETS crowded training sets on: with fewer, the halves have learned
        // crowded sets from pairs (the full ratio, no offset), and an offset added to that
        // would count the crowding twice. The fitted model's options say which it has.
        let crowded_sets = rows.iter().filter(|r| r.members.len() >= 3).count();
        let options = MemberOptions {
            time_share_crowded: options.time_share_crowded && crowded_sets >= SET_LINEAR_MIN_SETS,
            ..options
        };
        let width = options.booster_features();
        let member_rows = || {
            rows.iter().flat_map(|row| {
                views_of(&row.members)
                    .into_iter()
                    .zip(row.throughputs.iter().copied())
                    .map(|(view, throughput)| {
                        let ratio = throughput / view.own.0[EXCLUSIVE_THROUGHPUT];
                        let y = clamp_log_ratio(ratio.max(f64::MIN_POSITIVE).ln())
                            - prior(options, &view);
                        (view, y)
                    })
                    .collect::<Vec<_>>()
            })
        };
        let ridge = ridge::fit(RIDGE_ALPHA, || {
            member_rows().map(|(view, y)| (ridge_features(view.own, &view.others), y))
        })?;
        let (ridge_intercept, ridge_coefficients) = (ridge.intercept, ridge.coefficients);

        // Above `tree_rows` member rows the trees are grown on a fixed random sample of
        // them (the same sample for every tree), so that neither the trees' matrix nor
        // their per-iteration work grows with the store.
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
                let ratio = throughput / view.own.0[EXCLUSIVE_THROUGHPUT];
                let y = clamp_log_ratio(ratio.max(f64::MIN_POSITIVE).ln()) - prior(options, &view);
                target.push(if options.stacked {
                    let x = ridge_features(view.own, &view.others);
                    y - ridge_linear(ridge_intercept, &ridge_coefficients, &x)
                } else {
                    y
                });
            }
        }
        debug_assert_eq!(target.len(), m);

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
            .set_parallel(sample.is_some())
            .set_seed(0);
        let matrix = Matrix::new(&data, m, width);
        if options.weighs_rows() {
            booster.fit(&matrix, &target, &weights, None)
        } else {
            booster.fit_unweighted(&matrix, &target, None)
        }
        .map_err(|e| FitError::Solver(format!("gradient boosting: {e}")))?;
        let set_linear = if options.set_linear {
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
                .transpose()?
        } else {
            None
        };
        let model = Self {
            ridge_intercept,
            ridge_coefficients,
            booster: Booster(Arc::new(booster)),
            options,
            intervals: None,
            seen: None,
            set_linear,
            scorer: LazyScorer::default(),
        };
        if !model.is_finite() {
            return Err(FitError::NotFinite);
        }
        Ok(model)
    }

    pub fn is_finite(&self) -> bool {
        self.ridge_intercept.is_finite()
            && self.ridge_coefficients.iter().all(|c| c.is_finite())
            && self.set_linear.as_ref().is_none_or(KaceLinear::is_finite)
    }

    /// A set's member predictions with the sum-level linear model blended in (sets of
    /// three or more, when the model has one): the set's sum becomes the mean of the
    /// members' sum and the linear sum (below zero read as zero; with `set_linear_bounded`,
    /// held within [1/2, 2] x the members' sum), and every member is scaled by the same
    /// factor. Also the difficulty ([`Self::difficulty`]): |ln| of that factor.
    fn blend_set(&self, members: &[Features], mut predicted: Vec<f64>) -> (Vec<f64>, f64) {
        let difficulty = self.blend_set_linear(members, &mut predicted);
        self.blend_law(members, &mut predicted);
        (predicted, difficulty)
    }

    /// With [`MemberOptions::law_blend`], in a set of three or more of a model that learns
    /// crowded sets around the time-sharing law (of any model, with
    /// [`MemberOptions::law_blend_always`]): each member's prediction becomes (1 - w) x
    /// itself + w x its exclusive throughput x the law, w = `law_blend` / 100. Each term is
    /// at most the member's exclusive throughput, so the blend keeps the cap.
    fn blend_law(&self, members: &[Features], predicted: &mut [f64]) {
        let applies = self.options.time_share_crowded || self.options.law_blend_always;
        if self.options.law_blend == 0 || !applies || members.len() < 3 {
            return;
        }
        let w = f64::from(self.options.law_blend) / 100.0;
        let law = time_share_law(members);
        for (p, member) in predicted.iter_mut().zip(members) {
            *p = (1.0 - w) * *p + w * member.0[EXCLUSIVE_THROUGHPUT] * law;
        }
    }

    /// The set-level blend of [`Self::blend_set`], in place; returns the difficulty.
    fn blend_set_linear(&self, members: &[Features], predicted: &mut [f64]) -> f64 {
        let Some(linear) = self.set_linear.as_ref().filter(|_| members.len() >= 3) else {
            return 0.0;
        };
        let members_sum: f64 = predicted.iter().sum();
        let mut difficulty = 0.0;
        if members_sum > 0.0 {
            let refs: Vec<&Features> = members.iter().collect();
            let mut linear_sum = linear.predict_set(&refs).sum.max(0.0);
            if self.options.set_linear_ratio && self.options.set_linear_shrink > 0 {
                linear_sum *= members
                    .iter()
                    .map(|m| m.0[EXCLUSIVE_THROUGHPUT])
                    .sum::<f64>();
            }
            if self.options.set_linear_bounded {
                linear_sum = linear_sum.clamp(0.5 * members_sum, 2.0 * members_sum);
            }
            let scale = 0.5 * (members_sum + linear_sum) / members_sum;
            difficulty = scale.ln().abs();
            for (p, member) in predicted.iter_mut().zip(members) {
                *p *= scale;
                if self.options.members_capped {
                    *p = p.min(member.0[EXCLUSIVE_THROUGHPUT]);
                }
            }
        }
        difficulty
    }

    pub fn has_expected_shape(&self) -> bool {
        self.ridge_coefficients.len() == RIDGE_FEATURES
    }

    /// Predicted colocated throughput of each member view.
    fn predict_members(&self, members: &[MemberView]) -> Vec<f64> {
        let width = self.options.booster_features();
        let booster_x: Vec<[f64; MAX_BOOSTER_FEATURES]> = members
            .iter()
            .map(|view| booster_features(view, self.options))
            .collect();
        let data = column_major(&booster_x, width);
        let boosted = self
            .booster
            .0
            .predict(&Matrix::new(&data, booster_x.len(), width), false);
        members
            .iter()
            .zip(boosted)
            .map(|(view, boosted)| {
                let linear = ridge_linear(
                    self.ridge_intercept,
                    &self.ridge_coefficients,
                    &ridge_features(view.own, &view.others),
                );
                let prior = prior(self.options, view);
                // Stacked: the trees learn the ridge half's residual, so the prior once.
                let boosted = if self.options.stacked {
                    boosted
                } else {
                    boosted + prior
                };
                member_throughput(linear + prior, boosted, view.own, self.options.stacked)
            })
            .collect()
    }

    /// The predictions of many sets in one pass of the trees over all of their members
    /// (equal to [`Self::predict_set`] set by set), in chunks on the caller's threads.
    pub fn predict_sets(&self, sets: &[Vec<&Features>]) -> Vec<SetPrediction> {
        self.predict_sets_with_difficulty(sets)
            .into_iter()
            .map(|(prediction, _)| prediction)
            .collect()
    }

    /// [`Self::predict_sets`] with each prediction's [`Self::difficulty`] (what a crowded
    /// set's scaled interval needs, without walking the trees again).
    pub fn predict_sets_with_difficulty(
        &self,
        sets: &[Vec<&Features>],
    ) -> Vec<(SetPrediction, f64)> {
        use rayon::prelude::*;
        sets.par_chunks(512)
            .flat_map_iter(|chunk| {
                let owned: Vec<Vec<Features>> = chunk
                    .iter()
                    .map(|set| set.iter().map(|m| **m).collect())
                    .collect();
                self.predict_batch(owned.iter().map(|m| &m[..]))
                    .into_iter()
                    .map(|(members, difficulty)| {
                        (
                            SetPrediction {
                                sum: members.iter().sum(),
                                members: Some(members),
                            },
                            difficulty,
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The predicted sum of each training row's set, in one pass of the trees over all of
    /// their members (equal to [`Self::predict_set`] row by row).
    pub fn predict_sums(&self, rows: &[TrainingRow]) -> Vec<f64> {
        self.predict_batch(rows.iter().map(|r| &r.members[..]))
            .into_iter()
            .map(|(members, _)| members.iter().sum())
            .collect()
    }

    /// Each set's member predictions and difficulty, the trees walked once over every
    /// member of them all.
    fn predict_batch<'a>(
        &self,
        sets: impl Iterator<Item = &'a [Features]> + Clone,
    ) -> Vec<(Vec<f64>, f64)> {
        let views: Vec<MemberView> = sets.clone().flat_map(views_of).collect();
        let mut predicted = self.predict_members(&views).into_iter();
        sets.map(|members| {
            let set = predicted.by_ref().take(members.len()).collect();
            self.blend_set(members, set)
        })
        .collect()
    }

    pub fn predict_set(&self, members: &[&Features]) -> SetPrediction {
        self.predict_set_with_difficulty(members).0
    }

    /// [`Self::predict_set`] and the prediction's [`Self::difficulty`].
    pub fn predict_set_with_difficulty(&self, members: &[&Features]) -> (SetPrediction, f64) {
        let owned: Vec<Features> = members.iter().map(|m| **m).collect();
        let (predicted, difficulty) =
            self.blend_set(&owned, self.predict_members(&views_of(&owned)));
        (
            SetPrediction {
                sum: predicted.iter().sum(),
                members: Some(predicted),
            },
            difficulty,
        )
    }

    /// The model compiled for scoring pairs (see [`PairScorer`]); `None` for trees deeper
    /// than the ones this kind fits, and for the `time-share` candidate (an offset on pairs
    /// too, which the compiled tables do not know).
    pub fn pair_scorer(&self) -> Option<&PairScorer> {
        if self.options.time_share {
            // The compiled tables know no prior: such a model walks its trees.
            return None;
        }
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
                    self.options,
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
        let view = |own, other: &Features| MemberView {
            own,
            others: *other,
            others_max: *other,
            n_others: 1,
        };
        let mut inputs: Vec<MemberView> = Vec::with_capacity(2 * candidates.len());
        for candidate in candidates {
            inputs.push(view(target, candidate));
            inputs.push(view(candidate, target));
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

/// Training sets of three or more members the set-level linear model needs before it is
/// fitted: ten per coefficient (the summed metrics and the intercept), the usual rule for
/// least squares. With fewer it interpolates rather than fits (it was fitted from
/// `MIN_TRAINING_ROWS`, 12, on: a service that had received its first 16 crowded runs
/// trained a model whose cross-validated MSE was 6x the champion's), and the sum is the
/// members' alone. Every KACE evaluation trains on 230 or more such sets.
pub const SET_LINEAR_MIN_SETS: usize = 10 * (NUM_FEATURES + 1);

/// Rows that calibrate a model's intervals at most (the calibration refits the model
/// [`intervals::FOLDS`] times on them, and up to [`intervals::PROFILE_OUT_FOLDS`] more
/// times for [`intervals::Folds::ProfileOut`], on at most
/// [`PROFILE_OUT_CALIBRATION_ROWS`] of them).
pub const CALIBRATION_ROWS: usize = 20_000;

/// Rows the one-profile-per-fold refits of the crowded bands take at most, evenly strided
/// from the calibration's rows: so that their 20 refits fit as many rows in all as the
/// profile folds' 5 (20 x 5,000 = 5 x 20,000). Without it a store with crowded runs paid
/// 25 refits on 20,000 rows each, four times the calibration of a store of pairs. Every
/// store of KACE's size (hundreds of runs) is below it, so its intervals are unchanged.
pub const PROFILE_OUT_CALIBRATION_ROWS: usize =
    CALIBRATION_ROWS * intervals::FOLDS / intervals::PROFILE_OUT_FOLDS;

/// Rows the seen bands' five refits take at most, evenly strided from the training: as
/// many as each one-profile-per-fold refit, so a store with crowded runs of known
/// workloads pays five more small refits (every KACE-sized training is below it).
pub const SEEN_CALIBRATION_ROWS: usize = PROFILE_OUT_CALIBRATION_ROWS;

/// At most `at_most` of `rows`, evenly strided (every row when there are no more).
fn strided(rows: &[TrainingRow], at_most: usize) -> Vec<TrainingRow> {
    let stride = rows.len().div_ceil(at_most).max(1);
    rows.iter().step_by(stride).cloned().collect()
}

/// `folds` folds that hold out whole profiles: each distinct profile (by its exact
/// metrics) goes to fold (its rank in first-seen order) mod `folds`; a run is held out in
/// the fold of each of its members.
fn profile_folds(rows: &[TrainingRow], folds: usize) -> Vec<Vec<usize>> {
    // By hash, not by a scan of the profiles seen so far: a sample of a large store holds
    // tens of thousands of distinct profiles.
    let mut profiles: std::collections::HashMap<[u64; NUM_FEATURES], usize> = Default::default();
    let groups: Vec<Vec<usize>> = rows
        .iter()
        .map(|row| {
            row.members
                .iter()
                .map(|m| {
                    let next = profiles.len();
                    let rank = *profiles.entry(m.0.map(f64::to_bits)).or_insert(next);
                    rank % folds
                })
                .collect()
        })
        .collect();
    intervals::folds_by_group(&groups)
}

/// Each member's view of its set. The others' metrics are summed directly (not as total
/// minus own) so that in a pair the "others" are exactly the partner.
fn views_of(members: &[Features]) -> Vec<MemberView<'_>> {
    (0..members.len())
        .map(|i| {
            let others = || members.iter().enumerate().filter(move |(j, _)| *j != i);
            let mut others_max = Features::default();
            for (k, (_, m)) in others().enumerate() {
                for (slot, v) in others_max.0.iter_mut().zip(m.0) {
                    *slot = if k == 0 { v } else { slot.max(v) };
                }
            }
            MemberView {
                own: &members[i],
                others: Features::sum(others().map(|(_, m)| m)),
                others_max,
                n_others: members.len() - 1,
            }
        })
        .collect()
}

/// The member rows (indices in order, distinct) the trees are grown on when there are more
/// than `at_most` of `n`: a random `at_most` of them, the same for the same `n`.
fn tree_sample(n: usize, at_most: usize) -> Option<Vec<usize>> {
    (n > at_most).then(|| {
        let mut rng = StdRng::seed_from_u64(TREE_SAMPLE_SEED);
        let mut chosen = rand::seq::index::sample(&mut rng, n, at_most).into_vec();
        chosen.sort_unstable();
        chosen
    })
}

/// The log ratio both halves learn around (with [`MemberOptions::time_share`], or
/// [`MemberOptions::time_share_crowded`] in a set of three or more), else 0.
fn prior(options: MemberOptions, view: &MemberView) -> f64 {
    if options.time_share || (options.time_share_crowded && view.n_others >= 2) {
        time_share_log_ratio(view.own, &view.others)
    } else {
        0.0
    }
}

fn ridge_linear(intercept: f64, coefficients: &[f64], x: &[f64; RIDGE_FEATURES]) -> f64 {
    x.iter()
        .zip(coefficients)
        .fold(intercept, |acc, (x, c)| acc + x * c)
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
        let batch = model.predict_sets(&sets);
        assert_eq!(batch.len(), sets.len());
        for (set, predicted) in sets.iter().zip(&batch) {
            assert_eq!(predicted, &model.predict_set(set));
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
        assert!(
            on_sums.set_linear.as_ref().unwrap().intercept.abs() > 10.0 * ridge.intercept.abs()
        );
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
        let batch = model.predict_sets(&sets);
        let with_difficulty = model.predict_sets_with_difficulty(&sets);
        for ((set, predicted), (again, difficulty)) in sets.iter().zip(&batch).zip(&with_difficulty)
        {
            assert_eq!(predicted, &model.predict_set(set));
            assert_eq!(again, predicted);
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
            let interval = model.interval(&set, &prediction).expect("has intervals");
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
        let interval = model.interval(&pair, &prediction).unwrap();
        assert!(close(interval.sum.0, prediction.sum * (-0.2f64).exp()));
        assert!(close(interval.sum.1, prediction.sum * 0.4f64.exp()));
        let params = ModelParams::MemberRidgeGbt(model);
        assert!(params.has_intervals());
        assert_eq!(params.interval(&pair, &prediction), Some(interval));
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
            let interval = model.interval(set, &prediction).expect("has intervals");
            let params = ModelParams::MemberRidgeGbt(model.clone());
            let difficulty = params.predict_set_with_difficulty(set).1;
            assert_eq!(
                params.interval_with_difficulty(set, &prediction, difficulty),
                Some(interval.clone()),
                "Place's and Rank's path answers alike"
            );
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
        let mut stored = serde_json::to_value(ModelParams::MemberRidgeGbt(model.clone())).unwrap();
        let fields = stored.as_object_mut().expect("a model is an object");
        assert!(fields.remove("seen").is_some());
        let ModelParams::MemberRidgeGbt(old) = serde_json::from_value(stored).unwrap() else {
            panic!("the same kind");
        };
        assert_eq!(old.seen, None);
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

    #[test]
    fn every_calibration_gives_pairs_the_plain_band_of_five_profile_folds() {
        let mut state = 31;
        // 24 workloads: 276 triples, so that every fold's model has its linear part.
        let seen: Vec<Features> = (0..24).map(|_| workload(&mut state)).collect();
        let mixed = mixed_rows(&seen);
        let options = MemberOptions::CHOSEN;
        let ways: Vec<Calibration> = intervals::CANDIDATES.iter().map(|(_, c)| *c).collect();
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
        for ((name, way), intervals) in intervals::CANDIDATES.iter().zip(&calibrated) {
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
        assert_eq!(
            intervals::CANDIDATES[5].1.sums,
            Some(intervals::Folds::Profiles)
        );
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
        let probe = [&seen[3], &seen[7]];
        assert_eq!(back.predict_set(&probe), model.predict_set(&probe));
    }

    #[test]
    fn ridge_feature_names_match_the_features() {
        assert_eq!(ridge_feature_names().len(), RIDGE_FEATURES);
    }
}
