//! The model's predictions of sets of profiled workloads, shared by Rank and Place: pairs
//! scored in batches (through the model's pair scorer and the entries' codes where it has
//! them) and any set with its difficulty.

use super::{GpuProfiles, ProfileEntry};
use crate::{
    model::{Features, SetPrediction},
    store::StoredModel,
};

/// What the model says about one (target, candidate) pair, without allocating. Models
/// that predict only sums get their members estimated (`split_by_exclusive`).
#[derive(Debug, Clone, Copy)]
pub(super) struct PairScore {
    pub sum: f64,
    pub members: Option<[f64; 2]>,
}

impl PairScore {
    fn from_prediction(p: SetPrediction, exclusive: [f64; 2]) -> Self {
        let (members, _) = p.members_or_estimated(&exclusive);
        Self {
            sum: p.sum,
            members: Some([members[0], members[1]]),
        }
    }
}

/// Batches at least this large are scored on all cores.
const PARALLEL_BATCH: usize = 16_384;

/// Scores the pairs (target, each candidate). With a pair scorer, each candidate costs its
/// code (kept in the catalog entry when it was computed under this model) and a few table
/// lookups; other kinds score the batch at once.
pub(super) fn score_pairs(
    model: &StoredModel,
    table: &GpuProfiles,
    target: &ProfileEntry,
    candidates: &[&ProfileEntry],
) -> Vec<PairScore> {
    let Some(scorer) = model.params.pair_scorer() else {
        let features: Vec<&Features> = candidates.iter().map(|e| &e.features).collect();
        let target_exclusive = target.features.exclusive_throughput();
        return model
            .params
            .predict_pairs(&target.features, &features)
            .into_iter()
            .zip(candidates)
            .map(|(p, c)| {
                PairScore::from_prediction(p, [target_exclusive, c.features.exclusive_throughput()])
            })
            .collect();
    };
    let tables = scorer.target_tables(&target.features);
    let codes_current = table.scoring_version() == Some(model.version);
    let score = |entry: &&ProfileEntry| {
        let members = match (&entry.code, codes_current) {
            (Some(code), true) => scorer.score(&tables, &entry.features, code),
            _ => scorer.score(&tables, &entry.features, &scorer.code(&entry.features)),
        };
        PairScore {
            sum: members[0] + members[1],
            members: Some(members),
        }
    };
    if candidates.len() >= PARALLEL_BATCH {
        use rayon::prelude::*;
        candidates.par_iter().map(score).collect()
    } else {
        candidates.iter().map(score).collect()
    }
}

/// The model's prediction for a set of profiled workloads and its difficulty (what a
/// crowded set's interval needs; 0 for pairs). A pair is scored exactly as Rank scores it
/// (the pair scorer and the entries' codes, when the model has them).
pub(super) fn predict_entries(
    model: &StoredModel,
    table: &GpuProfiles,
    entries: &[&ProfileEntry],
) -> (SetPrediction, f64) {
    match entries {
        [first, second] => {
            let pair = score_pairs(model, table, first, &[second])[0];
            (
                SetPrediction {
                    sum: pair.sum,
                    members: pair.members.map(|m| m.to_vec()),
                },
                0.0,
            )
        }
        _ => {
            let features: Vec<&Features> = entries.iter().map(|e| &e.features).collect();
            let predicted = model.params.predict(&[features]).remove(0);
            (predicted.prediction, predicted.difficulty)
        }
    }
}
