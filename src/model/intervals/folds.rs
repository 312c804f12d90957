//! Held-out runs by cross-validation, and the folds that hold them out: of whole profiles,
//! of whole sets, or at random.

use super::{HeldOut, FOLDS};
use crate::model::{Features, FitError, ModelParams, TrainingRow};

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
    if train.len() < crate::model::MIN_TRAINING_ROWS {
        return Ok(Vec::new());
    }
    let params = fit(&train)?;
    let scored_rows: Vec<usize> = test.iter().copied().filter(|&i| scored(i)).collect();
    let sets: Vec<Vec<&Features>> = scored_rows
        .iter()
        .map(|&i| rows[i].members.iter().collect())
        .collect();
    Ok(scored_rows
        .iter()
        .zip(params.predict(&sets))
        .map(|(&i, predicted)| HeldOut {
            throughputs: rows[i].throughputs.clone(),
            prediction: predicted.prediction,
            difficulty: predicted.difficulty,
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
pub(super) fn set_folds_of(prints: &[Vec<u64>]) -> Vec<Vec<usize>> {
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
