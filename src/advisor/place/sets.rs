//! Set values and the per-request set cache: each distinct multiset of one GPU model's
//! workloads is predicted once per request (backed by [`PlacedSets`], the predictions kept
//! across requests), each member's throughput the lowest the model gives it in any subset
//! of the set that contains it.

use std::sync::Arc;

use foldhash::HashMap as FastMap;

use super::work::Ready;
use crate::{
    advisor::predict::predict_entries,
    model::{split_by_exclusive, SetPrediction},
};

/// Set predictions kept across Place requests, keyed by (model version, profile table
/// generation, the set's sorted table positions): a cluster asks about the same resident
/// sets request after request (kube-scheduler's filter and prioritize for one pod, pods of
/// the same workload), and a set's prediction depends on nothing else. Bounded by entries;
/// a new model or any change of the GPU model's profiles makes older entries unreachable,
/// and they age out.
pub struct PlacedSets(quick_cache::sync::Cache<(u64, u64, Vec<u32>), Arc<SetValue>>);

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
    pub(super) sum: f64,
    pub(super) members: Option<Vec<f64>>,
    /// Each member's 80 % interval, where the model carries intervals (a lone job's is its
    /// exclusive throughput, exactly).
    pub(super) bounds: Option<Vec<(f64, f64)>>,
}

/// Predictions of multisets of one GPU model's workloads, keyed by sorted table positions:
/// this request's, backed by the ones kept across requests.
pub(super) struct SetCache<'a> {
    ready: &'a Ready,
    sets: FastMap<Vec<u32>, Arc<SetValue>>,
    shared: Option<&'a PlacedSets>,
    /// The model's own predictions of sets of three and more, made in one batch
    /// ([`Self::prefetch`]) before the min-over-subsets rule reads them.
    /// Batch predictions not yet turned into values, with their difficulty.
    raw: FastMap<Vec<u32>, (SetPrediction, f64)>,
    /// The model predicts only sums and the request needs each member: members are
    /// estimated from the sum in proportion to their exclusive throughputs, as Rank and
    /// Predict do (such values are not kept across requests).
    estimate: bool,
}

impl<'a> SetCache<'a> {
    pub(super) fn new(ready: &'a Ready, shared: Option<&'a PlacedSets>, estimate: bool) -> Self {
        Self {
            ready,
            sets: FastMap::default(),
            shared: if estimate { None } else { shared },
            raw: FastMap::default(),
            estimate,
        }
    }

    /// Predicts, in one batch, every set of three and more members that the values of
    /// `keys` (sorted) will need and that is known neither here nor across requests: each
    /// key and, through the min-over-subsets rule, its subsets. Walking the trees set by
    /// set costs an allocation and a pass per set; a batch walks them once over all rows.
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
            for j in 0..key.len() {
                if key.len() > 3 {
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
        let needed: Vec<Vec<u32>> = needed.into_iter().collect();
        let entries = self.ready.table.entries();
        let sets: Vec<Vec<&crate::model::Features>> = needed
            .iter()
            .map(|key| key.iter().map(|&i| &entries[i as usize].features).collect())
            .collect();
        let predicted = self.ready.model.params.predict(&sets);
        let predicted = predicted.into_iter().map(|p| (p.prediction, p.difficulty));
        self.raw.extend(needed.into_iter().zip(predicted));
    }

    fn shared_key(&self, key: &[u32]) -> (u64, u64, Vec<u32>) {
        (
            self.ready.model.version,
            self.ready.table.generation(),
            key.to_vec(),
        )
    }

    pub(super) fn exclusive(&self, index: u32) -> f64 {
        self.ready.table.entries()[index as usize]
            .features
            .exclusive_throughput()
    }

    /// The prediction of the multiset `key` (sorted), each member's throughput the lowest
    /// over the subsets that contain it.
    pub(super) fn value(&mut self, key: &[u32]) -> Arc<SetValue> {
        if let Some(value) = self.sets.get(key) {
            return value.clone();
        }
        if key.len() >= 2 {
            if let Some(value) = self.shared.and_then(|s| s.0.get(&self.shared_key(key))) {
                self.sets.insert(key.to_vec(), value.clone());
                return value;
            }
        }
        let value = match key {
            [] => SetValue {
                sum: 0.0,
                members: Some(Vec::new()),
                bounds: Some(Vec::new()),
            },
            [only] => {
                let alone = self.exclusive(*only);
                SetValue {
                    sum: alone,
                    members: Some(vec![alone]),
                    bounds: Some(vec![(alone, alone)]),
                }
            }
            _ => {
                let (raw, difficulty) = match self.raw.remove(key) {
                    Some(raw) => raw,
                    None => {
                        let entries: Vec<_> = key
                            .iter()
                            .map(|&i| &self.ready.table.entries()[i as usize])
                            .collect();
                        predict_entries(&self.ready.model, &self.ready.table, &entries)
                    }
                };
                let members = match raw.members {
                    None if self.estimate => {
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
                    },
                    Some(mut members) => {
                        // Without member j, member i sits at i (i < j) or i - 1 (i > j).
                        let mut without = Vec::with_capacity(key.len() - 1);
                        for j in 0..key.len() {
                            without.clear();
                            without.extend_from_slice(&key[..j]);
                            without.extend_from_slice(&key[j + 1..]);
                            let sub = self.value(&without);
                            let sub = sub.members.as_ref().expect("the same model");
                            for (i, member) in members.iter_mut().enumerate() {
                                if i != j {
                                    let at = if i < j { i } else { i - 1 };
                                    *member = member.min(sub[at]);
                                }
                            }
                        }
                        // The interval is the model's for a set of this size (and the
                        // set's difficulty) around the member's prediction (the lowest over
                        // the subsets).
                        let prediction = SetPrediction {
                            sum: members.iter().sum(),
                            members: Some(members),
                        };
                        let features: Vec<_> = key
                            .iter()
                            .map(|&i| &self.ready.table.entries()[i as usize].features)
                            .collect();
                        let bounds = self
                            .ready
                            .model
                            .params
                            .interval(&features, &prediction, difficulty)
                            .and_then(|interval| interval.members);
                        SetValue {
                            sum: prediction.sum,
                            members: prediction.members,
                            bounds,
                        }
                    }
                }
            }
        };
        let value = Arc::new(value);
        if let (Some(shared), true) = (self.shared, key.len() >= 2) {
            shared.0.insert(self.shared_key(key), value.clone());
        }
        self.sets.insert(key.to_vec(), value.clone());
        value
    }
}
