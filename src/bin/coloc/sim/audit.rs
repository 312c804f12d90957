//! How honest the model policies' cautious caps are on the simulation's truth. For every
//! measured set the simulation may create, each distinct member's measured speed (colocated
//! / exclusive throughput) is set against what `coloc`'s model says of that member in that
//! set: the point and the low end of its interval (80 %, as `Train` calibrates it, unless
//! `--bands` says otherwise). By set size: how often the truth falls below the low end (10 %
//! is what a calibrated 80 % interval promises), and, at the
//! latency-sensitive cap, how many members a cap check on the low end (or on the point)
//! would admit whose measured speed is below the cap. It depends on the model and the
//! truth, not on a seed or a policy's choices, so it is computed once per `coloc simulate`.
//! The members are the model's raw answers; Place's own reading (a member's lowest
//! prediction over the subsets holding it) can only be lower.
//!
//! Beside it, a what-if that no policy uses: the same model with its intervals calibrated
//! on runs held out at random (five folds of the training runs, so that every held-out
//! run's workloads were in its fold's training) instead of on held-out profiles: how wide
//! the intervals would be for sets of workloads the model has seen, which is what the
//! simulation asks of it.

use std::collections::{BTreeMap, HashMap};

use anyhow::Context;
use serde::Serialize;

use coloc::model::{
    fit_member,
    intervals::{self, Intervals},
    Features, MemberOptions, ModelParams, TrainingRow,
};

use super::truth::Truth;

/// One set size's tally.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SizeAudit {
    /// Members of the set (with repeats): 2, 3, 4, ...
    pub size: usize,
    pub sets: usize,
    /// Distinct members of those sets (repeats of a workload in one set count once: the
    /// truth averages them, and the model predicts them alike).
    pub members: usize,
    /// Members whose measured speed is below the low end of their interval.
    pub below_low_end: usize,
    /// Members whose low end is at or above the cap: a cautious cap check admits them.
    pub admitted_on_low_end: usize,
    /// Of those, the ones whose measured speed is below the cap.
    pub admitted_on_low_end_below_cap: usize,
    /// Members whose point is at or above the cap.
    pub admitted_on_point: usize,
    /// Of those, the ones whose measured speed is below the cap.
    pub admitted_on_point_below_cap: usize,
}

/// Audits `model` against every measured set of `truth` at `cap`; `features` by workload
/// name. Members without an interval (a model kind without one) count the point as the
/// low end, as Place's cautious mode does.
pub fn intervals_on_truth(
    model: &ModelParams,
    truth: &Truth,
    features: &HashMap<String, Features>,
    cap: f64,
) -> anyhow::Result<Vec<SizeAudit>> {
    let profile = |w: u8| -> anyhow::Result<&Features> {
        let name = &truth.workloads[w as usize].name;
        features
            .get(name)
            .with_context(|| format!("{name} has no profile"))
    };
    let mut by_size: BTreeMap<usize, SizeAudit> = BTreeMap::new();
    for (set, speeds) in truth.measured_iter() {
        let members = set.members();
        let profiles: Vec<&Features> = members
            .iter()
            .map(|&w| profile(w))
            .collect::<anyhow::Result<_>>()?;
        let predicted = model.predict(&[&profiles]).remove(0);
        let interval = model.interval(&profiles, &predicted.prediction, predicted.difficulty);
        let prediction = predicted.prediction;
        let predicted = prediction
            .members
            .as_ref()
            .context("the audited model predicts no members")?;
        let tally = by_size.entry(members.len()).or_insert_with(|| SizeAudit {
            size: members.len(),
            ..SizeAudit::default()
        });
        tally.sets += 1;
        for (&w, &speed) in speeds {
            // The first slot of this workload: repeats are predicted alike.
            let i = members.iter().position(|&m| m == w).expect("a member");
            let exclusive = truth.workloads[w as usize].exclusive_throughput;
            let point = predicted[i] / exclusive;
            let low = interval
                .as_ref()
                .and_then(|iv| iv.members.as_ref())
                .map_or(point, |m| m[i].0 / exclusive);
            tally.members += 1;
            tally.below_low_end += usize::from(speed < low);
            if low >= cap {
                tally.admitted_on_low_end += 1;
                tally.admitted_on_low_end_below_cap += usize::from(speed < cap);
            }
            if point >= cap {
                tally.admitted_on_point += 1;
                tally.admitted_on_point_below_cap += usize::from(speed < cap);
            }
        }
    }
    Ok(by_size.into_values().collect())
}

/// `model` with its intervals calibrated as `Train` calibrates them but on five random folds
/// of `rows` (runs held out, their workloads seen) instead of folds of profiles; `None` for
/// a model kind without intervals, or when too few runs are left to calibrate.
pub fn calibrated_on_held_out_runs(
    model: &ModelParams,
    rows: &[TrainingRow],
) -> anyhow::Result<Option<ModelParams>> {
    calibrated_on_held_out_runs_at(model, rows, (intervals::LOWER, intervals::UPPER))
}

/// [`calibrated_on_held_out_runs`] with the bands at the quantiles `levels` (lower, upper).
pub fn calibrated_on_held_out_runs_at(
    model: &ModelParams,
    rows: &[TrainingRow],
    levels: (f64, f64),
) -> anyhow::Result<Option<ModelParams>> {
    let ModelParams::MemberRidgeGbt(fitted) = model else {
        return Ok(None);
    };
    let held_out = intervals::held_out(rows, &intervals::k_folds(rows.len()), |train| {
        fit_member(train, MemberOptions::CHOSEN)
    })?;
    let calibrated = Intervals::calibrate_at(&held_out, levels);
    if calibrated.bands.iter().all(Option::is_none) {
        return Ok(None);
    }
    let mut recalibrated = fitted.clone();
    recalibrated.intervals = Some(calibrated);
    // Every band from these folds: the model's own seen bands would otherwise answer the
    // crowded sets of known workloads first.
    recalibrated.seen = None;
    Ok(Some(ModelParams::MemberRidgeGbt(recalibrated)))
}
