//! forust-ml's trees laid out for walking many rows at once. Place's cold requests walk
//! hundreds of trees for tens of thousands of members; forust-ml's own `predict` makes a
//! vector per tree and follows its wide nodes one test at a time. Here:
//! - trees of depth two at most (what `member-ridge-gbt` fits) become one small record
//!   each, three tests and four leaves, read without a branch: the three tests at once,
//!   the leaf picked by their outcomes (a shallower branch is padded with equal leaves);
//! - rows are walked in blocks of four, tree by tree, their sums kept in registers; where
//!   the CPU has AVX, in blocks of eight laid out by feature, four rows to a register, the
//!   tests made and the leaves picked on all of them at once;
//! - deeper trees, and rows with a missing value, walk every node of every tree in one
//!   array of small nodes.
//!
//! The answer equals `GradientBooster::predict` to the bit: each row starts at the base
//! score and adds each tree's leaf (the same `f32` weight read as `f64`) in the same tree
//! order; a missing value (NaN, forust-ml's default marker) takes the node's missing
//! branch. A booster this layout cannot reproduce exactly (another missing marker, a node
//! forust-ml would read out of range) is not compiled, and its caller walks forust-ml's.

use forust_ml::GradientBooster;

/// Rows walked through each tree together.
const BLOCK: usize = 4;

/// `feature` of a leaf.
const LEAF: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct FlatNode {
    threshold: f64,
    /// The leaf's weight; unused in a split.
    value: f64,
    /// The split's feature, or [`LEAF`].
    feature: u32,
    left: u32,
    right: u32,
    missing: u32,
}

/// A tree of depth two at most: the root's test, then its left or right child's, picks one
/// of four leaves (left-left, left-right, right-left, right-right). A value goes right
/// when it is not below the threshold.
#[derive(Debug, Clone, Copy)]
struct Shallow {
    thresholds: [f64; 3],
    features: [u32; 3],
    leaves: [f64; 4],
}

impl Shallow {
    /// The tree of `nodes` (node 0 its root) as one record, or `None` when it is deeper.
    fn of(nodes: &[FlatNode], root: usize) -> Option<Self> {
        let root_node = &nodes[root];
        if root_node.feature == LEAF {
            return Some(Self {
                thresholds: [0.0; 3],
                features: [0; 3],
                leaves: [root_node.value; 4],
            });
        }
        let mut tree = Self {
            thresholds: [root_node.threshold, 0.0, 0.0],
            features: [root_node.feature, 0, 0],
            leaves: [0.0; 4],
        };
        for (side, child) in [root_node.left, root_node.right].into_iter().enumerate() {
            let child = &nodes[child as usize];
            if child.feature == LEAF {
                tree.leaves[2 * side] = child.value;
                tree.leaves[2 * side + 1] = child.value;
                continue;
            }
            let (left, right) = (&nodes[child.left as usize], &nodes[child.right as usize]);
            if left.feature != LEAF || right.feature != LEAF {
                return None;
            }
            tree.thresholds[1 + side] = child.threshold;
            tree.features[1 + side] = child.feature;
            tree.leaves[2 * side] = left.value;
            tree.leaves[2 * side + 1] = right.value;
        }
        Some(tree)
    }

    /// The leaf of a row without missing values.
    #[inline(always)]
    fn leaf(&self, row: &[f64]) -> f64 {
        let right = |k: usize| usize::from(row[self.features[k] as usize] >= self.thresholds[k]);
        let (root, left, right_child) = (right(0), right(1), right(2));
        let below = if root == 1 { right_child } else { left };
        self.leaves[2 * root + below]
    }
}

/// The compiled trees ([`FlatForest::compile`]).
#[derive(Debug, Clone)]
pub(crate) struct FlatForest {
    base_score: f64,
    nodes: Vec<FlatNode>,
    /// Each tree's root in `nodes`, in forust-ml's order.
    roots: Vec<u32>,
    /// Every tree as a [`Shallow`] record, in the same order, when all are that shallow.
    shallow: Option<Vec<Shallow>>,
    /// Rows must have at least this many features.
    width: usize,
}

impl FlatForest {
    /// The trees forust-ml predicts with (`prediction_iteration` of them), or `None` where
    /// this layout could differ from forust-ml's walk.
    pub(crate) fn compile(booster: &GradientBooster) -> Option<Self> {
        if !booster.missing.is_nan() {
            return None;
        }
        let iterations = booster
            .prediction_iteration
            .unwrap_or(booster.trees.len())
            .min(booster.trees.len());
        let mut nodes = Vec::new();
        let mut roots = Vec::with_capacity(iterations);
        let mut width = 0;
        for tree in &booster.trees[..iterations] {
            let offset = u32::try_from(nodes.len()).ok()?;
            let count = tree.nodes.len();
            if count == 0 {
                return None;
            }
            let at = |child: usize| (child < count).then(|| offset + child as u32);
            roots.push(offset);
            for node in &tree.nodes {
                nodes.push(if node.is_leaf {
                    FlatNode {
                        threshold: 0.0,
                        value: f64::from(node.weight_value),
                        feature: LEAF,
                        left: 0,
                        right: 0,
                        missing: 0,
                    }
                } else {
                    width = width.max(node.split_feature + 1);
                    FlatNode {
                        threshold: node.split_value,
                        value: 0.0,
                        feature: u32::try_from(node.split_feature)
                            .ok()
                            .filter(|f| *f != LEAF)?,
                        left: at(node.left_child)?,
                        right: at(node.right_child)?,
                        missing: at(node.missing_node)?,
                    }
                });
            }
        }
        let shallow = roots
            .iter()
            .map(|&root| Shallow::of(&nodes, root as usize))
            .collect();
        Some(Self {
            base_score: booster.base_score,
            nodes,
            roots,
            shallow,
            width,
        })
    }

    /// The prediction of each row (`rows[i][..width]` are its features), as
    /// `GradientBooster::predict` gives it; `None` when the rows are narrower than a split
    /// reads.
    pub(crate) fn predict<const N: usize>(&self, rows: &[[f64; N]]) -> Option<Vec<f64>> {
        self.predict_with(rows, Simd::available())
    }

    /// [`Self::predict`], with the vector walk of shallow trees (`simd`, where the CPU has
    /// it) or without.
    fn predict_with<const N: usize>(&self, rows: &[[f64; N]], simd: Simd) -> Option<Vec<f64>> {
        if N < self.width {
            return None;
        }
        let mut out = Vec::with_capacity(rows.len());
        let Some(shallow) = &self.shallow else {
            out.extend(rows.iter().map(|row| self.walk(row)));
            return Some(out);
        };
        let mut rest = rows;
        if let Simd::Avx = simd {
            let mut blocks = rows.chunks_exact(simd::ROWS);
            for block in blocks.by_ref() {
                if block.iter().any(|row| has_missing(&row[..self.width])) {
                    self.shallow_blocks(shallow, block, &mut out);
                } else {
                    out.extend_from_slice(&simd::sums(self.base_score, shallow, block));
                }
            }
            rest = blocks.remainder();
        }
        self.shallow_blocks(shallow, rest, &mut out);
        Some(out)
    }

    /// Rows through shallow trees, four at a time (a block with a missing value, and the
    /// last rows, one at a time through every node).
    fn shallow_blocks<const N: usize>(
        &self,
        shallow: &[Shallow],
        rows: &[[f64; N]],
        out: &mut Vec<f64>,
    ) {
        let mut blocks = rows.chunks_exact(BLOCK);
        for block in blocks.by_ref() {
            if block.iter().any(|row| has_missing(&row[..self.width])) {
                out.extend(block.iter().map(|row| self.walk(row)));
                continue;
            }
            // Four named sums, so that they stay in registers across the trees.
            let [a, b, c, d] = block else {
                unreachable!("chunks of {BLOCK}")
            };
            let (mut sa, mut sb, mut sc, mut sd) = (
                self.base_score,
                self.base_score,
                self.base_score,
                self.base_score,
            );
            for tree in shallow {
                sa += tree.leaf(a);
                sb += tree.leaf(b);
                sc += tree.leaf(c);
                sd += tree.leaf(d);
            }
            out.extend_from_slice(&[sa, sb, sc, sd]);
        }
        out.extend(blocks.remainder().iter().map(|row| self.walk(row)));
    }

    /// One row through every node it reaches of every tree.
    fn walk(&self, row: &[f64]) -> f64 {
        let mut sum = self.base_score;
        for &root in &self.roots {
            sum += self.leaf(root, row);
        }
        sum
    }

    #[inline]
    fn leaf(&self, root: u32, row: &[f64]) -> f64 {
        let mut node = &self.nodes[root as usize];
        while node.feature != LEAF {
            let value = row[node.feature as usize];
            let next = if value.is_nan() {
                node.missing
            } else if value < node.threshold {
                node.left
            } else {
                node.right
            };
            node = &self.nodes[next as usize];
        }
        node.value
    }
}

fn has_missing(row: &[f64]) -> bool {
    row.iter().any(|v| v.is_nan())
}

/// Whether shallow trees are walked with vector instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simd {
    /// Eight rows at a time, four per AVX register.
    Avx,
    None,
}

impl Simd {
    /// What this CPU offers (AVX is checked once, then cached by the standard library).
    fn available() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            return Self::Avx;
        }
        Self::None
    }
}

/// The vector walk of shallow trees: eight rows without missing values, laid out by
/// feature (four rows to a register), each tree's three tests made on all of them at once
/// and the leaf picked by blends. Each row's sum adds the same leaves in the same tree
/// order as [`Shallow::leaf`], so the answer is the same to the bit.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::{
        __m256d, _mm256_add_pd, _mm256_blendv_pd, _mm256_cmp_pd, _mm256_set1_pd, _mm256_set_pd,
        _mm256_setzero_pd, _CMP_GE_OQ,
    };

    use super::Shallow;

    /// Rows per call of [`sums`].
    pub(super) const ROWS: usize = 8;

    /// The sums of `rows` (eight, none with a missing value) over `trees`, from `base`.
    pub(super) fn sums<const N: usize>(
        base: f64,
        trees: &[Shallow],
        rows: &[[f64; N]],
    ) -> [f64; ROWS] {
        assert!(std::arch::is_x86_feature_detected!("avx") && rows.len() == ROWS);
        // SAFETY: the CPU has AVX (checked above).
        unsafe { sums_avx(base, trees, rows) }
    }

    #[target_feature(enable = "avx")]
    fn sums_avx<const N: usize>(base: f64, trees: &[Shallow], rows: &[[f64; N]]) -> [f64; ROWS] {
        // Feature f of rows 0-3 in `low[f]`, of rows 4-7 in `high[f]`.
        let mut low = [_mm256_setzero_pd(); N];
        let mut high = [_mm256_setzero_pd(); N];
        for f in 0..N {
            low[f] = _mm256_set_pd(rows[3][f], rows[2][f], rows[1][f], rows[0][f]);
            high[f] = _mm256_set_pd(rows[7][f], rows[6][f], rows[5][f], rows[4][f]);
        }
        let mut sum_low = _mm256_set1_pd(base);
        let mut sum_high = sum_low;
        for tree in trees {
            let [f0, f1, f2] = tree.features.map(|f| f as usize);
            let [t0, t1, t2] = tree.thresholds.map(|t| _mm256_set1_pd(t));
            let [l0, l1, l2, l3] = tree.leaves.map(|l| _mm256_set1_pd(l));
            // All lanes set where the value is not below the threshold (goes right).
            let leaf = |columns: &[__m256d; N]| {
                let root = _mm256_cmp_pd::<_CMP_GE_OQ>(columns[f0], t0);
                let left = _mm256_cmp_pd::<_CMP_GE_OQ>(columns[f1], t1);
                let right = _mm256_cmp_pd::<_CMP_GE_OQ>(columns[f2], t2);
                let below = _mm256_blendv_pd(left, right, root);
                let left_leaf = _mm256_blendv_pd(l0, l1, below);
                let right_leaf = _mm256_blendv_pd(l2, l3, below);
                _mm256_blendv_pd(left_leaf, right_leaf, root)
            };
            sum_low = _mm256_add_pd(sum_low, leaf(&low));
            sum_high = _mm256_add_pd(sum_high, leaf(&high));
        }
        // SAFETY: `__m256d` is four `f64`s.
        let (low, high) = unsafe {
            (
                std::mem::transmute::<__m256d, [f64; 4]>(sum_low),
                std::mem::transmute::<__m256d, [f64; 4]>(sum_high),
            )
        };
        [
            low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3],
        ]
    }
}

/// Without x86-64 there is no vector walk: [`Simd::available`] never says so.
#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use super::Shallow;

    pub(super) const ROWS: usize = 8;

    pub(super) fn sums<const N: usize>(_: f64, _: &[Shallow], _: &[[f64; N]]) -> [f64; ROWS] {
        unreachable!("no vector walk on this architecture")
    }
}

#[cfg(test)]
mod tests {
    use forust_ml::{data::Matrix, objective::ObjectiveType, GradientBooster};

    use super::{FlatForest, Simd};

    /// A booster fitted on rows with a missing column and features on split thresholds.
    fn fitted(max_depth: usize) -> (GradientBooster, Vec<[f64; 4]>) {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 10_000) as f64 / 10_000.0
        };
        let rows: Vec<[f64; 4]> = (0..400)
            .map(|i| {
                let missing = if i % 7 == 0 { f64::NAN } else { next() };
                [next(), next() * 3.0, missing, (i % 5) as f64]
            })
            .collect();
        let y: Vec<f64> = rows
            .iter()
            .map(|r| r[0] * 2.0 + r[1] - if r[2].is_nan() { 1.0 } else { r[2] } + r[3] * 0.3)
            .collect();
        let mut data = Vec::new();
        for j in 0..4 {
            data.extend(rows.iter().map(|r| r[j]));
        }
        let matrix = Matrix::new(&data, rows.len(), 4);
        let mut booster = GradientBooster::default()
            .set_objective_type(ObjectiveType::SquaredLoss)
            .set_iterations(60)
            .set_max_depth(max_depth)
            .set_learning_rate(0.3);
        booster.fit_unweighted(&matrix, &y, None).unwrap();
        (booster, rows)
    }

    fn forust(booster: &GradientBooster, rows: &[[f64; 4]]) -> Vec<f64> {
        let mut data = Vec::new();
        for j in 0..4 {
            data.extend(rows.iter().map(|r| r[j]));
        }
        booster.predict(&Matrix::new(&data, rows.len(), 4), false)
    }

    #[test]
    fn the_flat_walk_equals_forust_to_the_bit() {
        for depth in [1, 2, 5] {
            let (booster, mut rows) = fitted(depth);
            // Rows exactly on each split's threshold, and odd block sizes.
            for tree in booster.trees.iter().take(20) {
                for node in tree.nodes.iter().filter(|n| !n.is_leaf) {
                    let mut row = rows[rows.len() % 13];
                    row[node.split_feature] = node.split_value;
                    rows.push(row);
                }
            }
            rows.truncate(rows.len() - rows.len() % 8 + 3);
            let flat = FlatForest::compile(&booster).expect("compiled");
            assert_eq!(flat.shallow.is_some(), depth <= 2, "depth {depth}");
            // Then the rows without a missing value: every block of eight walked at once.
            let complete: Vec<[f64; 4]> = rows
                .iter()
                .filter(|r| !r.iter().any(|v| v.is_nan()))
                .copied()
                .collect();
            for rows in [rows, complete] {
                let theirs = forust(&booster, &rows);
                // The vector walk where this CPU has it, and the plain one.
                for simd in [Simd::available(), Simd::None] {
                    let ours = flat.predict_with(&rows, simd).unwrap();
                    assert_eq!(ours.len(), rows.len());
                    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "depth {depth}, {simd:?}, row {i}: {a} vs {b}"
                        );
                    }
                }
                // A leaf of another value in a row changes the answer (the test can fail).
                assert!(theirs.iter().any(|p| (p - theirs[0]).abs() > 1e-9));
            }
        }
    }

    #[test]
    fn rows_narrower_than_a_split_reads_are_refused() {
        let (booster, _) = fitted(2);
        let flat = FlatForest::compile(&booster).unwrap();
        assert!(flat.predict(&[[0.5f64; 2]]).is_none());
    }
}
