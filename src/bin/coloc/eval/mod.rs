//! `coloc eval`: the KACE paper's evaluation protocol ("normalised throughput sum vs
//! oracle"), run through the same fitting, prediction and ranking order that the Rank RPC
//! uses, for coloc's model kinds and the paper's baselines.
//!
//! For each case (a train/test split, or a held-out workload) a model is fitted on the
//! training pairs only and predicts every test pair. For each target the policy picks the
//! test pair containing it with the best score; score(target) = the picked pair's actual
//! throughput sum / the best actual sum among those pairs (the oracle).

pub mod candidates;
pub mod mape;
pub mod nested;
pub mod nested_calibration;
pub mod nested_pairs;
pub mod nested_pairs_trained;
pub mod nway;
pub mod nway_api;
mod objectives;
mod pair_coverage;
mod plot;
mod report;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

pub use objectives::{evaluate_objectives, print_objectives};
pub use pair_coverage::pair_protocol_coverage;
pub use plot::draw;
pub use report::{
    nway_predictions_writer, print_nway_table, print_table, write_nway_predictions,
    write_predictions,
};

use coloc::{
    advisor::rank_order,
    dataset::{KaceDataset, KacePair},
    model::{self, Features, ModelKind, ProfileLevel, TrainingRow},
};

/// A way of picking a partner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Policy {
    /// A model kind: the best predicted throughput sum.
    Model(ModelKind),
    /// `member-ridge-gbt` with the options of `candidates::MEMBER_CANDIDATES[i]`.
    Candidate(usize),
    /// The expected score of a uniformly random pick.
    Random,
    /// The partner with the smallest summed memory (a rule baseline of the paper).
    SmallestMemory,
    /// The partner with the largest summed exclusive throughput.
    LargestExclusive,
}

impl Policy {
    pub fn name(self) -> String {
        match self {
            Self::Model(kind) => kind.as_str().to_string(),
            Self::Candidate(i) => format!("cand:{}", candidates::MEMBER_CANDIDATES[i].0),
            Self::Random => "random".into(),
            Self::SmallestMemory => "smallest-memory".into(),
            Self::LargestExclusive => "largest-exclusive".into(),
        }
    }
}

impl Policy {
    /// Fits the policy's model (model kinds and candidates only); a model kind as the
    /// service fits it for profiles of `level`.
    pub fn fit(
        self,
        rows: &[TrainingRow],
        level: ProfileLevel,
    ) -> Result<model::ModelParams, model::FitError> {
        match self {
            // The served fit without its interval calibration, which ranking does not use.
            Self::Model(kind) => model::fit_point_at(kind, rows, level),
            Self::Candidate(i) => model::fit_member(rows, candidates::MEMBER_CANDIDATES[i].1),
            _ => unreachable!("{} fits no model", self.name()),
        }
    }

    /// Every candidate of `member-ridge-gbt`'s options.
    pub fn candidates() -> Vec<Policy> {
        (0..candidates::MEMBER_CANDIDATES.len())
            .map(Policy::Candidate)
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Split,
    Unseen,
    /// Every workload of one family (model and mode, any batch size) held out together:
    /// training has no pair with a member of the family; the family's members are scored.
    Family,
}

/// One training/test case.
#[derive(Debug, Clone)]
pub struct Case {
    pub protocol: Protocol,
    pub n_occur: Option<u32>,
    pub seed: Option<u32>,
    /// The held-out workload (unseen protocol) or family (`model mode`, family protocol).
    pub holdout: Option<String>,
    /// The workloads scored as targets (unseen and family protocols; every one for splits).
    pub targets: Option<BTreeSet<String>>,
    pub train: Vec<usize>,
    pub test: Vec<usize>,
}

/// The dataset as the evaluation needs it.
pub struct EvalData {
    pub pairs: Vec<KacePair>,
    pub features: HashMap<String, Features>,
    pub cases: Vec<Case>,
    /// `NvmlOnly` once the kernel metrics are withheld: models are then fitted as the
    /// service fits its NVML-only twin.
    pub level: ProfileLevel,
}

#[derive(Deserialize)]
struct SplitRow {
    n_occur: u32,
    seed: u32,
    workload1: String,
    workload2: String,
}

impl EvalData {
    /// Every profile as NVML alone measures it ([`Features::nvml_only`]).
    pub fn withhold_kernel_metrics(&mut self) {
        for f in self.features.values_mut() {
            *f = f.nvml_only();
        }
        self.level = ProfileLevel::NvmlOnly;
    }

    /// Reads the dataset and its splits (splits.csv beside the metric files).
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let dataset = KaceDataset::read(dir)?;
        let features: HashMap<String, Features> = dataset.features();
        let pairs: Vec<KacePair> = dataset
            .pairs
            .into_iter()
            .filter(|p| features.contains_key(&p.workload1) && features.contains_key(&p.workload2))
            .collect();
        let index: HashMap<(&str, &str), usize> = pairs
            .iter()
            .enumerate()
            .map(|(i, p)| ((p.workload1.as_str(), p.workload2.as_str()), i))
            .collect();

        // Without splits.csv (a dataset of coloc's own, such as datasets/h100): the unseen
        // protocol only.
        let splits_path = dir.join("splits.csv");
        let mut training: BTreeMap<(u32, u32), BTreeSet<usize>> = BTreeMap::new();
        let rows: Vec<SplitRow> = if splits_path.exists() {
            csv::Reader::from_path(&splits_path)
                .with_context(|| format!("cannot read {}", splits_path.display()))?
                .deserialize::<SplitRow>()
                .collect::<Result<_, _>>()
                .with_context(|| format!("bad row in {}", splits_path.display()))?
        } else {
            Vec::new()
        };
        for row in rows.into_iter().map(Ok::<_, anyhow::Error>) {
            let row = row.with_context(|| format!("bad row in {}", splits_path.display()))?;
            let Some(&i) = index
                .get(&(row.workload1.as_str(), row.workload2.as_str()))
                .or_else(|| index.get(&(row.workload2.as_str(), row.workload1.as_str())))
            else {
                bail!(
                    "split ({}, {}) trains on {} + {}, which is not in pairs.csv",
                    row.n_occur,
                    row.seed,
                    row.workload1,
                    row.workload2
                );
            };
            training
                .entry((row.n_occur, row.seed))
                .or_default()
                .insert(i);
        }

        let mut cases: Vec<Case> = training
            .into_iter()
            .map(|((n_occur, seed), train)| Case {
                protocol: Protocol::Split,
                n_occur: Some(n_occur),
                seed: Some(seed),
                holdout: None,
                targets: None,
                test: (0..pairs.len()).filter(|i| !train.contains(i)).collect(),
                train: train.into_iter().collect(),
            })
            .collect();
        let workloads: BTreeSet<&str> = pairs
            .iter()
            .flat_map(|p| [p.workload1.as_str(), p.workload2.as_str()])
            .collect();
        for &w in &workloads {
            let (test, train): (Vec<usize>, Vec<usize>) =
                (0..pairs.len()).partition(|&i| pairs[i].workload1 == w || pairs[i].workload2 == w);
            cases.push(Case {
                protocol: Protocol::Unseen,
                n_occur: None,
                seed: None,
                holdout: Some(w.to_string()),
                targets: Some(BTreeSet::from([w.to_string()])),
                train,
                test,
            });
        }
        let mut families: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for &w in &workloads {
            families
                .entry(family_label(w))
                .or_default()
                .insert(w.to_string());
        }
        for (label, members) in families {
            let (test, train): (Vec<usize>, Vec<usize>) = (0..pairs.len()).partition(|&i| {
                members.contains(&pairs[i].workload1) || members.contains(&pairs[i].workload2)
            });
            cases.push(Case {
                protocol: Protocol::Family,
                n_occur: None,
                seed: None,
                holdout: Some(label),
                targets: Some(members),
                train,
                test,
            });
        }
        Ok(Self {
            pairs,
            features,
            cases,
            level: ProfileLevel::Full,
        })
    }

    pub fn row(&self, i: usize) -> TrainingRow {
        let p = &self.pairs[i];
        TrainingRow {
            members: vec![self.features[&p.workload1], self.features[&p.workload2]],
            throughputs: vec![p.throughput1, p.throughput2],
        }
    }
}

/// A workload's family as the family protocols name it: its model and mode
/// (`bert-base-cased inf` for every batch size of BERT-base inference).
pub fn family_label(name: &str) -> String {
    let (model, _, mode) = coloc::dataset::parse_workload_name(name);
    format!("{model} {}", mode.as_str())
}

/// What one policy made of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub case: usize,
    pub policy: Policy,
    /// score(target) per target, by target name.
    pub target_scores: BTreeMap<String, f64>,
    /// The policy's score of each test pair, in `Case::test` order (models: the predicted
    /// throughput sum); empty for `Random`.
    pub pair_scores: Vec<f64>,
    /// Models: the absolute percentage errors of every test pair.
    pub ape: mape::Ape,
}

impl CaseResult {
    pub fn mean(&self) -> f64 {
        self.target_scores.values().sum::<f64>() / self.target_scores.len() as f64
    }
}

/// Scores a case given each test pair's policy score: per target, the best-scored pair
/// containing it (ties broken by partner name, as Rank does) against the oracle.
pub fn score_targets(
    pairs: &[KacePair],
    test: &[usize],
    pair_scores: &[f64],
    only: Option<&BTreeSet<String>>,
) -> BTreeMap<String, f64> {
    let mut by_target: BTreeMap<&str, Vec<(f64, &str, f64)>> = BTreeMap::new();
    for (&i, &score) in test.iter().zip(pair_scores) {
        let p = &pairs[i];
        let actual = p.throughput_sum();
        by_target
            .entry(&p.workload1)
            .or_default()
            .push((score, &p.workload2, actual));
        if p.workload2 != p.workload1 {
            by_target
                .entry(&p.workload2)
                .or_default()
                .push((score, &p.workload1, actual));
        }
    }
    by_target
        .into_iter()
        .filter(|(t, _)| only.is_none_or(|o| o.contains(*t)))
        .map(|(target, candidates)| {
            let oracle = candidates.iter().map(|c| c.2).fold(f64::MIN, f64::max);
            let picked = candidates
                .iter()
                .min_by(|a, b| rank_order((a.0, a.1), (b.0, b.1)))
                .expect("a target has at least one pair");
            (target.to_string(), picked.2 / oracle)
        })
        .collect()
}

/// The expected score of a random pick: the mean of actual/oracle over each target's pairs.
pub fn random_targets(
    pairs: &[KacePair],
    test: &[usize],
    only: Option<&BTreeSet<String>>,
) -> BTreeMap<String, f64> {
    let mut by_target: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for &i in test {
        let p = &pairs[i];
        by_target
            .entry(&p.workload1)
            .or_default()
            .push(p.throughput_sum());
        if p.workload2 != p.workload1 {
            by_target
                .entry(&p.workload2)
                .or_default()
                .push(p.throughput_sum());
        }
    }
    by_target
        .into_iter()
        .filter(|(t, _)| only.is_none_or(|o| o.contains(*t)))
        .map(|(target, sums)| {
            let oracle = sums.iter().cloned().fold(f64::MIN, f64::max);
            let mean = sums.iter().map(|s| s / oracle).sum::<f64>() / sums.len() as f64;
            (target.to_string(), mean)
        })
        .collect()
}

/// Runs every policy on every case. Model fits are CPU work: call from a blocking context.
pub fn evaluate(data: &EvalData, policies: &[Policy]) -> anyhow::Result<Vec<CaseResult>> {
    let mut results = Vec::new();
    let progress = coloc::progress::bar((data.cases.len() * policies.len()) as u64, "eval");
    for (c, case) in data.cases.iter().enumerate() {
        let only = case.targets.as_ref();
        for &policy in policies {
            progress.inc(1);
            let mut ape = mape::Ape::default();
            let pair_scores: Vec<f64> = match policy {
                Policy::Random => Vec::new(),
                Policy::SmallestMemory => case
                    .test
                    .iter()
                    .map(|&i| {
                        -data
                            .row(i)
                            .members
                            .iter()
                            .map(Features::memory_gb)
                            .sum::<f64>()
                    })
                    .collect(),
                Policy::LargestExclusive => case
                    .test
                    .iter()
                    .map(|&i| {
                        data.row(i)
                            .members
                            .iter()
                            .map(Features::exclusive_throughput)
                            .sum()
                    })
                    .collect(),
                Policy::Model(_) | Policy::Candidate(_) => {
                    let rows: Vec<TrainingRow> = case.train.iter().map(|&i| data.row(i)).collect();
                    let params = policy.fit(&rows, data.level).with_context(|| {
                        format!(
                            "fitting {} on case {c} ({} rows)",
                            policy.name(),
                            rows.len()
                        )
                    })?;
                    case.test
                        .iter()
                        .map(|&i| {
                            let row = data.row(i);
                            let members: Vec<&Features> = row.members.iter().collect();
                            let predicted = params.predict(&[members]).remove(0).prediction;
                            ape.add(&row.members, &predicted, &row.throughputs);
                            predicted.sum
                        })
                        .collect()
                }
            };
            let target_scores = match policy {
                Policy::Random => random_targets(&data.pairs, &case.test, only),
                _ => score_targets(&data.pairs, &case.test, &pair_scores, only),
            };
            results.push(CaseResult {
                case: c,
                policy,
                target_scores,
                pair_scores,
                ape,
            });
        }
    }
    Ok(results)
}

/// The summary table: one row per n_occur, the mean over all splits, the mean over the
/// report half of the seeds, and the unseen-workload protocol.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub policies: Vec<String>,
    pub rows: Vec<SummaryRow>,
    /// Per policy, per target: the mean score over the n_occur=2 splits.
    pub per_target_n_occur_2: BTreeMap<String, BTreeMap<String, f64>>,
    /// With `--coverage`: the default model's 80 % intervals on each pair protocol.
    pub coverage: Vec<nway::Coverage>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SummaryRow {
    pub row: String,
    /// Per policy name.
    pub scores: BTreeMap<String, f64>,
    /// Per model policy name: the absolute percentage errors of the row's test pairs.
    pub mape: BTreeMap<String, mape::Mape>,
}

/// Seeds on which settings may be chosen; the others report.
pub const SELECTION_SEEDS: [u32; 2] = [10, 30];

pub fn summarize(data: &EvalData, policies: &[Policy], results: &[CaseResult]) -> Summary {
    let names: Vec<String> = policies.iter().map(|p| p.name()).collect();
    let mean_of = |filter: &dyn Fn(&Case) -> bool, policy: Policy| -> f64 {
        let values: Vec<f64> = results
            .iter()
            .filter(|r| r.policy == policy && filter(&data.cases[r.case]))
            .map(CaseResult::mean)
            .collect();
        values.iter().sum::<f64>() / values.len() as f64
    };
    let mut rows = Vec::new();
    let mut n_occurs: Vec<u32> = data.cases.iter().filter_map(|c| c.n_occur).collect();
    n_occurs.sort();
    n_occurs.dedup();
    let mape_of = |filter: &dyn Fn(&Case) -> bool, policy: Policy| -> mape::Mape {
        let mut ape = mape::Ape::default();
        for r in results
            .iter()
            .filter(|r| r.policy == policy && filter(&data.cases[r.case]))
        {
            ape.extend(&r.ape);
        }
        ape.summary()
    };
    let row = |label: String, filter: &dyn Fn(&Case) -> bool| SummaryRow {
        row: label,
        scores: policies
            .iter()
            .map(|&p| (p.name(), mean_of(filter, p)))
            .collect(),
        mape: policies
            .iter()
            .filter(|p| matches!(p, Policy::Model(_) | Policy::Candidate(_)))
            .map(|&p| (p.name(), mape_of(filter, p)))
            .collect(),
    };
    for n in &n_occurs {
        rows.push(row(format!("n_occur={n}"), &|c| c.n_occur == Some(*n)));
    }
    let selection_seed = |c: &Case| c.seed.is_some_and(|s| SELECTION_SEEDS.contains(&s));
    let split = |c: &Case| c.protocol == Protocol::Split;
    rows.push(row("mean".into(), &|c| split(c)));
    rows.push(row("n_occur=2, selection seeds 10,30".into(), &|c| {
        c.n_occur == Some(2) && selection_seed(c)
    }));
    rows.push(row("n_occur=2, report seeds 20,40,50".into(), &|c| {
        c.n_occur == Some(2) && !selection_seed(c)
    }));
    rows.push(row("mean, selection seeds 10,30".into(), &|c| {
        split(c) && selection_seed(c)
    }));
    rows.push(row("mean, report seeds 20,40,50".into(), &|c| {
        split(c) && !selection_seed(c)
    }));
    rows.push(row("unseen".into(), &|c| c.protocol == Protocol::Unseen));
    // Held-out workloads in name order: the even-numbered half may choose settings, the
    // odd-numbered half reports.
    let mut holdouts: Vec<&str> = data
        .cases
        .iter()
        .filter_map(|c| c.holdout.as_deref())
        .collect();
    holdouts.sort();
    let selection_workload = |c: &Case| {
        c.holdout
            .as_deref()
            .and_then(|h| holdouts.iter().position(|x| *x == h))
            .is_some_and(|i| i % 2 == 0)
    };
    rows.push(row("unseen, selection workloads (even)".into(), &|c| {
        c.protocol == Protocol::Unseen && selection_workload(c)
    }));
    rows.push(row("unseen, report workloads (odd)".into(), &|c| {
        c.protocol == Protocol::Unseen && !selection_workload(c)
    }));
    rows.push(row("family unseen".into(), &|c| {
        c.protocol == Protocol::Family
    }));

    let mut per_target: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for &policy in policies {
        let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for r in results
            .iter()
            .filter(|r| r.policy == policy && data.cases[r.case].n_occur == Some(2))
        {
            for (target, score) in &r.target_scores {
                let entry = sums.entry(target.clone()).or_default();
                entry.0 += score;
                entry.1 += 1;
            }
        }
        per_target.insert(
            policy.name(),
            sums.into_iter()
                .map(|(t, (s, n))| (t, s / n as f64))
                .collect(),
        );
    }
    Summary {
        policies: names,
        rows,
        per_target_n_occur_2: per_target,
        coverage: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(a: &str, b: &str, t1: f64, t2: f64) -> KacePair {
        KacePair {
            workload1: a.into(),
            workload2: b.into(),
            throughput1: t1,
            throughput2: t2,
        }
    }

    #[test]
    fn the_scorer_matches_a_hand_computed_example() {
        // Target A has pairs AB (sum 10), AC (sum 8), AA (sum 5); B has AB and BC (sum 4).
        let pairs = vec![
            pair("A", "B", 6.0, 4.0),
            pair("A", "C", 5.0, 3.0),
            pair("A", "A", 2.5, 2.5),
            pair("B", "C", 1.0, 3.0),
        ];
        let test = [0, 1, 2, 3];
        // The policy scores BC highest, then AC: A picks AC (8/10), B picks BC (4/10), and
        // C picks BC (4/8).
        let scores = [1.0, 3.0, 2.0, 5.0];
        let got = score_targets(&pairs, &test, &scores, None);
        let only_b = BTreeSet::from(["B".to_string()]);
        assert_eq!(got["A"], 0.8);
        assert_eq!(got["B"], 0.4);
        assert_eq!(got["C"], 0.5);
        // Random: A = (10/10 + 8/10 + 5/10) / 3, B = (1 + 0.4) / 2, C = (1 + 0.5) / 2.
        let random = random_targets(&pairs, &test, None);
        assert!((random["A"] - 2.3 / 3.0).abs() < 1e-12);
        assert!((random["B"] - 0.7).abs() < 1e-12);
        assert!((random["C"] - 0.75).abs() < 1e-12);
        // Only the held-out target is scored in the unseen protocol.
        assert_eq!(
            score_targets(&pairs, &test, &scores, Some(&only_b)).len(),
            1
        );
    }

    #[test]
    fn ties_are_broken_by_partner_name_like_rank() {
        let pairs = vec![pair("T", "Z", 1.0, 1.0), pair("T", "M", 3.0, 3.0)];
        let only_t = BTreeSet::from(["T".to_string()]);
        let got = score_targets(&pairs, &[0, 1], &[7.0, 7.0], Some(&only_t));
        assert_eq!(got["T"], 1.0, "M sorts before Z");
    }
}
