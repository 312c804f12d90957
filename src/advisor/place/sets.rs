//! Set values and the per-request set cache: each distinct multiset of one GPU model's
//! workloads is predicted once per request (backed by [`PlacedSets`], the predictions kept
//! across requests), each member's throughput the lowest the model gives it in any subset
//! of the set that contains it (the bound of `advisor::predict`). Predict reads its sets
//! here too, so that every caller gets the same members to the bit.

use std::sync::Arc;

use foldhash::HashMap as FastMap;

use crate::{
    advisor::{
        predict::{cautious_bounds, predict_batch, predict_entries, set_interval},
        GpuProfiles,
    },
    model::{split_by_exclusive, Features, ProfileLevel, SetPrediction},
    store::StoredModel,
};

/// Set predictions kept across Place requests, keyed by (model version, profile table
/// generation, the set's sorted table positions): a cluster asks about the same resident
/// sets request after request (kube-scheduler's filter and prioritize for one pod, pods of
/// the same workload), and a set's prediction depends on nothing else. Bounded by entries;
/// a new model or any change of the GPU model's profiles makes older entries unreachable,
/// and they age out.
pub struct PlacedSets(quick_cache::sync::Cache<(u64, u64, Vec<u32>), Arc<SetValue>>);

/// Sets one rayon task values at least, in [`SetCache::prefetch`].
const VALUES_PER_TASK: usize = 64;

/// Set predictions [`PlacedSets`] keeps at most (a few hundred bytes each).
pub const PLACED_SETS: usize = 200_000;

impl PlacedSets {
    pub fn new(entries: usize) -> Self {
        Self(quick_cache::sync::Cache::new(entries.max(1)))
    }

    pub fn clear(&self) {
        self.0.clear();
    }
}

impl std::fmt::Debug for PlacedSets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PlacedSets").field(&self.0.len()).finish()
    }
}

/// A set's predictions: each member's (in the key's order, when the model predicts
/// members) and the sum.
#[derive(Debug, Clone)]
pub struct SetValue {
    pub(in crate::advisor) sum: f64,
    pub(in crate::advisor) members: Option<Vec<f64>>,
    /// Each member's 80 % interval, where the model carries intervals (a lone job's is its
    /// exclusive throughput, exactly).
    pub(in crate::advisor) bounds: Option<Vec<(f64, f64)>>,
    /// The sum's 80 % interval, where the model carries intervals.
    pub(in crate::advisor) sum_bounds: Option<(f64, f64)>,
}

/// Predictions of multisets of one GPU model's workloads, keyed by sorted table positions:
/// this request's, backed by the ones kept across requests. A model that predicts only
/// sums gets its members estimated from the sum in proportion to their exclusive
/// throughputs.
pub(in crate::advisor) struct SetCache<'a> {
    model: &'a StoredModel,
    table: &'a GpuProfiles,
    /// The asking job's table position: a pair with it is scored job first (see
    /// `advisor::predict`), any other pair lower position first.
    lead: u32,
    sets: FastMap<Vec<u32>, Arc<SetValue>>,
    shared: Option<&'a PlacedSets>,
    /// The model's own predictions of sets of three and more, made in one batch
    /// ([`Self::prefetch`]) before the min-over-subsets rule reads them.
    /// Batch predictions not yet turned into values, with their difficulty.
    raw: FastMap<Vec<u32>, (SetPrediction, f64)>,
}

impl<'a> SetCache<'a> {
    pub(in crate::advisor) fn new(
        model: &'a StoredModel,
        table: &'a GpuProfiles,
        lead: u32,
        shared: Option<&'a PlacedSets>,
    ) -> Self {
        Self {
            model,
            table,
            lead,
            sets: FastMap::default(),
            shared,
            raw: FastMap::default(),
        }
    }

    /// A pair in the order it is scored in: the lead first, else lower position first.
    fn oriented(&self, key: &[u32]) -> Vec<u32> {
        match key {
            [a, b] if *b == self.lead && *a != self.lead => vec![*b, *a],
            _ => key.to_vec(),
        }
    }

    /// Values, before the GPUs are judged, every set that the values of `keys` (sorted)
    /// will need and that is known neither here nor across requests: each key and, through
    /// the min-over-subsets rule, its subsets of two and more members. The sets of three
    /// and more are predicted in one batch (walking the trees set by set costs an
    /// allocation and a pass per set; a batch walks them once over all rows); then the
    /// values are made size by size, pairs first, the sets of one size on the caller's
    /// rayon threads (each reads only values of the size below). What [`Self::value`]
    /// would make of each set, to the bit: the same steps in another order.
    pub(super) fn prefetch(&mut self, keys: &[Vec<u32>]) {
        let mut needed: foldhash::HashSet<Vec<u32>> = Default::default();
        let mut stack: Vec<Vec<u32>> = keys.iter().filter(|k| k.len() >= 3).cloned().collect();
        while let Some(key) = stack.pop() {
            if needed.contains(&key) || self.sets.contains_key(&key) {
                continue;
            }
            if let Some(value) = self.shared.and_then(|s| s.0.get(&self.shared_key(&key))) {
                self.sets.insert(key, value);
                continue;
            }
            if key.len() >= 3 {
                for j in 0..key.len() {
                    let mut without = key.clone();
                    without.remove(j);
                    stack.push(without);
                }
            }
            needed.insert(key);
        }
        if needed.is_empty() {
            return;
        }
        let entries = self.table.entries();
        // A set with an NVML-only member goes to the NVML-only twin ([`predict_batch`]).
        let (nvml, full): (Vec<&Vec<u32>>, Vec<&Vec<u32>>) = needed
            .iter()
            .filter(|key| key.len() >= 3)
            .partition(|key| key.iter().any(|&i| entries[i as usize].nvml_only));
        for (level, batch) in [(ProfileLevel::Full, full), (ProfileLevel::NvmlOnly, nvml)] {
            if batch.is_empty() {
                continue;
            }
            let sets: Vec<Vec<Features>> = batch
                .iter()
                .map(|key| {
                    key.iter()
                        .map(|&i| level.features(&entries[i as usize].features))
                        .collect()
                })
                .collect();
            let predicted = predict_batch(self.model, level, &sets);
            let predicted = predicted.into_iter().map(|p| (p.prediction, p.difficulty));
            self.raw.extend(batch.into_iter().cloned().zip(predicted));
        }
        let mut by_size: Vec<Vec<Vec<u32>>> = Vec::new();
        for key in needed {
            if by_size.len() <= key.len() {
                by_size.resize_with(key.len() + 1, Vec::new);
            }
            by_size[key.len()].push(key);
        }
        use rayon::prelude::*;
        for keys in by_size {
            let work: Vec<_> = keys
                .into_iter()
                .map(|key| {
                    let raw = self.raw.remove(&key);
                    (key, raw)
                })
                .collect();
            let this = &*self;
            let make = |(key, raw): (Vec<u32>, _)| {
                let value = this.make(&key, raw);
                (key, value)
            };
            // A few sets are valued here: handing them to rayon's threads, which a caller
            // on an async thread would wait for, costs more than valuing them.
            let made: Vec<(Vec<u32>, Arc<SetValue>)> = if work.len() < 2 * VALUES_PER_TASK {
                work.into_iter().map(make).collect()
            } else {
                work.into_par_iter()
                    .with_min_len(VALUES_PER_TASK)
                    .map(make)
                    .collect()
            };
            for (key, value) in made {
                self.keep(key, value);
            }
        }
    }

    /// A pair's key across requests is in the order it is scored in (a pair scored the
    /// other way round is another entry).
    fn shared_key(&self, key: &[u32]) -> (u64, u64, Vec<u32>) {
        (
            self.model.version,
            self.table.generation(),
            self.oriented(key),
        )
    }

    pub(in crate::advisor) fn exclusive(&self, index: u32) -> f64 {
        self.table.entries()[index as usize].exclusive()
    }

    /// The value of the multiset `key` (sorted) whose members (bounded) are `members`,
    /// with the model's interval for a set of this size (and the set's difficulty) around
    /// each member's prediction, asked in the order the set was scored in, read cautiously
    /// (`raw`: the model's own members in key order; `advisor::predict::cautious_bounds`).
    fn with_interval(
        &self,
        key: &[u32],
        mut members: Vec<f64>,
        raw: &[f64],
        difficulty: f64,
    ) -> SetValue {
        let oriented = self.oriented(key);
        let swapped = oriented != key;
        if swapped {
            members.reverse();
        }
        let mut prediction = SetPrediction {
            sum: members.iter().sum(),
            members: Some(members),
        };
        let oriented_entries: Vec<_> = oriented
            .iter()
            .map(|&i| &self.table.entries()[i as usize])
            .collect();
        let interval = set_interval(self.model, &oriented_entries, &prediction, difficulty);
        let sum_bounds = interval.as_ref().map(|i| i.sum);
        let mut bounds = interval.and_then(|interval| interval.members);
        if swapped {
            if let Some(m) = prediction.members.as_mut() {
                m.reverse();
            }
            if let Some(b) = bounds.as_mut() {
                b.reverse();
            }
        }
        if let (Some(b), Some(m)) = (bounds.as_mut(), prediction.members.as_ref()) {
            let entries: Vec<_> = key
                .iter()
                .map(|&i| &self.table.entries()[i as usize])
                .collect();
            cautious_bounds(self.table, &entries, b, raw, m);
        }
        SetValue {
            sum: prediction.sum,
            members: prediction.members,
            bounds,
            sum_bounds,
        }
    }

    /// The prediction of the multiset `key` (sorted), each member's throughput the lowest
    /// over the subsets that contain it.
    pub(in crate::advisor) fn value(&mut self, key: &[u32]) -> Arc<SetValue> {
        if let Some(value) = self.sets.get(key) {
            return value.clone();
        }
        if key.len() >= 2 {
            if let Some(value) = self.shared.and_then(|s| s.0.get(&self.shared_key(key))) {
                self.sets.insert(key.to_vec(), value.clone());
                return value;
            }
        }
        if key.len() >= 3 {
            // The subsets the rule reads, valued (and kept) first.
            let mut without = Vec::with_capacity(key.len() - 1);
            for j in 0..key.len() {
                without.clear();
                without.extend_from_slice(&key[..j]);
                without.extend_from_slice(&key[j + 1..]);
                self.value(&without);
            }
        }
        let raw = self.raw.remove(key);
        let value = self.make(key, raw);
        if key.len() >= 2 {
            self.keep(key.to_vec(), value.clone());
        } else {
            self.sets.insert(key.to_vec(), value.clone());
        }
        value
    }

    /// Keeps the value of a set of two and more members, here and across requests.
    fn keep(&mut self, key: Vec<u32>, value: Arc<SetValue>) {
        if let Some(shared) = self.shared {
            shared.0.insert(self.shared_key(&key), value.clone());
        }
        self.sets.insert(key, value);
    }

    /// The members of a set of one member fewer than the one being valued: a lone job's
    /// is its exclusive throughput; a larger set's was valued before ([`Self::value`],
    /// [`Self::prefetch`]).
    fn subset_members(&self, sub: &[u32]) -> std::borrow::Cow<'_, [f64]> {
        match sub {
            [only] => std::borrow::Cow::Owned(vec![self.exclusive(*only)]),
            _ => std::borrow::Cow::Borrowed(
                self.sets[sub].members.as_deref().expect("the same model"),
            ),
        }
    }

    /// Makes the value of `key` (sorted) from the model's own prediction of it (`raw`,
    /// from the batch; predicted here when `None`) and, for a set of two and more, the
    /// values of its subsets of one member fewer, which must be known.
    fn make(&self, key: &[u32], raw: Option<(SetPrediction, f64)>) -> Arc<SetValue> {
        let value = match key {
            [] => SetValue {
                sum: 0.0,
                members: Some(Vec::new()),
                bounds: Some(Vec::new()),
                sum_bounds: Some((0.0, 0.0)),
            },
            [only] => {
                let alone = self.exclusive(*only);
                SetValue {
                    sum: alone,
                    members: Some(vec![alone]),
                    bounds: Some(vec![(alone, alone)]),
                    sum_bounds: Some((alone, alone)),
                }
            }
            _ => {
                let (raw, difficulty) = match raw {
                    Some(raw) => raw,
                    None => {
                        let oriented = self.oriented(key);
                        let entries: Vec<_> = oriented
                            .iter()
                            .map(|&i| &self.table.entries()[i as usize])
                            .collect();
                        let (mut raw, difficulty) =
                            predict_entries(self.model, self.table, &entries);
                        if oriented != key {
                            if let Some(members) = raw.members.as_mut() {
                                members.reverse();
                            }
                        }
                        (raw, difficulty)
                    }
                };
                let members = match raw.members {
                    None => {
                        let exclusive: Vec<f64> = key.iter().map(|&i| self.exclusive(i)).collect();
                        Some(split_by_exclusive(raw.sum, &exclusive))
                    }
                    members => members,
                };
                match members {
                    None => SetValue {
                        sum: raw.sum,
                        members: None,
                        bounds: None,
                        sum_bounds: None,
                    },
                    Some(mut members) => {
                        let raw_members = members.clone();
                        // Without member j, member i sits at i (i < j) or i - 1 (i > j).
                        let mut without = Vec::with_capacity(key.len() - 1);
                        for j in 0..key.len() {
                            without.clear();
                            without.extend_from_slice(&key[..j]);
                            without.extend_from_slice(&key[j + 1..]);
                            let sub = self.subset_members(&without);
                            for (i, member) in members.iter_mut().enumerate() {
                                if i != j {
                                    let at = if i < j { i } else { i - 1 };
                                    *member = member.min(sub[at]);
                                }
                            }
                        }
                        self.with_interval(key, members, &raw_members, difficulty)
                    }
                }
            }
        };
        Arc::new(value)
    }
}
