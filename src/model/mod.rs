//! The model layer: turns profiles of a colocated set into a predicted throughput. Model
//! kinds live behind [`ModelParams`]. Its face, what the rest of coloc calls:
//! - [`ModelParams::predict`]: any sets at once (pairs, threes, fours), each with its
//!   [`PredictedSet::difficulty`]; [`ModelParams::interval`] of one of its answers, and
//!   [`ModelParams::has_intervals`] (Predict, Place, Rank's general path, `coloc eval`,
//!   `coloc simulate`);
//! - the pair fast path, Rank's scoring of many pairs: [`ModelParams::pair_scorer`] (the
//!   advisor's catalog keeps each profile's [`ProfileCode`] under the serving model
//!   ([`PairScorer::code`]), and Rank folds the target into [`TargetTables`]
//!   ([`PairScorer::target_tables`]) and scores each candidate with [`PairScorer::score`];
//!   only `member-ridge-gbt` has one), else [`ModelParams::predict_pairs`];
//! - [`fit`] (the trainer, through the advisor) and [`evaluate`]; [`fit_point`],
//!   [`fit_member`], [`fit_with_options`] and [`fit_calibrated_each`] for experiments;
//! - [`ModelParams::coefficients`], [`ModelParams::is_servable`], [`ModelKind`].
//!
//! What is served is named here, never read from an experiment's list by position: the
//! kind [`ModelKind::DEFAULT`], its options [`MemberOptions::CHOSEN`], its intervals'
//! calibration [`intervals::Calibration::CHOSEN`] (the lists `coloc eval` compares live
//! with the evaluation).
//!
//! Inside, imports run one way: `member` (the fitter) uses `pair_scorer` and `ridge`, and
//! both of the first use `member_terms` (the shared terms and the fit options) and
//! `features`; nothing here imports the service.

mod features;
mod flat_forest;
pub mod intervals;
mod kace_linear;
mod member;
mod member_terms;
mod pair_scorer;
mod ridge;
pub mod validation;

use serde::{Deserialize, Serialize};

pub use features::{Features, ProfileLevel, FEATURE_NAMES, NUM_FEATURES};
pub use kace_linear::KaceLinear;
pub use member::MemberRidgeGbt;
pub use member_terms::MemberOptions;
pub use pair_scorer::{PairScorer, ProfileCode, TargetTables};

/// Fewer observations than this cannot pin down the ten coefficients and the intercept of
/// the linear model with any residual left to judge the fit.
pub const MIN_TRAINING_ROWS: usize = NUM_FEATURES + 2;

/// One colocated run as training data: each member's profile features and its measured
/// colocated throughput, in the same order.
#[derive(Debug, Clone)]
pub struct TrainingRow {
    pub members: Vec<Features>,
    pub throughputs: Vec<f64>,
}

impl TrainingRow {
    pub fn throughput_sum(&self) -> f64 {
        self.throughputs.iter().sum()
    }

    /// The run as NVML alone would have profiled its members ([`Features::nvml_only`]): what
    /// the NVML-only twin learns from, and `coloc eval --nvml-only` judges.
    pub fn nvml_only(&self) -> Self {
        Self {
            members: self.members.iter().map(Features::nvml_only).collect(),
            throughputs: self.throughputs.clone(),
        }
    }
}

/// What a model says about one colocated set.
#[derive(Debug, Clone, PartialEq)]
pub struct SetPrediction {
    pub sum: f64,
    /// Each member's predicted colocated throughput, for kinds that predict per member.
    pub members: Option<Vec<f64>>,
}

impl SetPrediction {
    pub fn sum_only(sum: f64) -> Self {
        Self { sum, members: None }
    }

    /// Each member's colocated throughput: the model's own, or, for kinds that predict only
    /// the sum, the sum split in proportion to the members' exclusive throughputs (every
    /// member then keeps the same fraction of its speed). The flag is true when estimated.
    pub fn members_or_estimated(&self, exclusive: &[f64]) -> (Vec<f64>, bool) {
        if let Some(members) = &self.members {
            return (members.clone(), false);
        }
        (split_by_exclusive(self.sum, exclusive), true)
    }
}

/// What [`ModelParams::predict`] answers for one set: the prediction, and its difficulty
/// (what [`ModelParams::interval`] reads with it).
#[derive(Debug, Clone, PartialEq)]
pub struct PredictedSet {
    pub prediction: SetPrediction,
    /// How far the set lies from what the model knows (see [`ModelParams::predict`]).
    pub difficulty: f64,
}

/// `sum` shared among members in proportion to their exclusive throughputs.
pub fn split_by_exclusive(sum: f64, exclusive: &[f64]) -> Vec<f64> {
    let total: f64 = exclusive.iter().sum();
    exclusive.iter().map(|e| sum * e / total).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ModelKind {
    /// coloc's per-member model: ridge + boosted trees on each member's slowdown.
    MemberRidgeGbt,
    /// KACE's model: least squares from summed metrics to the throughput sum.
    KaceLinear,
}

impl ModelKind {
    pub const ALL: [ModelKind; 2] = [ModelKind::MemberRidgeGbt, ModelKind::KaceLinear];
    /// The kind `Train` fits unless told otherwise: the winner of `coloc eval kace` (see
    /// docs/model.md, "Model quality").
    pub const DEFAULT: ModelKind = ModelKind::MemberRidgeGbt;

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemberRidgeGbt => "member-ridge-gbt",
            Self::KaceLinear => "kace-linear",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == raw)
    }

    /// What scoring one candidate pair in Rank costs, roughly (benches/scoring.rs on a
    /// 2-core machine: about 120 ns through the pair scorer with the candidate's code kept,
    /// 10 ns for a dot product).
    pub fn scoring_cost_ns(self) -> u64 {
        match self {
            Self::MemberRidgeGbt => 200,
            Self::KaceLinear => 10,
        }
    }

    /// True when the kind predicts each member's throughput, not only the set's sum.
    pub fn predicts_members(self) -> bool {
        match self {
            Self::MemberRidgeGbt => true,
            Self::KaceLinear => false,
        }
    }
}

/// A fitted model of any kind, as persisted (JSON, tagged by kind).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ModelParams {
    MemberRidgeGbt(MemberRidgeGbt),
    KaceLinear(KaceLinear),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FitError {
    #[error("{have} usable observations; at least {need} are needed to fit a model")]
    TooFewObservations { have: usize, need: usize },
    #[error("the solver failed: {0}")]
    Solver(String),
    #[error("the fit produced non-finite coefficients (the observations are degenerate)")]
    NotFinite,
}

/// In-sample quality of a fitted model on the throughput sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitMetrics {
    pub observations: usize,
    pub r2: f64,
    pub mse: f64,
}

impl ModelParams {
    pub fn kind(&self) -> ModelKind {
        match self {
            Self::MemberRidgeGbt(_) => ModelKind::MemberRidgeGbt,
            Self::KaceLinear(_) => ModelKind::KaceLinear,
        }
    }

    /// Checks a model loaded from storage before it is served.
    pub fn is_servable(&self) -> bool {
        match self {
            Self::MemberRidgeGbt(m) => m.has_expected_shape() && m.is_finite(),
            Self::KaceLinear(m) => m.has_expected_shape() && m.is_finite(),
        }
    }

    /// The prediction of each set of `sets` (pairs, threes and fours alike, in one call),
    /// with its difficulty: how far the set lies from what the model knows, which a scaled
    /// interval band widens with (for `member-ridge-gbt`, how far its set-level linear
    /// model moves the members' sum, |ln| of the factor; 0 for pairs and for other kinds).
    /// The trees walk every member of the batch at once, a large batch in chunks on the
    /// caller's rayon threads; each answer equals the set predicted alone, to the bit.
    pub fn predict<'f, S: AsRef<[&'f Features]> + Sync>(&self, sets: &[S]) -> Vec<PredictedSet> {
        match self {
            Self::MemberRidgeGbt(m) => m.predict(sets),
            Self::KaceLinear(m) => sets
                .iter()
                .map(|set| PredictedSet {
                    prediction: m.predict_set(set.as_ref()),
                    difficulty: 0.0,
                })
                .collect(),
        }
    }

    /// The 80 % interval of `prediction` of the set `members`, whose difficulty came with
    /// it from [`Self::predict`] (0 for a pair), for models that carry calibrated
    /// intervals: `member-ridge-gbt` fitted since intervals exist. Its seen band where the
    /// model knows every member, else its band for the set's size. Place's cautious mode
    /// reads the pessimistic end of each member's throughput.
    pub fn interval(
        &self,
        members: &[&Features],
        prediction: &SetPrediction,
        difficulty: f64,
    ) -> Option<intervals::SetInterval> {
        match self {
            Self::MemberRidgeGbt(m) => m.interval(members, prediction, difficulty),
            Self::KaceLinear(_) => None,
        }
    }

    /// The model that answers a set at `level`: itself for full profiles; for a set with a
    /// member profiled by NVML alone, its NVML-only twin (fitted on the same runs with the
    /// kernel metrics withheld, its own intervals calibrated the same way), which reads
    /// every member's [`Features::nvml_only`]. `None` where the model has no twin
    /// (`kace-linear`, models stored before twins existed).
    pub fn at_level(&self, level: ProfileLevel) -> Option<&ModelParams> {
        match (level, self) {
            (ProfileLevel::Full, _) => Some(self),
            (ProfileLevel::NvmlOnly, Self::MemberRidgeGbt(m)) => m.nvml_twin.as_deref(),
            (ProfileLevel::NvmlOnly, Self::KaceLinear(_)) => None,
        }
    }

    /// Whether the model carries calibrated intervals (Rank's `cautious` reads them; a
    /// model without answers on its point): `member-ridge-gbt` fitted since intervals exist.
    pub fn has_intervals(&self) -> bool {
        match self {
            Self::MemberRidgeGbt(m) => m.intervals.is_some(),
            Self::KaceLinear(_) => false,
        }
    }

    /// The compiled pair scorer, for kinds that have one: Rank's fast path for pairs (see
    /// the module's header); [`Self::predict_pairs`] otherwise.
    pub fn pair_scorer(&self) -> Option<&PairScorer> {
        match self {
            Self::MemberRidgeGbt(m) => m.pair_scorer(),
            Self::KaceLinear(_) => None,
        }
    }

    /// Scores the pairs (target, candidate) for every candidate, as one batch: Rank's path
    /// for pairs where [`Self::pair_scorer`] has none (for `kace-linear`, the target's
    /// part once and one dot product per candidate).
    pub fn predict_pairs(&self, target: &Features, candidates: &[&Features]) -> Vec<SetPrediction> {
        match self {
            Self::MemberRidgeGbt(m) => m.predict_pairs(target, candidates),
            Self::KaceLinear(m) => m.predict_pairs(target, candidates),
        }
    }

    /// The linear part of the model: intercept and coefficients by feature name (for
    /// `member-ridge-gbt`, its ridge half; the trees are not shown).
    pub fn coefficients(&self) -> (f64, Vec<(String, f64)>) {
        match self {
            Self::MemberRidgeGbt(m) => (
                m.ridge_intercept,
                member::ridge_feature_names()
                    .into_iter()
                    .zip(m.ridge_coefficients.iter().copied())
                    .collect(),
            ),
            Self::KaceLinear(m) => (m.intercept, by_summed_feature(&m.coefficients)),
        }
    }

    /// The sum-level linear model of `member-ridge-gbt`'s crowded sets (intercept, then each
    /// summed feature's coefficient in raw units); `None` for `kace-linear` and for a model
    /// without one (fitted on pairs alone, or without the option).
    pub fn set_linear_coefficients(&self) -> Option<(f64, Vec<(String, f64)>)> {
        match self {
            Self::MemberRidgeGbt(m) => m
                .set_linear
                .as_ref()
                .map(|linear| (linear.intercept, by_summed_feature(&linear.coefficients))),
            Self::KaceLinear(_) => None,
        }
    }
}

/// Coefficients of a sum-level linear model, named by the summed feature they weigh.
fn by_summed_feature(coefficients: &[f64]) -> Vec<(String, f64)> {
    FEATURE_NAMES
        .iter()
        .map(|n| n.to_string())
        .zip(coefficients.iter().copied())
        .collect()
}

/// Fits `member-ridge-gbt` with other options (the candidates `coloc eval` compares).
pub fn fit_member(rows: &[TrainingRow], options: MemberOptions) -> Result<ModelParams, FitError> {
    if rows.len() < MIN_TRAINING_ROWS {
        return Err(FitError::TooFewObservations {
            have: rows.len(),
            need: MIN_TRAINING_ROWS,
        });
    }
    Ok(ModelParams::MemberRidgeGbt(MemberRidgeGbt::fit_with(
        rows, options,
    )?))
}

/// `member-ridge-gbt` with the served options of `level` fitted once on `rows`, then its intervals
/// calibrated on `rows` each way of `calibrations` (the held-out runs of each way of folding
/// computed once), one model per way: for `coloc eval nway --coverage`, which compares
/// them. No seen bands.
pub fn fit_calibrated_each(
    rows: &[TrainingRow],
    calibrations: &[intervals::Calibration],
    level: ProfileLevel,
) -> Result<Vec<ModelParams>, FitError> {
    let options = MemberOptions::at(level);
    let point = MemberRidgeGbt::fit_with(rows, options)?;
    Ok(MemberRidgeGbt::calibrate(rows, options, calibrations)?
        .into_iter()
        .map(|intervals| {
            let mut model = point.clone();
            model.intervals = intervals;
            ModelParams::MemberRidgeGbt(model)
        })
        .collect())
}

/// Fits a model of `kind` as [`fit`] does, without what only a served model needs (the
/// intervals' calibration, five more fits; the in-sample figures): the same point
/// predictions, for cross-validation and `coloc eval`.
pub fn fit_point(kind: ModelKind, rows: &[TrainingRow]) -> Result<ModelParams, FitError> {
    fit_point_at(kind, rows, ProfileLevel::Full)
}

/// [`fit_point`] with the served options of `level` ([`MemberOptions::at`]): what the
/// twin's point predictions are when `rows` hold NVML-only profiles.
pub fn fit_point_at(
    kind: ModelKind,
    rows: &[TrainingRow],
    level: ProfileLevel,
) -> Result<ModelParams, FitError> {
    match kind {
        ModelKind::MemberRidgeGbt => fit_member(rows, MemberOptions::at(level)),
        ModelKind::KaceLinear => {
            if rows.len() < MIN_TRAINING_ROWS {
                return Err(FitError::TooFewObservations {
                    have: rows.len(),
                    need: MIN_TRAINING_ROWS,
                });
            }
            Ok(ModelParams::KaceLinear(KaceLinear::fit(rows)?))
        }
    }
}

/// Fits a model of `kind` on `rows` and measures it in-sample. CPU-bound: call it off the
/// async threads.
pub fn fit(kind: ModelKind, rows: &[TrainingRow]) -> Result<(ModelParams, FitMetrics), FitError> {
    fit_with_options(kind, rows, MemberOptions::CHOSEN)
}

/// [`fit`], `member-ridge-gbt` with `options` instead of the chosen ones (`kace-linear` has
/// none): for experiments that serve another form of the default, as `coloc simulate
/// --law-blend` does.
pub fn fit_with_options(
    kind: ModelKind,
    rows: &[TrainingRow],
    options: MemberOptions,
) -> Result<(ModelParams, FitMetrics), FitError> {
    if rows.len() < MIN_TRAINING_ROWS {
        return Err(FitError::TooFewObservations {
            have: rows.len(),
            need: MIN_TRAINING_ROWS,
        });
    }
    let params = match kind {
        ModelKind::MemberRidgeGbt => {
            ModelParams::MemberRidgeGbt(MemberRidgeGbt::fit_calibrated(rows, options)?)
        }
        ModelKind::KaceLinear => ModelParams::KaceLinear(KaceLinear::fit(rows)?),
    };
    let metrics = evaluate(&params, rows);
    Ok((params, metrics))
}

/// R² and MSE of the predicted throughput sum over `rows`.
pub fn evaluate(params: &ModelParams, rows: &[TrainingRow]) -> FitMetrics {
    let n = rows.len() as f64;
    let labels: Vec<f64> = rows.iter().map(TrainingRow::throughput_sum).collect();
    let mean = labels.iter().sum::<f64>() / n;
    // In chunks on the caller's threads (a large store has a million runs), summed in
    // order afterwards, so the figures do not depend on the number of threads.
    let predicted: Vec<f64> = {
        use rayon::prelude::*;
        rows.par_chunks(4_096)
            .map(|chunk| match params {
                ModelParams::MemberRidgeGbt(m) => m.predict_sums(chunk),
                ModelParams::KaceLinear(m) => chunk
                    .iter()
                    .map(|row| m.predict_set(&row.members.iter().collect::<Vec<_>>()).sum)
                    .collect(),
            })
            .flatten_iter()
            .collect()
    };
    let mut residual = 0.0;
    let mut total = 0.0;
    for (predicted, label) in predicted.iter().zip(&labels) {
        residual += (label - predicted).powi(2);
        total += (label - mean).powi(2);
    }
    FitMetrics {
        observations: rows.len(),
        r2: if total > 0.0 {
            1.0 - residual / total
        } else {
            0.0
        },
        mse: residual / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitting_needs_a_minimum_number_of_rows() {
        let rows = vec![
            TrainingRow {
                members: vec![Features::default(); 2],
                throughputs: vec![1.0, 1.0]
            };
            MIN_TRAINING_ROWS - 1
        ];
        assert_eq!(
            fit(ModelKind::KaceLinear, &rows).unwrap_err(),
            FitError::TooFewObservations {
                have: MIN_TRAINING_ROWS - 1,
                need: MIN_TRAINING_ROWS
            }
        );
    }

    #[test]
    fn parameters_round_trip_through_json_with_their_kind() {
        let params = ModelParams::KaceLinear(KaceLinear {
            intercept: 1.5,
            coefficients: vec![0.25; 10],
        });
        let json = serde_json::to_string(&params).unwrap();
        assert!(json.contains("\"kind\":\"kace-linear\""), "{json}");
        assert_eq!(serde_json::from_str::<ModelParams>(&json).unwrap(), params);
    }

    #[test]
    fn evaluate_reports_perfect_r2_for_an_exact_model_and_mse_for_an_offset() {
        let linear = |intercept: f64| {
            let mut coefficients = vec![0.0; 10];
            coefficients[6] = 1.0;
            ModelParams::KaceLinear(KaceLinear {
                intercept,
                coefficients,
            })
        };
        let rows: Vec<TrainingRow> = (1..=4)
            .map(|i| {
                let mut f = Features::default();
                f.0[6] = i as f64;
                TrainingRow {
                    members: vec![f, f],
                    throughputs: vec![i as f64, i as f64],
                }
            })
            .collect();
        let m = evaluate(&linear(0.0), &rows);
        assert_eq!((m.r2, m.mse), (1.0, 0.0));
        assert_eq!(evaluate(&linear(2.0), &rows).mse, 4.0);
    }
}
