//! What stored runs say beside the model: which workloads and which sets have run (a
//! member's [`Evidence`] in answers), and which profiles' exclusive throughputs the runs
//! contradict ([`SuspectProfile`]): a workload measured above its exclusive throughput
//! beyond noise ([`EXCLUSIVE_NOISE_MARGIN`]) in at least [`MIN_SUSPECT_RUNS`] runs. While
//! a profile is suspect the answers bound and normalize its predictions by a corrected
//! figure, the highest throughput at least [`MIN_SUSPECT_RUNS`] of its runs reached (a
//! figure one lucky run cannot set), and a new profile replaces both. It also keeps the
//! sharing modes the runs were measured under: an answer for another mode says so
//! ([`ModeEvidence`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::predict::EXCLUSIVE_NOISE_MARGIN;
use crate::domain::{GpuName, SharingMode};

/// Runs above the exclusive throughput beyond noise that make a profile suspect: more than
/// one, so that a single noisy run never does ("several runs", docs/api.md).
pub const MIN_SUSPECT_RUNS: usize = 3;

/// What the model has seen of a member of a predicted set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// Stored runs of this very multiset of workloads.
    RunsOfSet,
    /// Stored runs of this workload, in other sets.
    RunsOfWorkload,
    /// No stored run of this workload: its profile only.
    ProfileOnly,
}

/// A profile whose exclusive throughput the stored runs contradict.
#[derive(Debug, Clone, PartialEq)]
pub struct SuspectProfile {
    pub workload: String,
    /// The profile's exclusive throughput.
    pub profile_exclusive: f64,
    /// What the answers use instead until a new profile comes.
    pub corrected_exclusive: f64,
    /// Runs above `profile_exclusive × (1 + EXCLUSIVE_NOISE_MARGIN)`, of `runs`.
    pub runs_above: usize,
    pub runs: usize,
}

/// The runs of one GPU model, summarized.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    workloads: HashSet<String>,
    /// Each run's members, sorted.
    sets: HashSet<Vec<String>>,
    pub suspects: Vec<SuspectProfile>,
    /// The sharing modes the runs were measured under.
    modes: BTreeSet<SharingMode>,
}

/// What an answer says of the sharing mode it was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeEvidence {
    pub mode: SharingMode,
    /// The GPU model's runs include none measured under `mode`.
    pub unmeasured: bool,
    /// Why, in a sentence, when `unmeasured`; empty otherwise.
    pub note: String,
}

impl ModeEvidence {
    /// What the runs in `summary` (of `gpu`) say of `mode`.
    pub fn of(summary: &RunSummary, gpu: &GpuName, mode: SharingMode) -> Self {
        if summary.measured(mode) {
            return Self {
                mode,
                unmeasured: false,
                note: String::new(),
            };
        }
        let measured: Vec<&str> = summary.modes.iter().map(|m| m.as_str()).collect();
        let note = if measured.is_empty() {
            format!(
                "coloc has no runs on {gpu}: the prediction for sharing mode {mode} rests on \
                 profiles alone, measured in no mode"
            )
        } else {
            format!(
                "coloc has no runs of sharing mode {mode} on {gpu}: the prediction comes from \
                 runs under {}, and colocated throughput differs between modes",
                measured.join(", ")
            )
        };
        Self {
            mode,
            unmeasured: true,
            note,
        }
    }
}

impl RunSummary {
    /// Summarizes `runs` (each run's members with their measured throughputs), judging each
    /// workload's measured throughputs against `exclusive` (its profile's figure).
    pub fn of<'a>(
        runs: impl IntoIterator<Item = &'a [(String, f64)]>,
        exclusive: impl Fn(&str) -> Option<f64>,
    ) -> Self {
        let mut summary = Self::default();
        let mut measured: HashMap<&str, Vec<f64>> = HashMap::new();
        for run in runs {
            let mut names: Vec<String> = run.iter().map(|(name, _)| name.clone()).collect();
            names.sort_unstable();
            summary.sets.insert(names);
            for (name, throughput) in run {
                summary.workloads.insert(name.clone());
                measured.entry(name.as_str()).or_default().push(*throughput);
            }
        }
        let mut suspects: Vec<SuspectProfile> = measured
            .into_iter()
            .filter_map(|(name, mut throughputs)| {
                let profile_exclusive = exclusive(name)?;
                let limit = profile_exclusive * (1.0 + EXCLUSIVE_NOISE_MARGIN);
                let runs_above = throughputs.iter().filter(|&&t| t > limit).count();
                if runs_above < MIN_SUSPECT_RUNS {
                    return None;
                }
                throughputs.sort_unstable_by(|a, b| b.total_cmp(a));
                Some(SuspectProfile {
                    workload: name.to_string(),
                    profile_exclusive,
                    corrected_exclusive: throughputs[MIN_SUSPECT_RUNS - 1],
                    runs_above,
                    runs: throughputs.len(),
                })
            })
            .collect();
        suspects.sort_by(|a, b| a.workload.cmp(&b.workload));
        summary.suspects = suspects;
        summary
    }

    /// Whether any run has `member`: [`Self::evidence`] is not `ProfileOnly`.
    pub fn has_runs_of(&self, member: &str) -> bool {
        self.workloads.contains(member)
    }

    /// What the runs say of `member` in the set `set` (names, any order).
    pub fn evidence(&self, set: &[&str], member: &str) -> Evidence {
        if !self.has_runs_of(member) {
            return Evidence::ProfileOnly;
        }
        let mut names: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        names.sort_unstable();
        if self.sets.contains(&names) {
            Evidence::RunsOfSet
        } else {
            Evidence::RunsOfWorkload
        }
    }

    /// The same summary, knowing the sharing modes its runs were measured under.
    pub fn with_modes(mut self, modes: impl IntoIterator<Item = SharingMode>) -> Self {
        self.modes = modes.into_iter().collect();
        self
    }

    /// Whether any of the runs was measured under `mode`.
    pub fn measured(&self, mode: SharingMode) -> bool {
        self.modes.contains(&mode)
    }

    pub fn suspect(&self, workload: &str) -> Option<&SuspectProfile> {
        self.suspects.iter().find(|s| s.workload == workload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(members: &[(&str, f64)]) -> Vec<(String, f64)> {
        members.iter().map(|(n, t)| (n.to_string(), *t)).collect()
    }

    #[test]
    fn three_runs_beyond_noise_make_a_profile_suspect_and_one_or_runs_within_noise_do_not() {
        // a: exclusive 10; runs at 13, 12, 11.5 (beyond 11) and 9. b: exclusive 10, one run
        // at 20 and two at 10.9 (within noise). c: never above.
        let runs = [
            run(&[("a", 13.0), ("b", 20.0)]),
            run(&[("a", 12.0), ("b", 10.9)]),
            run(&[("a", 11.5), ("b", 10.9)]),
            run(&[("a", 9.0), ("c", 4.0)]),
        ];
        let summary = RunSummary::of(runs.iter().map(|r| r.as_slice()), |_| Some(10.0));
        assert_eq!(summary.suspects.len(), 1);
        let a = summary.suspect("a").unwrap();
        assert_eq!((a.runs_above, a.runs), (3, 4));
        // The highest throughput three runs reached.
        assert_eq!(a.corrected_exclusive, 11.5);
        assert!(summary.suspect("b").is_none());
        assert_eq!(summary.evidence(&["c", "a"], "a"), Evidence::RunsOfSet);
        assert_eq!(summary.evidence(&["b", "c"], "c"), Evidence::RunsOfWorkload);
        assert_eq!(summary.evidence(&["a", "d"], "d"), Evidence::ProfileOnly);
    }

    #[test]
    fn a_mode_without_runs_is_flagged_with_the_modes_that_have_some() {
        let gpu = GpuName::parse("gpu", "Tesla V100-SXM2-32GB").unwrap();
        let runs = [run(&[("a", 1.0), ("b", 1.0)])];
        let summary = RunSummary::of(runs.iter().map(|r| r.as_slice()), |_| None)
            .with_modes([SharingMode::Mps]);
        let mps = ModeEvidence::of(&summary, &gpu, SharingMode::Mps);
        assert!(!mps.unmeasured);
        assert!(mps.note.is_empty());
        let sliced = ModeEvidence::of(&summary, &gpu, SharingMode::TimeSlicing);
        assert!(sliced.unmeasured);
        assert!(sliced.note.contains("time-slicing"), "{}", sliced.note);
        assert!(sliced.note.contains("under mps"), "{}", sliced.note);
        let none = ModeEvidence::of(&RunSummary::default(), &gpu, SharingMode::Mps);
        assert!(none.unmeasured);
        assert!(none.note.contains("no runs on"), "{}", none.note);
    }
}
