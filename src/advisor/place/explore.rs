//! Safe exploration ([decision 024](../../../docs/decisions/024-observer.md)): within a
//! budget (`observer.explore_budget`, a share of the placements; 0, the default, = off),
//! Place may offer first the GPU whose new set the model is least sure of, so that the run
//! it makes narrows the intervals where they are widest. Only a GPU Place already admits,
//! and only when the low end of every member's 80 % interval still keeps that member's
//! caps and floors: exploring never risks a cap, even under a policy that reads them on
//! the point predictions.
//!
//! The budget is deterministic: with n placements (answers offering at least one GPU) and e
//! explored since start, an answer explores when it has a candidate and e + 1 <= b x n, so
//! e / n never exceeds b. The explored placement comes first, marked `explored`.

use std::sync::Mutex;

use super::{PlaceQuery, Placement};
use crate::{advisor::Policy, sync::Unpoisoned};

/// Tolerance for a low end at exactly its floor (as the caps' checks use).
const EPSILON: f64 = 1e-9;

/// The width of a new set's normalized-sum interval: the sum over its members of
/// (high - low) / exclusive throughput; `None` when a member has no interval.
pub fn set_width(placement: &Placement) -> Option<f64> {
    placement
        .members
        .iter()
        .map(|m| {
            let (low, high) = m.predicted_interval?;
            Some((high - low) / m.exclusive_throughput)
        })
        .sum()
}

/// Whether the low end of every member's interval keeps its caps and floors: the job
/// (first member) `min_job_fraction`, each resident the larger of `min_partner_fraction`
/// and its own floor (`resident_floors`, in the residents' order). A member without an
/// interval fails.
pub fn low_ends_keep_floors(
    placement: &Placement,
    policy: &Policy,
    resident_floors: &[Option<f64>],
) -> bool {
    let Some((job, residents)) = placement.members.split_first() else {
        return false;
    };
    let floors =
        std::iter::once(policy.min_job_fraction).chain((0..residents.len()).map(|i| {
            match (
                policy.min_partner_fraction,
                resident_floors.get(i).copied().flatten(),
            ) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            }
        }));
    std::iter::once(job)
        .chain(residents)
        .zip(floors)
        .all(|(member, floor)| {
            let Some((low, _)) = member.predicted_interval else {
                return false;
            };
            floor.is_none_or(|f| low / member.exclusive_throughput >= f - EPSILON)
        })
}

/// The placement to explore, if any: the widest among those whose low ends keep every cap
/// and floor (ties in Place's order), when it is strictly wider than Place's first.
pub fn candidate(placements: &[Placement], query: &PlaceQuery) -> Option<usize> {
    let first = set_width(placements.first()?).unwrap_or(0.0);
    let floors_of = |gpu_id: &str| {
        query
            .gpus
            .iter()
            .find(|g| g.id == gpu_id)
            .map_or(&[][..], |g| &g.resident_floors[..])
    };
    let mut best: Option<(usize, f64)> = None;
    for (i, placement) in placements.iter().enumerate().skip(1) {
        let Some(width) = set_width(placement) else {
            continue;
        };
        if width <= first + EPSILON || best.is_some_and(|(_, w)| width <= w) {
            continue;
        }
        if low_ends_keep_floors(placement, &query.policy, floors_of(&placement.gpu_id)) {
            best = Some((i, width));
        }
    }
    best.map(|(i, _)| i)
}

/// The budget and what was spent of it since start.
#[derive(Debug)]
pub struct Exploration {
    budget: f64,
    /// Placements answered, and explored among them.
    counts: Mutex<(u64, u64)>,
}

impl Exploration {
    /// `budget`: the share of placements that may explore, in [0, 1].
    pub fn new(budget: f64) -> Self {
        Self {
            budget: budget.clamp(0.0, 1.0),
            counts: Mutex::new((0, 0)),
        }
    }

    /// Placements answered and explored since start.
    pub fn counts(&self) -> (u64, u64) {
        *self.counts.lock().unpoisoned()
    }

    /// Counts an answer offering a GPU as a placement and, when the budget allows and a
    /// candidate exists, puts the candidate first, marked `explored`.
    pub fn apply(&self, placements: &mut Vec<Placement>, query: &PlaceQuery) {
        if placements.is_empty() {
            return;
        }
        let candidate = if self.budget > 0.0 {
            candidate(placements, query)
        } else {
            None
        };
        let mut counts = self.counts.lock().unpoisoned();
        counts.0 += 1;
        let Some(index) = candidate else {
            return;
        };
        if (counts.1 + 1) as f64 <= self.budget * counts.0 as f64 + EPSILON {
            counts.1 += 1;
            let mut explored = placements.remove(index);
            explored.explored = true;
            placements.insert(0, explored);
        }
    }
}

#[cfg(test)]
mod tests;
