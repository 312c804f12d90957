//! What a simulation run reports: per policy and seed the operators' figures (makespan,
//! job completion time, queueing delay, GPU-hours, jobs per GPU, out-of-memory events, jobs
//! below their cap, time on the conservative bound, Place calls, the share of job-time run
//! alone and in sets of two, three and four), their spread over the seeds, and the ratios
//! against one job per GPU in the same seed; as a table or JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{engine::Outcome, retraining::RetrainingTrace};

/// One policy on one seed.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub policy: String,
    pub seed: u64,
    pub jobs: usize,
    pub makespan_h: f64,
    pub mean_jct_h: f64,
    pub p50_jct_h: f64,
    pub p95_jct_h: f64,
    pub p99_jct_h: f64,
    pub mean_queueing_h: f64,
    /// The longest a job waited (starvation shows here first).
    pub max_queueing_h: f64,
    pub gpu_hours: f64,
    /// Time-averaged jobs on a busy GPU.
    pub jobs_per_busy_gpu: f64,
    pub max_jobs_on_a_gpu: usize,
    /// Share of all job-time run alone, in a pair, a set of three, of four.
    pub job_time_share_by_set_size: [f64; 4],
    /// The same for capped (LS) jobs only.
    pub capped_job_time_share_by_set_size: [f64; 4],
    pub oom_events: u64,
    /// Capped (LS) jobs that ever ran below their cap.
    pub capped_jobs: usize,
    pub capped_jobs_below_cap: usize,
    /// The lowest speed a capped job ran at, as a share of its cap (1 = never below).
    pub worst_share_of_cap: f64,
    pub job_hours_below_cap: f64,
    /// Share of all job-seconds run at the conservative bound.
    pub bound_share: f64,
    pub bound_job_hours: f64,
    pub place_calls: u64,
    pub place_us_per_call: f64,
    /// A learning policy's runs reported to the service, its retraining turns that
    /// trained, and the models they promoted (0 for the others).
    pub reports: u64,
    pub trainings: u64,
    pub promotions: u64,
    /// Placements taken because Place offered them to explore (`observer.explore_budget`).
    pub explored: u64,
    pub wall_ms: f64,
    /// `coloc-online`'s retraining trace (`--trace-retraining`, written to its own file).
    #[serde(skip)]
    pub retrainings: Vec<RetrainingTrace>,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Each set size's share of the total (sizes 1-4; all zero when nothing ran).
fn shares(by_size: &[f64; 5]) -> [f64; 4] {
    let total: f64 = by_size[1..].iter().sum();
    let mut out = [0.0; 4];
    if total > 0.0 {
        for (o, v) in out.iter_mut().zip(&by_size[1..]) {
            *o = v / total;
        }
    }
    out
}

impl RunSummary {
    pub fn of(policy: &str, seed: u64, outcome: &Outcome) -> Self {
        let h = 3600.0;
        let n = outcome.jobs.len().max(1) as f64;
        let mut jct: Vec<f64> = outcome.jobs.iter().map(|j| j.completion_time()).collect();
        jct.sort_by(f64::total_cmp);
        let capped: Vec<_> = outcome.jobs.iter().filter(|j| j.cap.is_some()).collect();
        Self {
            policy: policy.into(),
            seed,
            jobs: outcome.jobs.len(),
            makespan_h: outcome.makespan / h,
            mean_jct_h: jct.iter().sum::<f64>() / n / h,
            p50_jct_h: percentile(&jct, 0.5) / h,
            p95_jct_h: percentile(&jct, 0.95) / h,
            p99_jct_h: percentile(&jct, 0.99) / h,
            mean_queueing_h: outcome.jobs.iter().map(|j| j.queueing_delay()).sum::<f64>() / n / h,
            max_queueing_h: outcome
                .jobs
                .iter()
                .map(|j| j.queueing_delay())
                .fold(0.0, f64::max)
                / h,
            gpu_hours: outcome.busy_gpu_seconds / h,
            jobs_per_busy_gpu: if outcome.busy_gpu_seconds > 0.0 {
                outcome.job_seconds / outcome.busy_gpu_seconds
            } else {
                0.0
            },
            max_jobs_on_a_gpu: outcome.max_set,
            job_time_share_by_set_size: shares(&outcome.job_seconds_by_set_size),
            capped_job_time_share_by_set_size: shares(&outcome.capped_job_seconds_by_set_size),
            oom_events: outcome.oom_events,
            capped_jobs: capped.len(),
            capped_jobs_below_cap: capped.iter().filter(|j| j.seconds_below_cap > 0.0).count(),
            worst_share_of_cap: capped
                .iter()
                .map(|j| (j.min_speed / j.cap.unwrap_or(1.0)).min(1.0))
                .fold(1.0, f64::min),
            job_hours_below_cap: capped.iter().map(|j| j.seconds_below_cap).sum::<f64>() / h,
            bound_share: if outcome.job_seconds > 0.0 {
                outcome.bound_job_seconds / outcome.job_seconds
            } else {
                0.0
            },
            bound_job_hours: outcome.bound_job_seconds / h,
            place_calls: 0,
            place_us_per_call: 0.0,
            reports: 0,
            trainings: 0,
            promotions: 0,
            explored: 0,
            wall_ms: 0.0,
            retrainings: Vec::new(),
        }
    }
}

/// Mean, smallest and largest over the seeds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Self {
        let v: Vec<f64> = values.into_iter().collect();
        Self {
            mean: v.iter().sum::<f64>() / v.len().max(1) as f64,
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }

    fn show(self, digits: usize) -> String {
        if (self.max - self.min).abs() < 0.5 * 10f64.powi(-(digits as i32)) {
            format!("{:.*}", digits, self.mean)
        } else {
            format!(
                "{:.*} ({:.*}-{:.*})",
                digits, self.mean, digits, self.min, digits, self.max
            )
        }
    }
}

/// A policy over every seed.
#[derive(Debug, Clone, Serialize)]
pub struct PolicySummary {
    pub policy: String,
    pub makespan_h: Spread,
    pub mean_jct_h: Spread,
    pub p50_jct_h: Spread,
    pub p95_jct_h: Spread,
    pub p99_jct_h: Spread,
    pub mean_queueing_h: Spread,
    pub max_queueing_h: Spread,
    pub gpu_hours: Spread,
    pub jobs_per_busy_gpu: Spread,
    pub oom_events: Spread,
    pub capped_jobs_below_cap: Spread,
    pub worst_share_of_cap: Spread,
    pub bound_share: Spread,
    /// 1 - this policy / one-per-gpu, per seed (positive = shorter).
    pub makespan_cut: Option<Spread>,
    pub mean_jct_cut: Option<Spread>,
    pub place_us_per_call: Spread,
    /// Mean over the seeds of [`RunSummary::job_time_share_by_set_size`] and of its
    /// capped-jobs twin.
    pub job_time_share_by_set_size: [f64; 4],
    pub capped_job_time_share_by_set_size: [f64; 4],
}

/// The element-wise mean of `shares` (zeros for none).
fn mean_shares<'a>(shares: impl Iterator<Item = &'a [f64; 4]>) -> [f64; 4] {
    let (mut sum, mut n) = ([0.0; 4], 0.0);
    for s in shares {
        for (t, v) in sum.iter_mut().zip(s) {
            *t += v;
        }
        n += 1.0;
    }
    sum.map(|t| if n > 0.0 { t / n } else { 0.0 })
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub setup: BTreeMap<String, serde_json::Value>,
    pub policies: Vec<PolicySummary>,
    pub runs: Vec<RunSummary>,
}

pub const BASELINE: &str = "one-per-gpu";

impl Report {
    pub fn new(setup: BTreeMap<String, serde_json::Value>, runs: Vec<RunSummary>) -> Self {
        let mut names: Vec<String> = Vec::new();
        for r in &runs {
            if !names.contains(&r.policy) {
                names.push(r.policy.clone());
            }
        }
        let baseline = |seed: u64| runs.iter().find(|r| r.policy == BASELINE && r.seed == seed);
        let policies = names
            .iter()
            .map(|name| {
                let mine: Vec<&RunSummary> = runs.iter().filter(|r| &r.policy == name).collect();
                let s = |f: fn(&RunSummary) -> f64| Spread::of(mine.iter().map(|r| f(r)));
                let cut = |f: fn(&RunSummary) -> f64| {
                    let cuts: Vec<f64> = mine
                        .iter()
                        .filter_map(|r| baseline(r.seed).map(|b| 1.0 - f(r) / f(b)))
                        .collect();
                    (cuts.len() == mine.len() && !cuts.is_empty()).then(|| Spread::of(cuts))
                };
                PolicySummary {
                    policy: name.clone(),
                    makespan_h: s(|r| r.makespan_h),
                    mean_jct_h: s(|r| r.mean_jct_h),
                    p50_jct_h: s(|r| r.p50_jct_h),
                    p95_jct_h: s(|r| r.p95_jct_h),
                    p99_jct_h: s(|r| r.p99_jct_h),
                    mean_queueing_h: s(|r| r.mean_queueing_h),
                    max_queueing_h: s(|r| r.max_queueing_h),
                    gpu_hours: s(|r| r.gpu_hours),
                    jobs_per_busy_gpu: s(|r| r.jobs_per_busy_gpu),
                    oom_events: s(|r| r.oom_events as f64),
                    capped_jobs_below_cap: s(|r| r.capped_jobs_below_cap as f64),
                    worst_share_of_cap: s(|r| r.worst_share_of_cap),
                    bound_share: s(|r| r.bound_share),
                    makespan_cut: cut(|r| r.makespan_h),
                    mean_jct_cut: cut(|r| r.mean_jct_h),
                    place_us_per_call: s(|r| r.place_us_per_call),
                    job_time_share_by_set_size: mean_shares(
                        mine.iter().map(|r| &r.job_time_share_by_set_size),
                    ),
                    capped_job_time_share_by_set_size: mean_shares(
                        mine.iter().map(|r| &r.capped_job_time_share_by_set_size),
                    ),
                }
            })
            .collect();
        Self {
            setup,
            policies,
            runs,
        }
    }

    pub fn print_table(&self) {
        for (k, v) in &self.setup {
            println!("{k}: {v}");
        }
        println!();
        println!(
            "mean over seeds (smallest-largest); cut = 1 - policy / {BASELINE} in the same seed"
        );
        let header = [
            "policy",
            "makespan h",
            "makespan cut",
            "mean JCT h",
            "JCT cut",
            "p50 JCT h",
            "p95 JCT h",
            "p99 JCT h",
            "queueing h",
            "longest wait h",
            "GPU-hours",
            "jobs/GPU",
            "OOM",
            "LS below cap",
            "worst/cap",
            "bound time",
        ];
        println!("| {} |", header.join(" | "));
        println!("|{}", " --- |".repeat(header.len()));
        let pct = |s: Option<Spread>| {
            s.map(|s| {
                Spread {
                    mean: s.mean * 100.0,
                    min: s.min * 100.0,
                    max: s.max * 100.0,
                }
                .show(1)
                    + " %"
            })
            .unwrap_or_else(|| "-".into())
        };
        for p in &self.policies {
            let bound = Spread {
                mean: p.bound_share.mean * 100.0,
                min: p.bound_share.min * 100.0,
                max: p.bound_share.max * 100.0,
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} % |",
                p.policy,
                p.makespan_h.show(0),
                pct(p.makespan_cut),
                p.mean_jct_h.show(1),
                pct(p.mean_jct_cut),
                p.p50_jct_h.show(2),
                p.p95_jct_h.show(1),
                p.p99_jct_h.show(1),
                p.mean_queueing_h.show(1),
                p.max_queueing_h.show(1),
                p.gpu_hours.show(0),
                p.jobs_per_busy_gpu.show(2),
                p.oom_events.show(0),
                p.capped_jobs_below_cap.show(0),
                p.worst_share_of_cap.show(2),
                bound.show(2),
            );
        }
        println!();
        println!("job-time by the size of the set it ran in, mean over seeds: all jobs / LS jobs");
        println!("| policy | alone | pair | three | four |");
        println!("| --- | --- | --- | --- | --- |");
        for p in &self.policies {
            let cells: Vec<String> = p
                .job_time_share_by_set_size
                .iter()
                .zip(&p.capped_job_time_share_by_set_size)
                .map(|(all, ls)| format!("{:.1} / {:.1} %", all * 100.0, ls * 100.0))
                .collect();
            println!("| {} | {} |", p.policy, cells.join(" | "));
        }
        let places: Vec<&PolicySummary> = self
            .policies
            .iter()
            .filter(|p| p.place_us_per_call.max > 0.0)
            .collect();
        if !places.is_empty() {
            println!();
            for p in places {
                let calls: u64 = self
                    .runs
                    .iter()
                    .filter(|r| r.policy == p.policy)
                    .map(|r| r.place_calls)
                    .sum();
                println!(
                    "{}: {} Place calls over the seeds, {} µs per call",
                    p.policy,
                    calls,
                    p.place_us_per_call.show(2)
                );
            }
        }
        for p in &self.policies {
            let mine: Vec<&RunSummary> =
                self.runs.iter().filter(|r| r.policy == p.policy).collect();
            if mine.iter().any(|r| r.reports > 0) {
                let show = |f: fn(&RunSummary) -> u64| {
                    Spread::of(mine.iter().map(|r| f(r) as f64)).show(0)
                };
                println!(
                    "{}: runs reported {}, retrainings {}, models promoted {}, placements \
                     explored {} (per seed)",
                    p.policy,
                    show(|r| r.reports),
                    show(|r| r.trainings),
                    show(|r| r.promotions),
                    show(|r| r.explored)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.95), 96.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
