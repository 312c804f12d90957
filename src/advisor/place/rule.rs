//! The rule a shared GPU must pass ([`PlaceRule`]: gain, fair share, break-even), and the
//! sentence that says why it refuses one.

use crate::domain::WorkloadName;

/// What a shared GPU must promise before a job may start there, besides memory and caps:
/// the rule the cluster simulation compares and the scheduler extender applies (README,
/// "Cluster simulation"). `speeds` are the new set's members' shares of their exclusive
/// throughput (the job among them), `gain` the change of the set's value with the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceRule {
    /// The set's value grows with the job.
    Gain,
    /// Every member of the new set of k keeps at least 1/k of its exclusive throughput,
    /// what time-slicing the GPU among the k would give it (Σ >= 1 follows).
    FairShare,
    /// The new set's Σ share is at least 1: the GPU does at least one exclusive job's work.
    BreakEven,
}

impl PlaceRule {
    pub const ALL: [PlaceRule; 3] = [PlaceRule::Gain, PlaceRule::FairShare, PlaceRule::BreakEven];

    pub fn name(self) -> &'static str {
        match self {
            PlaceRule::Gain => "gain",
            PlaceRule::FairShare => "fair-share",
            PlaceRule::BreakEven => "break-even",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Whether a GPU whose new set has the members' `speeds` and whose value changes by
    /// `gain` with the job may take it.
    pub fn admits(self, gain: f64, speeds: &[f64]) -> bool {
        // Tolerance for a speed measured or predicted at exactly the floor.
        const EPSILON: f64 = 1e-9;
        match self {
            PlaceRule::Gain => gain > 0.0,
            PlaceRule::FairShare => {
                let floor = 1.0 / speeds.len().max(1) as f64;
                speeds.iter().all(|&s| s >= floor - EPSILON)
            }
            PlaceRule::BreakEven => speeds.iter().sum::<f64>() >= 1.0 - EPSILON,
        }
    }
}

/// Why a rule refuses a GPU: a sentence for people and, for fair share, the member that
/// falls furthest below it with its share.
pub(in crate::advisor) struct Refusal<'a> {
    pub reason: String,
    pub worst: Option<(&'a WorkloadName, f64)>,
}

impl PlaceRule {
    /// Why the rule refuses the new set whose members (the job first) keep `shares` of
    /// their exclusive throughput and whose value changes by `gain`; `None` = admitted.
    pub(in crate::advisor) fn refusal<'a>(
        self,
        gain: f64,
        names: &[&'a WorkloadName],
        shares: &[f64],
    ) -> Option<Refusal<'a>> {
        if self.admits(gain, shares) {
            return None;
        }
        let k = shares.len();
        Some(match self {
            PlaceRule::FairShare => {
                let (worst, share) = names
                    .iter()
                    .zip(shares)
                    .min_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(name, share)| (*name, *share))
                    .expect("a shared GPU has members");
                Refusal {
                    reason: format!(
                        "below its fair share: {worst} is predicted to keep {:.0} % of its \
                         exclusive throughput, less than 1/{k} of the GPU",
                        share * 100.0
                    ),
                    worst: Some((worst, share)),
                }
            }
            PlaceRule::BreakEven => Refusal {
                reason: format!(
                    "below break-even: the {k} jobs together are predicted to do {:.2} of \
                     one job's work (Σ colocated / exclusive throughput)",
                    shares.iter().sum::<f64>()
                ),
                worst: None,
            },
            PlaceRule::Gain => Refusal {
                reason: format!("the GPU's predicted value would not grow ({gain:.3})"),
                worst: None,
            },
        })
    }
}
