//! The intervals of `member-ridge-gbt`: what `Train` fits (the point model, then its
//! intervals calibrated on held-out profiles and its seen bands on held-out sets), and the
//! interval of one of its predictions.

use super::{MemberRidgeGbt, SET_LINEAR_MIN_SETS};
use crate::model::{
    intervals::{self, Calibration, Intervals, MeasuredSets, SeenBands, SetInterval},
    member_terms::MemberOptions,
    Features, FitError, ModelParams, SetPrediction, TrainingRow, NUM_FEATURES,
};

impl MemberRidgeGbt {
    /// Fits both learners on one row per member of every training set.
    /// What `Train` fits: the chosen options, with calibrated intervals.
    #[cfg(test)]
    pub(super) fn fit(rows: &[TrainingRow]) -> Result<Self, FitError> {
        Self::fit_calibrated(rows, MemberOptions::CHOSEN)
    }

    /// Fits with `options`, and calibrates the model's intervals as [`Self::calibrate`]
    /// does with [`Calibration::CHOSEN`].
    ///
    /// One after the other, not side by side: on a large store the fit's matrices are most
    /// of the memory, and the calibration's refits would add to them.
    ///
    /// Then the NVML-only twin ([`Self::nvml_twin`]): a fit and calibration of the same rows
    /// with every member's kernel metrics withheld (docs/decisions/031-nvml-only-twin.md),
    /// with the twin's own options ([`MemberOptions::TWIN`], decision 037) and calibration
    /// ([`Calibration::TWIN`], decision 040).
    /// A twin that cannot be fitted leaves the model without one (NVML-only profiles are
    /// then refused, as before twins existed).
    pub(crate) fn fit_calibrated(
        rows: &[TrainingRow],
        options: MemberOptions,
    ) -> Result<Self, FitError> {
        let mut model = Self::fit_calibrated_alone(rows, options, Calibration::CHOSEN)?;
        let withheld: Vec<TrainingRow> = rows.iter().map(TrainingRow::nvml_only).collect();
        model.nvml_twin =
            Self::fit_calibrated_alone(&withheld, MemberOptions::TWIN, Calibration::TWIN)
                .ok()
                .map(|twin| Box::new(ModelParams::MemberRidgeGbt(twin)));
        Ok(model)
    }

    /// [`Self::fit_calibrated`] without the twin, its intervals calibrated with
    /// `calibration`.
    fn fit_calibrated_alone(
        rows: &[TrainingRow],
        options: MemberOptions,
        calibration: Calibration,
    ) -> Result<Self, FitError> {
        let mut model = Self::fit_with(rows, options)?;
        model.intervals = Self::calibrate(rows, options, &[calibration])?
            .pop()
            .flatten();
        if model.intervals.is_none() {
            return Ok(model);
        }
        // Every seen band where the model learned crowded sets from none or from enough
        // (docs/decisions/013-seen-bands-after-few-crowded-runs.md); from a few, only the
        // band of two (docs/decisions/035-measured-low-ends.md).
        let crowded = rows.iter().filter(|r| r.members.len() >= 3).count();
        let seen = Self::calibrate_seen(rows, options)?;
        model.seen = if crowded == 0 || crowded >= SET_LINEAR_MIN_SETS {
            seen
        } else {
            seen.and_then(SeenBands::pairs_only)
        };
        model.measured = MeasuredSets::of(rows);
        Ok(model)
    }

    /// The seen bands of the model fitted with `options` on `rows` ([`SeenBands`]): five
    /// folds of whole sets of at most [`SEEN_CALIBRATION_ROWS`] rows (evenly strided), each
    /// fold's runs of known workloads scored by the model fitted on the other folds (each
    /// fold its own task on the caller's rayon pool). No refit at all when no size could
    /// reach its band's fewest scored runs.
    pub(super) fn calibrate_seen(
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
    pub(crate) fn calibrate(
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

    /// The interval of a prediction of this model for the set `members`, whose difficulty
    /// is `difficulty` (it came with the prediction): its seen band where [`SeenBands`]
    /// covers the set, else its band for the set's size; a set of its training runs with
    /// no low end above what the set was measured at ([`MeasuredSets`]).
    pub(crate) fn interval(
        &self,
        members: &[&Features],
        prediction: &SetPrediction,
        difficulty: f64,
    ) -> Option<SetInterval> {
        let mut interval = match self
            .seen
            .as_ref()
            .and_then(|s| s.apply(members, prediction))
        {
            Some(seen) => seen,
            None => self
                .intervals
                .as_ref()?
                .apply(members.len(), prediction, difficulty)?,
        };
        if let Some(measured) = &self.measured {
            measured.bound(members, &mut interval);
        }
        Some(interval)
    }
}

/// Rows that calibrate a model's intervals at most (the calibration refits the model
/// [`intervals::FOLDS`] times on them, and up to [`intervals::PROFILE_OUT_FOLDS`] more
/// times for [`intervals::Folds::ProfileOut`], on at most
/// [`PROFILE_OUT_CALIBRATION_ROWS`] of them).
const CALIBRATION_ROWS: usize = 20_000;

/// Rows the one-profile-per-fold refits of the crowded bands take at most, evenly strided
/// from the calibration's rows: so that their 20 refits fit as many rows in all as the
/// profile folds' 5 (20 x 5,000 = 5 x 20,000). Without it a store with crowded runs paid
/// 25 refits on 20,000 rows each, four times the calibration of a store of pairs. Every
/// store of KACE's size (hundreds of runs) is below it, so its intervals are unchanged.
const PROFILE_OUT_CALIBRATION_ROWS: usize =
    CALIBRATION_ROWS * intervals::FOLDS / intervals::PROFILE_OUT_FOLDS;

/// Rows the seen bands' five refits take at most, evenly strided from the training: as
/// many as each one-profile-per-fold refit, so a store with crowded runs of known
/// workloads pays five more small refits (every KACE-sized training is below it).
const SEEN_CALIBRATION_ROWS: usize = PROFILE_OUT_CALIBRATION_ROWS;

/// At most `at_most` of `rows`, evenly strided (every row when there are no more).
fn strided(rows: &[TrainingRow], at_most: usize) -> Vec<TrainingRow> {
    let stride = rows.len().div_ceil(at_most).max(1);
    rows.iter().step_by(stride).cloned().collect()
}

/// `folds` folds that hold out whole profiles: each distinct profile (by its exact
/// metrics) goes to fold (its rank in first-seen order) mod `folds`; a run is held out in
/// the fold of each of its members.
pub(super) fn profile_folds(rows: &[TrainingRow], folds: usize) -> Vec<Vec<usize>> {
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
