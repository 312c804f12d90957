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

use std::{fmt, sync::Arc};

use super::{
    member_terms::{member_throughput, MemberOptions, RidgeParts},
    Features, SetPrediction, NUM_FEATURES,
};

/// How many bytes of target tables a scorer keeps (each is two step tables of a few
/// thousand slots: tens of KB).
const TABLES_CACHE_BYTES: u64 = 16 << 20;

/// Tables of recently ranked targets, by the exact bits of the target's metrics (a changed
/// profile is a new key; a new model is a new scorer, with an empty cache). Schedulers ask
/// for the same pending job again and again, and a target's tables cost more to build than
/// scoring a hundred candidates.
struct TablesCache(quick_cache::sync::Cache<[u64; NUM_FEATURES], Arc<TargetTables>, TableBytes>);

#[derive(Clone)]
struct TableBytes;

impl quick_cache::Weighter<[u64; NUM_FEATURES], Arc<TargetTables>> for TableBytes {
    fn weight(&self, _key: &[u64; NUM_FEATURES], tables: &Arc<TargetTables>) -> u64 {
        (std::mem::size_of::<TargetTables>()
            + tables.steps.iter().map(|s| s.len() * 8).sum::<usize>()) as u64
    }
}

impl TablesCache {
    fn new() -> Self {
        Self(quick_cache::sync::Cache::with_weighter(
            256,
            TABLES_CACHE_BYTES,
            TableBytes,
        ))
    }
}

impl Clone for TablesCache {
    /// A copy starts empty: the entries are a cache.
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl fmt::Debug for TablesCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TablesCache")
            .field("targets", &self.0.len())
            .finish()
    }
}

/// A test on a path, `value < threshold` goes left, on one metric of one of the pair's
/// profiles.
#[derive(Debug, Clone, Copy)]
struct Test {
    metric: usize,
    threshold: f64,
    left: bool,
}

impl Test {
    #[inline]
    fn holds(&self, metrics: &Features) -> bool {
        (metrics.0[self.metric] < self.threshold) == self.left
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

/// A leaf whose tests all fall on one profile of the pair: the candidate's (summed per
/// profile) or the target's (a per-request constant).
#[derive(Debug, Clone, Copy)]
struct OneSidedLeaf {
    value: f64,
    tests: [Test; 2],
    count: usize,
}

impl OneSidedLeaf {
    fn new(value: f64, tests: &[Test]) -> Self {
        let mut padded = [tests.first().copied().unwrap_or(Test {
            metric: 0,
            threshold: 0.0,
            left: true,
        }); 2];
        padded[..tests.len()].copy_from_slice(tests);
        Self {
            value,
            tests: padded,
            count: tests.len(),
        }
    }

    /// True when every test of the leaf holds on `metrics`.
    #[inline]
    fn applies(&self, metrics: &Features) -> bool {
        self.tests[..self.count].iter().all(|t| t.holds(metrics))
    }
}

/// A leaf with one test on the candidate (a range of its bins, slots `lo..hi` of the flat
/// step table) and at most one on the target.
#[derive(Debug, Clone, Copy)]
struct StepLeaf {
    value: f64,
    lo: usize,
    hi: usize,
    fixed: Option<Test>,
}

/// A leaf as one role sees it: how its contribution is computed.
#[derive(Debug, Clone, Default)]
struct RoleLeaves {
    profile: Vec<OneSidedLeaf>,
    step: Vec<StepLeaf>,
    constant: Vec<OneSidedLeaf>,
}

/// The compiled model. Built once per model; `None` from [`PairScorer::compile`] for a tree
/// deeper than two (a leaf with two tests on the candidate and one on the target has no
/// such split).
#[derive(Debug, Clone)]
pub struct PairScorer {
    base_score: f64,
    /// Per metric, the sorted distinct thresholds of both its booster features.
    thresholds: [Vec<f64>; NUM_FEATURES],
    /// Per metric, where its bins start in a flat step table. A metric with n thresholds
    /// has n + 1 bins and one spare slot, so that one running sum over the whole table
    /// turns the difference array into step values.
    offsets: [usize; NUM_FEATURES + 1],
    roles: [RoleLeaves; 2],
    ridge: RidgeParts,
    stacked: bool,
    tables: TablesCache,
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
    /// The ridge half's terms on the target's own metrics.
    ridge_own: f64,
    constant: [f64; 2],
    steps: [Vec<f64>; 2],
}

/// One booster tree as forust-ml stores it, reduced to what scoring needs.
pub(super) struct TreeNode {
    pub is_leaf: bool,
    pub value: f64,
    pub feature: usize,
    pub threshold: f64,
    pub left: usize,
    pub right: usize,
}

impl PairScorer {
    /// Compiles `trees` (node 0 is the root) with the ridge half.
    pub(super) fn compile(
        base_score: f64,
        trees: &[Vec<TreeNode>],
        ridge_intercept: f64,
        ridge_coefficients: &[f64],
        options: MemberOptions,
    ) -> Option<Self> {
        let mut paths: Vec<LeafPath> = Vec::new();
        for tree in trees {
            collect_leaves(tree, 0, options, &mut Vec::new(), &mut paths)?;
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
            offsets[j + 1] = offsets[j] + t.len() + 2;
        }
        if thresholds.iter().any(|t| t.len() >= u16::MAX as usize) {
            return None;
        }
        let mut roles: [RoleLeaves; 2] = Default::default();
        for (value, path) in paths {
            for role in Role::BOTH {
                let mut varying = Vec::new();
                let mut fixed = Vec::new();
                for &(feature, threshold, left) in &path {
                    let test = Test {
                        metric: feature % NUM_FEATURES,
                        threshold,
                        left,
                    };
                    if role.is_varying(feature) {
                        varying.push(test);
                    } else {
                        fixed.push(test);
                    }
                }
                let slot = &mut roles[role as usize];
                match (varying.as_slice(), fixed.as_slice()) {
                    ([], _) => slot.constant.push(OneSidedLeaf::new(value, &fixed)),
                    (_, []) => slot.profile.push(OneSidedLeaf::new(value, &varying)),
                    ([test], [_]) => {
                        let j = test.metric;
                        // x < t exactly when bin(x) <= (number of thresholds below t).
                        let split = thresholds[j].partition_point(|&u| u < test.threshold);
                        let bins = thresholds[j].len() + 1;
                        let (lo, hi) = if test.left {
                            (0, split + 1)
                        } else {
                            (split + 1, bins)
                        };
                        slot.step.push(StepLeaf {
                            value,
                            lo: offsets[j] + lo,
                            hi: offsets[j] + hi,
                            fixed: fixed.first().copied(),
                        });
                    }
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
            stacked: options.stacked,
            tables: TablesCache::new(),
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
                .filter(|leaf| leaf.applies(profile))
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
        let mut constant = [self.base_score; 2];
        let mut steps: [Vec<f64>; 2] = Default::default();
        for role in Role::BOTH {
            let leaves = &self.roles[role as usize];
            constant[role as usize] += leaves
                .constant
                .iter()
                .filter(|leaf| leaf.applies(target))
                .map(|leaf| leaf.value)
                .sum::<f64>();
            // A difference array: +value where a leaf's range of bins starts, -value
            // where it ends (at most the metric's spare slot); one running sum then gives
            // every bin's value.
            let mut table = vec![0.0; self.offsets[NUM_FEATURES]];
            for leaf in &leaves.step {
                if leaf.fixed.is_none_or(|t| t.holds(target)) {
                    table[leaf.lo] += leaf.value;
                    table[leaf.hi] -= leaf.value;
                }
            }
            let mut running = 0.0;
            for slot in &mut table {
                running += *slot;
                *slot = running;
            }
            steps[role as usize] = table;
        }
        TargetTables {
            target: *target,
            ridge_own: self.ridge.own_terms(target),
            constant,
            steps,
        }
    }

    /// [`PairScorer::target`], kept for the targets ranked most recently.
    pub fn target_tables(&self, target: &Features) -> Arc<TargetTables> {
        let key = target.0.map(f64::to_bits);
        match self.tables.0.get_or_insert_with(&key, || {
            Ok::<_, std::convert::Infallible>(Arc::new(self.target(target)))
        }) {
            Ok(tables) => tables,
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
            self.ridge.intercept + tables.ridge_own + set,
            self.ridge.intercept + code.ridge_own + set,
        ];
        [
            member_throughput(linear[0], boosted[0], target, self.stacked),
            member_throughput(linear[1], boosted[1], candidate, self.stacked),
        ]
    }

    /// Scores every candidate against the target, codes computed on the way.
    pub fn predict_pairs(&self, target: &Features, candidates: &[&Features]) -> Vec<SetPrediction> {
        let tables = self.target_tables(target);
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
    options: MemberOptions,
    path: &mut Vec<(usize, f64, bool)>,
    out: &mut Vec<LeafPath>,
) -> Option<()> {
    let n = tree.get(node)?;
    if n.is_leaf {
        out.push((n.value, path.clone()));
        return Some(());
    }
    if !n.threshold.is_finite() {
        return None;
    }
    // The crowding features, as a pair sees them: one other member, whose metrics are the
    // others' largest.
    const COUNT: usize = 2 * NUM_FEATURES;
    let feature = match n.feature {
        f if f < COUNT => f,
        COUNT if options.crowding => {
            let left = 1.0 < n.threshold;
            return collect_leaves(
                tree,
                if left { n.left } else { n.right },
                options,
                path,
                out,
            );
        }
        f if options.crowding && f <= COUNT + NUM_FEATURES => NUM_FEATURES + (f - COUNT - 1),
        _ => return None,
    };
    if path.len() >= 2 {
        return None;
    }
    path.push((feature, n.threshold, true));
    collect_leaves(tree, n.left, options, path, out)?;
    path.pop();
    path.push((feature, n.threshold, false));
    collect_leaves(tree, n.right, options, path, out)?;
    path.pop();
    Some(())
}
