//! Rank's fast path for `member-ridge-gbt`: pairs scored with table lookups instead of
//! walking 1 000 trees per candidate.
//!
//! Why it is exact. Every tree has depth ≤ 2, so the path to a leaf tests at most two
//! features. In a pair (target, candidate), each member's booster features are its own
//! metrics and the other's; for the target's member the own half is fixed by the request
//! and the other half varies with the candidate, and the other way round for the
//! candidate's member. Per member role, a leaf whose tests are all on varying features is a
//! function of the candidate alone: summed once per profile ([`ProfileCode`]). A leaf with
//! one varying test and fixed ones is a step in one candidate metric, present or not
//! depending on the target: summed per request into a table over that metric's threshold
//! bins ([`TargetTables`]). A leaf with no varying test is a per-request constant. So a
//! candidate costs, per member, one precomputed number and ten table lookups, plus the
//! ridge half's nine logarithms of the pair's summed metrics.
//!
//! Scores equal the reference predictor's up to floating-point summation order (tested to
//! 1e-12 relative, with candidates placed exactly on split thresholds).

use super::{
    member::{member_throughput, RidgeParts},
    Features, SetPrediction, NUM_FEATURES,
};

/// One test on a path: `value < threshold` goes left. `feature` indexes the booster
/// features (own metrics 0..10, the other's 10..20).
#[derive(Debug, Clone, Copy)]
struct Test {
    feature: usize,
    threshold: f64,
    left: bool,
    /// The threshold's position among the sorted distinct thresholds of its metric.
    bin: u16,
}

impl Test {
    fn metric(&self) -> usize {
        self.feature % NUM_FEATURES
    }

    fn holds(&self, value: f64) -> bool {
        (value < self.threshold) == self.left
    }

    /// The bins of its metric where the test holds: x < t ⟺ bin(x) <= bin(t).
    fn bin_range(&self, bins_of_metric: usize) -> (usize, usize) {
        let split = self.bin as usize;
        if self.left {
            (0, split)
        } else {
            (split + 1, bins_of_metric - 1)
        }
    }
}

/// The target's member (its own metrics fixed) or the candidate's (the other's fixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Target = 0,
    Candidate = 1,
}

impl Role {
    const BOTH: [Role; 2] = [Role::Target, Role::Candidate];

    fn is_varying(self, feature: usize) -> bool {
        match self {
            Role::Target => feature >= NUM_FEATURES,
            Role::Candidate => feature < NUM_FEATURES,
        }
    }
}

#[derive(Debug, Clone)]
struct Leaf {
    value: f64,
    varying: Vec<Test>,
    fixed: Vec<Test>,
}

/// A leaf as one role sees it: how its contribution is computed.
#[derive(Debug, Clone, Default)]
struct RoleLeaves {
    /// Only varying tests: summed per profile.
    profile: Vec<Leaf>,
    /// One varying test and fixed ones: a step, per request.
    step: Vec<Leaf>,
    /// No varying test: a constant, per request.
    constant: Vec<Leaf>,
}

/// The compiled model. Built once per model; `None` from [`PairScorer::compile`] for a tree
/// deeper than two (a leaf with two varying and a fixed test has no such split).
#[derive(Debug, Clone)]
pub struct PairScorer {
    base_score: f64,
    /// Per metric, the sorted distinct thresholds of both its booster features.
    thresholds: [Vec<f64>; NUM_FEATURES],
    /// Per metric, where its bins start in a flat step table.
    offsets: [usize; NUM_FEATURES + 1],
    roles: [RoleLeaves; 2],
    ridge: RidgeParts,
}

/// What one profile contributes to any pair it is in, under one model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileCode {
    /// Per metric, the number of thresholds at or below the profile's value.
    bins: [u16; NUM_FEATURES],
    /// Per role, the sum of the leaves that test only this profile's metrics.
    boosted: [f64; 2],
    /// The ridge half's terms on the profile's own metrics.
    ridge_own: f64,
}

/// A request's target folded into the model: per role, a constant and a step table.
#[derive(Debug, Clone)]
pub struct TargetTables {
    target: Features,
    code: ProfileCode,
    constant: [f64; 2],
    steps: [Vec<f64>; 2],
}

/// One booster tree as forust-ml stores it, reduced to what scoring needs.
pub struct TreeNode {
    pub is_leaf: bool,
    pub value: f64,
    pub feature: usize,
    pub threshold: f64,
    pub left: usize,
    pub right: usize,
}

impl PairScorer {
    /// Compiles `trees` (node 0 is the root) with the ridge half.
    pub fn compile(
        base_score: f64,
        trees: &[Vec<TreeNode>],
        ridge_intercept: f64,
        ridge_coefficients: &[f64],
    ) -> Option<Self> {
        let mut paths: Vec<LeafPath> = Vec::new();
        for tree in trees {
            collect_leaves(tree, 0, &mut Vec::new(), &mut paths)?;
        }
        let mut thresholds: [Vec<f64>; NUM_FEATURES] = Default::default();
        for (_, path) in &paths {
            for &(feature, threshold, _) in path {
                thresholds[feature % NUM_FEATURES].push(threshold);
            }
        }
        let mut offsets = [0; NUM_FEATURES + 1];
        for (j, t) in thresholds.iter_mut().enumerate() {
            t.sort_by(f64::total_cmp);
            t.dedup();
            // bins(x) ranges over 0..=len: len + 1 bins per metric.
            offsets[j + 1] = offsets[j] + t.len() + 1;
        }
        if thresholds.iter().any(|t| t.len() >= u16::MAX as usize) {
            return None;
        }
        let mut roles: [RoleLeaves; 2] = Default::default();
        for (value, path) in paths {
            let tests: Vec<Test> = path
                .into_iter()
                .map(|(feature, threshold, left)| Test {
                    feature,
                    threshold,
                    left,
                    bin: thresholds[feature % NUM_FEATURES].partition_point(|&t| t < threshold)
                        as u16,
                })
                .collect();
            for role in Role::BOTH {
                let (varying, fixed): (Vec<Test>, Vec<Test>) =
                    tests.iter().partition(|t| role.is_varying(t.feature));
                let leaf = Leaf {
                    value,
                    varying,
                    fixed,
                };
                let slot = &mut roles[role as usize];
                match (leaf.varying.len(), leaf.fixed.len()) {
                    (0, _) => slot.constant.push(leaf),
                    (_, 0) => slot.profile.push(leaf),
                    (1, _) => slot.step.push(leaf),
                    _ => return None,
                }
            }
        }
        Some(Self {
            base_score,
            thresholds,
            offsets,
            roles,
            ridge: RidgeParts::new(ridge_intercept, ridge_coefficients),
        })
    }

    /// Reduces a profile to its code under this model (once per profile and model).
    pub fn code(&self, profile: &Features) -> ProfileCode {
        let mut bins = [0u16; NUM_FEATURES];
        for (j, bin) in bins.iter_mut().enumerate() {
            let value = profile.0[j];
            *bin = self.thresholds[j].partition_point(|&t| t <= value) as u16;
        }
        let mut boosted = [0.0; 2];
        for role in Role::BOTH {
            boosted[role as usize] = self.roles[role as usize]
                .profile
                .iter()
                .filter(|leaf| leaf.varying.iter().all(|t| t.holds(profile.0[t.metric()])))
                .map(|leaf| leaf.value)
                .sum();
        }
        ProfileCode {
            bins,
            boosted,
            ridge_own: self.ridge.own_terms(profile),
        }
    }

    /// Folds the target into per-role constants and step tables (once per request).
    pub fn target(&self, target: &Features) -> TargetTables {
        let code = self.code(target);
        let fixed_value = |role: Role, t: &Test| match role {
            // The target's member: its own metrics are fixed.
            Role::Target => target.0[t.feature],
            // The candidate's member: the other's (the target's) metrics are fixed.
            Role::Candidate => target.0[t.feature - NUM_FEATURES],
        };
        let mut constant = [self.base_score; 2];
        let mut steps: [Vec<f64>; 2] = Default::default();
        for role in Role::BOTH {
            let leaves = &self.roles[role as usize];
            let applies = |leaf: &&Leaf| leaf.fixed.iter().all(|t| t.holds(fixed_value(role, t)));
            constant[role as usize] += leaves
                .constant
                .iter()
                .filter(applies)
                .map(|l| l.value)
                .sum::<f64>();
            // A difference array per metric: a range of bins is +value at its start and
            // -value past its end, unless it ends at the metric's last bin.
            let mut diff = vec![0.0; self.offsets[NUM_FEATURES]];
            for leaf in leaves.step.iter().filter(applies) {
                let test = &leaf.varying[0];
                let j = test.metric();
                let bins = self.thresholds[j].len() + 1;
                let (lo, hi) = test.bin_range(bins);
                diff[self.offsets[j] + lo] += leaf.value;
                if hi + 1 < bins {
                    diff[self.offsets[j] + hi + 1] -= leaf.value;
                }
            }
            let mut table = vec![0.0; self.offsets[NUM_FEATURES]];
            for j in 0..NUM_FEATURES {
                let mut running = 0.0;
                for k in self.offsets[j]..self.offsets[j + 1] {
                    running += diff[k];
                    table[k] = running;
                }
            }
            steps[role as usize] = table;
        }
        TargetTables {
            target: *target,
            code,
            constant,
            steps,
        }
    }

    /// The pair (target, candidate): each member's predicted colocated throughput.
    #[inline]
    pub fn score(
        &self,
        tables: &TargetTables,
        candidate: &Features,
        code: &ProfileCode,
    ) -> [f64; 2] {
        let target = &tables.target;
        let set = self.ridge.set_terms(target, candidate);
        let mut boosted = [0.0; 2];
        for (role, out) in boosted.iter_mut().enumerate() {
            let table = &tables.steps[role];
            let mut sum = tables.constant[role] + code.boosted[role];
            for j in 0..NUM_FEATURES {
                sum += table[self.offsets[j] + code.bins[j] as usize];
            }
            *out = sum;
        }
        let linear = [
            self.ridge.intercept + tables.code.ridge_own + set,
            self.ridge.intercept + code.ridge_own + set,
        ];
        [
            member_throughput(linear[0], boosted[0], target),
            member_throughput(linear[1], boosted[1], candidate),
        ]
    }

    /// Scores every candidate against the target, codes computed on the way.
    pub fn predict_pairs(&self, target: &Features, candidates: &[&Features]) -> Vec<SetPrediction> {
        let tables = self.target(target);
        candidates
            .iter()
            .map(|c| {
                let members = self.score(&tables, c, &self.code(c));
                SetPrediction {
                    sum: members[0] + members[1],
                    members: Some(members.to_vec()),
                }
            })
            .collect()
    }
}

/// A leaf's value and the tests on its path: (feature, threshold, goes left).
type LeafPath = (f64, Vec<(usize, f64, bool)>);

/// Walks a tree and records every leaf with the tests on its path.
fn collect_leaves(
    tree: &[TreeNode],
    node: usize,
    path: &mut Vec<(usize, f64, bool)>,
    out: &mut Vec<LeafPath>,
) -> Option<()> {
    let n = tree.get(node)?;
    if n.is_leaf {
        out.push((n.value, path.clone()));
        return Some(());
    }
    if n.feature >= 2 * NUM_FEATURES || !n.threshold.is_finite() || path.len() >= 2 {
        return None;
    }
    path.push((n.feature, n.threshold, true));
    collect_leaves(tree, n.left, path, out)?;
    path.pop();
    path.push((n.feature, n.threshold, false));
    collect_leaves(tree, n.right, path, out)?;
    path.pop();
    Some(())
}
