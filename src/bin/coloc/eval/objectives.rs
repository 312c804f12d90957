//! `coloc eval objectives`: which Rank objective a scheduler should get by default. For
//! every held-out workload (the unseen protocol: no pair of it in training) a model of the
//! default kind is fitted on the other pairs and predicts each member of the held-out
//! workload's measured pairs; each policy picks one partner (or none, when it keeps only
//! pairs predicted to beat running the two apart) and is judged on what the pick measured.
//!
//! The protocol and its figures were fixed before looking at the results: the actual
//! normalized sum of the pick (Σ colocated / exclusive; 1 = the same work as running the two
//! apart, and "no pick" counts as 1), how many picks in fact lose (actual normalized sum
//! below 1), how many leave the target below half its speed, and KACE's score (actual
//! throughput sum / the best actual sum among the target's pairs).

use std::collections::BTreeMap;

use anyhow::Context;
use serde::Serialize;

use super::{EvalData, Protocol};
use coloc::{
    advisor::rank_order,
    model::{self, Features, ModelKind, TrainingRow},
};

/// A Rank policy as evaluated here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ObjectivePolicy {
    /// Orders by the predicted normalized sum (else by the predicted throughput sum).
    pub normalized: bool,
    /// Leaves out candidates predicted below break-even (normalized sum < 1).
    pub break_even: bool,
}

impl ObjectivePolicy {
    pub const ALL: [ObjectivePolicy; 4] = [
        ObjectivePolicy {
            normalized: false,
            break_even: false,
        },
        ObjectivePolicy {
            normalized: false,
            break_even: true,
        },
        ObjectivePolicy {
            normalized: true,
            break_even: false,
        },
        ObjectivePolicy {
            normalized: true,
            break_even: true,
        },
    ];

    pub fn name(self) -> String {
        format!(
            "{}{}",
            if self.normalized {
                "NORMALIZED_SUM"
            } else {
                "THROUGHPUT_SUM"
            },
            if self.break_even { " + break-even" } else { "" }
        )
    }
}

/// What one policy's picks measured, over a set of held-out targets.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ObjectiveFigures {
    pub targets: usize,
    /// Targets for which the policy picked no partner (every pair predicted to lose).
    pub no_pick: usize,
    /// Mean actual normalized sum of the pick (1 where there is none).
    pub mean_normalized_sum: f64,
    /// Picks whose actual normalized sum is below 1: worse than running apart.
    pub losses: usize,
    /// Picks that left the target below 50 % of its exclusive throughput.
    pub target_below_half: usize,
    /// Mean actual throughput sum of the pick / the best actual sum among the target's
    /// pairs (KACE's score; targets with no pick are left out).
    pub kace_score: f64,
    /// Distinct partners picked.
    pub distinct_partners: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ObjectiveReport {
    pub kind: String,
    /// Per row ("all", "selection workloads (even)", "report workloads (odd)"), per policy.
    pub rows: BTreeMap<String, BTreeMap<String, ObjectiveFigures>>,
}

/// One held-out target's candidates: (partner, predicted sum, predicted normalized sum,
/// actual sum, actual normalized sum, actual fraction the target kept).
type Candidate = (String, f64, f64, f64, f64, f64);

fn pick(candidates: &[Candidate], policy: ObjectivePolicy) -> Option<&Candidate> {
    candidates
        .iter()
        .filter(|c| !policy.break_even || c.2 >= 1.0)
        .min_by(|a, b| {
            let score = |c: &Candidate| if policy.normalized { c.2 } else { c.1 };
            rank_order((score(a), &a.0), (score(b), &b.0))
        })
}

/// Runs the unseen protocol with `kind`. CPU work: call from a blocking context.
pub fn evaluate_objectives(data: &EvalData, kind: ModelKind) -> anyhow::Result<ObjectiveReport> {
    let mut per_target: Vec<(String, Vec<Candidate>)> = Vec::new();
    let unseen = data
        .cases
        .iter()
        .filter(|c| c.protocol == Protocol::Unseen)
        .count();
    let progress = coloc::progress::bar(unseen as u64, "eval objectives");
    for case in data.cases.iter().filter(|c| c.protocol == Protocol::Unseen) {
        progress.inc(1);
        let target = case
            .holdout
            .clone()
            .expect("unseen cases name their holdout");
        let rows: Vec<TrainingRow> = case.train.iter().map(|&i| data.row(i)).collect();
        // The point predictions are what is judged: no interval calibration.
        let params = model::fit_point(kind, &rows)
            .with_context(|| format!("fitting {} without {target}", kind.as_str()))?;
        let mut candidates = Vec::new();
        for &i in &case.test {
            let pair = &data.pairs[i];
            // The target first, as Rank orders members.
            let (partner, target_actual, partner_actual) = if pair.workload1 == target {
                (&pair.workload2, pair.throughput1, pair.throughput2)
            } else {
                (&pair.workload1, pair.throughput2, pair.throughput1)
            };
            let features: [&Features; 2] = [&data.features[&target], &data.features[partner]];
            let exclusive: Vec<f64> = features.iter().map(|f| f.exclusive_throughput()).collect();
            let prediction = params.predict(&[features]).remove(0).prediction;
            let (members, _) = prediction.members_or_estimated(&exclusive);
            let predicted_normalized = members[0] / exclusive[0] + members[1] / exclusive[1];
            let actual_normalized = target_actual / exclusive[0] + partner_actual / exclusive[1];
            candidates.push((
                partner.clone(),
                prediction.sum,
                predicted_normalized,
                target_actual + partner_actual,
                actual_normalized,
                target_actual / exclusive[0],
            ));
        }
        per_target.push((target, candidates));
    }
    progress.finish_and_clear();
    per_target.sort_by(|a, b| a.0.cmp(&b.0));

    let mut rows = BTreeMap::new();
    let halves: [(&str, &dyn Fn(usize) -> bool); 3] = [
        ("all", &|_| true),
        ("selection workloads (even)", &|i| i % 2 == 0),
        ("report workloads (odd)", &|i| i % 2 == 1),
    ];
    for (label, keep) in halves {
        let mut by_policy = BTreeMap::new();
        for policy in ObjectivePolicy::ALL {
            let mut figures = ObjectiveFigures::default();
            let mut partners = std::collections::BTreeSet::new();
            let (mut normalized_total, mut kace_total, mut picked) = (0.0, 0.0, 0usize);
            let kept = per_target.iter().enumerate().filter(|(i, _)| keep(*i));
            for (_, (_, candidates)) in kept {
                figures.targets += 1;
                let oracle = candidates.iter().map(|c| c.3).fold(f64::MIN, f64::max);
                match pick(candidates, policy) {
                    None => {
                        figures.no_pick += 1;
                        normalized_total += 1.0;
                    }
                    Some(c) => {
                        picked += 1;
                        partners.insert(c.0.clone());
                        normalized_total += c.4;
                        kace_total += c.3 / oracle;
                        figures.losses += usize::from(c.4 < 1.0);
                        figures.target_below_half += usize::from(c.5 < 0.5);
                    }
                }
            }
            figures.mean_normalized_sum = normalized_total / figures.targets as f64;
            figures.kace_score = kace_total / picked.max(1) as f64;
            figures.distinct_partners = partners.len();
            by_policy.insert(policy.name(), figures);
        }
        rows.insert(label.to_string(), by_policy);
    }
    Ok(ObjectiveReport {
        kind: kind.as_str().to_string(),
        rows,
    })
}

/// The report as a table for people.
pub fn print_objectives(
    report: &ObjectiveReport,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "model kind {} (unseen protocol: each target held out of training)",
        report.kind
    )?;
    for (row, policies) in &report.rows {
        writeln!(out, "\n{row}")?;
        writeln!(
            out,
            "{:<30} {:>7} {:>7} {:>10} {:>7} {:>11} {:>10} {:>9}",
            "policy",
            "targets",
            "no pick",
            "mean norm",
            "losses",
            "target<50%",
            "kace score",
            "partners"
        )?;
        for (name, f) in policies {
            writeln!(
                out,
                "{:<30} {:>7} {:>7} {:>10.3} {:>7} {:>11} {:>10.3} {:>9}",
                name,
                f.targets,
                f.no_pick,
                f.mean_normalized_sum,
                f.losses,
                f.target_below_half,
                f.kace_score,
                f.distinct_partners
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(partner: &str, sum: f64, normalized: f64) -> Candidate {
        (partner.to_string(), sum, normalized, 0.0, 0.0, 0.0)
    }

    #[test]
    fn each_policy_picks_by_its_own_score_and_break_even_can_leave_no_pick() {
        // B has the biggest predicted sum but is predicted to lose; C the best normalized.
        let candidates = [
            candidate("A", 10.0, 1.2),
            candidate("B", 50.0, 0.8),
            candidate("C", 5.0, 1.9),
        ];
        let [sum, sum_even, normalized, normalized_even] = ObjectivePolicy::ALL;
        assert_eq!(pick(&candidates, sum).unwrap().0, "B");
        assert_eq!(pick(&candidates, sum_even).unwrap().0, "A");
        assert_eq!(pick(&candidates, normalized).unwrap().0, "C");
        assert_eq!(pick(&candidates, normalized_even).unwrap().0, "C");
        let losers = [candidate("A", 10.0, 0.9), candidate("B", 50.0, 0.8)];
        assert!(pick(&losers, normalized_even).is_none());
        assert_eq!(pick(&losers, normalized).unwrap().0, "A");
    }
}
