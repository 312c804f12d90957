//! Seen bands: intervals for sets of workloads the model was trained on, calibrated on
//! sets held out at random rather than on held-out profiles.

use serde::{Deserialize, Serialize};

use super::{
    band, folds::set_folds_of, HeldOut, Intervals, SetInterval, BANDS, MIN_BAND_RUNS,
    MIN_CROWDED_BAND_RUNS,
};
use crate::model::{Features, SetPrediction, TrainingRow};

/// Bands for sets of workloads the model was trained on. The model's [`Intervals`] are
/// calibrated on workloads held out (folds of whole profiles), which is the error on a new
/// workload and far wider than the error on a new set of known ones (trained on pairs and
/// crowded runs, the cluster simulation found 1.9-3.3 % of crowded members below the low
/// end where 10 % belong; docs/nway.md, "Seen bands"). These bands come from sets held
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
pub(crate) struct SeenFolds {
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

    /// Only the band of two (every band of three and more dropped): the seen bands of a
    /// model trained on 1 to 109 crowded runs, which learned crowded sets from a few runs
    /// but pairs as every model does (docs/decisions/035-measured-low-ends.md). `None`
    /// without a band of two.
    pub fn pairs_only(mut self) -> Option<Self> {
        for band in self.intervals.bands.iter_mut().skip(1) {
            *band = None;
        }
        self.crowded_profiles.clear();
        self.intervals.bands[0].is_some().then_some(self)
    }

    /// The folds that calibrate seen bands on `rows`: [`set_folds`], each with the rows it
    /// scores (by row index: pairs whose both members are in a row outside the fold,
    /// crowded runs whose every member is in a crowded run outside the fold). `None` when
    /// no size would have its band's fewest scored runs ([`MIN_BAND_RUNS`] for pairs,
    /// [`MIN_CROWDED_BAND_RUNS`] for three and more), so that nothing is refitted for
    /// bands that cannot exist (a store of many workloads, each in few runs, is
    /// calibrated at no cost).
    pub(crate) fn folds(rows: &[TrainingRow]) -> Option<SeenFolds> {
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
    pub(crate) fn calibrate<'a>(
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
