//! `coloc eval nway --nested`: every crowded-set choice of the default made by nested
//! leave-family-out cross-validation inside the training data (decision 020). Outer folds
//! are the artifact's unseen-family cases and only they report; inside each outer training
//! set every family is held out in turn, and the candidate with the best inner score (of
//! [`super::candidates::NESTED_CANDIDATES`], or of another list: [`NestedSet`]) is refitted
//! on the whole outer training set and judged on the outer test runs.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use rayon::prelude::*;
use serde::Serialize;

use coloc::model::{self, Features, MemberOptions, TrainingRow};

use super::{
    candidates::{Candidates, NestedSet},
    family_label,
    mape::{Ape, Mape},
    nway::{pick, NwayCase, NwayData, Run, Scope, Training},
};

/// Candidates within this much of the best inner mean score count as tied (decision 020).
pub const TIE: f64 = 0.002;

/// One candidate's inner figures.
#[derive(Debug, Clone, Serialize)]
pub struct InnerFigure {
    pub candidate: String,
    pub score: f64,
    pub member_mape: f64,
}

/// One outer target: what the inner folds chose and how it did on the outer test runs.
#[derive(Debug, Clone, Serialize)]
pub struct NestedTarget {
    pub target: String,
    pub chosen: String,
    pub outer_score: f64,
    pub inner: Vec<InnerFigure>,
    /// Each candidate's outer score had it been fixed (for the records' comparison).
    pub fixed: BTreeMap<String, f64>,
}

/// One run file under the nested protocol.
#[derive(Debug, Clone, Serialize)]
pub struct NestedReport {
    pub set: String,
    /// What the models are fitted on: "runs" (decision 020) or "pairs" (decision 041).
    pub training: String,
    /// The mean outer score of the nested procedure (choose inside, report outside).
    pub mean: f64,
    pub worst: f64,
    /// The outer absolute percentage errors of the chosen candidates.
    pub mape: Mape,
    /// Each candidate's outer mean score and MAPE had it been fixed for every target.
    pub fixed_mean: BTreeMap<String, f64>,
    pub fixed_mape: BTreeMap<String, Mape>,
    pub targets: Vec<NestedTarget>,
    /// The rule applied to the whole file: what a model trained on it serves.
    pub served_choice: String,
    pub served_inner: Vec<InnerFigure>,
}

/// The pick's actual sum / the best actual sum among `candidates`, predicted by `params`;
/// the candidates' errors go into `ape`.
pub(super) fn score_target(
    data: &NwayData,
    candidates: &[usize],
    params: &model::ModelParams,
    ape: &mut Ape,
) -> f64 {
    let scores: Vec<f64> = candidates
        .iter()
        .map(|&i| {
            let row = data.run_row(i);
            let members: Vec<&Features> = row.members.iter().collect();
            let predicted = params.predict(&[members]).remove(0).prediction;
            ape.add(&row.members, &predicted, &row.throughputs);
            predicted.sum
        })
        .collect();
    let oracle = candidates
        .iter()
        .map(|&i| data.runs[i].throughput_sum())
        .fold(f64::MIN, f64::max);
    data.runs[pick(&data.runs, candidates, &scores)].throughput_sum() / oracle
}

pub(super) fn fit(
    rows: &[TrainingRow],
    options: MemberOptions,
) -> anyhow::Result<model::ModelParams> {
    model::fit_member(rows, options).with_context(|| format!("fitting on {} runs", rows.len()))
}

/// The rule of decision 020 inside `train` (indices into the runs): every family held out
/// in turn, each candidate scored on the family's targets. Returns the winner's index and
/// every candidate's inner figures.
pub fn inner_choice(
    data: &NwayData,
    train: &[usize],
    candidates: &Candidates,
) -> anyhow::Result<(usize, Vec<InnerFigure>)> {
    let k = candidates.len();
    let mut scores: Vec<Vec<f64>> = vec![Vec::new(); k];
    let mut apes: Vec<Ape> = vec![Ape::default(); k];
    for fold in family_folds(&data.runs, train) {
        let inner_train: Vec<TrainingRow> = fold.kept.iter().map(|&i| data.run_row(i)).collect();
        if inner_train.len() < model::MIN_TRAINING_ROWS {
            continue;
        }
        for (c, (_, options)) in candidates.iter().enumerate() {
            let params = fit(&inner_train, *options)?;
            for target in &fold.workloads {
                let candidates: Vec<usize> = fold
                    .held
                    .iter()
                    .copied()
                    .filter(|&i| data.runs[i].members.iter().any(|m| m == target))
                    .collect();
                scores[c].push(score_target(data, &candidates, &params, &mut apes[c]));
            }
        }
    }
    let figures: Vec<InnerFigure> = (0..k)
        .map(|c| InnerFigure {
            candidate: candidates[c].0.clone(),
            score: super::mape::mean(&scores[c]),
            member_mape: apes[c].summary().member_mean,
        })
        .collect();
    Ok((choose(&figures), figures))
}

/// One inner fold of a nested protocol: a family held out of an outer training set.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyFold {
    pub family: String,
    /// The family's workloads that occur in the outer training set, in name order.
    pub workloads: Vec<String>,
    /// The outer training runs with none of the family's workloads: the inner training.
    pub kept: Vec<usize>,
    /// The outer training runs with at least one: the inner test.
    pub held: Vec<usize>,
}

/// The leave-family-out inner folds of `train` (indices into `runs`), one per family that
/// occurs there, in family order: both nested protocols (decisions 020 and 038) fold this
/// way.
pub fn family_folds(runs: &[Run], train: &[usize]) -> Vec<FamilyFold> {
    let workloads: BTreeSet<&str> = train
        .iter()
        .flat_map(|&i| runs[i].members.iter().map(String::as_str))
        .collect();
    let mut families: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in workloads {
        families
            .entry(family_label(w))
            .or_default()
            .push(w.to_string());
    }
    families
        .into_iter()
        .map(|(family, workloads)| {
            let (held, kept) = train
                .iter()
                .partition(|&&i| runs[i].members.iter().any(|m| family_label(m) == family));
            FamilyFold {
                family,
                workloads,
                kept,
                held,
            }
        })
        .collect()
}

/// The winner among the figures: the best score; within [`TIE`] of it the lowest member
/// MAPE; an exact tie to the earlier (simpler) candidate.
pub fn choose(figures: &[InnerFigure]) -> usize {
    let best = figures.iter().map(|f| f.score).fold(f64::MIN, f64::max);
    let mut winner: Option<usize> = None;
    for (c, f) in figures.iter().enumerate() {
        if f.score < best - TIE {
            continue;
        }
        if winner.is_none_or(|w| f.member_mape < figures[w].member_mape) {
            winner = Some(c);
        }
    }
    winner.expect("the best candidate is within the tie of itself")
}

/// The nested protocol on one run file: outer targets of the "all, runs" cases, choosing
/// among the candidates of `set` (for the profiles' level, `data.level`).
pub fn evaluate(data: &NwayData, set: NestedSet) -> anyhow::Result<NestedReport> {
    let all: Vec<usize> = (0..data.runs.len()).collect();
    outer_folds(
        data,
        set,
        Training::Runs,
        |case, candidates| {
            let chosen = inner_choice(data, &case.train_runs, candidates)?;
            let train = case.train_runs.iter().map(|&i| data.run_row(i)).collect();
            Ok((chosen, train))
        },
        |candidates| inner_choice(data, &all, candidates),
    )
}

/// What a nested protocol's inner folds chose for one outer case, with the outer training
/// rows the choice is refitted on.
pub(super) type CaseChoice = ((usize, Vec<InnerFigure>), Vec<TrainingRow>);

/// The outer loop of the nested protocols (decisions 020 and 041): every "all" case of
/// `training` chosen for by `inner` (which also gives the outer training rows) and scored
/// on its test runs, every candidate fixed beside; `whole_file` makes the served choice.
pub(super) fn outer_folds(
    data: &NwayData,
    set: NestedSet,
    training: Training,
    inner: impl Fn(&NwayCase, &Candidates) -> anyhow::Result<CaseChoice> + Sync,
    whole_file: impl FnOnce(&Candidates) -> anyhow::Result<(usize, Vec<InnerFigure>)>,
) -> anyhow::Result<NestedReport> {
    let candidates = set.candidates(data.level);
    let candidates = &candidates;
    let cases: Vec<_> = data
        .cases()
        .into_iter()
        .filter(|c| c.scope == Scope::All && c.training == training)
        .collect();
    let name = match training {
        Training::Runs => "runs",
        Training::PairsAndRuns => "pairs",
    };
    let progress = coloc::progress::bar(
        cases.len() as u64 + 1,
        &format!("nested ({name} training) {}", data.label),
    );
    let outer: Vec<Outer> = cases
        .par_iter()
        .map(|case| -> anyhow::Result<_> {
            let (chosen, train) = inner(case, candidates)?;
            let outer = outer_target(
                data,
                &case.target,
                &case.candidates,
                &train,
                candidates,
                chosen,
            );
            progress.inc(1);
            outer
        })
        .collect::<anyhow::Result<_>>()?;
    let served = whole_file(candidates)?;
    progress.finish_and_clear();
    Ok(report(data, name, candidates, outer, served))
}

/// One outer target's result: what was chosen and scored, the chosen candidate's errors,
/// and every candidate's.
type Outer = (NestedTarget, Ape, Vec<Ape>);

/// The outer target `target` scored on its test runs `test` after fitting every candidate
/// on `train`, the inner rule having chosen `chosen` (with its `inner` figures).
fn outer_target(
    data: &NwayData,
    target: &str,
    test: &[usize],
    train: &[TrainingRow],
    candidates: &Candidates,
    (chosen, inner): (usize, Vec<InnerFigure>),
) -> anyhow::Result<Outer> {
    let mut fixed = BTreeMap::new();
    let mut apes = vec![Ape::default(); candidates.len()];
    for (c, (name, options)) in candidates.iter().enumerate() {
        let params = fit(train, *options)?;
        let score = score_target(data, test, &params, &mut apes[c]);
        fixed.insert(name.clone(), score);
    }
    let target = NestedTarget {
        target: target.to_string(),
        chosen: candidates[chosen].0.clone(),
        outer_score: fixed[&candidates[chosen].0],
        inner,
        fixed,
    };
    Ok((target, apes[chosen].clone(), apes))
}

/// The report of a nested protocol from its outer targets and its whole-file choice.
fn report(
    data: &NwayData,
    training: &str,
    candidates: &Candidates,
    outer: Vec<Outer>,
    (served, served_inner): (usize, Vec<InnerFigure>),
) -> NestedReport {
    let mut ape = Ape::default();
    let mut fixed_apes = vec![Ape::default(); candidates.len()];
    for (_, chosen_ape, apes) in &outer {
        ape.extend(chosen_ape);
        for (total, a) in fixed_apes.iter_mut().zip(apes) {
            total.extend(a);
        }
    }
    let targets: Vec<NestedTarget> = outer.into_iter().map(|(t, _, _)| t).collect();
    let scores: Vec<f64> = targets.iter().map(|t| t.outer_score).collect();
    NestedReport {
        set: data.label.clone(),
        training: training.to_string(),
        mean: super::mape::mean(&scores),
        worst: scores.iter().copied().fold(f64::MAX, f64::min),
        mape: ape.summary(),
        fixed_mean: candidates
            .iter()
            .map(|(name, _)| {
                let s: Vec<f64> = targets.iter().map(|t| t.fixed[name]).collect();
                (name.clone(), super::mape::mean(&s))
            })
            .collect(),
        fixed_mape: candidates
            .iter()
            .zip(&fixed_apes)
            .map(|((name, _), a)| (name.clone(), a.summary()))
            .collect(),
        targets,
        served_choice: candidates[served].0.clone(),
        served_inner,
    }
}

impl std::fmt::Display for NestedReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} nested (all runs, {} training): outer mean {:.4} (worst {:.4}), {}",
            self.set, self.training, self.mean, self.worst, self.mape
        )?;
        for t in &self.targets {
            writeln!(
                f,
                "  {}: chose {}, outer {:.4}",
                t.target, t.chosen, t.outer_score
            )?;
        }
        for (name, mean) in &self.fixed_mean {
            writeln!(
                f,
                "  fixed {name}: outer mean {mean:.4}, {}",
                self.fixed_mape[name]
            )?;
        }
        write!(
            f,
            "  served (rule on the whole file): {}; inner",
            self.served_choice
        )?;
        for i in &self.served_inner {
            write!(f, " {} {:.4}/{:.1} %", i.candidate, i.score, i.member_mape)?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(score: f64, member_mape: f64) -> InnerFigure {
        InnerFigure {
            candidate: String::new(),
            score,
            member_mape,
        }
    }

    #[test]
    fn the_rule_takes_the_best_score_and_breaks_near_ties_by_member_error() {
        // 0.950 is more than the tie below 0.960: out; 0.959 ties, with a lower error.
        let figures = [figure(0.950, 5.0), figure(0.960, 30.0), figure(0.959, 20.0)];
        assert_eq!(choose(&figures), 2);
        // An exact tie goes to the earlier (simpler) candidate.
        assert_eq!(choose(&[figure(0.9, 10.0), figure(0.9, 10.0)]), 0);
    }

    fn run(members: &[&str]) -> Run {
        Run {
            id: 0,
            members: members.iter().map(|m| m.to_string()).collect(),
            throughputs: vec![1.0; members.len()],
            in_subset: None,
        }
    }

    #[test]
    fn each_family_in_the_training_runs_is_held_out_once_with_every_run_that_holds_it() {
        let runs = [
            run(&["bert-base-cased_batch8-inf", "resnet50_batch32-train"]),
            run(&["bert-base-cased_batch16-inf", "gpt2_batch4-inf"]),
            run(&["resnet50_batch32-train", "gpt2_batch4-inf"]),
            // Not in the outer training set: its workload makes no fold.
            run(&["vgg16_batch8-train", "gpt2_batch4-inf"]),
        ];
        let fold = |family: &str, workloads: &[&str], kept: &[usize], held: &[usize]| FamilyFold {
            family: family.to_string(),
            workloads: workloads.iter().map(|w| w.to_string()).collect(),
            kept: kept.to_vec(),
            held: held.to_vec(),
        };
        assert_eq!(
            family_folds(&runs, &[0, 1, 2]),
            [
                fold(
                    "bert-base-cased inference",
                    &["bert-base-cased_batch16-inf", "bert-base-cased_batch8-inf"],
                    &[2],
                    &[0, 1],
                ),
                fold("gpt2 inference", &["gpt2_batch4-inf"], &[0], &[1, 2]),
                fold(
                    "resnet50 training",
                    &["resnet50_batch32-train"],
                    &[1],
                    &[0, 2]
                ),
            ]
        );
    }
}
