//! `coloc eval nway --nested --nested-train pairs`: decision 020's nested leave-family-out
//! protocol for models fitted on pairs alone, judged on crowded runs (decision 041): what a
//! service that imported the KACE pairs answers for sets of three and four. Outer folds:
//! for each target, the pairs with no workload of its family train, the runs holding it
//! test. Inner folds, inside one outer training: every family of its pairs held out in
//! turn, judged on the runs that hold the family and none of the outer target's.

use std::collections::{BTreeMap, BTreeSet};

use coloc::model::{self, TrainingRow};

use super::{
    candidates::{Candidates, NestedSet},
    family_label,
    mape::{mean, Ape},
    nested::{choose, fit, outer_folds, score_target, InnerFigure, NestedReport},
    nway::{NwayData, Training},
};

/// The rule of decision 020 inside the training pairs `train` (indices into the pairs):
/// every family of their workloads held out in turn, each candidate fitted on the other
/// pairs and scored on the family's targets, a target's test being the runs that hold it
/// and no workload of `outer_family` (the outer target's, whose runs are the outer test).
pub fn inner_choice(
    data: &NwayData,
    train: &[usize],
    outer_family: Option<&str>,
    candidates: &Candidates,
) -> anyhow::Result<(usize, Vec<InnerFigure>)> {
    let mut families: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for &i in train {
        let pair = &data.pairs[i];
        for w in [&pair.workload1, &pair.workload2] {
            families.entry(family_label(w)).or_default().insert(w);
        }
    }
    let runs_of = |w: &str| -> Vec<usize> {
        (0..data.runs.len())
            .filter(|&i| {
                let members = &data.runs[i].members;
                members.iter().any(|m| m == w)
                    && !members
                        .iter()
                        .any(|m| Some(family_label(m).as_str()) == outer_family)
            })
            .collect()
    };
    let k = candidates.len();
    let mut scores: Vec<Vec<f64>> = vec![Vec::new(); k];
    let mut apes: Vec<Ape> = vec![Ape::default(); k];
    for (family, workloads) in families {
        let targets: Vec<Vec<usize>> = workloads
            .iter()
            .map(|w| runs_of(w))
            .filter(|runs| !runs.is_empty())
            .collect();
        let kept: Vec<TrainingRow> = train
            .iter()
            .filter(|&&i| {
                let pair = &data.pairs[i];
                family_label(&pair.workload1) != family && family_label(&pair.workload2) != family
            })
            .map(|&i| data.pair_row(i))
            .collect();
        if targets.is_empty() || kept.len() < model::MIN_TRAINING_ROWS {
            continue;
        }
        for (c, (_, options)) in candidates.iter().enumerate() {
            let params = fit(&kept, *options)?;
            for runs in &targets {
                scores[c].push(score_target(data, runs, &params, &mut apes[c]));
            }
        }
    }
    let figures: Vec<InnerFigure> = (0..k)
        .map(|c| InnerFigure {
            candidate: candidates[c].0.clone(),
            score: mean(&scores[c]),
            member_mape: apes[c].summary().member_mean,
        })
        .collect();
    Ok((choose(&figures), figures))
}

/// The protocol on one run file, choosing among the candidates of `set`: the "all, pairs +
/// runs" cases, whose training pairs exclude the target's family (their training runs are
/// not used).
pub fn evaluate(data: &NwayData, set: NestedSet) -> anyhow::Result<NestedReport> {
    let all: Vec<usize> = (0..data.pairs.len()).collect();
    outer_folds(
        data,
        set,
        Training::PairsAndRuns,
        |case, candidates| {
            let family = family_label(&case.target);
            let chosen = inner_choice(data, &case.train_pairs, Some(&family), candidates)?;
            let train = case.train_pairs.iter().map(|&i| data.pair_row(i)).collect();
            Ok((chosen, train))
        },
        |candidates| inner_choice(data, &all, None, candidates),
    )
}
