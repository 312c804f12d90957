//! The placement policy on the wire: a request's `Policy` as changes to the server's
//! default ([`PolicyChanges`]), and the applied [`Policy`] every answer echoes.

use crate::{
    advisor::{Objective, Policy, PolicyChanges},
    domain::ValidationError,
    proto as pb,
};

/// The request's changes to the server's default policy (`defaults`): each field of
/// `raw` that is set.
pub fn policy_changes(raw: Option<pb::Policy>) -> Result<PolicyChanges, ValidationError> {
    let Some(raw) = raw else {
        return Ok(PolicyChanges::default());
    };
    Ok(PolicyChanges {
        objective: raw.objective.map(super::convert::objective).transpose()?,
        rule: match raw.rule {
            0 => None,
            rule => Some(super::convert::place_rule(rule)?),
        },
        cautious: raw.cautious,
        min_job_fraction: raw.min_job_fraction,
        min_partner_fraction: raw.min_partner_fraction,
        include_losses: raw.include_losses,
    })
}

pub fn policy_to_pb(policy: &Policy) -> pb::Policy {
    use crate::advisor::PlaceRule;
    pb::Policy {
        objective: Some(match policy.objective {
            Objective::ThroughputSum => pb::Objective::ThroughputSum,
            Objective::NormalizedSum => pb::Objective::NormalizedSum,
        } as i32),
        rule: match policy.rule {
            None => pb::PlaceRule::None,
            Some(PlaceRule::Gain) => pb::PlaceRule::Gain,
            Some(PlaceRule::FairShare) => pb::PlaceRule::FairShare,
            Some(PlaceRule::BreakEven) => pb::PlaceRule::BreakEven,
        } as i32,
        cautious: Some(policy.cautious),
        min_job_fraction: policy.min_job_fraction,
        min_partner_fraction: policy.min_partner_fraction,
        include_losses: Some(policy.include_losses),
    }
}
