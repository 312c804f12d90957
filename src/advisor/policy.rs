//! The one placement policy Rank, Place and the scheduler extender apply ([`Policy`]): what
//! a set's value is (the objective), what a shared GPU must promise (the rule), whether the
//! floors and the order read the low ends of the 80 % intervals (cautious), the floors of the
//! asking job and of its partners, and whether predicted losses are listed. One set of
//! defaults ([`Policy::default`], the `[policy]` settings): the simulation's choice
//! (docs/decisions/015-placement-rule.md), normalized sum, fair share, cautious.
//!
//! Rank asks Place's question for each candidate: the target is the job, the candidate the
//! GPU's only resident; both read the same predictions and the same checks here, so they
//! give the same verdict on the same (job, residents) question.

use super::{Objective, PlaceRule};

/// What Rank, Place and the extender apply (see the module header).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub objective: Objective,
    /// What a shared GPU must promise, on the point predictions (`None`: nothing beyond
    /// the floors).
    pub rule: Option<PlaceRule>,
    /// Floors read on the low end of each member's 80 % interval, and the order (Rank's
    /// score, Place's gain) on the low ends too: a partner the model knows little about
    /// wins only when even its pessimistic reading does.
    pub cautious: bool,
    /// The lowest fraction of its exclusive throughput the asking job may keep (Rank's
    /// target, Place's new job).
    pub min_job_fraction: Option<f64>,
    /// The lowest fraction every partner (Rank's candidate, Place's residents) may keep.
    pub min_partner_fraction: Option<f64>,
    /// List sets predicted to do less work than their members apart (a negative normalized
    /// gain) too.
    pub include_losses: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            objective: Objective::NormalizedSum,
            rule: Some(PlaceRule::FairShare),
            cautious: true,
            min_job_fraction: None,
            min_partner_fraction: None,
            include_losses: false,
        }
    }
}

/// Per-request changes to a policy: each field set replaces the default's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PolicyChanges {
    pub objective: Option<Objective>,
    /// `Some(None)`: no rule.
    pub rule: Option<Option<PlaceRule>>,
    pub cautious: Option<bool>,
    pub min_job_fraction: Option<f64>,
    pub min_partner_fraction: Option<f64>,
    pub include_losses: Option<bool>,
}

impl Policy {
    /// No rule, no floor, point predictions, losses listed: only memory and the GPUs' own
    /// limits refuse a GPU (what Place did before policies; tools and tests compare
    /// against it).
    pub fn unrestricted(objective: Objective) -> Self {
        Self {
            objective,
            rule: None,
            cautious: false,
            min_job_fraction: None,
            min_partner_fraction: None,
            include_losses: true,
        }
    }

    /// This policy with the request's changes.
    pub fn with(self, changes: PolicyChanges) -> Self {
        Self {
            objective: changes.objective.unwrap_or(self.objective),
            rule: changes.rule.unwrap_or(self.rule),
            cautious: changes.cautious.unwrap_or(self.cautious),
            min_job_fraction: changes.min_job_fraction.or(self.min_job_fraction),
            min_partner_fraction: changes.min_partner_fraction.or(self.min_partner_fraction),
            include_losses: changes.include_losses.unwrap_or(self.include_losses),
        }
    }

    /// A one-line summary for logs and tables.
    pub fn describe(&self) -> String {
        let floor = |f: Option<f64>| f.map_or("none".to_string(), |f| format!("{f}"));
        format!(
            "objective {}, rule {}, {}, job floor {}, partner floor {}{}",
            match self.objective {
                Objective::NormalizedSum => "normalized-sum",
                Objective::ThroughputSum => "throughput-sum",
            },
            self.rule.map_or("none", |r| r.name()),
            if self.cautious { "cautious" } else { "point" },
            floor(self.min_job_fraction),
            floor(self.min_partner_fraction),
            if self.include_losses {
                ", losses listed"
            } else {
                ""
            }
        )
    }
}

/// Whether a set is a predicted loss: with the job, the GPU does less work (Σ colocated /
/// exclusive) than its residents and the job apart, i.e. the normalized gain is negative.
pub fn is_loss(normalized_gain: f64) -> bool {
    normalized_gain < 0.0
}
