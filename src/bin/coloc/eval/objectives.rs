//! `coloc eval objectives`: what a scheduler that follows Rank's top pick blindly gets, per
//! policy. For every held-out workload (the unseen protocol: no pair of it in training) a
//! model of the default kind is fitted, with its intervals, on the other pairs; a catalog
//! holds every profiled workload of the dataset (measured or not, as a fresh import does),
//! and the training pairs are its stored runs (evidence, suspect profiles). Each policy asks
//! the real Rank (`coloc::advisor::rank_in`) for the target's top partner and is judged on
//! what that pair measured.
//!
//! The protocol and its figures were fixed before the runs (issue 37): the measured
//! normalized sum of the picks (Σ colocated / exclusive by the profiles' figures; "no pick"
//! counts as 1, running apart), measured losses (below 1), targets left below 50 % of their
//! exclusive throughput, picks with a member predicted above its exclusive throughput beyond
//! the noise margin (the figure the answer states; and, apart, the profile's), picks never
//! measured (nothing to judge them on), and the oracle: the best measured normalized sum
//! among the target's pairs.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use anyhow::Context;
use serde::Serialize;

use super::{EvalData, Protocol};
use coloc::{
    advisor::{
        rank_in, Catalog, Objective, PlaceRule, Policy, RankQuery, RunSummary,
        EXCLUSIVE_NOISE_MARGIN,
    },
    dataset::{DatasetGpu, KaceDataset},
    domain::{GpuName, Profile, ProfileSource, WorkloadName},
    model::{self, ModelKind, TrainingRow},
    store::StoredModel,
};

/// The policies compared: the default first.
pub fn policies() -> Vec<(&'static str, Policy)> {
    let default = Policy::default();
    let point = |rule| Policy {
        cautious: false,
        rule,
        ..default
    };
    vec![
        ("default (normalized, fair-share, cautious)", default),
        (
            "normalized, fair-share, point",
            point(Some(PlaceRule::FairShare)),
        ),
        (
            "normalized, break-even, point",
            point(Some(PlaceRule::BreakEven)),
        ),
        (
            "normalized, no rule, losses listed",
            Policy::unrestricted(Objective::NormalizedSum),
        ),
        (
            "throughput, no rule, losses listed",
            Policy::unrestricted(Objective::ThroughputSum),
        ),
    ]
}

/// What one policy's picks measured, over the held-out targets.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ObjectiveFigures {
    pub targets: usize,
    /// Targets for which the policy picked no partner.
    pub no_pick: usize,
    /// Mean measured normalized sum of the measured picks, 1 where there is no pick
    /// (unmeasured picks left out).
    pub mean_normalized_sum: f64,
    /// The oracle's: the best measured normalized sum among each target's pairs.
    pub oracle_normalized_sum: f64,
    /// Measured picks below 1: worse than running apart.
    pub losses: usize,
    /// Measured picks that left the target below 50 % of its exclusive throughput.
    pub target_below_half: usize,
    /// Of those two, picks where a measured pair of the target was neither.
    pub avoidable: usize,
    /// Picks with a member predicted above the exclusive throughput its answer states,
    /// beyond the noise margin.
    pub above_exclusive: usize,
    /// Picks with a member predicted above its profile's exclusive throughput beyond the
    /// margin (a suspect profile's corrected figure allows it).
    pub above_profile_exclusive: usize,
    /// Picks of a pair never measured.
    pub never_measured: usize,
    /// Picks whose partner has never run at all (evidence: profile only).
    pub partner_profile_only: usize,
    /// Distinct partners picked.
    pub distinct_partners: usize,
    /// Each target's pick (none: "-").
    pub picks: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ObjectiveReport {
    pub kind: String,
    pub noise_margin: f64,
    /// Suspect profiles found in the whole dataset's runs.
    pub suspect_profiles: Vec<String>,
    /// Per policy.
    pub policies: Vec<(String, ObjectiveFigures)>,
}

/// One measured pair of a target: (measured normalized sum, the target's measured share).
type Measured = (f64, f64);

/// The dataset's catalog: every workload with both metric files, on the dataset's GPU.
fn catalog_of(dir: &Path) -> anyhow::Result<(Catalog, GpuName, f64)> {
    let dataset = KaceDataset::read(dir)?;
    let (gpu, memory) = match DatasetGpu::read(dir)? {
        Some(g) => (g.gpu, g.gpu_memory_gb),
        None => ("Tesla V100-SXM2-32GB".to_string(), 32.0),
    };
    let gpu = GpuName::parse("gpu", &gpu).map_err(|e| anyhow::anyhow!(e.message))?;
    let mut catalog = Catalog::default();
    for w in &dataset.workloads {
        let profile = Profile {
            gpu: gpu.clone(),
            kernel: w.kernel,
            system: w.system.clone(),
            source: ProfileSource::Imported,
            gpu_memory_gb: Some(memory),
            measured_at_ms: 0,
            kernel_missing: false,
        };
        catalog.put_workload(&w.name, &[profile]);
    }
    Ok((catalog, gpu, memory))
}

fn runs_of(data: &EvalData, pairs: &[usize]) -> RunSummary {
    let runs: Vec<Vec<(String, f64)>> = pairs
        .iter()
        .map(|&i| {
            let p = &data.pairs[i];
            vec![
                (p.workload1.clone(), p.throughput1),
                (p.workload2.clone(), p.throughput2),
            ]
        })
        .collect();
    RunSummary::of(runs.iter().map(|r| r.as_slice()), |name| {
        data.features.get(name).map(|f| f.exclusive_throughput())
    })
}

/// Runs the protocol with `kind` on the dataset in `dir`. CPU work: call from a blocking
/// context.
pub fn evaluate_objectives(
    dir: &Path,
    data: &EvalData,
    kind: ModelKind,
) -> anyhow::Result<ObjectiveReport> {
    let (_, gpu, memory) = catalog_of(dir)?;
    let policies = policies();
    let mut figures: Vec<ObjectiveFigures> = vec![ObjectiveFigures::default(); policies.len()];
    let mut partners: Vec<std::collections::BTreeSet<String>> =
        vec![Default::default(); policies.len()];
    let mut oracle_total = 0.0;
    let cases: Vec<_> = data
        .cases
        .iter()
        .filter(|c| c.protocol == Protocol::Unseen)
        .collect();
    let progress = coloc::progress::bar(cases.len() as u64, "eval objectives");
    for case in &cases {
        progress.inc(1);
        let target = case
            .holdout
            .clone()
            .expect("unseen cases name their holdout");
        let rows: Vec<TrainingRow> = case.train.iter().map(|&i| data.row(i)).collect();
        let (params, metrics) = model::fit(kind, &rows)
            .with_context(|| format!("fitting {} without {target}", kind.as_str()))?;
        let model = Arc::new(StoredModel::fitted_in_process(
            gpu.clone(),
            params,
            metrics,
            String::new(),
        ));
        let mut catalog_now = catalog_of(dir)?.0;
        catalog_now.set_scoring_model(model.clone());
        catalog_now.set_runs(&gpu, runs_of(data, &case.train));
        let measured: BTreeMap<&str, Measured> = case
            .test
            .iter()
            .map(|&i| {
                let p = &data.pairs[i];
                let (partner, t, o) = if p.workload1 == target {
                    (&p.workload2, p.throughput1, p.throughput2)
                } else {
                    (&p.workload1, p.throughput2, p.throughput1)
                };
                let e_t = data.features[&target].exclusive_throughput();
                let e_p = data.features[partner].exclusive_throughput();
                (partner.as_str(), (t / e_t + o / e_p, t / e_t))
            })
            .collect();
        let oracle = measured.values().map(|m| m.0).fold(f64::MIN, f64::max);
        oracle_total += oracle;
        let fine_alternative = measured.values().any(|m| m.0 >= 1.0 && m.1 >= 0.5);
        for (k, (_, policy)) in policies.iter().enumerate() {
            let query = RankQuery {
                target: WorkloadName::parse("target", &target)
                    .map_err(|e| anyhow::anyhow!(e.message))?,
                candidates: Vec::new(),
                top_k: 1,
                gpu: Some(gpu.clone()),
                gpu_memory_gb: Some(memory),
                include_oversubscribed: false,
                policy: *policy,
                min_benefit: 0.0,
            };
            let answer = rank_in(&catalog_now, &model, query)
                .map_err(|e| anyhow::anyhow!("Rank refused {target}: {e}"))?;
            judge_pick(
                &mut figures[k],
                &mut partners[k],
                &target,
                answer.ranked.first(),
                &measured,
                fine_alternative,
            );
        }
    }
    progress.finish_and_clear();
    let targets = cases.len().max(1) as f64;
    for (f, p) in figures.iter_mut().zip(&partners) {
        let judged = (f.targets - f.never_measured).max(1) as f64;
        f.mean_normalized_sum /= judged;
        f.oracle_normalized_sum = oracle_total / targets;
        f.distinct_partners = p.len();
    }
    let all: Vec<usize> = (0..data.pairs.len()).collect();
    let suspects = runs_of(data, &all)
        .suspects
        .iter()
        .map(|s| {
            format!(
                "{} ({} of {} runs above {:.2} x 1.1; corrected {:.2})",
                s.workload, s.runs_above, s.runs, s.profile_exclusive, s.corrected_exclusive
            )
        })
        .collect();
    Ok(ObjectiveReport {
        kind: kind.as_str().to_string(),
        noise_margin: EXCLUSIVE_NOISE_MARGIN,
        suspect_profiles: suspects,
        policies: policies
            .iter()
            .map(|(name, _)| name.to_string())
            .zip(figures)
            .collect(),
    })
}

/// Adds one target's pick (or none) to a policy's figures.
fn judge_pick(
    f: &mut ObjectiveFigures,
    partners: &mut std::collections::BTreeSet<String>,
    target: &str,
    pick: Option<&coloc::advisor::RankedCandidate>,
    measured: &BTreeMap<&str, Measured>,
    fine_alternative: bool,
) {
    f.targets += 1;
    let Some(pick) = pick else {
        f.no_pick += 1;
        f.mean_normalized_sum += 1.0;
        f.picks.insert(target.to_string(), "-".into());
        return;
    };
    let partner = pick.workload.as_str();
    f.picks.insert(target.to_string(), partner.to_string());
    partners.insert(partner.to_string());
    let limit = 1.0 + EXCLUSIVE_NOISE_MARGIN;
    let above = |m: &coloc::advisor::MemberPrediction, exclusive: f64| {
        m.predicted_throughput
            .is_some_and(|t| t > exclusive * limit)
    };
    f.above_exclusive += usize::from(
        pick.members
            .iter()
            .any(|m| above(m, m.exclusive_throughput)),
    );
    f.above_profile_exclusive += usize::from(
        pick.members
            .iter()
            .any(|m| above(m, m.profile_exclusive_throughput)),
    );
    f.partner_profile_only +=
        usize::from(pick.members[1].evidence == coloc::advisor::Evidence::ProfileOnly);
    match measured.get(partner) {
        None => f.never_measured += 1,
        Some(&(normalized, share)) => {
            f.mean_normalized_sum += normalized;
            let bad = normalized < 1.0 || share < 0.5;
            f.losses += usize::from(normalized < 1.0);
            f.target_below_half += usize::from(share < 0.5);
            f.avoidable += usize::from(bad && fine_alternative);
        }
    }
}

/// The report as a table for people.
pub fn print_objectives(
    report: &ObjectiveReport,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "model kind {} (unseen protocol: each target held out of training; Rank's top pick \
         over every profiled workload); noise margin {:.0} %",
        report.kind,
        report.noise_margin * 100.0
    )?;
    for suspect in &report.suspect_profiles {
        writeln!(out, "suspect profile: {suspect}")?;
    }
    writeln!(
        out,
        "{:<44} {:>7} {:>7} {:>9} {:>7} {:>6} {:>10} {:>9} {:>9} {:>10} {:>8} {:>8}",
        "policy",
        "targets",
        "no pick",
        "mean norm",
        "oracle",
        "losses",
        "target<50%",
        "avoidable",
        ">excl.",
        ">profile",
        "unmeas.",
        "partners"
    )?;
    for (name, f) in &report.policies {
        writeln!(
            out,
            "{:<44} {:>7} {:>7} {:>9.3} {:>7.3} {:>6} {:>10} {:>9} {:>9} {:>10} {:>8} {:>8}",
            name,
            f.targets,
            f.no_pick,
            f.mean_normalized_sum,
            f.oracle_normalized_sum,
            f.losses,
            f.target_below_half,
            f.avoidable,
            f.above_exclusive,
            f.above_profile_exclusive,
            f.never_measured,
            f.distinct_partners
        )?;
    }
    Ok(())
}
