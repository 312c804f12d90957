//! The one prediction of a set's members, shared by Predict, Rank, Place (and through it the
//! scheduler extender and the cluster simulation): the serving model's prediction, members
//! estimated from the sum where the model predicts only sums, and the physical bound that a
//! co-runner never makes a job faster than it runs alone.
//!
//! The bound: a member's predicted throughput in a set is the lowest the model predicts for
//! it in any subset of that set that contains it, and alone it runs at its exclusive
//! throughput, so no member is ever predicted above its exclusive throughput (a pair's
//! members are `min(model, exclusive)`: [`bounded_pair`]). Measurements are noisier than
//! that: two copies of one workload measured side by side differ by up to
//! [`EXCLUSIVE_NOISE_MARGIN`], and only a measured run above its exclusive throughput beyond
//! that margin says something about the profile (docs/decisions/021-one-prediction-one-policy.md).
//!
//! The cautious reading of a set's intervals is here too ([`cautious_bounds`]): a member
//! predicted above its bound has its low end widened by that overshoot, and a set with
//! several members no run has shown has its intervals widened (decision 025).
//!
//! A pair is scored with the asking job first (Rank's target, Place's job, Predict's first
//! workload): the pair scorer is not symmetric to the last bit, so every caller asks it the
//! same way round. A pair of residents is scored lower table position first.

use super::{GpuProfiles, ProfileEntry};
use crate::{
    model::{
        intervals::SetInterval, split_by_exclusive, Features, ModelParams, ProfileLevel,
        SetPrediction,
    },
    store::StoredModel,
};

/// The level a set of entries is answered at: NVML-only as soon as one member is
/// (docs/decisions/031-nvml-only-twin.md).
pub(super) fn level_of(entries: &[&ProfileEntry]) -> ProfileLevel {
    ProfileLevel::of_set(entries.iter().map(|e| e.nvml_only))
}

/// Whether `model` can answer for sets with `entry`: every full profile, and an NVML-only
/// one where the model has an NVML-only twin. Rank, Predict and Place refuse the others
/// as not profiled with kernel metrics, before anything is predicted.
pub(super) fn answerable(model: &StoredModel, entry: &ProfileEntry) -> bool {
    !entry.nvml_only || model.params.at_level(ProfileLevel::NvmlOnly).is_some()
}

/// The model answering at `level` (the serving model itself where it has no twin: callers
/// refuse such sets first, [`answerable`]).
fn params_at(model: &StoredModel, level: ProfileLevel) -> &ModelParams {
    model.params.at_level(level).unwrap_or(&model.params)
}

/// The predictions of `sets` (each member's features as `level` reads them) by the model
/// answering at `level`, in one batch (Place's prefetch of crowded sets).
pub(super) fn predict_batch(
    model: &StoredModel,
    level: ProfileLevel,
    sets: &[Vec<Features>],
) -> Vec<crate::model::PredictedSet> {
    let sets: Vec<Vec<&Features>> = sets.iter().map(|set| set.iter().collect()).collect();
    params_at(model, level).predict(&sets)
}

/// The 80 % interval of `prediction` of the set `entries` (difficulty from
/// [`predict_entries`]), from the model answering at the set's level: the twin's wider
/// bands for a set with an NVML-only member.
pub(super) fn set_interval(
    model: &StoredModel,
    entries: &[&ProfileEntry],
    prediction: &SetPrediction,
    difficulty: f64,
) -> Option<SetInterval> {
    let level = level_of(entries);
    let features: Vec<Features> = entries
        .iter()
        .map(|e| level.features(&e.features))
        .collect();
    let members: Vec<&Features> = features.iter().collect();
    params_at(model, level).interval(&members, prediction, difficulty)
}

/// The noise of a measured throughput, as a fraction of it: a run is above its exclusive
/// throughput *beyond noise* when it exceeds `exclusive × (1 + EXCLUSIVE_NOISE_MARGIN)`.
/// Chosen by a rule written down before any figure of this issue was measured: the 90th
/// percentile of the relative difference between the two copies of a workload measured
/// side by side (the KACE V100 data's 16 self-pairs: median 1.7 %, 90th percentile 10.1 %,
/// largest 10.9 %), rounded to 10 % (docs/decisions/021-one-prediction-one-policy.md).
pub const EXCLUSIVE_NOISE_MARGIN: f64 = 0.10;

/// The cautious reading of a set's member intervals (`bounds`, around the bounded members
/// `bounded`, in the order of `entries`; `raw`: the model's own members): a set with k >= 2
/// members no stored run has shown (evidence profile only) has each interval's log width
/// scaled by √k, the band having been calibrated on held-out sets with one unseen member;
/// then each low end widened by its member's overshoot ([`widen_for_overshoot`];
/// docs/decisions/025-cautious-low-ends.md).
pub(super) fn cautious_bounds(
    table: &GpuProfiles,
    entries: &[&ProfileEntry],
    bounds: &mut [(f64, f64)],
    raw: &[f64],
    bounded: &[f64],
) {
    // Evidence "profile only" is no run of the member at all (`RunSummary::has_runs_of`).
    let unseen = entries
        .iter()
        .filter(|e| !table.runs().has_runs_of(e.name.as_str()))
        .count();
    widen_for_unseen(bounds, bounded, unseen);
    widen_for_overshoot(bounds, raw, bounded);
}

/// Scales each interval's log width around its prediction by √`unseen` where at least
/// two members are unseen (see [`cautious_bounds`]).
fn widen_for_unseen(bounds: &mut [(f64, f64)], predicted: &[f64], unseen: usize) {
    if unseen < 2 {
        return;
    }
    let scale = (unseen as f64).sqrt();
    for (bound, &p) in bounds.iter_mut().zip(predicted) {
        if p > 0.0 && bound.0 > 0.0 && bound.1 > 0.0 {
            *bound = (p * (bound.0 / p).powf(scale), p * (bound.1 / p).powf(scale));
        }
    }
}

/// Widens the low end of each member's 80 % interval (`bounds`) by the factor its model
/// prediction (`raw`) overshot its bounded prediction (`bounded`): a member the model put
/// above its bound is read, on the cautious side, as wrong by at least that much
/// (docs/decisions/025-cautious-low-ends.md). Nothing changes where the model's
/// prediction is within the bound.
fn widen_for_overshoot(bounds: &mut [(f64, f64)], raw: &[f64], bounded: &[f64]) {
    for ((bound, &raw), &bounded) in bounds.iter_mut().zip(raw).zip(bounded) {
        if bounded > 0.0 && raw > bounded {
            bound.0 /= raw / bounded;
        }
    }
}

/// Bounds a pair's members (`raw`, in the pair's order) by their exclusive throughputs.
pub(super) fn bounded_pair(raw: [f64; 2], exclusive: [f64; 2]) -> [f64; 2] {
    [raw[0].min(exclusive[0]), raw[1].min(exclusive[1])]
}

/// What the model says about one (target, candidate) pair, members bounded, without
/// allocating.
#[derive(Debug, Clone, Copy)]
pub(super) struct PairScore {
    /// The members' sum (after the bound).
    pub sum: f64,
    /// The target's and the candidate's throughputs (after the bound).
    pub members: [f64; 2],
    /// The same before the bound (what widens the low ends, [`widen_for_overshoot`]).
    pub raw: [f64; 2],
}

impl PairScore {
    fn bounded(raw: [f64; 2], exclusive: [f64; 2]) -> Self {
        let members = bounded_pair(raw, exclusive);
        Self {
            sum: members[0] + members[1],
            members,
            raw,
        }
    }
}

/// Batches at least this large are scored on all cores.
const PARALLEL_BATCH: usize = 16_384;

/// The model's own (unbounded) members of each pair (target, candidate): with a pair
/// scorer, each candidate costs its code (kept in the catalog entry when it was computed
/// under this model) and a few table lookups; other kinds score the batch at once, and
/// members of sum-only models are estimated (`split_by_exclusive`). A pair with an
/// NVML-only member is scored by the NVML-only twin on both members' NVML metrics.
fn raw_pairs(
    model: &StoredModel,
    table: &GpuProfiles,
    target: &ProfileEntry,
    candidates: &[&ProfileEntry],
) -> Vec<[f64; 2]> {
    if target.nvml_only {
        return raw_pairs_at(model, table, ProfileLevel::NvmlOnly, target, candidates);
    }
    if !candidates.iter().any(|c| c.nvml_only) {
        return raw_pairs_at(model, table, ProfileLevel::Full, target, candidates);
    }
    let (nvml, full): (Vec<usize>, Vec<usize>) =
        (0..candidates.len()).partition(|&i| candidates[i].nvml_only);
    let pick = |indices: &[usize]| indices.iter().map(|&i| candidates[i]).collect::<Vec<_>>();
    let mut raw = vec![[0.0; 2]; candidates.len()];
    for (level, indices) in [(ProfileLevel::Full, full), (ProfileLevel::NvmlOnly, nvml)] {
        let scored = raw_pairs_at(model, table, level, target, &pick(&indices));
        for (i, pair) in indices.into_iter().zip(scored) {
            raw[i] = pair;
        }
    }
    raw
}

/// [`raw_pairs`] with every pair answered at `level` (the catalog's codes serve full
/// profiles only; the twin codes each candidate as it scores it).
fn raw_pairs_at(
    model: &StoredModel,
    table: &GpuProfiles,
    level: ProfileLevel,
    target: &ProfileEntry,
    candidates: &[&ProfileEntry],
) -> Vec<[f64; 2]> {
    let params = params_at(model, level);
    let target_features = level.features(&target.features);
    let Some(scorer) = params.pair_scorer() else {
        let features: Vec<Features> = candidates
            .iter()
            .map(|e| level.features(&e.features))
            .collect();
        let features: Vec<&Features> = features.iter().collect();
        let target_exclusive = target.exclusive();
        return params
            .predict_pairs(&target_features, &features)
            .into_iter()
            .zip(candidates)
            .map(|(p, c)| {
                let (members, _) = p.members_or_estimated(&[target_exclusive, c.exclusive()]);
                [members[0], members[1]]
            })
            .collect();
    };
    let tables = scorer.target_tables(&target_features);
    let codes_current =
        level == ProfileLevel::Full && table.scoring_version() == Some(model.version);
    let score = |entry: &&ProfileEntry| match (&entry.code, codes_current) {
        (Some(code), true) => scorer.score(&tables, &entry.features, code),
        _ => {
            let features = level.features(&entry.features);
            scorer.score(&tables, &features, &scorer.code(&features))
        }
    };
    if candidates.len() >= PARALLEL_BATCH {
        use rayon::prelude::*;
        candidates.par_iter().map(score).collect()
    } else {
        candidates.iter().map(score).collect()
    }
}

/// Scores the pairs (target, each candidate), members bounded ([`bounded_pair`]).
pub(super) fn score_pairs(
    model: &StoredModel,
    table: &GpuProfiles,
    target: &ProfileEntry,
    candidates: &[&ProfileEntry],
) -> Vec<PairScore> {
    let target_exclusive = target.exclusive();
    raw_pairs(model, table, target, candidates)
        .into_iter()
        .zip(candidates)
        .map(|(raw, c)| PairScore::bounded(raw, [target_exclusive, c.exclusive()]))
        .collect()
}

/// The model's own prediction for a set of profiled workloads (members estimated for
/// sum-only models, not bounded) and its difficulty (what a crowded set's interval needs;
/// 0 for pairs). A pair is scored first member first, exactly as Rank scores it.
pub(super) fn predict_entries(
    model: &StoredModel,
    table: &GpuProfiles,
    entries: &[&ProfileEntry],
) -> (SetPrediction, f64) {
    match entries {
        [first, second] => {
            let raw = raw_pairs(model, table, first, &[second])[0];
            (
                SetPrediction {
                    sum: raw[0] + raw[1],
                    members: Some(raw.to_vec()),
                },
                0.0,
            )
        }
        _ => {
            let level = level_of(entries);
            let features: Vec<Features> = entries
                .iter()
                .map(|e| level.features(&e.features))
                .collect();
            let features: Vec<&Features> = features.iter().collect();
            let mut predicted = params_at(model, level).predict(&[features]).remove(0);
            if predicted.prediction.members.is_none() {
                let exclusive: Vec<f64> = entries.iter().map(|e| e.exclusive()).collect();
                predicted.prediction.members =
                    Some(split_by_exclusive(predicted.prediction.sum, &exclusive));
            }
            (predicted.prediction, predicted.difficulty)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overshoot_above_the_bound_widens_only_that_members_low_end_by_its_factor() {
        // Member 0: the model said 15 where the bound is 10 (overshoot 1.5); member 1:
        // within its bound.
        let mut bounds = [(6.0, 12.0), (3.0, 9.0)];
        widen_for_overshoot(&mut bounds, &[15.0, 7.0], &[10.0, 7.0]);
        assert_eq!(bounds, [(4.0, 12.0), (3.0, 9.0)]);
        // Exactly at the bound: nothing changes.
        let mut at = [(6.0, 12.0)];
        widen_for_overshoot(&mut at, &[10.0], &[10.0]);
        assert_eq!(at, [(6.0, 12.0)]);
    }

    #[test]
    fn two_unseen_members_scale_the_log_width_by_root_two_and_one_changes_nothing() {
        let mut one = [(5.0, 20.0)];
        widen_for_unseen(&mut one, &[10.0], 1);
        assert_eq!(one, [(5.0, 20.0)]);
        let mut two = [(5.0, 20.0)];
        widen_for_unseen(&mut two, &[10.0], 2);
        // 10 × 0.5^√2 and 10 × 2^√2.
        assert!((two[0].0 - 3.752_142).abs() < 1e-6, "{two:?}");
        assert!((two[0].1 - 26.651_441).abs() < 1e-6, "{two:?}");
    }
}
