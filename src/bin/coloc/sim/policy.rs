//! Placement policies, all under the same rules: the engine offers a queued job the GPUs it
//! may go to (a GPU whose new set was measured, or would overflow memory: the engine
//! never offers a set that fits but was never measured), and the policy picks one or lets
//! the job wait.
//!
//! - `one-per-gpu`: today's default, a job gets an empty GPU or waits.
//! - `fraction-pack`: what HAMi and KAI-Scheduler's binpack do: the fullest GPU whose
//!   requested fractions (gpu_milli) still add up to at most one GPU; memory unchecked.
//! - `smallest-memory`: the GPU whose residents use the least memory among those the job
//!   fits (an empty one first), KACE's memcap rule made a placement.
//! - `oracle`: knows the measured speeds: the GPU where the set's summed speed (Σ
//!   colocated / exclusive) gains most with the job, every capped member at or above its
//!   cap, memory fitting, among the GPUs its [`PlaceRule`] admits; else it waits. A greedy
//!   upper bound of the same rule the model policies follow: it knows the truth of each
//!   step, not the future.
//! - `oracle-pairs`: the same oracle limited to what pair measurements can tell: it knows
//!   every measured pair exactly and never creates a set of three or more, whose truth a
//!   model trained on pairs has never seen. What perfect knowledge of the pair data alone
//!   buys under the same rule, caps and memory (a reference, not a bound on a model that
//!   dares crowded sets).
//!
//! The model policies go through Place (`place.rs`).
//!
//! [`PlaceRule`] is what the oracle and the model policies (`kace-linear`, `coloc`) accept
//! besides memory and caps, the same for the three so that only the speeds differ (the
//! truth, or a model's predictions). The queued job runs at speed 0 while it waits; the
//! rules differ in what they ask of a shared GPU before it starts there:
//!
//! - `gain`: the set's Σ speed grows with the job (the largest instantaneous throughput;
//!   a job waits rather than lower a GPU's Σ).
//! - `fair-share`: every member of the new set of k keeps at least 1/k of its exclusive
//!   speed, what time-slicing the GPU among the k would give it (and a capped member its
//!   cap, as under every rule). No one runs slower than under time-slicing; Σ ≥ 1 follows.
//! - `break-even`: the new set's Σ speed is at least 1 (the GPU does at least one
//!   exclusive job's work per second, as time-slicing would), caps kept; a member may fall
//!   below 1/k.
//!
//! An empty GPU (gain 1, Σ 1, the job alone) is admitted by all three, and the largest gain
//! is taken among the GPUs admitted: the rules only change when a job starts shared instead
//! of waiting.

use super::truth::{SetKey, Truth};

/// A job asking for a GPU.
#[derive(Debug, Clone, Copy)]
pub struct JobView {
    pub workload: u8,
    pub gpu_milli: u32,
    pub cap: Option<f64>,
}

/// A job already on a GPU.
pub type Resident = JobView;

/// A GPU the job may go to.
#[derive(Debug, Clone)]
pub struct GpuView<'a> {
    pub residents: &'a [Resident],
    /// The residents' set.
    pub set: SetKey,
    pub gpu_milli_used: u32,
    pub memory_gb_used: f64,
    /// The set with the job fits GPU memory.
    pub fits_memory: bool,
}

pub trait Policy {
    fn name(&self) -> &str;
    /// The position in `gpus` of the GPU for `job`, or `None` to keep it waiting.
    fn choose(&mut self, job: &JobView, gpus: &[GpuView]) -> Option<usize>;
    /// What of `job` [`Policy::choose`] depends on besides the GPUs offered: two jobs with
    /// the same key (and the same workload, on which the offer itself depends) offered the
    /// same GPUs get the same answer. The engine refuses a job without asking when a job of
    /// the same key was refused and the cluster has not changed since. Every field by
    /// default; a policy that reads less says so.
    fn decision_key(&self, job: &JobView) -> DecisionKey {
        DecisionKey::everything(job)
    }
    /// Whether the policy learns from the runs it caused: the engine then reports each set
    /// of two or more jobs on measured speeds once it has run unchanged for
    /// [`super::engine::REPORT_AFTER_S`] ([`Policy::observe`]).
    fn learns(&self) -> bool {
        false
    }
    /// A reported run at `now` (simulated seconds): each member's (workload, measured speed
    /// as a share of its exclusive speed). Returns whether the policy's answers may have
    /// changed (the engine then offers jobs it refused again).
    fn observe(&mut self, _members: &[(u8, f64)], _now: f64) -> bool {
        false
    }
}

/// The fields of a queued job a policy's decision reads (module `engine`, the refusal
/// shortcut). `None` for a field the decision ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecisionKey {
    pub gpu_milli: Option<u32>,
    /// The cap's bits (`f64::to_bits`; `Some(None)`: read, and the job has none).
    pub cap: Option<Option<u64>>,
}

impl DecisionKey {
    /// A decision that reads nothing of the job but its workload.
    pub const WORKLOAD_ONLY: DecisionKey = DecisionKey {
        gpu_milli: None,
        cap: None,
    };

    pub fn everything(job: &JobView) -> Self {
        Self {
            gpu_milli: Some(job.gpu_milli),
            cap: Some(job.cap.map(f64::to_bits)),
        }
    }

    /// A decision that reads the job's cap (and its workload).
    pub fn cap(job: &JobView) -> Self {
        Self {
            gpu_milli: None,
            cap: Some(job.cap.map(f64::to_bits)),
        }
    }
}

pub struct OnePerGpu;

impl Policy for OnePerGpu {
    fn name(&self) -> &str {
        "one-per-gpu"
    }

    fn choose(&mut self, _job: &JobView, gpus: &[GpuView]) -> Option<usize> {
        gpus.iter().position(|g| g.residents.is_empty())
    }

    fn decision_key(&self, _job: &JobView) -> DecisionKey {
        DecisionKey::WORKLOAD_ONLY
    }
}

pub struct FractionPack;

impl Policy for FractionPack {
    fn name(&self) -> &str {
        "fraction-pack"
    }

    fn choose(&mut self, job: &JobView, gpus: &[GpuView]) -> Option<usize> {
        let mut best: Option<(usize, u32)> = None;
        for (i, g) in gpus.iter().enumerate() {
            if g.gpu_milli_used + job.gpu_milli > 1000 {
                continue;
            }
            if best.is_none_or(|(_, used)| g.gpu_milli_used > used) {
                best = Some((i, g.gpu_milli_used));
            }
        }
        best.map(|(i, _)| i)
    }

    fn decision_key(&self, job: &JobView) -> DecisionKey {
        DecisionKey {
            gpu_milli: Some(job.gpu_milli),
            cap: None,
        }
    }
}

pub struct SmallestMemory;

impl Policy for SmallestMemory {
    fn name(&self) -> &str {
        "smallest-memory"
    }

    fn choose(&mut self, _job: &JobView, gpus: &[GpuView]) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, g) in gpus.iter().enumerate() {
            if g.fits_memory && best.is_none_or(|(_, used)| g.memory_gb_used < used) {
                best = Some((i, g.memory_gb_used));
            }
        }
        best.map(|(i, _)| i)
    }

    fn decision_key(&self, _job: &JobView) -> DecisionKey {
        DecisionKey::WORKLOAD_ONLY
    }
}

pub use coloc::advisor::PlaceRule;

/// Σ speed of a set by the truth the engine runs it at (measured, or the bound).
fn summed_speed(truth: &Truth, set: SetKey) -> Option<f64> {
    let speeds = truth.speeds(set)?;
    Some(set.members().iter().map(|&m| speeds.of(m)).sum())
}

pub struct Oracle<'t> {
    pub truth: &'t Truth,
    pub rule: PlaceRule,
    /// The largest set it creates: `usize::MAX` for `oracle`, 2 for `oracle-pairs`.
    pub max_set: usize,
}

impl<'t> Oracle<'t> {
    pub fn new(truth: &'t Truth, rule: PlaceRule) -> Self {
        Self {
            truth,
            rule,
            max_set: usize::MAX,
        }
    }

    /// `oracle-pairs` (module header).
    pub fn pairs(truth: &'t Truth, rule: PlaceRule) -> Self {
        Self {
            max_set: 2,
            ..Self::new(truth, rule)
        }
    }
}

impl Policy for Oracle<'_> {
    fn name(&self) -> &str {
        if self.max_set == 2 {
            "oracle-pairs"
        } else {
            "oracle"
        }
    }

    fn choose(&mut self, job: &JobView, gpus: &[GpuView]) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for (i, g) in gpus.iter().enumerate() {
            if !g.fits_memory || g.residents.len() >= self.max_set {
                continue;
            }
            let with = g.set.with(job.workload);
            let Some(speeds) = self.truth.measured(with) else {
                continue;
            };
            let caps_hold = g
                .residents
                .iter()
                .chain([job])
                .all(|r| r.cap.is_none_or(|cap| speeds[&r.workload] >= cap));
            if !caps_hold {
                continue;
            }
            let members: Vec<f64> = with.members().iter().map(|m| speeds[m]).collect();
            let after: f64 = members.iter().sum();
            let Some(before) = summed_speed(self.truth, g.set) else {
                continue;
            };
            let gain = after - before;
            if self.rule.admits(gain, &members) && best.is_none_or(|(_, b)| gain > b) {
                best = Some((i, gain));
            }
        }
        best.map(|(i, _)| i)
    }

    fn decision_key(&self, job: &JobView) -> DecisionKey {
        DecisionKey::cap(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_differ_only_on_a_shared_gpu_whose_sum_shrinks_or_leaves_a_member_below_its_share()
    {
        use PlaceRule::*;
        // A job alone: every rule starts it.
        for rule in PlaceRule::ALL {
            assert!(rule.admits(1.0, &[1.0]), "{rule:?}");
        }
        // Three members at 0.40, 0.35, 0.30 where the pair before summed 1.20: Σ 1.05 shrinks
        // (gain -0.15) but stays above 1, and 0.30 is below the 1/3 of time-slicing.
        let three = [0.40, 0.35, 0.30];
        assert!(!Gain.admits(-0.15, &three));
        assert!(BreakEven.admits(-0.15, &three));
        assert!(!FairShare.admits(-0.15, &three));
        // Every member at its third: fair share holds (at the floor exactly), Σ = 1.
        let thirds = [1.0 / 3.0; 3];
        assert!(FairShare.admits(-0.2, &thirds));
        assert!(BreakEven.admits(-0.2, &thirds));
        // A pair at 0.9 and 0.3 gains 0.2 but leaves one member below half.
        assert!(Gain.admits(0.2, &[0.9, 0.3]));
        assert!(!FairShare.admits(0.2, &[0.9, 0.3]));
        // Σ below 1: no rule starts it (a positive gain cannot arise from Σ < 1 after a
        // set that summed at least 1, so gain refuses as well).
        for rule in PlaceRule::ALL {
            assert!(!rule.admits(-0.1, &[0.45, 0.45]), "{rule:?}");
        }
        for rule in PlaceRule::ALL {
            assert_eq!(PlaceRule::parse(rule.name()), Some(rule));
        }
        assert_eq!(PlaceRule::parse("largest-gain"), None);
    }
}
