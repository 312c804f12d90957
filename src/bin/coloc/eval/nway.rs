//! `coloc eval nway`: the KACE artifact's "unseen workload" protocol on runs of three or
//! more jobs sharing one GPU (run-set files such as `kace-3way/runs.csv` and
//! `kace-4way/runs.csv`), for every model kind and the random and rule baselines.
//!
//! For each target T (every workload in the runs): candidates = every run containing T;
//! training = every run containing no workload of T's model and mode at any batch size
//! (`bert-base-cased_batch2-inf` removes every `bert-base-cased_*-inf`). The policy picks
//! the candidate with the highest score (ties: the lower run id);
//! score(T) = actual sum of the pick / the best actual sum among T's candidates.
//!
//! Scopes: every run, and, where the file flags them (`in_recorded_eval_subset`), the runs
//! the artifact scored: candidates and training both come from the flagged runs, as the
//! artifact's own dataset file held only those. Training: the runs alone, or "pairs + runs"
//! (the pair dataset's pairs under the same exclusion, and the training runs), as a
//! deployment that has both would train.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::Path,
};

use anyhow::{bail, Context};
use serde::Serialize;

use super::{mape, Policy};
use coloc::{
    dataset::{parse_workload_name, KaceDataset, KacePair, KaceWorkload},
    domain::WorkloadMode,
    model::{self, intervals::Calibration, Features, ModelKind, ProfileLevel, TrainingRow},
};

/// One measured run: the members (repeats allowed) and each one's colocated throughput.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: u64,
    pub members: Vec<String>,
    pub throughputs: Vec<f64>,
    /// `Some` when the file has an `in_recorded_eval_subset` column.
    pub in_subset: Option<bool>,
}

impl Run {
    pub fn throughput_sum(&self) -> f64 {
        self.throughputs.iter().sum()
    }
}

/// Reads a run-set file: `run_id`, `workload1..N`, `w1throughput..wNthroughput`, and an
/// optional `in_recorded_eval_subset` (0/1). Other columns are ignored.
pub fn read_runs(path: &Path) -> anyhow::Result<Vec<Run>> {
    let mut reader =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let headers = reader.headers()?.clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let id_col = col("run_id").with_context(|| format!("{}: no run_id column", path.display()))?;
    let mut member_cols = Vec::new();
    for k in 1.. {
        match (
            col(&format!("workload{k}")),
            col(&format!("w{k}throughput")),
        ) {
            (Some(w), Some(t)) => member_cols.push((w, t)),
            (None, None) => break,
            _ => bail!(
                "{}: workload{k} and w{k}throughput must come together",
                path.display()
            ),
        }
    }
    if member_cols.len() < 2 {
        bail!(
            "{}: a run-set file needs workload1.., w1throughput.. for at least two members",
            path.display()
        );
    }
    let subset_col = col("in_recorded_eval_subset");
    let mut runs = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i + 2;
        let r = record.with_context(|| format!("{}: bad row {line}", path.display()))?;
        let number = |c: usize, what: &str| -> anyhow::Result<f64> {
            let value: f64 = r[c]
                .trim()
                .parse()
                .with_context(|| format!("{}: row {line}: {what} {:?}", path.display(), &r[c]))?;
            if !value.is_finite() || value < 0.0 {
                bail!(
                    "{}: row {line}: {what} {value} is not a throughput",
                    path.display()
                );
            }
            Ok(value)
        };
        let id = r[id_col]
            .trim()
            .parse()
            .with_context(|| format!("{}: row {line}: run_id {:?}", path.display(), &r[id_col]))?;
        let mut members = Vec::new();
        let mut throughputs = Vec::new();
        for (k, &(w, t)) in member_cols.iter().enumerate() {
            members.push(r[w].trim().to_string());
            throughputs.push(number(t, &format!("w{}throughput", k + 1))?);
        }
        let in_subset = subset_col.map(|c| r[c].trim() == "1");
        runs.push(Run {
            id,
            members,
            throughputs,
            in_subset,
        });
    }
    Ok(runs)
}

/// Which runs a case draws its candidates and training from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// The runs the artifact scored (`in_recorded_eval_subset` = 1).
    Subset,
    All,
}

/// What a case trains on besides its training runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Training {
    Runs,
    #[serde(rename = "pairs+runs")]
    PairsAndRuns,
}

impl Training {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runs => "runs",
            Self::PairsAndRuns => "pairs+runs",
        }
    }
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Subset => "subset",
            Self::All => "all",
        }
    }
}

/// A run-set file with the profiles and the pairs it is judged with.
pub struct NwayData {
    /// A label for the file, e.g. "4-way".
    pub label: String,
    pub runs: Vec<Run>,
    pub features: HashMap<String, Features>,
    pub pairs: Vec<KacePair>,
    /// Every workload of the profile dataset with its metrics (what the evaluation through
    /// the API registers).
    pub workloads: Vec<KaceWorkload>,
    /// `NvmlOnly` once the kernel metrics are withheld: models are then fitted as the
    /// service fits its NVML-only twin.
    pub level: ProfileLevel,
}

/// One target under one scope and training.
#[derive(Debug, Clone)]
pub struct NwayCase {
    pub scope: Scope,
    pub training: Training,
    pub target: String,
    /// Indices into `runs`.
    pub candidates: Vec<usize>,
    pub train_runs: Vec<usize>,
    /// Indices into `pairs` (empty for `Training::Runs`).
    pub train_pairs: Vec<usize>,
}

/// A workload's family for the protocol's exclusion: its model and mode.
fn family(name: &str) -> (String, WorkloadMode) {
    let (model, _, mode) = parse_workload_name(name);
    (model, mode)
}

impl NwayData {
    /// Reads `runs` and the profiles and pairs of the KACE-format dataset `profiles`.
    pub fn read(label: &str, runs: &Path, profiles: &Path) -> anyhow::Result<Self> {
        let runs = read_runs(runs)?;
        let dataset = KaceDataset::read(profiles)?;
        let features = dataset.features();
        for run in &runs {
            if let Some(missing) = run.members.iter().find(|m| !features.contains_key(*m)) {
                bail!(
                    "run {} has {missing}, which has no profile in {}",
                    run.id,
                    profiles.display()
                );
            }
        }
        let pairs = dataset
            .pairs
            .into_iter()
            .filter(|p| features.contains_key(&p.workload1) && features.contains_key(&p.workload2))
            .collect();
        Ok(Self {
            label: label.to_string(),
            runs,
            features,
            pairs,
            workloads: dataset.workloads,
            level: ProfileLevel::Full,
        })
    }

    /// Every profile as NVML alone measures it ([`Features::nvml_only`]).
    pub fn withhold_kernel_metrics(&mut self) {
        for f in self.features.values_mut() {
            *f = f.nvml_only();
        }
        self.level = ProfileLevel::NvmlOnly;
    }

    pub fn has_subset(&self) -> bool {
        self.runs.iter().any(|r| r.in_subset.is_some())
    }

    /// Every case of the protocol: per scope the file supports, per training, per target.
    pub fn cases(&self) -> Vec<NwayCase> {
        let targets: BTreeSet<&str> = self
            .runs
            .iter()
            .flat_map(|r| r.members.iter().map(String::as_str))
            .collect();
        let mut scopes = Vec::new();
        if self.has_subset() {
            scopes.push(Scope::Subset);
        }
        scopes.push(Scope::All);
        let mut cases = Vec::new();
        for scope in scopes {
            let in_scope: Vec<usize> = (0..self.runs.len())
                .filter(|&i| scope == Scope::All || self.runs[i].in_subset == Some(true))
                .collect();
            for training in [Training::Runs, Training::PairsAndRuns] {
                for &target in &targets {
                    let target_family = family(target);
                    let unseen = |name: &str| family(name) != target_family;
                    let candidates: Vec<usize> = in_scope
                        .iter()
                        .copied()
                        .filter(|&i| self.runs[i].members.iter().any(|m| m == target))
                        .collect();
                    if candidates.is_empty() {
                        continue;
                    }
                    let train_runs = in_scope
                        .iter()
                        .copied()
                        .filter(|&i| self.runs[i].members.iter().all(|m| unseen(m)))
                        .collect();
                    let train_pairs = match training {
                        Training::Runs => Vec::new(),
                        Training::PairsAndRuns => (0..self.pairs.len())
                            .filter(|&i| {
                                unseen(&self.pairs[i].workload1) && unseen(&self.pairs[i].workload2)
                            })
                            .collect(),
                    };
                    cases.push(NwayCase {
                        scope,
                        training,
                        target: target.to_string(),
                        candidates,
                        train_runs,
                        train_pairs,
                    });
                }
            }
        }
        cases
    }

    pub fn run_row(&self, i: usize) -> TrainingRow {
        let run = &self.runs[i];
        TrainingRow {
            members: run.members.iter().map(|m| self.features[m]).collect(),
            throughputs: run.throughputs.clone(),
        }
    }

    pub fn pair_row(&self, i: usize) -> TrainingRow {
        let p = &self.pairs[i];
        TrainingRow {
            members: vec![self.features[&p.workload1], self.features[&p.workload2]],
            throughputs: vec![p.throughput1, p.throughput2],
        }
    }

    /// The member names of `training_rows(case)`, in the same order.
    pub fn training_names(&self, case: &NwayCase) -> Vec<Vec<String>> {
        case.train_pairs
            .iter()
            .map(|&i| {
                vec![
                    self.pairs[i].workload1.clone(),
                    self.pairs[i].workload2.clone(),
                ]
            })
            .chain(
                case.train_runs
                    .iter()
                    .map(|&i| self.runs[i].members.clone()),
            )
            .collect()
    }

    pub fn training_rows(&self, case: &NwayCase) -> Vec<TrainingRow> {
        case.train_pairs
            .iter()
            .map(|&i| self.pair_row(i))
            .chain(case.train_runs.iter().map(|&i| self.run_row(i)))
            .collect()
    }
}

/// What one policy made of one case.
#[derive(Debug, Clone)]
pub struct NwayResult {
    pub case: usize,
    pub policy: Policy,
    /// The policy's score of each candidate, in `NwayCase::candidates` order (models: the
    /// predicted sum); empty for `Random`.
    pub run_scores: Vec<f64>,
    pub score: f64,
    /// Models scored in process: the absolute percentage errors of every candidate.
    pub ape: mape::Ape,
}

/// The candidate a policy picks: the highest score, ties to the lower run id.
pub fn pick(runs: &[Run], candidates: &[usize], scores: &[f64]) -> usize {
    let mut best = 0;
    for k in 1..candidates.len() {
        let (a, b) = (scores[k], scores[best]);
        if a > b || (a == b && runs[candidates[k]].id < runs[candidates[best]].id) {
            best = k;
        }
    }
    candidates[best]
}

/// What `policy` scored on case `c`, from its score of each candidate (`run_scores`, in
/// `case.candidates` order; empty for `Random`): the pick's actual sum / the best actual sum
/// (for `Random`, the mean over the candidates). The in-process evaluation and the one
/// through the API (`nway_api`) both score here.
pub fn scored(
    data: &NwayData,
    case: &NwayCase,
    c: usize,
    policy: Policy,
    run_scores: Vec<f64>,
) -> NwayResult {
    let oracle = case
        .candidates
        .iter()
        .map(|&i| data.runs[i].throughput_sum())
        .fold(f64::MIN, f64::max);
    let score = match policy {
        Policy::Random => {
            case.candidates
                .iter()
                .map(|&i| data.runs[i].throughput_sum() / oracle)
                .sum::<f64>()
                / case.candidates.len() as f64
        }
        _ => data.runs[pick(&data.runs, &case.candidates, &run_scores)].throughput_sum() / oracle,
    };
    NwayResult {
        case: c,
        policy,
        run_scores,
        score,
        ape: mape::Ape::default(),
    }
}

/// Runs every policy on every case. Model fits are CPU work: call from a blocking context.
pub fn evaluate(
    data: &NwayData,
    cases: &[NwayCase],
    policies: &[Policy],
) -> anyhow::Result<Vec<NwayResult>> {
    let mut results = Vec::new();
    let progress = coloc::progress::bar(
        (cases.len() * policies.len()) as u64,
        &format!("eval {}", data.label),
    );
    for (c, case) in cases.iter().enumerate() {
        progress.inc(policies.len() as u64);
        let rows: Vec<TrainingRow> = case.candidates.iter().map(|&i| data.run_row(i)).collect();
        for &policy in policies {
            let mut ape = mape::Ape::default();
            let run_scores: Vec<f64> = match policy {
                Policy::Random => Vec::new(),
                Policy::SmallestMemory => rows
                    .iter()
                    .map(|r| -r.members.iter().map(Features::memory_gb).sum::<f64>())
                    .collect(),
                Policy::LargestExclusive => rows
                    .iter()
                    .map(|r| r.members.iter().map(Features::exclusive_throughput).sum())
                    .collect(),
                Policy::Model(_) | Policy::Candidate(_) => {
                    let training = data.training_rows(case);
                    let params = policy.fit(&training, data.level).with_context(|| {
                        format!(
                            "fitting {} for {} ({}, {}, {} rows)",
                            policy.name(),
                            case.target,
                            case.scope.as_str(),
                            case.training.as_str(),
                            training.len()
                        )
                    })?;
                    rows.iter()
                        .map(|r| {
                            let members: Vec<&Features> = r.members.iter().collect();
                            let predicted = params.predict(&[members]).remove(0).prediction;
                            ape.add(&r.members, &predicted, &r.throughputs);
                            predicted.sum
                        })
                        .collect()
                }
            };
            let mut result = scored(data, case, c, policy, run_scores);
            result.ape = ape;
            results.push(result);
        }
    }
    progress.finish_and_clear();
    Ok(results)
}

/// One line of the summary: a scope and training, per policy the mean and the worst target.
#[derive(Debug, Clone, Serialize)]
pub struct NwayRow {
    pub set: String,
    pub scope: Scope,
    pub training: Training,
    pub targets: usize,
    pub candidates: usize,
    /// Per policy name: the mean over targets.
    pub mean: BTreeMap<String, f64>,
    /// Per policy name: the worst target's score.
    pub worst: BTreeMap<String, f64>,
    /// Per policy name: the mean over the selection half of the targets (even positions in
    /// name order), on which settings may be chosen.
    pub selection: BTreeMap<String, f64>,
    /// Per policy name: the mean over the report half (odd positions).
    pub report: BTreeMap<String, f64>,
    /// Per policy name, per target.
    pub per_target: BTreeMap<String, BTreeMap<String, f64>>,
    /// Per model policy scored in process: the absolute percentage errors over every
    /// target's candidates (a run counts once per target it is a candidate of).
    pub mape: BTreeMap<String, mape::Mape>,
}

pub fn summarize(
    data: &NwayData,
    cases: &[NwayCase],
    policies: &[Policy],
    results: &[NwayResult],
) -> Vec<NwayRow> {
    let mut groups: BTreeMap<(Scope, Training), Vec<usize>> = BTreeMap::new();
    for (c, case) in cases.iter().enumerate() {
        groups
            .entry((case.scope, case.training))
            .or_default()
            .push(c);
    }
    groups
        .into_iter()
        .map(|((scope, training), members)| {
            let candidates: BTreeSet<usize> = members
                .iter()
                .flat_map(|&c| cases[c].candidates.iter().copied())
                .collect();
            let mut mean = BTreeMap::new();
            let mut worst = BTreeMap::new();
            let mut per_target = BTreeMap::new();
            let mut selection = BTreeMap::new();
            let mut report = BTreeMap::new();
            let mut mapes = BTreeMap::new();
            for &policy in policies {
                let mut ape = mape::Ape::default();
                for r in results
                    .iter()
                    .filter(|r| r.policy == policy && members.contains(&r.case))
                {
                    ape.extend(&r.ape);
                }
                if !ape.sums.is_empty() {
                    mapes.insert(policy.name(), ape.summary());
                }
                let scores: BTreeMap<String, f64> = results
                    .iter()
                    .filter(|r| r.policy == policy && members.contains(&r.case))
                    .map(|r| (cases[r.case].target.clone(), r.score))
                    .collect();
                mean.insert(
                    policy.name(),
                    scores.values().sum::<f64>() / scores.len() as f64,
                );
                worst.insert(
                    policy.name(),
                    scores.values().copied().fold(f64::MAX, f64::min),
                );
                let half = |even: bool| {
                    let half: Vec<f64> = scores
                        .values()
                        .enumerate()
                        .filter(|(k, _)| (k % 2 == 0) == even)
                        .map(|(_, s)| *s)
                        .collect();
                    half.iter().sum::<f64>() / half.len() as f64
                };
                selection.insert(policy.name(), half(true));
                report.insert(policy.name(), half(false));
                per_target.insert(policy.name(), scores);
            }
            NwayRow {
                set: data.label.clone(),
                scope,
                training,
                targets: members.len(),
                candidates: candidates.len(),
                mean,
                worst,
                selection,
                report,
                per_target,
                mape: mapes,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: u64, members: &[&str], throughputs: &[f64]) -> Run {
        Run {
            id,
            members: members.iter().map(|m| m.to_string()).collect(),
            throughputs: throughputs.to_vec(),
            in_subset: None,
        }
    }

    #[test]
    fn the_pick_is_the_highest_score_and_ties_go_to_the_lower_run_id() {
        let runs = vec![
            run(7, &["a", "b", "c"], &[1.0, 1.0, 1.0]),
            run(3, &["a", "b", "b"], &[2.0, 1.0, 1.0]),
            run(5, &["a", "c", "c"], &[1.0, 1.0, 9.0]),
        ];
        assert_eq!(pick(&runs, &[0, 1, 2], &[1.0, 2.0, 1.5]), 1);
        assert_eq!(pick(&runs, &[0, 1, 2], &[4.0, 1.0, 4.0]), 2, "id 5 < 7");
    }

    #[test]
    fn a_family_is_the_model_and_mode_at_any_batch_size() {
        assert_eq!(
            family("bert-base-cased_batch2-inf"),
            family("bert-base-cased_batch8-inf")
        );
        assert_ne!(
            family("bert-base-cased_batch2-inf"),
            family("bert-base-cased_batch2-train")
        );
    }
}

/// How often 80 % intervals held what happened, for one protocol and policy (the default
/// model kind and a way of calibrating its intervals).
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    pub protocol: String,
    pub policy: String,
    pub members_inside: usize,
    pub members: usize,
    pub sums_inside: usize,
    pub sums: usize,
}

impl std::fmt::Display for Coverage {
    /// "protocol, policy: members 0.800 (8 of 10), sums ...", as `eval nway` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, {}: members {:.3} ({} of {}), sums {:.3} ({} of {})",
            self.protocol,
            self.policy,
            self.member_fraction(),
            self.members_inside,
            self.members,
            self.sum_fraction(),
            self.sums_inside,
            self.sums
        )
    }
}

impl Coverage {
    /// Adds `other`'s counts to these.
    pub fn pool(&mut self, other: &Coverage) {
        self.members_inside += other.members_inside;
        self.members += other.members;
        self.sums_inside += other.sums_inside;
        self.sums += other.sums;
    }

    pub fn member_fraction(&self) -> f64 {
        self.members_inside as f64 / self.members as f64
    }

    pub fn sum_fraction(&self) -> f64 {
        self.sums_inside as f64 / self.sums as f64
    }

    /// Counts the held-out `test` runs inside the intervals of `params`.
    pub(super) fn add(
        &mut self,
        params: &model::ModelParams,
        test: &[TrainingRow],
    ) -> anyhow::Result<()> {
        let inside = |v: f64, (lo, hi): (f64, f64)| lo <= v && v <= hi;
        for row in test {
            let members: Vec<&Features> = row.members.iter().collect();
            let predicted = params.predict(&[&members]).remove(0);
            let interval = params
                .interval(&members, &predicted.prediction, predicted.difficulty)
                .context("the model has no intervals")?;
            self.sums += 1;
            self.sums_inside += usize::from(inside(row.throughput_sum(), interval.sum));
            if let Some(bounds) = interval.members {
                for (actual, b) in row.throughputs.iter().zip(bounds) {
                    self.members += 1;
                    self.members_inside += usize::from(inside(*actual, b));
                }
            }
        }
        Ok(())
    }

    pub(super) fn new(protocol: String, calibration: &str) -> Self {
        Self {
            protocol,
            policy: format!("{}, {calibration}", ModelKind::DEFAULT.as_str()),
            members_inside: 0,
            members: 0,
            sums_inside: 0,
            sums: 0,
        }
    }
}

/// The model that answers profiles of `level` in `fitted` as `Train` fits it: `fitted`
/// itself for full profiles, its NVML-only twin for NVML-only ones (fitted on the same rows
/// with their kernel metrics withheld, which withholding again leaves as they are).
pub fn at_level(
    fitted: model::ModelParams,
    level: ProfileLevel,
) -> anyhow::Result<model::ModelParams> {
    fitted
        .at_level(level)
        .cloned()
        .context("the default model fitted a twin for NVML-only profiles")
}

/// The default model fitted on `training` as `Train` fits it, once per way of calibrating
/// its intervals (each calibrated on `training` alone).
pub(super) fn fit_calibrated_each(
    training: &[TrainingRow],
    calibrations: &[(&str, Calibration)],
    level: ProfileLevel,
) -> anyhow::Result<Vec<model::ModelParams>> {
    let ways: Vec<Calibration> = calibrations.iter().map(|(_, c)| *c).collect();
    Ok(model::fit_calibrated_each(training, &ways, level)?)
}

/// Coverage of the default model's 80 % intervals, calibrated each way of `calibrations`
/// (as `Train` calibrates them, on each case's training alone), on this file's protocol:
/// every run, runs training, each target's candidates. Per calibration three rows: the
/// selection half of the targets (name order, even positions), the report half (odd), and
/// every target.
pub fn coverage(
    data: &NwayData,
    cases: &[NwayCase],
    calibrations: &[(&str, Calibration)],
) -> anyhow::Result<Vec<Coverage>> {
    let protocol = format!("{} all, runs, unseen family", data.label);
    let halves = ["selection targets (even)", "report targets (odd)"];
    let mut rows: Vec<[Coverage; 3]> = calibrations
        .iter()
        .map(|(name, _)| {
            [
                Coverage::new(format!("{protocol}, {}", halves[0]), name),
                Coverage::new(format!("{protocol}, {}", halves[1]), name),
                Coverage::new(protocol.clone(), name),
            ]
        })
        .collect();
    // A target's half: its position among every target of the file, in name order (the
    // cases may be a subset of them).
    let targets: BTreeSet<&str> = data
        .runs
        .iter()
        .flat_map(|r| r.members.iter().map(String::as_str))
        .collect();
    for case in cases
        .iter()
        .filter(|c| c.scope == Scope::All && c.training == Training::Runs)
    {
        let position = targets
            .iter()
            .position(|t| *t == case.target)
            .context("a case's target is one of the runs' workloads")?;
        let test: Vec<TrainingRow> = case.candidates.iter().map(|&i| data.run_row(i)).collect();
        let models = fit_calibrated_each(&data.training_rows(case), calibrations, data.level)?;
        for (row, params) in rows.iter_mut().zip(&models) {
            row[position % 2].add(params, &test)?;
            row[2].add(params, &test)?;
        }
    }
    Ok(rows.into_iter().flatten().collect())
}

/// A [`seen_coverage`] row.
#[derive(Debug, Clone, Serialize)]
pub struct SeenCoverage {
    #[serde(flatten)]
    pub coverage: Coverage,
    /// Scored runs (sets) whose interval came from the seen bands.
    pub by_seen_bands: usize,
}

/// Coverage of the intervals `Train` gives sets of workloads it has seen (its seen bands
/// where they cover a set, docs/nway.md, "Seen bands"): five folds of whole sets (every
/// copy of a set in one fold, `intervals::set_folds`) of the file's runs, the default model
/// fitted as `Train` fits it on every pair and the other folds' runs, scored on the
/// held-out runs whose every member is in a run of that training. With `pairs`, also the
/// pairs alone the same way (folds of the pairs, a model on the other pairs): the pairs'
/// seen band on pairs of seen workloads. Returns the rows, each with how many scored runs
/// the seen bands answered.
pub fn seen_coverage(data: &NwayData, pairs: bool) -> anyhow::Result<Vec<SeenCoverage>> {
    let folds = model::intervals::set_folds;
    let mut rows = Vec::new();
    let mut measure = |protocol: String,
                       fixed: Vec<TrainingRow>,
                       folded: Vec<TrainingRow>|
     -> anyhow::Result<()> {
        let mut coverage = Coverage::new(protocol, "chosen as Train fits it");
        let mut by_seen_bands = 0;
        for fold in folds(&folded) {
            let mut held = vec![false; folded.len()];
            for &i in &fold {
                held[i] = true;
            }
            let training: Vec<TrainingRow> = fixed
                .iter()
                .cloned()
                .chain(
                    (0..folded.len())
                        .filter(|&i| !held[i])
                        .map(|i| folded[i].clone()),
                )
                .collect();
            let (fitted, _) = model::fit(ModelKind::DEFAULT, &training)?;
            let params = at_level(fitted, data.level)?;
            let known: std::collections::HashSet<u64> = training
                .iter()
                .flat_map(|r| r.members.iter().map(Features::fingerprint))
                .collect();
            let test: Vec<TrainingRow> = fold
                .iter()
                .map(|&i| folded[i].clone())
                .filter(|row| row.members.iter().all(|m| known.contains(&m.fingerprint())))
                .collect();
            if let model::ModelParams::MemberRidgeGbt(m) = &params {
                if let Some(seen) = &m.seen {
                    by_seen_bands += test
                        .iter()
                        .filter(|row| {
                            let members: Vec<&Features> = row.members.iter().collect();
                            seen.apply(&members, &params.predict(&[&members])[0].prediction)
                                .is_some()
                        })
                        .count();
                }
            }
            coverage.add(&params, &test)?;
        }
        rows.push(SeenCoverage {
            coverage,
            by_seen_bands,
        });
        Ok(())
    };
    let pair_rows: Vec<TrainingRow> = (0..data.pairs.len()).map(|i| data.pair_row(i)).collect();
    if pairs {
        measure(
            "pairs, held out at random, seen workloads".into(),
            Vec::new(),
            pair_rows.clone(),
        )?;
    }
    measure(
        format!(
            "{} all, runs held out at random, seen workloads",
            data.label
        ),
        pair_rows,
        (0..data.runs.len()).map(|i| data.run_row(i)).collect(),
    )?;
    Ok(rows)
}

/// The same on the pair dataset's unseen-workload protocol: each workload's pairs against
/// a model fitted and calibrated on the pairs without it; one row per calibration.
pub fn pair_coverage(
    data: &NwayData,
    calibrations: &[(&str, Calibration)],
) -> anyhow::Result<Vec<Coverage>> {
    let workloads: BTreeSet<&str> = data
        .pairs
        .iter()
        .flat_map(|p| [p.workload1.as_str(), p.workload2.as_str()])
        .collect();
    let mut rows: Vec<Coverage> = calibrations
        .iter()
        .map(|(name, _)| Coverage::new("pairs, unseen workload".into(), name))
        .collect();
    for &w in &workloads {
        let (test, train): (Vec<usize>, Vec<usize>) = (0..data.pairs.len())
            .partition(|&i| data.pairs[i].workload1 == w || data.pairs[i].workload2 == w);
        let pair_rows = |idx: &[usize]| idx.iter().map(|&i| data.pair_row(i)).collect::<Vec<_>>();
        let models = fit_calibrated_each(&pair_rows(&train), calibrations, data.level)?;
        let test = pair_rows(&test);
        for (row, params) in rows.iter_mut().zip(&models) {
            row.add(params, &test)?;
        }
    }
    Ok(rows)
}
