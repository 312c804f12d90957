//! Uncertainty on a prediction: split-conformal intervals from held-out residuals, by set
//! size. A residual is ln(actual / predicted), for each member's throughput and for the
//! set's sum; the interval of a new prediction is the prediction times e^q for the lower
//! and upper conformal quantiles of the residuals of runs of its size (2, 3, 4 or more
//! members; a size without residuals borrows the nearest size that has them). A band may
//! be scaled (normalized split-conformal): its quantiles are of the residual divided by
//! (floor + the prediction's difficulty), and a prediction's interval is e^(q (floor +
//! difficulty)) around it. Residuals must come from runs the model did not fit:
//! [`held_out`] gets them by k-fold.

//!
//! The folder: the bands and their calibration (here), the seen bands ([`seen`]), and the
//! held-out runs and their folds ([`folds`]).

mod folds;
mod measured;
mod seen;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use super::{ProfileLevel, SetPrediction};

pub(crate) use folds::{folds_by_group, held_out_in_parallel, held_out_scored_in_parallel};
pub use folds::{held_out, k_folds, set_folds};
pub use measured::{MeasuredSet, MeasuredSets};
pub use seen::SeenBands;

/// The central 80 %: the 10th and 90th percentiles.
pub const LOWER: f64 = 0.1;
pub const UPPER: f64 = 0.9;
/// Folds of the profile folds (pairs always; crowded bands with [`Folds::Profiles`]).
pub(crate) const FOLDS: usize = 5;
/// Folds at most of [`Folds::ProfileOut`]: one profile per fold up to this many profiles.
pub(crate) const PROFILE_OUT_FOLDS: usize = 20;

/// The fewest held-out runs a band is calibrated from: with n runs the conformal quantiles
/// are the floor((n + 1) x 0.1)-th and ceil((n + 1) x 0.9)-th smallest residuals, which
/// exist only from n = 9 on (below, the 80 % interval would be unbounded; reading the
/// smallest and largest residual instead, as before, gave an "80 %" band from three runs).
/// A size with fewer borrows the nearest size that has a band, as a size with none does.
pub(crate) const MIN_BAND_RUNS: usize = 9;

/// The fewest held-out runs a band of three or more members of a model `Train` fits is
/// kept from ([`Intervals::with_crowded_bands_from_at_least`]): 100, so that its 10 %
/// quantile is at least the 10th smallest residual (floor(101 x 0.1) = 10) rather than
/// the smallest of a handful. Found by the learning service of the cluster simulation: the
/// crowded runs a service holds early are the few sets its own placements made, and a
/// retrained model's band of three from 17 of them read its low end at e^-0.18 of the
/// prediction where its band of two read e^-0.52 (decision 013,
/// docs/decisions/013-seen-bands-after-few-crowded-runs.md). A crowded size with fewer
/// borrows the nearest band, the pairs' where there is no other. Every KACE-sized training holds hundreds.
pub(crate) const MIN_CROWDED_BAND_RUNS: usize = 100;

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
    /// What `Train` calibrates with, the served calibration: chosen by the rule fixed
    /// before comparing (docs/nway.md, "Intervals"), the candidate "profile-out members,
    /// profile-folds sums" of `coloc eval nway --coverage --candidates` (a test of the
    /// evaluation keeps the two equal).
    pub const CHOSEN: Calibration = Calibration {
        folds: Folds::ProfileOut,
        scale: Scale::Plain,
        sums: Some(Folds::Profiles),
    };

    /// What `Train` calibrates the NVML-only twin with: decision 038's nested rule, run on
    /// profiles withheld to NVML's, picks "profile-folds, scaled 0.1" on the 4-way file
    /// (docs/decisions/040-twin-calibration.md).
    pub const TWIN: Calibration = Calibration {
        folds: Folds::Profiles,
        scale: Scale::Fixed(0.1),
        sums: None,
    };

    /// The served calibration of a model fitted on profiles of `level`.
    pub const fn at(level: ProfileLevel) -> Calibration {
        match level {
            ProfileLevel::Full => Self::CHOSEN,
            ProfileLevel::NvmlOnly => Self::TWIN,
        }
    }

    /// The folds of the crowded bands' sum quantiles.
    pub(crate) fn sum_folds(&self) -> Folds {
        self.sums.unwrap_or(self.folds)
    }

    /// Whether any of the crowded bands' quantiles come from `folds`.
    pub(crate) fn uses(&self, folds: Folds) -> bool {
        self.folds == folds || self.sum_folds() == folds
    }
}

/// One held-out run: what happened, what a model that did not fit it predicted, and the
/// prediction's difficulty ([`super::PredictedSet::difficulty`]).
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
    pub(crate) fn calibrate<'a>(held_out: impl IntoIterator<Item = &'a HeldOut>) -> Self {
        Self::calibrate_scaled(held_out, Scale::Plain)
    }

    /// Calibrates every band from held-out runs; the crowded bands (3 and 4 or more) with
    /// `scale`, the pairs' plain.
    pub(crate) fn calibrate_scaled<'a>(
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
    pub(crate) fn with_crowded_bands_from_at_least(mut self, runs: usize) -> Self {
        for slot in self.bands.iter_mut().skip(1) {
            if slot.is_some_and(|band| band.runs < runs) {
                *slot = None;
            }
        }
        self
    }

    /// The bands of `self` for pairs and of `crowded` for 3 and more members.
    pub(crate) fn with_crowded_from(mut self, crowded: Intervals) -> Self {
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
    pub(crate) fn with_crowded_sums_from(mut self, sums: &Intervals) -> Self {
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

    /// Whether the interval of a set of `size` members reads the prediction's difficulty
    /// (what the tests check a scaled band by).
    #[cfg(test)]
    pub(crate) fn needs_difficulty(&self, size: usize) -> bool {
        self.band(size).is_some_and(|b| b.floor.is_some())
    }

    /// The interval of `prediction` for a set of `size` members, whose difficulty is
    /// `difficulty` (read only by scaled bands).
    pub(crate) fn apply(
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
