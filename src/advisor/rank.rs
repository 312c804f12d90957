//! Rank and Predict: scoring candidate sets against the current model, with the memory-fit
//! guard (an OOM costs more than a slow pair).

use std::sync::Arc;

use super::{
    place::SetCache,
    policy::is_loss,
    predict::{answerable, cautious_bounds, level_of, score_pairs, set_interval, PairScore},
    runs::Evidence,
    Error, GpuProfiles, Policy, ProfileEntry, Result,
};
use crate::{
    domain::{GpuName, ValidationError, WorkloadName, MAX_MEMBERS},
    model::{ProfileLevel, SetPrediction},
    store::StoredModel,
};

/// The most candidates one Rank request may name (an empty list means all profiled ones).
pub const MAX_CANDIDATES: usize = 10_000;
/// The largest top_k (0 = all).
pub const MAX_TOP_K: usize = 100_000;
/// Scoring that would take longer than this moves off the async threads.
const ASYNC_BUDGET_NS: u64 = 500_000;

/// A pair is predicted to pay off when its normalized sum (Σ colocated / exclusive
/// throughput) reaches this: 1 is as much work as running the two one after the other.
pub const BREAK_EVEN_NORMALIZED_SUM: f64 = 1.0;

/// What Rank orders candidates by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Objective {
    /// The predicted throughput sum in the members' own units (KACE).
    ThroughputSum,
    /// The sum of each member's predicted colocated / exclusive throughput: the default,
    /// chosen with `coloc eval objectives` (docs/api.md, "Trustworthy defaults").
    #[default]
    NormalizedSum,
}

#[derive(Debug, Clone)]
pub struct RankQuery {
    pub target: WorkloadName,
    /// Checked names (`WorkloadName::check`), kept as the request's strings: they are only
    /// looked up.
    pub candidates: Vec<String>,
    /// 0 = all.
    pub top_k: usize,
    pub gpu: Option<GpuName>,
    pub gpu_memory_gb: Option<f64>,
    pub include_oversubscribed: bool,
    /// Rank asks Place's question for each candidate (the target the job, the candidate
    /// its GPU's only resident): the objective, the rule, cautious, the target's floor
    /// (`min_job_fraction`), the candidate's (`min_partner_fraction`) and whether predicted
    /// losses (below break-even) are ranked.
    pub policy: Policy,
    /// The least predicted normalized sum above break-even a candidate needs.
    pub min_benefit: f64,
}

impl RankQuery {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.candidates.len() > MAX_CANDIDATES {
            return Err(ValidationError::new("candidates", format!(
                "at most {MAX_CANDIDATES} candidates may be named, got {}; send none to rank every profiled workload",
                self.candidates.len()
            )));
        }
        if self.top_k > MAX_TOP_K {
            return Err(ValidationError::new(
                "top_k",
                format!(
                    "top_k must be between 0 (all) and {MAX_TOP_K}, got {}",
                    self.top_k
                ),
            ));
        }
        for (field, fraction) in [
            ("min_target_speed_fraction", self.policy.min_job_fraction),
            ("min_partner_fraction", self.policy.min_partner_fraction),
        ] {
            if let Some(fraction) = fraction {
                if !(fraction > 0.0 && fraction <= 1.0) {
                    return Err(ValidationError::new(
                        field,
                        format!(
                            "{field} is the fraction of its exclusive throughput a job keeps: \
                             between 0 (no limit) and 1, got {fraction}"
                        ),
                    ));
                }
            }
        }
        if !(self.min_benefit.is_finite() && self.min_benefit >= 0.0) {
            return Err(ValidationError::new(
                "min_benefit",
                format!(
                    "min_benefit is the least predicted gain over running apart (normalized \
                     sum - 1): 0 (break-even) or more, got {}",
                    self.min_benefit
                ),
            ));
        }
        if self.policy.include_losses && self.min_benefit > 0.0 {
            return Err(ValidationError::new(
                "include_below_break_even",
                "include_below_break_even ranks candidates predicted to lose, min_benefit > 0 \
                 skips them: send one or the other",
            ));
        }
        Ok(())
    }

    /// The predicted normalized sum a candidate needs; `None` when losers are ranked too.
    pub fn normalized_floor(&self) -> Option<f64> {
        (!self.policy.include_losses).then_some(BREAK_EVEN_NORMALIZED_SUM + self.min_benefit)
    }
}

#[derive(Debug, Clone)]
pub struct PredictQuery {
    /// A name may repeat: copies of one workload.
    pub workloads: Vec<WorkloadName>,
    pub gpu: Option<GpuName>,
    pub gpu_memory_gb: Option<f64>,
}

impl PredictQuery {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.workloads.len() < 2 || self.workloads.len() > MAX_MEMBERS {
            return Err(ValidationError::new(
                "workloads",
                format!(
                    "a colocated set has 2 to {MAX_MEMBERS} workloads, got {}",
                    self.workloads.len()
                ),
            ));
        }
        Ok(())
    }
}

/// What the model says about one member of a set.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberPrediction {
    pub workload: WorkloadName,
    pub exclusive_throughput: f64,
    pub throughput_unit: std::sync::Arc<str>,
    pub predicted_throughput: Option<f64>,
    /// The 80 % interval of `predicted_throughput`, where the model carries intervals.
    pub predicted_interval: Option<(f64, f64)>,
    /// What the stored runs say of this member in this set.
    pub evidence: Evidence,
    /// The profile's exclusive throughput; `exclusive_throughput` differs from it while the
    /// profile is suspect (the corrected figure).
    pub profile_exclusive_throughput: f64,
    /// The profiles the prediction read: NVML-only for every member of a set with one
    /// NVML-only member (answered by the model's NVML-only twin, with its wider intervals).
    pub profile_level: ProfileLevel,
}

impl MemberPrediction {
    /// The answer for `entry` as a member of the set `set` (names) of `table`.
    pub(super) fn of(
        entry: &ProfileEntry,
        table: &GpuProfiles,
        set: &[&str],
        predicted_throughput: Option<f64>,
        predicted_interval: Option<(f64, f64)>,
        profile_level: ProfileLevel,
    ) -> Self {
        Self {
            workload: entry.name.clone(),
            exclusive_throughput: entry.exclusive(),
            throughput_unit: entry.throughput_unit.clone(),
            predicted_throughput,
            predicted_interval,
            evidence: table.runs().evidence(set, entry.name.as_str()),
            profile_exclusive_throughput: entry.features.exclusive_throughput(),
            profile_level,
        }
    }

    /// The profile's exclusive throughput is suspect: runs show the workload faster.
    pub fn exclusive_suspect(&self) -> bool {
        self.exclusive_throughput != self.profile_exclusive_throughput
    }
}

impl MemberPrediction {
    /// The fraction of its exclusive throughput the member is predicted to keep.
    pub fn predicted_speed_fraction(&self) -> Option<f64> {
        self.predicted_throughput
            .map(|t| t / self.exclusive_throughput)
    }

    /// The 80 % interval of the speed fraction (colocated / exclusive).
    pub fn speed_fraction_interval(&self) -> Option<(f64, f64)> {
        self.predicted_interval.map(|(lo, hi)| {
            (
                lo / self.exclusive_throughput,
                hi / self.exclusive_throughput,
            )
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RankedCandidate {
    pub workload: WorkloadName,
    pub predicted_throughput_sum: f64,
    pub predicted_normalized_sum: Option<f64>,
    /// The normalized sum on the members' low ends (a cautious policy's order).
    pub predicted_normalized_sum_low: Option<f64>,
    pub fits_memory: bool,
    pub memory_gb: f64,
    pub members: Vec<MemberPrediction>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipCode {
    UnknownWorkload,
    NotProfiledOnGpu,
    ExceedsGpuMemory,
    TargetSlowdown,
    KernelMetricsMissing,
    BelowBreakEven,
    /// The candidate would keep less than `min_partner_fraction`.
    PartnerSlowdown,
    /// The pair breaks the policy's rule.
    RuleRefused,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub workload: String,
    pub code: SkipCode,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct RankResult {
    pub gpu: GpuName,
    pub gpu_memory_gb: f64,
    pub model_version: u64,
    /// The policy applied.
    pub policy: Policy,
    /// The model predicts only sums: member throughputs are split by exclusive throughput.
    pub members_estimated: bool,
    pub ranked: Vec<RankedCandidate>,
    pub skipped: Vec<Skipped>,
}

#[derive(Debug, Clone)]
pub struct PredictResult {
    pub gpu: GpuName,
    pub model_version: u64,
    pub predicted_throughput_sum: f64,
    pub predicted_normalized_sum: Option<f64>,
    pub members: Vec<MemberPrediction>,
    pub memory_gb: f64,
    pub fits_memory: bool,
    /// The model predicts only sums: member throughputs are split by exclusive throughput.
    pub members_estimated: bool,
    /// The 80 % interval of the sum, where the model carries intervals.
    pub sum_interval: Option<(f64, f64)>,
}

/// The order of a ranking: higher score first, ties by name so that answers are stable.
/// The evaluation (`coloc eval`) picks partners with the same order.
pub fn rank_order(a: (f64, &str), b: (f64, &str)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1))
}

/// The memory a set may use: the request's limit, else the GPU model's memory.
fn memory_limit(gpu: &GpuName, table: &GpuProfiles, requested: Option<f64>) -> Result<f64> {
    requested
        .or(table.memory_gb)
        .ok_or_else(|| Error::GpuMemoryUnknown(gpu.clone()))
}

fn member_predictions(
    table: &GpuProfiles,
    entries: &[&ProfileEntry],
    members: Option<&[f64]>,
) -> Vec<MemberPrediction> {
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let level = level_of(entries);
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            MemberPrediction::of(entry, table, &names, members.map(|m| m[i]), None, level)
        })
        .collect()
}

/// Σ predicted colocated / exclusive throughput, when the model predicts each member.
fn normalized_sum(entries: &[&ProfileEntry], members: Option<&[f64]>) -> Option<f64> {
    Some(
        entries
            .iter()
            .zip(members?)
            .map(|(e, t)| t / e.exclusive())
            .sum(),
    )
}

fn not_profiled(gpu: &GpuName, name: &str) -> String {
    format!("{name} has no profile on GPU model {:?}", gpu.as_str())
}

/// One candidate's prediction while ranking.
struct Scored {
    /// Index into the candidates that passed the memory check.
    index: usize,
    prediction: PairScore,
    normalized: Option<f64>,
    /// The normalized sum on the members' low ends (cautious, with intervals).
    normalized_low: Option<f64>,
    /// What the objective orders by (on the low ends when cautious).
    score: f64,
}

/// What the catalog knows of a named candidate, looked up under its lock.
#[derive(Debug, Clone, Copy)]
pub(super) enum Found {
    /// Its position in the table's entries.
    Entry(usize),
    /// Registered, but with no rankable profile on this GPU model.
    NotRankable,
    /// Not a registered workload.
    Unknown,
}

/// A Rank request with everything it needs captured, so it can run on a blocking thread.
pub(super) struct RankWork {
    pub query: RankQuery,
    pub gpu: GpuName,
    pub model: Arc<StoredModel>,
    pub table: Arc<GpuProfiles>,
    /// Per named candidate, in order.
    pub found: Vec<Found>,
}

impl RankWork {
    pub fn is_large(&self) -> bool {
        let n = if self.query.candidates.is_empty() {
            self.table.entries().len()
        } else {
            self.query.candidates.len()
        };
        n as u64 * self.model.params.kind().scoring_cost_ns() > ASYNC_BUDGET_NS
    }

    pub fn run(self) -> Result<RankResult> {
        let target = self
            .table
            .get(&self.query.target)
            .filter(|entry| answerable(&self.model, entry))
            .ok_or_else(|| Error::TargetNotProfiled {
                workload: self.query.target.as_str().to_string(),
                gpu: self.gpu.clone(),
            })?;
        let limit = memory_limit(&self.gpu, &self.table, self.query.gpu_memory_gb)?;
        let mut skipped = Vec::new();
        let pool = self.pool(&mut skipped);
        let fitting = self.fitting(target, limit, pool, &mut skipped);
        let ranked = self.score(target, &fitting, &mut skipped);
        let ranked = self.best(target, &fitting, ranked);
        Ok(RankResult {
            gpu: self.gpu,
            gpu_memory_gb: limit,
            model_version: self.model.version,
            policy: self.query.policy,
            members_estimated: !self.model.params.kind().predicts_members(),
            ranked,
            skipped,
        })
    }

    /// The candidates: every profiled workload, or the named ones (each distinct workload
    /// once, at its first position) with those that cannot be ranked skipped.
    fn pool(&self, skipped: &mut Vec<Skipped>) -> Vec<&ProfileEntry> {
        let (query, table, gpu) = (&self.query, &self.table, &self.gpu);
        if query.candidates.is_empty() {
            let mut pool = Vec::with_capacity(table.entries().len());
            for entry in table.entries() {
                if answerable(&self.model, entry) {
                    pool.push(entry);
                } else {
                    skipped.push(self.without_twin(entry.name.as_str()));
                }
            }
            return pool;
        }
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(
            query.candidates.len(),
            foldhash::fast::RandomState::default(),
        );
        query
            .candidates
            .iter()
            .zip(&self.found)
            .filter(|(name, _)| seen.insert(name.as_str()))
            .filter_map(|(name, &found)| {
                let entry = match found {
                    Found::Entry(i) => Some(&table.entries()[i]),
                    Found::NotRankable | Found::Unknown => None,
                };
                if entry.is_some_and(|e| !answerable(&self.model, e)) {
                    skipped.push(self.without_twin(name));
                    return None;
                }
                if entry.is_none() {
                    skipped.push(if matches!(found, Found::Unknown) {
                        Skipped {
                            workload: name.clone(),
                            code: SkipCode::UnknownWorkload,
                            reason: format!("{name} is not a registered workload"),
                        }
                    } else if table.lacks_kernel_metrics(name.as_str()) {
                        Skipped {
                            workload: name.clone(),
                            code: SkipCode::KernelMetricsMissing,
                            reason: format!(
                                "{name} was profiled on GPU model {:?} without kernel metrics \
                                 (Nsight Compute was unavailable); profile it again",
                                gpu.as_str()
                            ),
                        }
                    } else {
                        Skipped {
                            workload: name.clone(),
                            code: SkipCode::NotProfiledOnGpu,
                            reason: not_profiled(gpu, name),
                        }
                    });
                }
                entry
            })
            .collect()
    }

    /// A candidate profiled by NVML alone, under a model without an NVML-only twin.
    fn without_twin(&self, name: &str) -> Skipped {
        Skipped {
            workload: name.to_string(),
            code: SkipCode::KernelMetricsMissing,
            reason: format!(
                "{name} was profiled on GPU model {:?} without kernel metrics (Nsight Compute \
                 was unavailable), and model version {} has no NVML-only twin; retrain or \
                 profile it again",
                self.gpu.as_str(),
                self.model.version
            ),
        }
    }

    /// The candidates whose pair with the target fits the memory (or all, asked for): each
    /// with the pair's memory and whether it fits.
    fn fitting<'a>(
        &self,
        target: &ProfileEntry,
        limit: f64,
        pool: Vec<&'a ProfileEntry>,
        skipped: &mut Vec<Skipped>,
    ) -> Vec<(&'a ProfileEntry, f64, bool)> {
        let mut fitting = Vec::with_capacity(pool.len());
        for entry in pool {
            let memory = target.features.memory_gb() + entry.features.memory_gb();
            let fits = memory <= limit;
            if !fits && !self.query.include_oversubscribed {
                skipped.push(Skipped {
                    workload: entry.name.to_string(),
                    code: SkipCode::ExceedsGpuMemory,
                    reason: format!(
                        "with the target it needs {memory:.1} GB, more than the {limit:.1} GB available"
                    ),
                });
                continue;
            }
            fitting.push((entry, memory, fits));
        }
        fitting
    }

    /// The pair's interval: the model's seen band of two where it knows both workloads,
    /// else its band of two; read cautiously ([`cautious_bounds`]).
    fn interval_of(
        &self,
        target: &ProfileEntry,
        entry: &ProfileEntry,
        prediction: &PairScore,
    ) -> Option<crate::model::intervals::SetInterval> {
        let mut interval = set_interval(
            &self.model,
            &[target, entry],
            &SetPrediction {
                sum: prediction.sum,
                members: Some(prediction.members.to_vec()),
            },
            0.0,
        )?;
        if let Some(bounds) = interval.members.as_mut() {
            cautious_bounds(
                &self.table,
                &[target, entry],
                bounds,
                &prediction.raw,
                &prediction.members,
            );
        }
        Some(interval)
    }

    /// Scores every fitting candidate, skipping those the policy refuses, in Place's order:
    /// the target's floor, the candidate's, the rule, then a predicted loss (or a gain
    /// below `min_benefit`).
    fn score(
        &self,
        target: &ProfileEntry,
        fitting: &[(&ProfileEntry, f64, bool)],
        skipped: &mut Vec<Skipped>,
    ) -> Vec<Scored> {
        let policy = &self.query.policy;
        let entries: Vec<&ProfileEntry> = fitting.iter().map(|(e, _, _)| *e).collect();
        let predictions = score_pairs(&self.model, &self.table, target, &entries);
        // Cautious needs intervals; a model without them answers with the point prediction.
        let cautious = policy.cautious && self.model.params.has_intervals();
        let mut ranked: Vec<Scored> = Vec::with_capacity(predictions.len());
        for (i, prediction) in predictions.into_iter().enumerate() {
            let entry = fitting[i].0;
            let pair = [target, entry];
            let low: Option<[f64; 2]> = if cautious {
                self.interval_of(target, entry, &prediction)
                    .and_then(|i| i.members)
                    .map(|b| [b[0].0, b[1].0])
            } else {
                None
            };
            let kept = low.unwrap_or(prediction.members);
            if let Some(skip) = self.floors(&pair, kept, low.is_some()) {
                skipped.push(skip);
                continue;
            }
            let normalized = normalized_sum(&pair, Some(&prediction.members[..]))
                .expect("every member is predicted or estimated");
            let gain = match policy.objective {
                Objective::ThroughputSum => prediction.sum - entry.exclusive(),
                Objective::NormalizedSum => normalized - 1.0,
            };
            if let Some(skip) = self.rule_refusal(&pair, &prediction, gain) {
                skipped.push(skip);
                continue;
            }
            if let Some(skip) = self.below_floor(entry, normalized) {
                skipped.push(skip);
                continue;
            }
            let normalized_low = low.map(|l| l[0] / target.exclusive() + l[1] / entry.exclusive());
            let score = match (policy.objective, low) {
                (Objective::ThroughputSum, None) => prediction.sum,
                (Objective::ThroughputSum, Some(l)) => l[0] + l[1],
                (Objective::NormalizedSum, _) => normalized_low.unwrap_or(normalized),
            };
            ranked.push(Scored {
                index: i,
                prediction,
                normalized: Some(normalized),
                normalized_low,
                score,
            });
        }
        ranked
    }

    /// Why the pair breaks a floor of the policy: the target's (`min_job_fraction`), then
    /// the candidate's (`min_partner_fraction`); `kept` are the members' throughputs as the
    /// floors read them (the low ends with `cautious`).
    fn floors(
        &self,
        pair: &[&ProfileEntry; 2],
        kept: [f64; 2],
        on_low_end: bool,
    ) -> Option<Skipped> {
        let policy = &self.query.policy;
        let floors = [
            (
                policy.min_job_fraction,
                SkipCode::TargetSlowdown,
                "the target",
            ),
            (
                policy.min_partner_fraction,
                SkipCode::PartnerSlowdown,
                "the partner",
            ),
        ];
        for (k, (floor, code, who)) in floors.into_iter().enumerate() {
            let Some(floor) = floor else { continue };
            let share = kept[k] / pair[k].exclusive();
            if share < floor {
                return Some(Skipped {
                    workload: pair[1].name.to_string(),
                    code,
                    reason: format!(
                        "predicted to leave {who} {:.0} % of its exclusive throughput{}, \
                         below the {:.0} % asked for",
                        share * 100.0,
                        if on_low_end {
                            " at the low end of its 80 % interval"
                        } else {
                            ""
                        },
                        floor * 100.0
                    ),
                });
            }
        }
        None
    }

    /// Why the policy's rule refuses the pair, on the point predictions.
    fn rule_refusal(
        &self,
        pair: &[&ProfileEntry; 2],
        prediction: &PairScore,
        gain: f64,
    ) -> Option<Skipped> {
        let rule = self.query.policy.rule?;
        let shares = [
            prediction.members[0] / pair[0].exclusive(),
            prediction.members[1] / pair[1].exclusive(),
        ];
        let names = [&pair[0].name, &pair[1].name];
        rule.refusal(gain, &names, &shares).map(|refusal| Skipped {
            workload: pair[1].name.to_string(),
            code: SkipCode::RuleRefused,
            reason: refusal.reason,
        })
    }

    /// Why the pair is skipped as a predicted loss, or below break-even + `min_benefit`.
    fn below_floor(&self, entry: &ProfileEntry, normalized: f64) -> Option<Skipped> {
        let query = &self.query;
        let floor = query.normalized_floor()?;
        let loss = is_loss(normalized - BREAK_EVEN_NORMALIZED_SUM);
        if !loss && normalized - BREAK_EVEN_NORMALIZED_SUM >= query.min_benefit {
            return None;
        }
        Some(Skipped {
            workload: entry.name.to_string(),
            code: SkipCode::BelowBreakEven,
            reason: if loss {
                format!(
                    "predicted normalized sum {normalized:.2} (colocated / exclusive \
                     throughput, summed) is below break-even ({BREAK_EVEN_NORMALIZED_SUM:.2}): \
                     together the pair is predicted to do {:.0} % less work than apart",
                    (BREAK_EVEN_NORMALIZED_SUM - normalized) * 100.0
                )
            } else {
                format!(
                    "predicted normalized sum {normalized:.2} is below {floor:.2} \
                     (break-even + min_benefit): a predicted gain of {:.0} % over \
                     running apart, less than the {:.0} % asked for",
                    (normalized - BREAK_EVEN_NORMALIZED_SUM) * 100.0,
                    query.min_benefit * 100.0
                )
            },
        })
    }

    /// The best `top_k` (all with 0), best first, with their members' predictions.
    fn best(
        &self,
        target: &ProfileEntry,
        fitting: &[(&ProfileEntry, f64, bool)],
        mut ranked: Vec<Scored>,
    ) -> Vec<RankedCandidate> {
        let top_k = self.query.top_k;
        let order = |a: &Scored, b: &Scored| {
            rank_order(
                (a.score, fitting[a.index].0.name.as_str()),
                (b.score, fitting[b.index].0.name.as_str()),
            )
        };
        if top_k > 0 && top_k < ranked.len() {
            // Only the best k are ordered.
            ranked.select_nth_unstable_by(top_k - 1, order);
            ranked.truncate(top_k);
        }
        ranked.sort_unstable_by(order);
        ranked
            .into_iter()
            .map(|s| {
                let (entry, memory, fits) = fitting[s.index];
                let mut members = member_predictions(
                    &self.table,
                    &[target, entry],
                    Some(&s.prediction.members[..]),
                );
                if let Some(bounds) = self
                    .interval_of(target, entry, &s.prediction)
                    .and_then(|i| i.members)
                {
                    for (member, bound) in members.iter_mut().zip(bounds) {
                        member.predicted_interval = Some(bound);
                    }
                }
                RankedCandidate {
                    workload: entry.name.clone(),
                    predicted_throughput_sum: s.prediction.sum,
                    predicted_normalized_sum: s.normalized,
                    predicted_normalized_sum_low: s.normalized_low,
                    fits_memory: fits,
                    memory_gb: memory,
                    members,
                }
            })
            .collect()
    }
}

/// Rank without an advisor: against `catalog` and `model` (its GPU model's profiles), at
/// once on this thread. For tools that hold their own catalog (the evaluation, tests); the
/// service calls [`super::Advisor::rank`].
pub fn rank_in(
    catalog: &super::Catalog,
    model: &Arc<StoredModel>,
    query: RankQuery,
) -> Result<RankResult> {
    query.validate()?;
    if !catalog.contains(&query.target) {
        return Err(Error::UnknownTarget(query.target.as_str().to_string()));
    }
    let table = catalog.gpu(&model.gpu).unwrap_or_default();
    let found = query
        .candidates
        .iter()
        .map(|c| match table.position(c.as_str()) {
            Some(i) => Found::Entry(i),
            None if catalog.contains(c.as_str()) => Found::NotRankable,
            None => Found::Unknown,
        })
        .collect();
    RankWork {
        query,
        gpu: model.gpu.clone(),
        model: model.clone(),
        table,
        found,
    }
    .run()
}

/// Predict without an advisor, as [`rank_in`].
pub fn predict_in(
    catalog: &super::Catalog,
    model: &StoredModel,
    query: PredictQuery,
) -> Result<PredictResult> {
    query.validate()?;
    let table = catalog.gpu(&model.gpu).unwrap_or_default();
    predict(&query, &model.gpu, model, &table)
}

pub(super) fn predict(
    query: &PredictQuery,
    gpu: &GpuName,
    model: &StoredModel,
    table: &GpuProfiles,
) -> Result<PredictResult> {
    let entries = query
        .workloads
        .iter()
        .map(|name| {
            table
                .get(name)
                .filter(|e| answerable(model, e))
                .ok_or_else(|| Error::MemberNotProfiled {
                    workload: name.as_str().to_string(),
                    gpu: gpu.clone(),
                })
        })
        .collect::<Result<Vec<&ProfileEntry>>>()?;
    let limit = memory_limit(gpu, table, query.gpu_memory_gb)?;
    // The one prediction (Place's set cache), the first workload asking.
    let positions: Vec<u32> = query
        .workloads
        .iter()
        .map(|name| table.position(name.as_str()).expect("looked up above") as u32)
        .collect();
    let mut key = positions.clone();
    key.sort_unstable();
    let mut cache = SetCache::new(model, table, positions[0], None);
    let value = cache.value(&key);
    let at = |p: u32| key.binary_search(&p).expect("a member of the set");
    let members: Vec<f64> = positions
        .iter()
        .map(|&p| value.members.as_ref().expect("predicted or estimated")[at(p)])
        .collect();
    let members_estimated = !model.params.kind().predicts_members();
    let memory: f64 = entries.iter().map(|e| e.features.memory_gb()).sum();
    let mut member_answers = member_predictions(table, &entries, Some(&members));
    if let Some(bounds) = value.bounds.as_ref() {
        for (answer, &p) in member_answers.iter_mut().zip(&positions) {
            answer.predicted_interval = Some(bounds[at(p)]);
        }
    }
    let sum_interval = value.sum_bounds;
    let members = Some(&members[..]);
    Ok(PredictResult {
        gpu: gpu.clone(),
        model_version: model.version,
        predicted_throughput_sum: value.sum,
        predicted_normalized_sum: normalized_sum(&entries, members),
        members: member_answers,
        memory_gb: memory,
        fits_memory: memory <= limit,
        members_estimated,
        sum_interval,
    })
}
