//! Uncertainty on a prediction: split-conformal intervals from held-out residuals, by set
//! size. A residual is ln(actual / predicted), for each member's throughput and for the
//! set's sum; the interval of a new prediction is the prediction times e^q for the lower
//! and upper conformal quantiles of the residuals of runs of its size (2, 3, 4 or more
//! members; a size without residuals borrows the nearest size that has them). A band may
//! be scaled (normalized split-conformal): its quantiles are of the residual divided by
//! (floor + the prediction's difficulty), and a prediction's interval is e^(q (floor +
//! difficulty)) around it. Residuals must come from runs the model did not fit:
//! [`held_out`] gets them by k-fold.

use serde::{Deserialize, Serialize};

use super::{Features, FitError, ModelParams, SetPrediction, TrainingRow};

/// The central 80 %: the 10th and 90th percentiles.
pub const LOWER: f64 = 0.1;
pub const UPPER: f64 = 0.9;
/// Folds of the profile folds (pairs always; crowded bands with [`Folds::Profiles`]).
pub const FOLDS: usize = 5;
/// Folds at most of [`Folds::ProfileOut`]: one profile per fold up to this many profiles.
pub const PROFILE_OUT_FOLDS: usize = 20;

/// The fewest held-out runs a band is calibrated from: with n runs the conformal quantiles
/// are the floor((n + 1) x 0.1)-th and ceil((n + 1) x 0.9)-th smallest residuals, which
/// exist only from n = 9 on (below, the 80 % interval would be unbounded; reading the
/// smallest and largest residual instead, as before, gave an "80 %" band from three runs).
/// A size with fewer borrows the nearest size that has a band, as a size with none does.
pub const MIN_BAND_RUNS: usize = 9;

/// The fewest held-out runs a band of three or more members of a model `Train` fits is
/// kept from ([`Intervals::with_crowded_bands_from_at_least`]): 100, so that its 10 %
/// quantile is at least the 10th smallest residual (floor(101 x 0.1) = 10) rather than
/// the smallest of a handful. Found by the learning service of the cluster simulation: the
/// crowded runs a service holds early are the few sets its own placements made, and a
/// retrained model's band of three from 17 of them read its low end at e^-0.18 of the
/// prediction where its band of two read e^-0.52 (README, "N-way", "Seen bands in a model
/// that learned from a few crowded runs"). A crowded size with fewer borrows the nearest
/// band, the pairs' where there is no other. Every KACE-sized training holds hundreds.
pub const MIN_CROWDED_BAND_RUNS: usize = 100;

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
    /// When set, the quantiles are of residual / (floor + difficulty), and an interval
    /// multiplies them by the prediction's (floor + difficulty); `None`: plain residuals
    /// (every band of models stored before scaled bands existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<f64>,
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

/// Bands for sets of workloads the model was trained on. The model's [`Intervals`] are
/// calibrated on workloads held out (folds of whole profiles), which is the error on a new
/// workload and far wider than the error on a new set of known ones (trained on pairs and
/// crowded runs, the cluster simulation found 1.9-3.3 % of crowded members below the low
/// end where 10 % belong; README, "N-way", "Seen bands"). These bands come from sets held
/// out at random instead (five folds of whole sets, so that no held-out run has a copy in
/// its training), each scored only if its members are known to its fold's training: a
/// pair's both members in any training run, a crowded set's every member in a crowded
/// training run. `Train` calibrates them only for a model trained on no crowded run or on
/// at least 110 (`member::SET_LINEAR_MIN_SETS`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeenBands {
    /// As [`Intervals::bands`], plain quantiles. A size without its own band here is
    /// answered by the model's [`Intervals`] (never borrowed: a band of 3 says nothing of
    /// 4).
    pub intervals: Intervals,
    /// Sorted, distinct [`Features::fingerprint`]s of every profile in a training run
    /// (what the band of two covers; empty without one).
    #[serde(default)]
    pub profiles: Vec<u64>,
    /// The same of every profile in a crowded training run (what the bands of three and
    /// more cover; empty without them).
    #[serde(default)]
    pub crowded_profiles: Vec<u64>,
}

/// The folds of [`SeenBands::folds`]: each fold's held-out rows, and per fold which rows
/// it scores (by row index).
#[derive(Debug, Clone, PartialEq)]
pub struct SeenFolds {
    pub folds: Vec<Vec<usize>>,
    pub scored: Vec<Vec<bool>>,
}

/// Sorted, distinct fingerprints of the members of every row of `rows`, and of the rows of
/// three or more members: one pass, each member hashed once.
fn fingerprints(rows: &[TrainingRow]) -> (Vec<u64>, Vec<u64>) {
    let (mut all, mut crowded) = (Vec::new(), Vec::new());
    for row in rows {
        let start = all.len();
        all.extend(row.members.iter().map(Features::fingerprint));
        if row.members.len() >= 3 {
            crowded.extend_from_slice(&all[start..]);
        }
    }
    for prints in [&mut all, &mut crowded] {
        prints.sort_unstable();
        prints.dedup();
    }
    (all, crowded)
}

impl SeenBands {
    /// The interval of `prediction` for the set `members` when this covers it: every
    /// member known (see the fields) and a band of the set's own size.
    pub fn apply(&self, members: &[&Features], prediction: &SetPrediction) -> Option<SetInterval> {
        let known = if members.len() >= 3 {
            &self.crowded_profiles
        } else {
            &self.profiles
        };
        if members.len() < 2
            || !members
                .iter()
                .all(|m| known.binary_search(&m.fingerprint()).is_ok())
        {
            return None;
        }
        self.intervals.apply_own(members.len(), prediction)
    }

    /// Without the band of two (the seen bands before they covered pairs, for comparison:
    /// `coloc simulate --seen-bands crowded`).
    pub fn crowded_only(mut self) -> Option<Self> {
        self.intervals.bands[0] = None;
        self.profiles.clear();
        self.intervals
            .bands
            .iter()
            .any(Option::is_some)
            .then_some(self)
    }

    /// The folds that calibrate seen bands on `rows`: [`set_folds`], each with the rows it
    /// scores (by row index: pairs whose both members are in a row outside the fold,
    /// crowded runs whose every member is in a crowded run outside the fold). `None` when
    /// no size would have its band's fewest scored runs ([`MIN_BAND_RUNS`] for pairs,
    /// [`MIN_CROWDED_BAND_RUNS`] for three and more), so that nothing is refitted for
    /// bands that cannot exist (a store of many workloads, each in few runs, is
    /// calibrated at no cost).
    pub fn folds(rows: &[TrainingRow]) -> Option<SeenFolds> {
        let crowded = |r: &TrainingRow| r.members.len() >= 3;
        let prints: Vec<Vec<u64>> = rows
            .iter()
            .map(|r| r.members.iter().map(Features::fingerprint).collect())
            .collect();
        let folds = set_folds_of(&prints);
        let mut scored_by_fold = Vec::with_capacity(folds.len());
        let mut scored_by_band = [0usize; BANDS];
        for fold in &folds {
            let mut in_fold = vec![false; rows.len()];
            for &i in fold {
                in_fold[i] = true;
            }
            let mut seen = std::collections::HashSet::new();
            let mut seen_crowded = std::collections::HashSet::new();
            for i in (0..rows.len()).filter(|&i| !in_fold[i]) {
                seen.extend(prints[i].iter().copied());
                if crowded(&rows[i]) {
                    seen_crowded.extend(prints[i].iter().copied());
                }
            }
            let mut scored = vec![false; rows.len()];
            for &i in fold {
                let known = if crowded(&rows[i]) {
                    &seen_crowded
                } else {
                    &seen
                };
                if rows[i].members.len() >= 2 && prints[i].iter().all(|p| known.contains(p)) {
                    scored[i] = true;
                    scored_by_band[band(rows[i].members.len())] += 1;
                }
            }
            scored_by_fold.push(scored);
        }
        (scored_by_band[0] >= MIN_BAND_RUNS
            || scored_by_band[1..]
                .iter()
                .any(|&n| n >= MIN_CROWDED_BAND_RUNS))
        .then_some(SeenFolds {
            folds,
            scored: scored_by_fold,
        })
    }

    /// Seen bands from the held-out runs that [`Self::folds`] scored, covering the
    /// profiles of `rows` (the model's training); `None` without a band.
    pub fn calibrate<'a>(
        held_out: impl IntoIterator<Item = &'a HeldOut>,
        rows: &[TrainingRow],
    ) -> Option<Self> {
        let intervals =
            Intervals::calibrate(held_out).with_crowded_bands_from_at_least(MIN_CROWDED_BAND_RUNS);
        let pairs = intervals.bands[0].is_some();
        let crowded = intervals.bands[1..].iter().any(Option::is_some);
        (pairs || crowded).then(|| {
            let (mut profiles, mut crowded_profiles) = fingerprints(rows);
            if !pairs {
                profiles = Vec::new();
            }
            if !crowded {
                crowded_profiles = Vec::new();
            }
            Self {
                intervals,
                profiles,
                crowded_profiles,
            }
        })
    }
}

/// Which held-out runs calibrate the crowded bands (3 and 4 or more members).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folds {
    /// [`FOLDS`] folds of whole profiles (profile rank mod [`FOLDS`]); the pairs' folds.
    Profiles,
    /// One fold per profile (rank mod [`PROFILE_OUT_FOLDS`]).
    ProfileOut,
}

/// The crowded bands' score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// The log residual.
    Plain,
    /// The log residual / (this floor + the difficulty).
    Fixed(f64),
    /// The log residual / (the median difficulty of the band's held-out runs + the
    /// difficulty); plain where that median is 0 (a model without the set-level part).
    Median,
}

/// How a model's intervals are calibrated. Pairs always use [`Folds::Profiles`] and plain
/// residuals; the choice concerns the crowded bands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The folds whose held-out runs calibrate the crowded bands (their member quantiles,
    /// and their sum quantiles unless `sums` names other folds).
    pub folds: Folds,
    pub scale: Scale,
    /// The folds whose held-out runs calibrate the crowded bands' sum quantiles, where they
    /// differ from `folds` (plain residuals only: a member and a sum quantile are computed
    /// apart, so each may come from the folding that matches its own error).
    pub sums: Option<Folds>,
}

impl Calibration {
    /// What `Train` calibrates with: chosen by the rule fixed before comparing (README,
    /// "N-way", "Intervals").
    pub const CHOSEN: Calibration = CANDIDATES[5].1;

    /// The folds of the crowded bands' sum quantiles.
    pub fn sum_folds(&self) -> Folds {
        self.sums.unwrap_or(self.folds)
    }

    /// Whether any of the crowded bands' quantiles come from `folds`.
    pub fn uses(&self, folds: Folds) -> bool {
        self.folds == folds || self.sum_folds() == folds
    }
}

/// The calibrations `coloc eval nway --coverage --candidates` compares (README, "N-way").
pub const CANDIDATES: [(&str, Calibration); 6] = [
    (
        "profile-folds",
        Calibration {
            folds: Folds::Profiles,
            scale: Scale::Plain,
            sums: None,
        },
    ),
    (
        "profile-folds, scaled 0.1",
        Calibration {
            folds: Folds::Profiles,
            scale: Scale::Fixed(0.1),
            sums: None,
        },
    ),
    (
        "profile-folds, scaled median",
        Calibration {
            folds: Folds::Profiles,
            scale: Scale::Median,
            sums: None,
        },
    ),
    (
        "profile-out",
        Calibration {
            folds: Folds::ProfileOut,
            scale: Scale::Plain,
            sums: None,
        },
    ),
    (
        "profile-out, scaled 0.1",
        Calibration {
            folds: Folds::ProfileOut,
            scale: Scale::Fixed(0.1),
            sums: None,
        },
    ),
    (
        "profile-out members, profile-folds sums",
        Calibration {
            folds: Folds::ProfileOut,
            scale: Scale::Plain,
            sums: Some(Folds::Profiles),
        },
    ),
];

/// One held-out run: what happened, what a model that did not fit it predicted, and the
/// prediction's difficulty ([`super::MemberRidgeGbt::difficulty`]; 0 for other kinds).
#[derive(Debug, Clone)]
pub struct HeldOut {
    pub throughputs: Vec<f64>,
    pub prediction: SetPrediction,
    pub difficulty: f64,
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

/// The lower median: the ceil(n / 2)-th smallest (`None` for no values).
fn lower_median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (n > 0).then(|| values[n.div_ceil(2) - 1])
}

fn log_residual(actual: f64, predicted: f64) -> Option<f64> {
    (actual > 0.0 && predicted > 0.0).then(|| (actual / predicted).ln())
}

impl Intervals {
    /// Calibrates every band from held-out runs, with plain residuals.
    pub fn calibrate<'a>(held_out: impl IntoIterator<Item = &'a HeldOut>) -> Self {
        Self::calibrate_scaled(held_out, Scale::Plain)
    }

    /// Calibrates every band from held-out runs; the crowded bands (3 and 4 or more) with
    /// `scale`, the pairs' plain.
    pub fn calibrate_scaled<'a>(
        held_out: impl IntoIterator<Item = &'a HeldOut>,
        scale: Scale,
    ) -> Self {
        Self::calibrate_scaled_at(held_out, scale, (LOWER, UPPER))
    }

    /// Every band from held-out runs, plain, at the quantiles `levels` (lower, upper)
    /// instead of 10 % and 90 %: for experiments with other intervals (`coloc simulate
    /// --bands held-out-runs-95`). A band needs as many runs as both ranks need.
    pub fn calibrate_at<'a>(
        held_out: impl IntoIterator<Item = &'a HeldOut>,
        levels: (f64, f64),
    ) -> Self {
        Self::calibrate_scaled_at(held_out, Scale::Plain, levels)
    }

    /// [`Self::calibrate_scaled`] at the quantiles `levels`.
    fn calibrate_scaled_at<'a>(
        held_out: impl IntoIterator<Item = &'a HeldOut>,
        scale: Scale,
        levels: (f64, f64),
    ) -> Self {
        let mut by_band: Vec<Vec<&HeldOut>> = vec![Vec::new(); BANDS];
        for h in held_out {
            by_band[band(h.throughputs.len())].push(h);
        }
        let bands = by_band
            .iter()
            .enumerate()
            .map(|(b, runs)| {
                let floor = match (b, scale) {
                    (0, _) | (_, Scale::Plain) => None,
                    (_, Scale::Fixed(floor)) => Some(floor),
                    (_, Scale::Median) => lower_median(runs.iter().map(|h| h.difficulty).collect())
                        .filter(|m| *m > 0.0),
                };
                calibrate_band(runs, floor, levels)
            })
            .collect();
        Self { bands }
    }

    /// `self` without the crowded bands calibrated from fewer than `runs` held-out runs
    /// (those sizes borrow the nearest band left).
    pub fn with_crowded_bands_from_at_least(mut self, runs: usize) -> Self {
        for slot in self.bands.iter_mut().skip(1) {
            if slot.is_some_and(|band| band.runs < runs) {
                *slot = None;
            }
        }
        self
    }

    /// The bands of `self` for pairs and of `crowded` for 3 and more members.
    pub fn with_crowded_from(mut self, crowded: Intervals) -> Self {
        for (b, band) in crowded.bands.into_iter().enumerate().skip(1) {
            if let Some(slot) = self.bands.get_mut(b) {
                *slot = band;
            }
        }
        self
    }

    /// `self` with the sum quantiles of each crowded band taken from `sums`'s band of the
    /// same size, where it has one with the same floor (a band's sum and member quantiles
    /// are read with one floor; a band whose floor differs keeps its own sums).
    pub fn with_crowded_sums_from(mut self, sums: &Intervals) -> Self {
        for (b, slot) in self.bands.iter_mut().enumerate().skip(1) {
            if let (Some(own), Some(Some(other))) = (slot.as_mut(), sums.bands.get(b)) {
                if own.floor == other.floor {
                    own.sum = other.sum;
                }
            }
        }
        self
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

    /// The interval from the band of the set size itself, plain (no borrowing from a
    /// neighbour, no difficulty); `None` without one.
    fn apply_own(&self, size: usize, prediction: &SetPrediction) -> Option<SetInterval> {
        let band = self.bands.get(band(size))?.as_ref()?;
        self.apply_band(band, 1.0, prediction)
    }

    /// Whether the interval of a set of `size` members reads the prediction's difficulty.
    pub fn needs_difficulty(&self, size: usize) -> bool {
        self.band(size).is_some_and(|b| b.floor.is_some())
    }

    /// The interval of `prediction` for a set of `size` members, whose difficulty is
    /// `difficulty` (read only by scaled bands).
    pub fn apply(
        &self,
        size: usize,
        prediction: &SetPrediction,
        difficulty: f64,
    ) -> Option<SetInterval> {
        let band = self.band(size)?;
        let width = band.floor.map_or(1.0, |floor| floor + difficulty);
        self.apply_band(band, width, prediction)
    }

    /// `prediction` times e^(q x width) for the band's quantiles q.
    fn apply_band(
        &self,
        band: &Band,
        width: f64,
        prediction: &SetPrediction,
    ) -> Option<SetInterval> {
        let scale = |value: f64, (lo, hi): (f64, f64)| {
            (value * (lo * width).exp(), value * (hi * width).exp())
        };
        Some(SetInterval {
            sum: scale(prediction.sum, band.sum),
            members: match (&prediction.members, band.member) {
                (Some(members), Some(q)) => Some(members.iter().map(|m| scale(*m, q)).collect()),
                _ => None,
            },
        })
    }
}

/// One band from its held-out runs: the quantiles of the log residuals, each divided by
/// (floor + the run's difficulty) when `floor` is set; `None` with fewer than
/// [`MIN_BAND_RUNS`] sum residuals.
fn calibrate_band(runs: &[&HeldOut], floor: Option<f64>, levels: (f64, f64)) -> Option<Band> {
    let (lower, upper) = levels;
    // The fewest runs for which the lower rank floor((n + 1) lower) is at least 1 (and the
    // upper rank at most n, for symmetric levels): MIN_BAND_RUNS at 10 % and 90 %.
    let min_runs = (((1.0 / lower).ceil() as usize).saturating_sub(1)).max(MIN_BAND_RUNS);
    let mut members = Vec::new();
    let mut sums = Vec::new();
    for h in runs {
        let width = floor.map_or(1.0, |floor| floor + h.difficulty);
        let actual_sum: f64 = h.throughputs.iter().sum();
        if let Some(r) = log_residual(actual_sum, h.prediction.sum) {
            sums.push(r / width);
        }
        if let Some(predicted) = &h.prediction.members {
            members.extend(
                h.throughputs
                    .iter()
                    .zip(predicted)
                    .filter_map(|(a, p)| log_residual(*a, *p))
                    .map(|r| r / width),
            );
        }
    }
    (sums.len() >= min_runs).then(|| Band {
        runs: runs.len(),
        member: (!members.is_empty()).then(|| {
            (
                conformal(&mut members, lower, false),
                conformal(&mut members, upper, true),
            )
        }),
        sum: (
            conformal(&mut sums, lower, false),
            conformal(&mut sums, upper, true),
        ),
        floor,
    })
}

/// The held-out runs of the procedure `fit` on `rows` by cross-validation over the given
/// folds (each the indices of its held-out rows; the model is fitted on the rest): every
/// prediction comes from a model that did not see the row. Folds should hold out what the
/// answers will face: leaving whole workloads out when the intervals serve workloads the
/// model has not seen ([`folds_by_group`]), random folds otherwise ([`k_folds`]).
pub fn held_out(
    rows: &[TrainingRow],
    folds: &[Vec<usize>],
    fit: impl Fn(&[TrainingRow]) -> Result<ModelParams, FitError>,
) -> Result<Vec<HeldOut>, FitError> {
    let mut held_out = Vec::with_capacity(rows.len());
    for test in folds {
        held_out.extend(fold_held_out(rows, test, &|_| true, &fit)?);
    }
    Ok(held_out)
}

/// [`held_out`] with each fold refitted as its own task on the caller's rayon pool (many
/// small folds fill the cores that other work leaves idle); the runs come back in the same
/// order, with the same bits.
pub fn held_out_in_parallel(
    rows: &[TrainingRow],
    folds: &[Vec<usize>],
    fit: impl Fn(&[TrainingRow]) -> Result<ModelParams, FitError> + Sync,
) -> Result<Vec<HeldOut>, FitError> {
    held_out_scored_in_parallel(rows, folds, |_, _| true, fit)
}

/// [`held_out_in_parallel`], predicting only the held-out rows that `scored(fold, row)`
/// accepts (every row of a fold is still left out of its training).
pub fn held_out_scored_in_parallel(
    rows: &[TrainingRow],
    folds: &[Vec<usize>],
    scored: impl Fn(usize, usize) -> bool + Sync,
    fit: impl Fn(&[TrainingRow]) -> Result<ModelParams, FitError> + Sync,
) -> Result<Vec<HeldOut>, FitError> {
    use rayon::prelude::*;
    let per_fold: Vec<Vec<HeldOut>> = folds
        .par_iter()
        .enumerate()
        .map(|(f, test)| fold_held_out(rows, test, &|i| scored(f, i), &fit))
        .collect::<Result<_, _>>()?;
    Ok(per_fold.into_iter().flatten().collect())
}

/// The held-out runs of one fold: `fit` on every row not in `test`, predicting the rows of
/// `test` that `scored` accepts (none when too few rows are left to fit).
fn fold_held_out(
    rows: &[TrainingRow],
    test: &[usize],
    scored: &(dyn Fn(usize) -> bool + Sync),
    fit: &impl Fn(&[TrainingRow]) -> Result<ModelParams, FitError>,
) -> Result<Vec<HeldOut>, FitError> {
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
        return Ok(Vec::new());
    }
    let params = fit(&train)?;
    Ok(test
        .iter()
        .filter(|&&i| scored(i))
        .map(|&i| {
            let members: Vec<&Features> = rows[i].members.iter().collect();
            let (prediction, difficulty) = params.predict_set_with_difficulty(&members);
            HeldOut {
                throughputs: rows[i].throughputs.clone(),
                prediction,
                difficulty,
            }
        })
        .collect())
}

/// [`FOLDS`] folds of whole sets: every run of one multiset of profiles (by their exact
/// metrics) in the fold of the set's first-seen rank mod [`FOLDS`]. A set measured again
/// must not be scored by a model that fitted its other copy: its error is that of a known
/// set, far narrower than a new set's.
pub fn set_folds(rows: &[TrainingRow]) -> Vec<Vec<usize>> {
    let prints: Vec<Vec<u64>> = rows
        .iter()
        .map(|r| r.members.iter().map(Features::fingerprint).collect())
        .collect();
    set_folds_of(&prints)
}

/// [`set_folds`] of rows given by their members' fingerprints.
fn set_folds_of(prints: &[Vec<u64>]) -> Vec<Vec<usize>> {
    let mut sets: std::collections::HashMap<Vec<u64>, usize> = Default::default();
    let mut folds = vec![Vec::new(); FOLDS];
    for (i, row) in prints.iter().enumerate() {
        let mut key = row.clone();
        key.sort_unstable();
        let next = sets.len();
        let rank = *sets.entry(key).or_insert(next);
        folds[rank % FOLDS].push(i);
    }
    folds
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
        assert!(
            (members[0].0 - 8.0 * 0.6).abs() < 1e-9 && (members[1].1 - 12.0 * 2.2).abs() < 1e-9
        );
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
}
