//! `coloc eval kace --nested`: the options that change a pair's answer chosen by nested
//! leave-workload-out cross-validation inside each training set (decision 020's addendum).
//! Outer folds are the unseen-workload cases and only they report.

use std::collections::{BTreeMap, BTreeSet};

use rayon::prelude::*;
use serde::Serialize;

use coloc::model::{self, Features, MemberOptions, TrainingRow};

use super::{
    candidates::MEMBER_CANDIDATES,
    mape::{mean, Ape, Mape},
    nested::{choose, InnerFigure, NestedTarget},
    score_targets, EvalData, Protocol,
};

/// The candidates, in the rule's tie order (rows of [`MEMBER_CANDIDATES`]).
pub const PAIR_CANDIDATES: [&str; 4] = ["plain", "crowding", "stacked", "weighted"];

fn options(name: &str) -> MemberOptions {
    MEMBER_CANDIDATES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, o)| *o)
        .expect("every pair candidate is a row of MEMBER_CANDIDATES")
}

/// The pair protocol under the nested rule.
#[derive(Debug, Clone, Serialize)]
pub struct PairNestedReport {
    pub mean: f64,
    pub mape: Mape,
    pub fixed_mean: BTreeMap<String, f64>,
    pub fixed_mape: BTreeMap<String, Mape>,
    pub targets: Vec<NestedTarget>,
    pub served_choice: String,
    pub served_inner: Vec<InnerFigure>,
}

/// Each candidate fitted on `train` (pair indices), its score of the `targets` among `test`.
fn scores(
    data: &EvalData,
    train: &[usize],
    test: &[usize],
    targets: &BTreeSet<String>,
) -> anyhow::Result<Vec<(f64, Ape)>> {
    let rows: Vec<TrainingRow> = train.iter().map(|&i| data.row(i)).collect();
    PAIR_CANDIDATES
        .iter()
        .map(|name| {
            let params = model::fit_member(&rows, options(name))?;
            let mut ape = Ape::default();
            let predicted: Vec<f64> = test
                .iter()
                .map(|&i| {
                    let row = data.row(i);
                    let members: Vec<&Features> = row.members.iter().collect();
                    let p = params.predict(&[members]).remove(0).prediction;
                    ape.add(&row.members, &p, &row.throughputs);
                    p.sum
                })
                .collect();
            let per_target = score_targets(&data.pairs, test, &predicted, Some(targets));
            Ok((mean(&per_target.values().copied().collect::<Vec<_>>()), ape))
        })
        .collect()
}

/// The rule inside `train`: every workload held out in turn.
fn inner_choice(data: &EvalData, train: &[usize]) -> anyhow::Result<(usize, Vec<InnerFigure>)> {
    let workloads: BTreeSet<&str> = train
        .iter()
        .flat_map(|&i| {
            [
                data.pairs[i].workload1.as_str(),
                data.pairs[i].workload2.as_str(),
            ]
        })
        .collect();
    let k = PAIR_CANDIDATES.len();
    let mut all: Vec<(Vec<f64>, Ape)> = vec![(Vec::new(), Ape::default()); k];
    for w in workloads {
        let (test, inner): (Vec<usize>, Vec<usize>) = train
            .iter()
            .partition(|&&i| data.pairs[i].workload1 == w || data.pairs[i].workload2 == w);
        if inner.len() < model::MIN_TRAINING_ROWS {
            continue;
        }
        let target = BTreeSet::from([w.to_string()]);
        for (c, (score, ape)) in scores(data, &inner, &test, &target)?
            .into_iter()
            .enumerate()
        {
            all[c].0.push(score);
            all[c].1.extend(&ape);
        }
    }
    let figures: Vec<InnerFigure> = all
        .iter()
        .zip(PAIR_CANDIDATES)
        .map(|((s, ape), name)| InnerFigure {
            candidate: name.to_string(),
            score: mean(s),
            member_mape: ape.summary().member_mean,
        })
        .collect();
    Ok((choose(&figures), figures))
}

pub fn evaluate(data: &EvalData) -> anyhow::Result<PairNestedReport> {
    let cases: Vec<_> = data
        .cases
        .iter()
        .filter(|c| c.protocol == Protocol::Unseen)
        .collect();
    let outer: Vec<(NestedTarget, Vec<Ape>)> = cases
        .par_iter()
        .map(|case| -> anyhow::Result<_> {
            let (chosen, inner) = inner_choice(data, &case.train)?;
            let targets = case.targets.clone().unwrap_or_default();
            let fixed = scores(data, &case.train, &case.test, &targets)?;
            let target = NestedTarget {
                target: case.holdout.clone().unwrap_or_default(),
                chosen: PAIR_CANDIDATES[chosen].to_string(),
                outer_score: fixed[chosen].0,
                inner,
                fixed: PAIR_CANDIDATES
                    .iter()
                    .zip(&fixed)
                    .map(|(n, (s, _))| (n.to_string(), *s))
                    .collect(),
            };
            Ok((target, fixed.into_iter().map(|(_, a)| a).collect()))
        })
        .collect::<anyhow::Result<_>>()?;
    let every: Vec<usize> = (0..data.pairs.len()).collect();
    let (served, served_inner) = inner_choice(data, &every)?;
    let mut chosen_ape = Ape::default();
    let mut fixed_apes = vec![Ape::default(); PAIR_CANDIDATES.len()];
    for (t, apes) in &outer {
        let c = PAIR_CANDIDATES
            .iter()
            .position(|n| *n == t.chosen)
            .unwrap_or(0);
        chosen_ape.extend(&apes[c]);
        for (total, a) in fixed_apes.iter_mut().zip(apes) {
            total.extend(a);
        }
    }
    let targets: Vec<NestedTarget> = outer.into_iter().map(|(t, _)| t).collect();
    Ok(PairNestedReport {
        mean: mean(&targets.iter().map(|t| t.outer_score).collect::<Vec<_>>()),
        mape: chosen_ape.summary(),
        fixed_mean: PAIR_CANDIDATES
            .iter()
            .map(|n| {
                let s: Vec<f64> = targets.iter().map(|t| t.fixed[*n]).collect();
                (n.to_string(), mean(&s))
            })
            .collect(),
        fixed_mape: PAIR_CANDIDATES
            .iter()
            .zip(&fixed_apes)
            .map(|(n, a)| (n.to_string(), a.summary()))
            .collect(),
        targets,
        served_choice: PAIR_CANDIDATES[served].to_string(),
        served_inner,
    })
}

impl std::fmt::Display for PairNestedReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "pairs nested (unseen workload): outer mean {:.4}, {}",
            self.mean, self.mape
        )?;
        for t in &self.targets {
            writeln!(
                f,
                "  {}: chose {}, outer {:.4}",
                t.target, t.chosen, t.outer_score
            )?;
        }
        for (name, m) in &self.fixed_mean {
            writeln!(
                f,
                "  fixed {name}: outer mean {m:.4}, {}",
                self.fixed_mape[name]
            )?;
        }
        write!(
            f,
            "  served (rule on every pair): {}; inner",
            self.served_choice
        )?;
        for i in &self.served_inner {
            write!(f, " {} {:.4}/{:.1} %", i.candidate, i.score, i.member_mape)?;
        }
        writeln!(f)
    }
}
