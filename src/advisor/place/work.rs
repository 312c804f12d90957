//! The work of one Place request, in named steps: look up what the request needs
//! ([`PlaceWork::new`]), predict the sets it will ask about in one batch per GPU model,
//! judge each GPU (its slots, residents and memory, then the caps, the residents' own
//! floors and the rule), and build the answer for the best GPUs (one of them put first to
//! explore, where the service's budget allows: `explore.rs`).

use std::sync::Arc;

use super::{
    explore::Exploration,
    job_not_placeable,
    judge::set_memory_gb,
    sets::{PlacedSets, SetCache, SetValue},
    unknown_job, ModelUsed, PlaceAnswer, PlaceQuery, PlaceSkipCode, Placement, SkippedGpu,
};
use crate::{
    advisor::{
        predict::answerable, Catalog, Error, GpuProfiles, MemberPrediction, Objective, Result,
    },
    domain::{GpuName, MAX_MEMBERS},
    model::ProfileLevel,
    store::StoredModel,
};

/// Scoring more GPUs than this moves off the async threads.
const ASYNC_GPUS: usize = 256;

/// What the catalog says about one resident, looked up under its lock.
#[derive(Debug, Clone, Copy)]
pub(in crate::advisor) enum Resident {
    /// Its position in its GPU model's table.
    Entry(u32),
    NotProfiled,
    KernelMissing,
    Unknown,
}

/// What a GPU model offers to the request: resolved once for all its GPUs.
pub(in crate::advisor) struct GpuModelContext {
    pub gpu: GpuName,
    /// `Err` = every GPU of this model is skipped with this code and reason.
    pub ready: std::result::Result<Ready, (PlaceSkipCode, String)>,
}

pub(in crate::advisor) struct Ready {
    pub model: Arc<StoredModel>,
    pub table: Arc<GpuProfiles>,
    pub job: u32,
}

/// A Place request with everything it needs captured, so it can run on a blocking thread.
pub(in crate::advisor) struct PlaceWork {
    pub query: PlaceQuery,
    pub contexts: Vec<GpuModelContext>,
    /// Per GPU of the query, the index of its context.
    pub gpu_context: Vec<usize>,
    /// Every GPU's residents, one after another in the query's order.
    pub residents: Vec<Resident>,
    /// Set predictions kept across requests (the service's), if any.
    pub shared: Option<Arc<PlacedSets>>,
    /// The exploration budget and its counts (the service's), if any.
    pub explore: Option<Arc<Exploration>>,
}

/// A GPU that qualified, before its answer is built.
pub(super) struct Scored {
    /// Its index in the query's GPUs, and where its residents start in `PlaceWork::residents`.
    pub gpu: usize,
    pub residents: usize,
    pub context: usize,
    pub gain: f64,
    /// The gain on the members' low ends (the point gain without intervals).
    pub gain_low: f64,
    /// What the GPUs are ordered by: `gain_low` when cautious, else `gain`.
    pub score: f64,
    pub value_before: f64,
    pub value_after: f64,
    pub fits: bool,
    pub memory: f64,
    pub limit: f64,
}

/// The table positions of a GPU's residents, into `key` (cleared first); `Err(k)`: the
/// k-th resident has none (unknown, or not profiled on the GPU's model).
pub(super) fn resident_positions(
    own: &[Resident],
    key: &mut Vec<u32>,
) -> std::result::Result<(), usize> {
    key.clear();
    for (k, resident) in own.iter().enumerate() {
        match resident {
            Resident::Entry(i) => key.push(*i),
            _ => return Err(k),
        }
    }
    Ok(())
}

/// Adds `job` to the sorted multiset `key`, keeping it sorted.
pub(super) fn insert_sorted(key: &mut Vec<u32>, job: u32) {
    let at = key.partition_point(|&i| i < job);
    key.insert(at, job);
}

/// The objective's value of a set.
pub(super) fn objective_value(
    objective: Objective,
    value: &SetValue,
    key: &[u32],
    cache: &SetCache<'_>,
) -> f64 {
    match objective {
        Objective::ThroughputSum => value.sum,
        Objective::NormalizedSum => value
            .members
            .as_ref()
            .expect("members are predicted or estimated")
            .iter()
            .zip(key)
            .map(|(t, &i)| t / cache.exclusive(i))
            .sum(),
    }
}

/// The objective's value of a set on its members' low ends (each member's 80 % interval;
/// the point prediction where the model has no intervals).
pub(super) fn low_objective_value(
    objective: Objective,
    value: &SetValue,
    key: &[u32],
    cache: &SetCache<'_>,
) -> f64 {
    let Some(bounds) = value.bounds.as_ref() else {
        return objective_value(objective, value, key, cache);
    };
    match objective {
        Objective::ThroughputSum => bounds.iter().map(|b| b.0).sum(),
        Objective::NormalizedSum => bounds
            .iter()
            .zip(key)
            .map(|(b, &i)| b.0 / cache.exclusive(i))
            .sum(),
    }
}

impl PlaceWork {
    /// Looks up everything the request needs: for each GPU model its model, profiles and
    /// the job's entry; for each resident its entry.
    pub fn new(
        catalog: &Catalog,
        models: &std::collections::HashMap<GpuName, Arc<StoredModel>>,
        default_gpu: Option<&GpuName>,
        query: PlaceQuery,
    ) -> Result<Self> {
        if !catalog.contains(&query.workload) {
            return Err(unknown_job(&query.workload));
        }
        let mut contexts: Vec<GpuModelContext> = Vec::new();
        let mut tables: Vec<Option<Arc<GpuProfiles>>> = Vec::new();
        let mut gpu_context = Vec::with_capacity(query.gpus.len());
        let mut residents = Vec::with_capacity(query.gpus.len() * 2);
        for state in &query.gpus {
            let gpu = state
                .gpu
                .as_ref()
                .or(default_gpu)
                .ok_or(Error::NoGpuModelKnown)?;
            let index = match contexts.iter().position(|c| &c.gpu == gpu) {
                Some(index) => index,
                None => {
                    let table = catalog.gpu(gpu);
                    let ready = match (models.get(gpu), &table) {
                        (None, _) => Err((
                            PlaceSkipCode::NoModel,
                            format!(
                                "no model has been trained for GPU model {:?} yet",
                                gpu.as_str()
                            ),
                        )),
                        (Some(_), None) => Err((
                            PlaceSkipCode::JobNotProfiled,
                            format!(
                                "the job {} has no profile on GPU model {:?}",
                                query.workload.as_str(),
                                gpu.as_str()
                            ),
                        )),
                        (Some(model), Some(table)) => {
                            match job_not_placeable(gpu, table, model, &query.workload) {
                                Some(why) => Err(why),
                                None => Ok(Ready {
                                    model: model.clone(),
                                    table: table.clone(),
                                    job: table.position(query.workload.as_str()).expect("checked")
                                        as u32,
                                }),
                            }
                        }
                    };
                    contexts.push(GpuModelContext {
                        gpu: gpu.clone(),
                        ready,
                    });
                    tables.push(table);
                    contexts.len() - 1
                }
            };
            gpu_context.push(index);
            let table = tables[index].as_deref();
            let model = models.get(gpu);
            for name in &state.residents {
                let name = name.as_str();
                let position = table.and_then(|t| t.position(name).map(|i| (t, i)));
                residents.push(match position {
                    Some((t, i)) if model.is_none_or(|m| answerable(m, &t.entries()[i])) => {
                        Resident::Entry(i as u32)
                    }
                    _ if table.is_some_and(|t| t.lacks_kernel_metrics(name)) => {
                        Resident::KernelMissing
                    }
                    _ if catalog.contains(name) => Resident::NotProfiled,
                    _ => Resident::Unknown,
                });
            }
        }
        Ok(Self {
            query,
            contexts,
            gpu_context,
            residents,
            shared: None,
            explore: None,
        })
    }

    pub fn is_large(&self) -> bool {
        self.query.gpus.len() > ASYNC_GPUS
    }

    /// One set cache per GPU model that can be scored.
    fn caches(&self) -> Vec<Option<SetCache<'_>>> {
        self.contexts
            .iter()
            .map(|c| {
                c.ready.as_ref().ok().map(|ready| {
                    SetCache::new(
                        &ready.model,
                        &ready.table,
                        ready.job,
                        self.shared.as_deref(),
                    )
                })
            })
            .collect()
    }

    pub fn run(self) -> Result<PlaceAnswer> {
        let mut caches = self.caches();
        self.prefetch(&mut caches);
        let mut used = vec![false; self.contexts.len()];
        let mut scored: Vec<Scored> = Vec::new();
        let mut skipped: Vec<SkippedGpu> = Vec::new();
        let mut key: Vec<u32> = Vec::with_capacity(MAX_MEMBERS + 1);
        let mut resident_start = 0usize;
        for (gpu_index, gpu) in self.query.gpus.iter().enumerate() {
            match self.judge(gpu_index, resident_start, &mut caches, &mut key) {
                Ok(one) => {
                    used[one.context] = true;
                    scored.push(one);
                }
                Err(skip) => skipped.push(skip),
            }
            resident_start += gpu.residents.len();
        }
        let mut placements = self.placements(scored, &mut caches);
        if let Some(exploration) = &self.explore {
            exploration.apply(&mut placements, &self.query);
        }
        Ok(PlaceAnswer {
            placements,
            skipped,
            models: self.models_used(&used),
            policy: self.query.policy,
        })
    }

    /// Predicts, in one batch per GPU model, the distinct sets of three and more members
    /// the GPUs will ask for (with the job and without it).
    fn prefetch(&self, caches: &mut [Option<SetCache<'_>>]) {
        let query = &self.query;
        let mut wanted: Vec<foldhash::HashSet<Vec<u32>>> =
            vec![Default::default(); self.contexts.len()];
        let mut start = 0usize;
        for (gpu, &context_index) in query.gpus.iter().zip(&self.gpu_context) {
            let own = &self.residents[start..start + gpu.residents.len()];
            start += gpu.residents.len();
            let Ok(ready) = &self.contexts[context_index].ready else {
                continue;
            };
            if own.len() < 2 || own.len() + 1 > query.max_jobs_per_gpu {
                continue;
            }
            let mut set: Vec<u32> = Vec::with_capacity(own.len() + 1);
            if resident_positions(own, &mut set).is_err() {
                continue;
            }
            // A GPU the job does not fit in is skipped before any set of it is valued
            // (`judge`): predicting its sets would be work no answer reads, done again at
            // every request since only valued sets are kept across requests.
            let fits = gpu
                .memory_gb
                .or(ready.table.memory_gb)
                .is_some_and(|limit| set_memory_gb(ready, &set) <= limit);
            if !fits && !query.include_oversubscribed {
                continue;
            }
            set.sort_unstable();
            let mut with_job = set.clone();
            insert_sorted(&mut with_job, ready.job);
            wanted[context_index].insert(with_job);
            wanted[context_index].insert(set);
        }
        for (cache, wanted) in caches.iter_mut().zip(wanted) {
            if let Some(cache) = cache {
                cache.prefetch(&wanted.into_iter().collect::<Vec<_>>());
            }
        }
    }

    /// The answer for the best `top_k` of the GPUs that qualified (all with 0), best first:
    /// highest gain, ties by GPU id.
    fn placements(
        &self,
        mut scored: Vec<Scored>,
        caches: &mut [Option<SetCache<'_>>],
    ) -> Vec<Placement> {
        let query = &self.query;
        let order = |a: &Scored, b: &Scored| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| query.gpus[a.gpu].id.cmp(&query.gpus[b.gpu].id))
        };
        if query.top_k > 0 && query.top_k < scored.len() {
            scored.select_nth_unstable_by(query.top_k - 1, order);
            scored.truncate(query.top_k);
        }
        scored.sort_unstable_by(order);
        let mut key: Vec<u32> = Vec::with_capacity(MAX_MEMBERS + 1);
        scored
            .iter()
            .map(|s| {
                let gpu = &query.gpus[s.gpu];
                let own = &self.residents[s.residents..s.residents + gpu.residents.len()];
                let ready = self.contexts[s.context].ready.as_ref().expect("scored");
                let mut placement = Placement {
                    gpu_id: gpu.id.clone(),
                    node: gpu.node.clone(),
                    gpu: self.contexts[s.context].gpu.clone(),
                    gain: s.gain,
                    gain_low: s.gain_low,
                    value_before: s.value_before,
                    value_after: s.value_after,
                    members: Vec::new(),
                    fits_memory: s.fits,
                    memory_gb: s.memory,
                    gpu_memory_gb: s.limit,
                    model_version: ready.model.version,
                    explored: false,
                };
                if !query.with_members {
                    return placement;
                }
                let cache = caches[s.context].as_mut().expect("scored");
                key.clear();
                key.push(ready.job);
                key.extend(own.iter().filter_map(|r| match r {
                    Resident::Entry(i) => Some(*i),
                    _ => None,
                }));
                key.sort_unstable();
                let after = cache.value(&key);
                let entries = ready.table.entries();
                let names: Vec<&str> = key
                    .iter()
                    .map(|&i| entries[i as usize].name.as_str())
                    .collect();
                let level =
                    ProfileLevel::of_set(key.iter().map(|&i| entries[i as usize].nvml_only));
                let member = |index: u32| {
                    let position = key.binary_search(&index).expect("a member of the set");
                    MemberPrediction::of(
                        &entries[index as usize],
                        &ready.table,
                        &names,
                        after.members.as_ref().map(|m| m[position]),
                        after.bounds.as_ref().map(|b| b[position]),
                        level,
                    )
                };
                placement.members.reserve(own.len() + 1);
                placement.members.push(member(ready.job));
                for resident in own {
                    if let Resident::Entry(i) = resident {
                        placement.members.push(member(*i));
                    }
                }
                placement
            })
            .collect()
    }

    /// The models that scored at least one GPU.
    fn models_used(&self, used: &[bool]) -> Vec<ModelUsed> {
        self.contexts
            .iter()
            .zip(used)
            .filter(|(_, used)| **used)
            .filter_map(|(c, _)| c.ready.as_ref().ok().map(|r| (c, r)))
            .map(|(c, r)| ModelUsed {
                gpu: c.gpu.clone(),
                version: r.model.version,
                kind: r.model.params.kind(),
                members_estimated: !r.model.params.kind().predicts_members(),
            })
            .collect()
    }
}
