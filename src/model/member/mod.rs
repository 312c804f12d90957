//! coloc's default model kind, `member-ridge-gbt`: it predicts each member of a colocated
//! set, not only the set's sum. For a member it predicts ln(colocated / exclusive
//! throughput) from its own ten metrics and the element-wise sum of the other members'
//! metrics, twice — ridge regression on log-transformed features ([`super::ridge`]), and
//! gradient-boosted trees (forust-ml) on the raw metrics — and averages the two predicted
//! throughputs. The set's sum is the sum over members, so the same model serves pairs and
//! larger sets, and every answer carries each member's predicted slowdown. For sets of
//! three or more members, both halves learn each member around the time-sharing law, ln
//! min(1, 100 / the set's summed SM-busy %) ([`MemberOptions::time_share_crowded`]), and
//! the sum is averaged with a sum-level linear model of the training sets of that size,
//! fitted by ridge ([`MemberOptions::set_linear`], [`MemberOptions::set_linear_shrink`]):
//! linear terms extrapolate to unseen workloads in crowded sets where the trees cannot, and
//! the penalty keeps them from extrapolating wildly. A model that learned no such set
//! (one fitted on imported pairs) first moves each crowded member halfway to what its own
//! pair answers compose to, slowdowns adding as under time-sharing
//! ([`MemberOptions::pair_composition`]). Last, each crowded member is moved a
//! tenth of the way to the time-sharing law itself ([`MemberOptions::law_blend`]), which
//! learns nothing from busy workloads and so reads sets of light ones it has never seen
//! where they run. Pairs are answered by the members alone.
//!
//! Chosen by `coloc eval kace` on the selection half of the data; see docs/model.md, "Model quality";
//! the options by `coloc eval nway --candidates`, docs/nway.md.
//!
//! The folder: the fitted model and what its parts share (here), the fit ([`fit`]), the
//! predictions and the pair scorer ([`predict`]), the intervals' calibration and their
//! answers ([`calibrate`]).

mod calibrate;
mod fit;
mod predict;
#[cfg(test)]
mod tests;

use std::{
    fmt,
    sync::{Arc, OnceLock},
};

use forust_ml::GradientBooster;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{
    flat_forest::FlatForest,
    intervals::{Intervals, MeasuredSets, SeenBands},
    member_terms::{time_share_log_ratio, MemberOptions, MAX_BOOSTER_FEATURES, RIDGE_FEATURES},
    pair_scorer::PairScorer,
    Features, KaceLinear, NUM_FEATURES,
};

pub(super) use super::member_terms::ridge_feature_names;

/// Training sets of three or more members the set-level linear model needs before it is
/// fitted: ten per coefficient (the summed metrics and the intercept), the usual rule for
/// least squares. With fewer it interpolates rather than fits (it was fitted from
/// `MIN_TRAINING_ROWS`, 12, on: a service that had received its first 16 crowded runs
/// trained a model whose cross-validated MSE was 6x the champion's), and the sum is the
/// members' alone. Every KACE evaluation trains on 230 or more such sets.
pub(super) const SET_LINEAR_MIN_SETS: usize = 10 * (NUM_FEATURES + 1);

/// A member's view of its set: its own metrics, the others' sum and largest, their number.
#[derive(Debug, Clone, Copy)]
struct MemberView<'a> {
    own: &'a Features,
    others: Features,
    others_max: Features,
    n_others: usize,
}

/// Booster features of a member: its own metrics, then the others' summed metrics, then
/// (crowding) their number and largest metrics.
fn booster_features(view: &MemberView, options: MemberOptions) -> [f64; MAX_BOOSTER_FEATURES] {
    let mut f = [0.0; MAX_BOOSTER_FEATURES];
    f[..NUM_FEATURES].copy_from_slice(&view.own.0);
    f[NUM_FEATURES..2 * NUM_FEATURES].copy_from_slice(&view.others.0);
    if options.crowding {
        f[2 * NUM_FEATURES] = view.n_others as f64;
        f[2 * NUM_FEATURES + 1..].copy_from_slice(&view.others_max.0);
    }
    f
}

/// The fitted booster, shared and serialised through forust-ml's own serde support, and
/// its trees laid out for walking many rows ([`FlatForest`], made on first use and shared
/// by clones).
#[derive(Clone)]
pub struct Booster(Arc<GradientBooster>, Arc<OnceLock<Option<FlatForest>>>);

impl Booster {
    fn new(booster: GradientBooster) -> Self {
        Self(Arc::new(booster), Arc::default())
    }

    /// The prediction of each row (its first `width` features are the booster's), equal to
    /// forust-ml's to the bit: through the flat layout where it compiles, else forust-ml's
    /// own walk over a column-major copy.
    fn predict_rows<const N: usize>(&self, rows: &[[f64; N]], width: usize) -> Vec<f64> {
        if let Some(predicted) = self
            .1
            .get_or_init(|| FlatForest::compile(&self.0))
            .as_ref()
            .and_then(|flat| flat.predict(rows))
        {
            return predicted;
        }
        let mut data = Vec::with_capacity(rows.len() * width);
        for j in 0..width {
            data.extend(rows.iter().map(|r| r[j]));
        }
        self.0.predict(
            &forust_ml::data::Matrix::new(&data, rows.len(), width),
            false,
        )
    }
}

impl fmt::Debug for Booster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GradientBooster({} trees)", self.0.trees.len())
    }
}

impl PartialEq for Booster {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || serde_json::to_string(&*self.0).ok() == serde_json::to_string(&*other.0).ok()
    }
}

impl Serialize for Booster {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Booster {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        GradientBooster::deserialize(deserializer).map(Self::new)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRidgeGbt {
    /// The ridge part in raw feature units (see [`ridge_feature_names`]).
    pub ridge_intercept: f64,
    pub ridge_coefficients: Vec<f64>,
    pub booster: Booster,
    #[serde(default)]
    pub options: MemberOptions,
    /// 80 % intervals calibrated at fit time on held-out profiles (models stored before
    /// intervals existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intervals: Option<Intervals>,
    /// Narrower bands for sets of workloads the model was trained on ([`SeenBands`]; only
    /// the band of two for models trained on 1 to 109 crowded runs, which learned crowded
    /// sets from a few runs: docs/decisions/013-seen-bands-after-few-crowded-runs.md and
    /// 035-measured-low-ends.md; none for models stored before they existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<SeenBands>,
    /// What the training runs measured of each distinct set, which bounds the low ends of
    /// those sets' intervals ([`MeasuredSets`]; none for models stored before it existed,
    /// and for models without intervals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredSets>,
    /// With [`MemberOptions::set_linear`], the sum-level linear model of sets of three or
    /// more members (none when the training held fewer than [`SET_LINEAR_MIN_SETS`] of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_linear: Option<KaceLinear>,
    /// The same kind fitted on the same runs with the kernel metrics withheld
    /// ([`Features::nvml_only`]) and its intervals calibrated the same way: what answers a
    /// set with a member profiled by NVML alone ([`super::ModelParams::at_level`]). None in
    /// the twin itself, and in models stored before twins existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_twin: Option<Box<super::ModelParams>>,
    #[serde(skip)]
    scorer: LazyScorer,
}

/// The pair scorer, compiled on first use and shared by clones of the model.
#[derive(Clone, Default)]
struct LazyScorer(Arc<OnceLock<Option<PairScorer>>>);

impl fmt::Debug for LazyScorer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairScorer")
    }
}

impl PartialEq for LazyScorer {
    /// Derived from the parameters: equal models have equal scorers.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl MemberRidgeGbt {
    pub(super) fn is_finite(&self) -> bool {
        self.ridge_intercept.is_finite()
            && self.ridge_coefficients.iter().all(|c| c.is_finite())
            && self.set_linear.as_ref().is_none_or(KaceLinear::is_finite)
            && self
                .nvml_twin
                .as_deref()
                .is_none_or(super::ModelParams::is_servable)
    }

    pub(super) fn has_expected_shape(&self) -> bool {
        self.ridge_coefficients.len() == RIDGE_FEATURES
    }
}

/// Each member's view of its set. The others' metrics are summed directly (not as total
/// minus own) so that in a pair the "others" are exactly the partner.
fn views_of(members: &[Features]) -> Vec<MemberView<'_>> {
    (0..members.len())
        .map(|i| {
            let others = || members.iter().enumerate().filter(move |(j, _)| *j != i);
            let mut others_max = Features::default();
            for (k, (_, m)) in others().enumerate() {
                for (slot, v) in others_max.0.iter_mut().zip(m.0) {
                    *slot = if k == 0 { v } else { slot.max(v) };
                }
            }
            MemberView {
                own: &members[i],
                others: Features::sum(others().map(|(_, m)| m)),
                others_max,
                n_others: members.len() - 1,
            }
        })
        .collect()
}

/// The log ratio both halves learn around (with [`MemberOptions::time_share`], or
/// [`MemberOptions::time_share_crowded`] in a set of three or more), else 0.
fn prior(options: MemberOptions, view: &MemberView) -> f64 {
    if options.time_share || (options.time_share_crowded && view.n_others >= 2) {
        time_share_log_ratio(view.own, &view.others)
    } else {
        0.0
    }
}

fn ridge_linear(intercept: f64, coefficients: &[f64], x: &[f64; RIDGE_FEATURES]) -> f64 {
    x.iter()
        .zip(coefficients)
        .fold(intercept, |acc, (x, c)| acc + x * c)
}
