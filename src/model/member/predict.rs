//! `member-ridge-gbt`'s answers: each member from both halves, the crowded sets' blends
//! (the sum-level linear model, the time-sharing law) with the prediction's difficulty,
//! sets in batches, and pairs through the compiled pair scorer.

use std::collections::HashMap;

use super::{booster_features, prior, ridge_linear, views_of, MemberRidgeGbt, MemberView};
use crate::model::{
    member_terms::{
        member_throughput, ridge_features, time_share_law, EXCLUSIVE_THROUGHPUT,
        MAX_BOOSTER_FEATURES,
    },
    pair_scorer::{PairScorer, TreeNode},
    Features, PredictedSet, SetPrediction, TrainingRow, NUM_FEATURES,
};

/// Sets predicted together by one task of a batch.
const CHUNK_SETS: usize = 512;

/// What one co-runner adds to a member's time per unit of work, from the member's answer
/// `paired` in the pair with it: x / p - 1 for its exclusive throughput x, none where the
/// answer is not below x (a co-runner predicted harmless), unbounded (the member stops)
/// where it is not above 0.
pub(super) fn added_slowdown(member: &Features, paired: f64) -> f64 {
    let x = member.0[EXCLUSIVE_THROUGHPUT];
    if paired <= 0.0 {
        return f64::INFINITY;
    }
    (x / paired - 1.0).max(0.0)
}

impl MemberRidgeGbt {
    /// A set's member predictions with the sum-level linear model blended in (sets of
    /// three or more, when the model has one): the set's sum becomes the mean of the
    /// members' sum and the linear sum (below zero read as zero; with `set_linear_bounded`,
    /// held within [1/2, 2] x the members' sum), and every member is scaled by the same
    /// factor. Also the set's difficulty: |ln| of that factor (0 for pairs and for models
    /// without the linear part), large where the two halves of the blend disagree: what
    /// scaled interval bands widen with.
    fn blend_set(&self, members: &[Features], mut predicted: Vec<f64>) -> (Vec<f64>, f64) {
        let difficulty = self.blend_set_linear(members, &mut predicted);
        self.blend_law(members, &mut predicted);
        (predicted, difficulty)
    }

    /// With [`MemberOptions::law_blend`], in a set of three or more of a model that learns
    /// crowded sets around the time-sharing law (of any model, with
    /// [`MemberOptions::law_blend_always`]): each member's prediction becomes (1 - w) x
    /// itself + w x its exclusive throughput x the law, w = `law_blend` / 100. Each term is
    /// at most the member's exclusive throughput, so the blend keeps the cap.
    ///
    /// [`MemberOptions::law_blend`]: crate::model::MemberOptions::law_blend
    /// [`MemberOptions::law_blend_always`]: crate::model::MemberOptions::law_blend_always
    fn blend_law(&self, members: &[Features], predicted: &mut [f64]) {
        let applies = self.options.time_share_crowded || self.options.law_blend_always;
        if self.options.law_blend == 0 || !applies || members.len() < 3 {
            return;
        }
        let w = f64::from(self.options.law_blend) / 100.0;
        let law = time_share_law(members);
        for (p, member) in predicted.iter_mut().zip(members) {
            *p = (1.0 - w) * *p + w * member.0[EXCLUSIVE_THROUGHPUT] * law;
        }
    }

    /// The set-level blend of [`Self::blend_set`], in place; returns the difficulty.
    fn blend_set_linear(&self, members: &[Features], predicted: &mut [f64]) -> f64 {
        let Some(linear) = self.set_linear.as_ref().filter(|_| members.len() >= 3) else {
            return 0.0;
        };
        let members_sum: f64 = predicted.iter().sum();
        let mut difficulty = 0.0;
        if members_sum > 0.0 {
            let refs: Vec<&Features> = members.iter().collect();
            let mut linear_sum = linear.predict_set(&refs).sum.max(0.0);
            if self.options.set_linear_ratio && self.options.set_linear_shrink > 0 {
                linear_sum *= members
                    .iter()
                    .map(|m| m.0[EXCLUSIVE_THROUGHPUT])
                    .sum::<f64>();
            }
            if self.options.set_linear_bounded {
                linear_sum = linear_sum.clamp(0.5 * members_sum, 2.0 * members_sum);
            }
            let scale = 0.5 * (members_sum + linear_sum) / members_sum;
            difficulty = scale.ln().abs();
            for (p, member) in predicted.iter_mut().zip(members) {
                *p *= scale;
                if self.options.members_capped {
                    *p = p.min(member.0[EXCLUSIVE_THROUGHPUT]);
                }
            }
        }
        difficulty
    }

    /// How far the set-level linear model moves the set's members' sum:
    /// |ln(blended sum / members' sum)|, the blend's factor before the cap (0 for pairs and
    /// for models without the linear part). Large where the two halves of the blend
    /// disagree: what scaled interval bands widen with.
    #[cfg(test)]
    pub(super) fn difficulty(&self, members: &[&Features]) -> f64 {
        if self.set_linear.is_none() || members.len() < 3 {
            return 0.0;
        }
        self.predict_set_with_difficulty(members).1
    }

    /// Predicted colocated throughput of each member view.
    fn predict_members(&self, members: &[MemberView]) -> Vec<f64> {
        let width = self.options.booster_features();
        let booster_x: Vec<[f64; MAX_BOOSTER_FEATURES]> = members
            .iter()
            .map(|view| booster_features(view, self.options))
            .collect();
        let boosted = self.booster.predict_rows(&booster_x, width);
        members
            .iter()
            .zip(boosted)
            .map(|(view, boosted)| {
                let linear = ridge_linear(
                    self.ridge_intercept,
                    &self.ridge_coefficients,
                    &ridge_features(view.own, &view.others),
                );
                let prior = prior(self.options, view);
                // Stacked: the trees learn the ridge half's residual, so the prior once.
                let boosted = if self.options.stacked {
                    boosted
                } else {
                    boosted + prior
                };
                member_throughput(linear + prior, boosted, view.own, self.options.stacked)
            })
            .collect()
    }

    /// The predictions of many sets, each with its difficulty ([`Self::blend_set`]), in one
    /// pass of the trees over all of their members (equal to each set predicted alone, to
    /// the bit): a batch of more than [`CHUNK_SETS`] sets in chunks on the
    /// caller's rayon threads, a smaller one on the caller's thread.
    pub(crate) fn predict<'f, S: AsRef<[&'f Features]> + Sync>(
        &self,
        sets: &[S],
    ) -> Vec<PredictedSet> {
        let chunk = |chunk: &[S]| {
            let owned: Vec<Vec<Features>> = chunk
                .iter()
                .map(|set| set.as_ref().iter().map(|m| **m).collect())
                .collect();
            self.predict_batch(owned.iter().map(|m| &m[..]))
                .into_iter()
                .map(|(members, difficulty)| PredictedSet {
                    prediction: SetPrediction {
                        sum: members.iter().sum(),
                        members: Some(members),
                    },
                    difficulty,
                })
                .collect::<Vec<_>>()
        };
        if sets.len() <= CHUNK_SETS {
            return chunk(sets);
        }
        use rayon::prelude::*;
        sets.par_chunks(CHUNK_SETS).flat_map_iter(chunk).collect()
    }

    /// The predicted sum of each training row's set, in one pass of the trees over all of
    /// their members (equal to each row's set predicted alone).
    pub(crate) fn predict_sums(&self, rows: &[TrainingRow]) -> Vec<f64> {
        self.predict_batch(rows.iter().map(|r| &r.members[..]))
            .into_iter()
            .map(|(members, _)| members.iter().sum())
            .collect()
    }

    /// Each set's member predictions and difficulty, the trees walked once over every
    /// member of them all.
    fn predict_batch<'a>(
        &self,
        sets: impl Iterator<Item = &'a [Features]> + Clone,
    ) -> Vec<(Vec<f64>, f64)> {
        // Sized first: grown by doubling, a batch's views would be copied a dozen times,
        // each time into fresh memory.
        let mut views: Vec<MemberView> =
            Vec::with_capacity(sets.clone().map(<[Features]>::len).sum());
        views.extend(sets.clone().flat_map(views_of));
        let mut predicted = self.predict_members(&views).into_iter();
        let mut members: Vec<Vec<f64>> = sets
            .clone()
            .map(|set| predicted.by_ref().take(set.len()).collect())
            .collect();
        self.compose_from_pairs(sets.clone(), &mut members);
        sets.zip(members)
            .map(|(set, predicted)| self.blend_set(set, predicted))
            .collect()
    }

    /// With [`MemberOptions::pair_composition`] (w > 0), each member of a set of three or
    /// more moves w of the way to its composition from the model's own pair answers:
    /// exclusive throughput x / (1 + Σ over its co-runners j of max(0, x / p(j) - 1)), p(j)
    /// its answer in the pair with j alone (decision 041). Every distinct pair inside the
    /// batch's crowded sets in one more pass of the trees.
    ///
    /// [`MemberOptions::pair_composition`]: crate::model::MemberOptions::pair_composition
    fn compose_from_pairs<'a>(
        &self,
        sets: impl Iterator<Item = &'a [Features]>,
        predicted: &mut [Vec<f64>],
    ) {
        if self.options.pair_composition == 0 {
            return;
        }
        let w = f64::from(self.options.pair_composition) / 100.0;
        let crowded: Vec<(usize, &[Features])> =
            sets.enumerate().filter(|(_, set)| set.len() >= 3).collect();
        // Each distinct pair once (a request's crowded sets share most of theirs: the job
        // beside each resident), both members' answers in one pass of the trees.
        let mut index: HashMap<[u64; 2 * NUM_FEATURES], usize> = HashMap::new();
        let mut pairs: Vec<[Features; 2]> = Vec::new();
        let mut occurrences: Vec<usize> = Vec::new();
        for (_, set) in &crowded {
            for a in 0..set.len() {
                for b in a + 1..set.len() {
                    let mut key = [0u64; 2 * NUM_FEATURES];
                    for (slot, v) in key.iter_mut().zip(set[a].0.iter().chain(&set[b].0)) {
                        *slot = v.to_bits();
                    }
                    let next = pairs.len();
                    let at = *index.entry(key).or_insert(next);
                    if at == next {
                        pairs.push([set[a], set[b]]);
                    }
                    occurrences.push(at);
                }
            }
        }
        if pairs.is_empty() {
            return;
        }
        let views: Vec<MemberView> = pairs.iter().flat_map(|pair| views_of(pair)).collect();
        let answered = self.predict_members(&views);
        let mut answers = occurrences
            .into_iter()
            .flat_map(|at| [answered[2 * at], answered[2 * at + 1]]);
        for (i, set) in crowded {
            let mut slowdown = vec![0.0; set.len()];
            for a in 0..set.len() {
                for b in a + 1..set.len() {
                    let (pa, pb) = (answers.next(), answers.next());
                    slowdown[a] += added_slowdown(&set[a], pa.unwrap_or_default());
                    slowdown[b] += added_slowdown(&set[b], pb.unwrap_or_default());
                }
            }
            for ((p, member), s) in predicted[i].iter_mut().zip(set).zip(slowdown) {
                let composed = member.0[EXCLUSIVE_THROUGHPUT] / (1.0 + s);
                *p = (1.0 - w) * *p + w * composed;
            }
        }
    }

    /// One set's prediction, as the tests read it (callers use
    /// [`crate::model::ModelParams::predict`]).
    #[cfg(test)]
    pub(super) fn predict_set(&self, members: &[&Features]) -> SetPrediction {
        self.predict_set_with_difficulty(members).0
    }

    /// [`Self::predict_set`] and the prediction's [`Self::difficulty`].
    #[cfg(test)]
    pub(super) fn predict_set_with_difficulty(
        &self,
        members: &[&Features],
    ) -> (SetPrediction, f64) {
        let owned: Vec<Features> = members.iter().map(|m| **m).collect();
        let (predicted, difficulty) = self.predict_batch(std::iter::once(&owned[..])).remove(0);
        (
            SetPrediction {
                sum: predicted.iter().sum(),
                members: Some(predicted),
            },
            difficulty,
        )
    }

    /// The model compiled for scoring pairs (see [`PairScorer`]); `None` for trees deeper
    /// than the ones this kind fits, and for the `time-share` candidate (an offset on pairs
    /// too, which the compiled tables do not know).
    pub(crate) fn pair_scorer(&self) -> Option<&PairScorer> {
        if self.options.time_share {
            // The compiled tables know no prior: such a model walks its trees.
            return None;
        }
        self.scorer
            .0
            .get_or_init(|| {
                let booster = &self.booster.0;
                let iterations = booster.prediction_iteration.unwrap_or(booster.trees.len());
                let trees: Vec<Vec<TreeNode>> = booster.trees[..iterations]
                    .iter()
                    .map(|tree| {
                        tree.nodes
                            .iter()
                            .map(|n| TreeNode {
                                is_leaf: n.is_leaf,
                                value: n.weight_value as f64,
                                feature: n.split_feature,
                                threshold: n.split_value,
                                left: n.left_child,
                                right: n.right_child,
                            })
                            .collect()
                    })
                    .collect();
                PairScorer::compile(
                    booster.base_score,
                    &trees,
                    self.ridge_intercept,
                    &self.ridge_coefficients,
                    self.options,
                )
            })
            .as_ref()
    }

    /// Scores (target, candidate) pairs through the pair scorer.
    pub(crate) fn predict_pairs(
        &self,
        target: &Features,
        candidates: &[&Features],
    ) -> Vec<SetPrediction> {
        match self.pair_scorer() {
            Some(scorer) => scorer.predict_pairs(target, candidates),
            None => self.predict_pairs_reference(target, candidates),
        }
    }

    /// Scores (target, candidate) pairs by walking every tree: one batch of 2 rows per
    /// candidate.
    pub(super) fn predict_pairs_reference(
        &self,
        target: &Features,
        candidates: &[&Features],
    ) -> Vec<SetPrediction> {
        let view = |own, other: &Features| MemberView {
            own,
            others: *other,
            others_max: *other,
            n_others: 1,
        };
        let mut inputs: Vec<MemberView> = Vec::with_capacity(2 * candidates.len());
        for candidate in candidates {
            inputs.push(view(target, candidate));
            inputs.push(view(candidate, target));
        }
        let predicted = self.predict_members(&inputs);
        predicted
            .chunks_exact(2)
            .map(|pair| SetPrediction {
                sum: pair[0] + pair[1],
                members: Some(pair.to_vec()),
            })
            .collect()
    }
}
