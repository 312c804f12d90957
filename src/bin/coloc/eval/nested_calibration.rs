//! `coloc eval nway --nested-calibration`: the crowded intervals' calibration chosen by
//! nested leave-family-out cross-validation inside each training set (decision 038). Outer
//! folds are decision 020's unseen-family cases and only they report; inside each outer
//! training set every family is held out in turn, each way of calibrating of
//! [`CALIBRATION_CANDIDATES`] is calibrated on the rest and counted on the held-out runs,
//! and the way whose inner coverage is nearest 80 % is the one the outer fold reports.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

use coloc::model::{self, TrainingRow};

use super::{
    candidates::CALIBRATION_CANDIDATES,
    nested::family_folds,
    nway::{fit_calibrated_each, Coverage, NwayData, Scope, Training},
};

/// Candidates within this much of the smallest inner gap count as tied (decision 038).
pub const TIE: f64 = 0.005;

/// Decision 010's tie order, simpler first, as indices into [`CALIBRATION_CANDIDATES`]:
/// 1 `profile-folds`, 4 `profile-out`, 2 and 3 (scaled profile folds), 5 (scaled
/// profile-out), 6 (profile-out members, profile-folds sums).
pub const TIE_ORDER: [usize; 6] = [0, 3, 1, 2, 4, 5];

/// The nominal coverage of the intervals.
const NOMINAL: f64 = 0.80;

/// One candidate's coverage, pooled over the folds it was counted on.
#[derive(Debug, Clone, Serialize)]
pub struct CandidateCoverage {
    pub candidate: String,
    pub members: f64,
    pub sums: f64,
    /// max(|members - 0.80|, |sums - 0.80|).
    pub gap: f64,
}

impl CandidateCoverage {
    fn of(candidate: &str, counts: &Coverage) -> Self {
        let (members, sums) = (counts.member_fraction(), counts.sum_fraction());
        Self {
            candidate: candidate.to_string(),
            members,
            sums,
            gap: (members - NOMINAL).abs().max((sums - NOMINAL).abs()),
        }
    }
}

/// One outer target: what the inner folds chose.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationTarget {
    pub target: String,
    pub chosen: String,
    pub inner: Vec<CandidateCoverage>,
}

/// One run file under decision 038's protocol.
#[derive(Debug, Clone, Serialize)]
pub struct CalibrationReport {
    pub set: String,
    /// The nested procedure's outer coverage: each target's runs counted in the intervals
    /// of the way its inner folds chose.
    pub nested: Coverage,
    /// Each candidate's outer coverage had it been fixed for every target (read; chooses
    /// nothing).
    pub fixed: Vec<Coverage>,
    pub targets: Vec<CalibrationTarget>,
    /// The rule applied to the whole file: what a model trained on it serves.
    pub served_choice: String,
    pub served_inner: Vec<CandidateCoverage>,
}

/// The winner: the smallest gap; within [`TIE`] of it the earliest in [`TIE_ORDER`].
pub fn choose(figures: &[CandidateCoverage]) -> usize {
    let best = figures.iter().map(|f| f.gap).fold(f64::MAX, f64::min);
    TIE_ORDER
        .into_iter()
        .find(|&i| figures[i].gap <= best + TIE)
        .expect("the best candidate is within the tie of itself")
}

fn counts(protocol: &str) -> Vec<Coverage> {
    CALIBRATION_CANDIDATES
        .iter()
        .map(|(name, _)| Coverage::new(protocol.to_string(), name))
        .collect()
}

/// Decision 038's rule inside `train` (indices into the runs): every family held out in
/// turn, each candidate calibrated on the rest and counted on the held-out runs.
fn inner_choice(
    data: &NwayData,
    train: &[usize],
) -> anyhow::Result<(usize, Vec<CandidateCoverage>)> {
    let mut pooled = counts("inner");
    for fold in family_folds(&data.runs, train) {
        let inner_train: Vec<TrainingRow> = fold.kept.iter().map(|&i| data.run_row(i)).collect();
        if inner_train.len() < model::MIN_TRAINING_ROWS {
            continue;
        }
        let inner_test: Vec<TrainingRow> = fold.held.iter().map(|&i| data.run_row(i)).collect();
        let models = fit_calibrated_each(&inner_train, &CALIBRATION_CANDIDATES, data.level)?;
        for (count, params) in pooled.iter_mut().zip(&models) {
            count.add(params, &inner_test)?;
        }
    }
    let figures: Vec<CandidateCoverage> = CALIBRATION_CANDIDATES
        .iter()
        .zip(&pooled)
        .map(|((name, _), count)| CandidateCoverage::of(name, count))
        .collect();
    Ok((choose(&figures), figures))
}

/// Decision 038's protocol on one run file: outer targets of the "all, runs" cases.
pub fn evaluate(data: &NwayData) -> anyhow::Result<CalibrationReport> {
    let cases: Vec<_> = data
        .cases()
        .into_iter()
        .filter(|c| c.scope == Scope::All && c.training == Training::Runs)
        .collect();
    let protocol = format!("{} all, runs, unseen family", data.label);
    let progress = coloc::progress::bar(
        cases.len() as u64 + 1,
        &format!("nested calibration {}", data.label),
    );
    let outer: Vec<(CalibrationTarget, Vec<Coverage>)> = cases
        .par_iter()
        .map(|case| -> anyhow::Result<_> {
            let (chosen, inner) = inner_choice(data, &case.train_runs)?;
            let models = fit_calibrated_each(
                &data.training_rows(case),
                &CALIBRATION_CANDIDATES,
                data.level,
            )?;
            let test: Vec<TrainingRow> = case.candidates.iter().map(|&i| data.run_row(i)).collect();
            let mut fixed = counts(&protocol);
            for (count, params) in fixed.iter_mut().zip(&models) {
                count.add(params, &test)?;
            }
            progress.inc(1);
            let target = CalibrationTarget {
                target: case.target.clone(),
                chosen: CALIBRATION_CANDIDATES[chosen].0.to_string(),
                inner,
            };
            Ok((target, fixed))
        })
        .collect::<anyhow::Result<_>>()?;
    let all: Vec<usize> = (0..data.runs.len()).collect();
    let (served, served_inner) = inner_choice(data, &all)?;
    progress.finish_and_clear();

    let index: BTreeMap<&str, usize> = CALIBRATION_CANDIDATES
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (*name, i))
        .collect();
    let mut nested = Coverage::new(protocol.clone(), "chosen by nested CV");
    let mut fixed = counts(&protocol);
    for (target, per_candidate) in &outer {
        nested.pool(&per_candidate[index[target.chosen.as_str()]]);
        for (total, count) in fixed.iter_mut().zip(per_candidate) {
            total.pool(count);
        }
    }
    Ok(CalibrationReport {
        set: data.label.clone(),
        nested,
        fixed,
        targets: outer.into_iter().map(|(t, _)| t).collect(),
        served_choice: CALIBRATION_CANDIDATES[served].0.to_string(),
        served_inner,
    })
}

impl std::fmt::Display for CalibrationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} (nested calibration, outer folds only)", self.set)?;
        writeln!(f, "  nested procedure: {}", self.nested)?;
        let mut chosen: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &self.targets {
            *chosen.entry(t.chosen.as_str()).or_default() += 1;
        }
        writeln!(f, "  inner choices: {chosen:?}")?;
        for c in &self.fixed {
            writeln!(f, "  fixed (read, chooses nothing): {c}")?;
        }
        writeln!(f, "  whole file chooses: {}", self.served_choice)?;
        for c in &self.served_inner {
            writeln!(
                f,
                "    {}: members {:.3}, sums {:.3}, gap {:.3}",
                c.candidate, c.members, c.sums, c.gap
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(gap: f64) -> CandidateCoverage {
        CandidateCoverage {
            candidate: String::new(),
            members: NOMINAL + gap,
            sums: NOMINAL,
            gap,
        }
    }

    #[test]
    fn the_rule_takes_the_smallest_gap_and_breaks_near_ties_by_decision_010s_order() {
        // Candidate 6 (index 5) alone nearest: it wins.
        let gaps = [0.05, 0.05, 0.05, 0.05, 0.05, 0.01];
        assert_eq!(choose(&gaps.map(figure)), 5);
        // Within 0.005 of the best, the earlier in the tie order wins: profile-out (index
        // 3) comes before candidate 6.
        let gaps = [0.05, 0.05, 0.05, 0.014, 0.05, 0.01];
        assert_eq!(choose(&gaps.map(figure)), 3);
        // Just outside the tie it does not.
        let gaps = [0.05, 0.05, 0.05, 0.016, 0.05, 0.01];
        assert_eq!(choose(&gaps.map(figure)), 5);
        // Profile folds (index 0) come first of all.
        assert_eq!(choose(&[0.02; 6].map(figure)), 0);
    }

    #[test]
    fn a_gap_is_the_larger_of_the_member_and_the_sum_distance_from_80_percent() {
        let count = Coverage {
            protocol: String::new(),
            policy: String::new(),
            members_inside: 70,
            members: 100,
            sums_inside: 17,
            sums: 20,
        };
        let c = CandidateCoverage::of("x", &count);
        assert!((c.gap - 0.10).abs() < 1e-12, "{}", c.gap);
    }
}
