//! The terms of `member-ridge-gbt` that both its fitter ([`super::member`]) and Rank's pair
//! scorer ([`super::pair_scorer`]) compute: the ridge half's features, the split of the
//! ridge half into own and set terms, and how the two halves' log ratios become a member's
//! throughput; and the options a model was fitted with, which both read. A leaf of the model
//! layer: it imports only the feature vector, so the fitter imports the scorer and never the
//! other way round.

use serde::{Deserialize, Serialize};

use super::{Features, ProfileLevel, FEATURE_NAMES, NUM_FEATURES};

/// The most booster features a member has: its own metrics, the others' summed metrics,
/// and with [`MemberOptions::crowding`] the number of others and the others' largest metrics.
pub(super) const MAX_BOOSTER_FEATURES: usize = 3 * NUM_FEATURES + 1;

/// Variants of the model's fit. A stored model keeps the options it was fitted with (models
/// stored before the options existed read as all off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
pub struct MemberOptions {
    /// The trees also see how crowded the GPU is: the number of other members, and the
    /// element-wise largest of their metrics. In a pair these equal 1 and the partner's
    /// metrics, so pair answers are scored by the same pair scorer.
    #[serde(default)]
    pub crowding: bool,
    /// The trees fit the ridge half's residuals and the model predicts ridge + trees
    /// (one log ratio), instead of averaging the two halves' throughputs.
    #[serde(default)]
    pub stacked: bool,
    /// Each member's row weighs as its share of the set's exclusive throughput times the
    /// number of members, in the trees' loss: the sum that ranking compares is dominated by
    /// the members with large throughput.
    #[serde(default)]
    pub weighted: bool,
    /// As `weighted`, but only in sets of three or more members: pair rows keep weight 1,
    /// so a model fitted on pairs alone is the model without it.
    #[serde(default)]
    pub weighted_crowded: bool,
    /// For sets of three or more members, the set's sum is the mean of the members' sum
    /// and a sum-level linear model (KACE's: summed metrics, ordinary least squares) fitted
    /// on the training sets of three or more members; each member is scaled by the same
    /// factor. Linear terms extrapolate to unseen workloads where the trees cannot. Pairs
    /// are untouched.
    #[serde(default)]
    pub set_linear: bool,
    /// With `set_linear`, the linear sum is first held within [1/2, 2] x the members' sum
    /// (a linear sum extrapolates without bound, below zero too), so the blend moves the
    /// members' sum by a factor in [3/4, 3/2].
    #[serde(default)]
    pub set_linear_bounded: bool,
    /// With `set_linear`, the sum-level model is ridge instead of ordinary least squares:
    /// on the standardised summed metrics, with penalty alpha = (number of crowded training
    /// sets) x `set_linear_shrink` / 10; 0 = ordinary least squares. The summed metrics
    /// are nearly collinear, and least squares on a few hundred sets extrapolates wildly
    /// for unseen workloads (below zero too).
    #[serde(default)]
    pub set_linear_shrink: u8,
    /// Each member's blended prediction is at most its exclusive throughput: a co-runner
    /// never speeds a job up, and the blend's common factor could otherwise lift a member
    /// above what it does alone.
    #[serde(default)]
    pub members_capped: bool,
    /// Both halves learn each member's log ratio around the time-sharing law, ln min(1,
    /// 100 / the set's summed sm busy %), and add it back when predicting: a set whose
    /// members together keep the SMs busy less than all the time shares them unslowed, a
    /// busier one in proportion (candidate; docs/nway.md).
    #[serde(default)]
    pub time_share: bool,
    /// [`Self::time_share`] for sets of three or more members only: pairs are learned and
    /// answered as without it, so a model fitted on pairs alone is unchanged. Fitted only
    /// from `member::SET_LINEAR_MIN_SETS` crowded training sets on, as the set-level model
    /// (a fitted model's options are false below).
    #[serde(default)]
    pub time_share_crowded: bool,
    /// With `set_linear` and ridge (`set_linear_shrink` > 0), the sum-level model predicts
    /// the set's efficiency, its summed colocated over its summed exclusive throughput,
    /// instead of the sum itself, and the linear sum is that times the summed exclusive
    /// throughput: a sum in throughput units extrapolates with the units of the workloads
    /// it was fitted on, an efficiency stays on the scale of any set (candidate; README,
    /// "N-way").
    #[serde(default)]
    pub set_linear_ratio: bool,
    /// In a set of three or more, each member's prediction is blended with the
    /// time-sharing law, after the set-level blend and the cap: (1 - w) x member + w x its
    /// exclusive throughput x min(1, 100 / the set's summed sm busy %), w = `law_blend` /
    /// 100. The law learns nothing from busy workloads, so it cannot carry their units to
    /// light ones the model has never seen. Only where the fitted model learns crowded sets
    /// around the law (`time_share_crowded` in its options), or with `law_blend_always`;
    /// 0 = off (docs/nway.md).
    #[serde(default)]
    pub law_blend: u8,
    /// With `law_blend`, the blend in every crowded set, also where the fitted model
    /// learned none (its crowded answers are then pair-learned members, blended with the
    /// law) (chosen by the simulation; docs/simulation.md).
    #[serde(default)]
    pub law_blend_always: bool,
    /// In a set of three or more, each member's prediction is blended, before the set-level
    /// blend and the law, with its composition from the model's own pair answers: its
    /// exclusive throughput x over 1 + Σ over the co-runners j of max(0, x / p(j) - 1),
    /// p(j) its prediction in the pair with j alone (slowdowns add, as under time-sharing):
    /// (1 - w) x member + w x composed, w = `pair_composition` / 100. Only where the fitted
    /// model learned no crowded set (its crowded answers are then all pair-learned; a model
    /// fitted on any crowded run has the option 0); 0 = off
    /// (docs/decisions/041-pair-composition.md).
    #[serde(default)]
    pub pair_composition: u8,
}

impl MemberOptions {
    /// What `Train` fits: chosen by the rule fixed before comparing (docs/nway.md).
    pub const CHOSEN: MemberOptions = MemberOptions {
        crowding: true,
        stacked: false,
        weighted: true,
        weighted_crowded: false,
        set_linear: true,
        set_linear_bounded: false,
        set_linear_shrink: 1,
        members_capped: true,
        time_share: false,
        time_share_crowded: true,
        set_linear_ratio: false,
        law_blend: 10,
        law_blend_always: true,
        pair_composition: 50,
    };

    /// What `Train` fits for the NVML-only twin, on the same runs with the kernel metrics
    /// withheld: its own nested choice, the full model's options without the row weights
    /// (docs/decisions/037-unserved-pair-choices.md).
    pub const TWIN: MemberOptions = MemberOptions {
        weighted: false,
        ..MemberOptions::CHOSEN
    };

    /// The served options of a profile level: [`Self::CHOSEN`] for full profiles,
    /// [`Self::TWIN`] for NVML-only ones.
    pub const fn at(level: ProfileLevel) -> MemberOptions {
        match level {
            ProfileLevel::Full => Self::CHOSEN,
            ProfileLevel::NvmlOnly => Self::TWIN,
        }
    }

    /// Whether the trees' loss weighs the member rows (see `weighted`, `weighted_crowded`).
    pub(crate) fn weighs_rows(self) -> bool {
        self.weighted || self.weighted_crowded
    }

    pub(crate) fn booster_features(self) -> usize {
        if self.crowding {
            MAX_BOOSTER_FEATURES
        } else {
            2 * NUM_FEATURES
        }
    }
}

/// Index of the exclusive throughput among a profile's metrics.
pub(super) const EXCLUSIVE_THROUGHPUT: usize = 6;
const SM_BUSY_PCT: usize = 7;

/// The time-sharing law's log ratio for a member with metrics `own` beside co-runners whose
/// summed metrics are `others`: ln min(1, 100 / (own + others' sm busy %)).
pub(super) fn time_share_log_ratio(own: &Features, others: &Features) -> f64 {
    let demand = (own.0[SM_BUSY_PCT] + others.0[SM_BUSY_PCT]) / 100.0;
    if demand > 1.0 {
        -demand.ln()
    } else {
        0.0
    }
}

/// The time-sharing law of a whole set: the share of its exclusive throughput each member
/// keeps, min(1, 100 / the members' summed sm busy %) (what [`time_share_log_ratio`] gives
/// any member of it, as a ratio).
pub(super) fn time_share_law(members: &[Features]) -> f64 {
    let demand: f64 = members.iter().map(|m| m.0[SM_BUSY_PCT]).sum::<f64>() / 100.0;
    if demand > 1.0 {
        1.0 / demand
    } else {
        1.0
    }
}

/// Predicted and observed ratios are kept within [e^-7, e^3] (0.1 % to 20x of exclusive):
/// far outside anything measured, and it keeps a wild extrapolation finite.
const LOG_RATIO_RANGE: (f64, f64) = (-7.0, 3.0);

pub(super) const RIDGE_FEATURES: usize = 2 * NUM_FEATURES;

/// ln(1 + x) for the metrics (all >= 0), as the logarithm of the sum: it differs from
/// `ln_1p` by about one unit in the last place of the result (3.6e-15 at x = 1e8; below
/// 3e-16 for small x, in absolute terms, which is what the linear terms see) and costs half
/// as much (glibc's `log` is table-driven, its `log1p` is not). Rank takes nine per
/// candidate.
#[inline]
pub(super) fn ln1p(x: f64) -> f64 {
    (1.0 + x).ln()
}

/// Ridge features of a member: ln(1 + own metric) for all ten metrics, ln(1 + own + others)
/// for the nine that are not throughputs, and the set's summed memory.
pub(super) fn ridge_features(own: &Features, others: &Features) -> [f64; RIDGE_FEATURES] {
    let mut f = [0.0; RIDGE_FEATURES];
    for (slot, value) in f.iter_mut().zip(own.0) {
        *slot = ln1p(value);
    }
    let mut k = NUM_FEATURES;
    for i in (0..NUM_FEATURES).filter(|&i| i != EXCLUSIVE_THROUGHPUT) {
        f[k] = ln1p(own.0[i] + others.0[i]);
        k += 1;
    }
    f[k] = own.memory_gb() + others.memory_gb();
    f
}

/// The ridge half split by what its terms depend on, for the pair scorer: the terms of a
/// member's own metrics, and those of the set's summed metrics (equal for both members).
#[derive(Debug, Clone)]
pub(super) struct RidgeParts {
    pub intercept: f64,
    own: [f64; NUM_FEATURES],
    /// Per metric (the exclusive throughput has none), then the set's memory.
    set: [f64; NUM_FEATURES],
    memory: f64,
}

impl RidgeParts {
    pub fn new(intercept: f64, coefficients: &[f64]) -> Self {
        let mut own = [0.0; NUM_FEATURES];
        own.copy_from_slice(&coefficients[..NUM_FEATURES]);
        let mut set = [0.0; NUM_FEATURES];
        let mut k = NUM_FEATURES;
        for (i, slot) in set.iter_mut().enumerate() {
            if i != EXCLUSIVE_THROUGHPUT {
                *slot = coefficients[k];
                k += 1;
            }
        }
        Self {
            intercept,
            own,
            set,
            memory: coefficients[k],
        }
    }

    pub fn own_terms(&self, own: &Features) -> f64 {
        own.0.iter().zip(&self.own).map(|(x, c)| ln1p(*x) * c).sum()
    }

    pub fn set_terms(&self, a: &Features, b: &Features) -> f64 {
        let mut sum = self.memory * (a.memory_gb() + b.memory_gb());
        for i in (0..NUM_FEATURES).filter(|&i| i != EXCLUSIVE_THROUGHPUT) {
            sum += self.set[i] * ln1p(a.0[i] + b.0[i]);
        }
        sum
    }
}

/// A member's predicted throughput from the two halves' predicted log ratios: their
/// throughputs averaged, or (`stacked`, trees fitted on the ridge half's residuals) the
/// ratio of their sum.
#[inline]
pub(super) fn member_throughput(linear: f64, boosted: f64, own: &Features, stacked: bool) -> f64 {
    let ratio = if stacked {
        clamp_log_ratio(linear + boosted).exp()
    } else {
        0.5 * (clamp_log_ratio(linear).exp() + clamp_log_ratio(boosted).exp())
    };
    ratio * own.0[EXCLUSIVE_THROUGHPUT]
}

/// Names of the ridge features, for GetModel.
pub fn ridge_feature_names() -> Vec<String> {
    let mut names: Vec<String> = FEATURE_NAMES
        .iter()
        .map(|n| format!("ln1p_own_{n}"))
        .collect();
    names.extend(
        FEATURE_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != EXCLUSIVE_THROUGHPUT)
            .map(|(_, n)| format!("ln1p_set_{n}")),
    );
    names.push("set_memory_gb".into());
    names
}

pub(super) fn clamp_log_ratio(value: f64) -> f64 {
    value.clamp(LOG_RATIO_RANGE.0, LOG_RATIO_RANGE.1)
}
