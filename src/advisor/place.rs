//! Place: "which GPU should this new job go to?" across GPUs that already run jobs.
//!
//! Each candidate GPU is scored by the predicted **gain**: the value of its set of jobs with
//! the new job minus the value without it (an empty GPU scores the job's own exclusive
//! value). A GPU is left out, with the reason, when the job or a resident cannot be
//! predicted there, the memory would overflow, a slowdown cap would be broken or it holds
//! too many jobs already.
//!
//! Predictions are the serving model's, with one rule added: a co-runner never speeds a job
//! up. A member's predicted throughput in a set is the lowest the model predicts for it in
//! any subset of that set that contains it (alone it runs at its exclusive throughput), so
//! adding a job to a GPU never raises anyone's prediction. Sets repeat heavily in a real
//! cluster; every distinct multiset of workloads is predicted once per request.
//!
//! Where the model carries 80 % intervals, each member's answer carries its interval (the
//! model's for a set of that size, or its seen band for a set of workloads it was trained
//! on, around the member's prediction), and `cautious` checks the caps on the low ends.

use std::sync::Arc;

use foldhash::HashMap as FastMap;

use super::{
    rank::predict_entries, Catalog, Error, GpuProfiles, MemberPrediction, Objective, Result,
};
use crate::{
    domain::{GpuName, ValidationError, WorkloadName, MAX_MEMBERS},
    model::{split_by_exclusive, ModelKind, SetPrediction},
    store::StoredModel,
};

/// The most GPUs one Place request may name.
pub const MAX_PLACE_GPUS: usize = 100_000;
/// Jobs per GPU (residents and the new job) unless the request says otherwise.
pub const DEFAULT_MAX_JOBS_PER_GPU: usize = 4;
/// The largest `max_jobs_per_gpu` accepted: a set of n members is predicted through its
/// 2^n subsets (see the module header), which stays cheap up to 8.
pub const MAX_JOBS_PER_GPU: usize = 8;
/// Scoring more GPUs than this moves off the async threads.
const ASYNC_GPUS: usize = 256;

/// One candidate GPU and what already runs on it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    /// Opaque, unique in a request.
    pub id: String,
    /// The node the GPU sits in; empty when not known.
    pub node: String,
    /// The GPU model; `None` = the default rules (as in Rank).
    pub gpu: Option<GpuName>,
    /// Memory available on this GPU, GB; `None` = the GPU model's total memory.
    pub memory_gb: Option<f64>,
    /// The workloads already running there (checked names; a name may repeat: copies).
    pub residents: Vec<String>,
}

/// A Place request in domain terms.
///
/// In-process callers (the cluster simulator, the Kubernetes extender) build one, call
/// [`super::Advisor::place`] and read the [`PlaceAnswer`]; they never touch protobuf types.
/// An empty `gpus` places against the occupancy coloc keeps (AssignJob/ReleaseJob),
/// filtered by `nodes` and `gpu_filter`.
#[derive(Debug, Clone)]
pub struct PlaceQuery {
    /// The job to place.
    pub workload: WorkloadName,
    pub gpus: Vec<GpuState>,
    /// With `gpus` empty: only GPUs on these nodes (empty = every node).
    pub nodes: Vec<String>,
    /// With `gpus` empty: only GPUs of this GPU model.
    pub gpu_filter: Option<GpuName>,
    pub objective: Objective,
    /// The lowest fraction of its exclusive throughput the new job may keep.
    pub min_job_fraction: Option<f64>,
    /// The lowest fraction of its exclusive throughput every resident may keep.
    pub min_resident_fraction: Option<f64>,
    /// Jobs a GPU may hold with the new one included.
    pub max_jobs_per_gpu: usize,
    /// 0 = every GPU that qualifies.
    pub top_k: usize,
    pub include_oversubscribed: bool,
    /// Check `min_job_fraction` and `min_resident_fraction` on the low end of each
    /// member's 80 % interval instead of its point prediction (a model without intervals
    /// answers with the point prediction).
    pub cautious: bool,
}

impl PlaceQuery {
    /// A query with the defaults for everything but the job and the GPUs.
    pub fn new(workload: WorkloadName, gpus: Vec<GpuState>) -> Self {
        Self {
            workload,
            gpus,
            nodes: Vec::new(),
            gpu_filter: None,
            objective: Objective::ThroughputSum,
            min_job_fraction: None,
            min_resident_fraction: None,
            max_jobs_per_gpu: DEFAULT_MAX_JOBS_PER_GPU,
            top_k: 0,
            include_oversubscribed: false,
            cautious: false,
        }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.gpus.len() > MAX_PLACE_GPUS {
            return Err(ValidationError::new(
                "gpus",
                format!(
                    "at most {MAX_PLACE_GPUS} GPUs may be named, got {}",
                    self.gpus.len()
                ),
            ));
        }
        if self.top_k > MAX_PLACE_GPUS {
            return Err(ValidationError::new(
                "top_k",
                format!(
                    "top_k must be between 0 (all) and {MAX_PLACE_GPUS}, got {}",
                    self.top_k
                ),
            ));
        }
        if !(1..=MAX_JOBS_PER_GPU).contains(&self.max_jobs_per_gpu) {
            return Err(ValidationError::new(
                "max_jobs_per_gpu",
                format!(
                    "max_jobs_per_gpu must be between 1 and {MAX_JOBS_PER_GPU} (0 = {DEFAULT_MAX_JOBS_PER_GPU}), got {}",
                    self.max_jobs_per_gpu
                ),
            ));
        }
        for (field, fraction) in [
            ("min_job_fraction", self.min_job_fraction),
            ("min_resident_fraction", self.min_resident_fraction),
        ] {
            if let Some(fraction) = fraction {
                if !(fraction > 0.0 && fraction <= 1.0) {
                    return Err(ValidationError::new(
                        field,
                        format!(
                            "{field} is the fraction of its exclusive throughput a job keeps: \
                             between 0 (no limit) and 1, got {fraction}"
                        ),
                    ));
                }
            }
        }
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(
            self.gpus.len(),
            foldhash::fast::RandomState::default(),
        );
        for (i, gpu) in self.gpus.iter().enumerate() {
            if !seen.insert(gpu.id.as_str()) {
                return Err(ValidationError::new(
                    format!("gpus[{i}].id"),
                    format!("GPU id {:?} is listed twice", gpu.id),
                ));
            }
            if gpu.residents.len() > MAX_MEMBERS {
                return Err(ValidationError::new(
                    format!("gpus[{i}].residents"),
                    format!(
                        "a GPU runs at most {MAX_MEMBERS} jobs, got {} residents",
                        gpu.residents.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// One GPU the job may go to, with what the model predicts there.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub gpu_id: String,
    pub node: String,
    pub gpu: GpuName,
    /// The objective's value of the set with the job minus without it.
    pub gain: f64,
    pub value_before: f64,
    pub value_after: f64,
    /// The new job first, then each resident in the order given.
    pub members: Vec<MemberPrediction>,
    pub fits_memory: bool,
    /// Memory of the residents and the job, GB.
    pub memory_gb: f64,
    /// The limit it was checked against.
    pub gpu_memory_gb: f64,
    pub model_version: u64,
}

/// What a shared GPU must promise before a job may start there, besides memory and caps:
/// the rule the cluster simulation compares and the scheduler extender applies (README,
/// "Cluster simulation"). `speeds` are the new set's members' shares of their exclusive
/// throughput (the job among them), `gain` the change of the set's value with the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceRule {
    /// The set's value grows with the job.
    Gain,
    /// Every member of the new set of k keeps at least 1/k of its exclusive throughput,
    /// what time-slicing the GPU among the k would give it (Σ >= 1 follows).
    FairShare,
    /// The new set's Σ share is at least 1: the GPU does at least one exclusive job's work.
    BreakEven,
}

impl PlaceRule {
    pub const ALL: [PlaceRule; 3] = [PlaceRule::Gain, PlaceRule::FairShare, PlaceRule::BreakEven];

    pub fn name(self) -> &'static str {
        match self {
            PlaceRule::Gain => "gain",
            PlaceRule::FairShare => "fair-share",
            PlaceRule::BreakEven => "break-even",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Whether a GPU whose new set has the members' `speeds` and whose value changes by
    /// `gain` with the job may take it.
    pub fn admits(self, gain: f64, speeds: &[f64]) -> bool {
        // Tolerance for a speed measured or predicted at exactly the floor.
        const EPSILON: f64 = 1e-9;
        match self {
            PlaceRule::Gain => gain > 0.0,
            PlaceRule::FairShare => {
                let floor = 1.0 / speeds.len().max(1) as f64;
                speeds.iter().all(|&s| s >= floor - EPSILON)
            }
            PlaceRule::BreakEven => speeds.iter().sum::<f64>() >= 1.0 - EPSILON,
        }
    }
}

/// Why a GPU was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceSkipCode {
    /// The residents and the job would need more memory than the GPU has.
    ExceedsGpuMemory,
    /// The new job would keep less than `min_job_fraction`.
    JobSlowdown,
    /// A resident would keep less than `min_resident_fraction`.
    ResidentSlowdown,
    /// The GPU already holds `max_jobs_per_gpu` jobs.
    TooManyJobs,
    /// A resident is not a registered workload.
    UnknownWorkload,
    /// No model serves the GPU's model, or it cannot check the caps asked for.
    NoModel,
    /// The new job has no (complete) profile on the GPU's model.
    JobNotProfiled,
    /// A resident has no (complete) profile on the GPU's model.
    ResidentNotProfiled,
    /// Neither the GPU nor its model says how much memory it has.
    GpuMemoryUnknown,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SkippedGpu {
    pub gpu_id: String,
    pub code: PlaceSkipCode,
    /// A sentence for people.
    pub reason: String,
    /// The member at fault (a resident, or the new job), when one is.
    pub workload: Option<WorkloadName>,
    /// For a broken cap: the fraction of its exclusive throughput that member was predicted
    /// to keep.
    pub predicted_fraction: Option<f64>,
}

/// The model that scored the GPUs of one GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelUsed {
    pub gpu: GpuName,
    pub version: u64,
    pub kind: ModelKind,
    /// The model predicts only sums, and the request's objective or caps needed each
    /// member: members were estimated from the sum in proportion to their exclusive
    /// throughputs.
    pub members_estimated: bool,
}

#[derive(Debug, Clone)]
pub struct PlaceAnswer {
    /// Best first: highest gain, ties by GPU id.
    pub placements: Vec<Placement>,
    pub skipped: Vec<SkippedGpu>,
    pub models: Vec<ModelUsed>,
}

/// What the catalog says about one resident, looked up under its lock.
#[derive(Debug, Clone, Copy)]
pub(super) enum Resident {
    /// Its position in its GPU model's table.
    Entry(u32),
    NotProfiled,
    KernelMissing,
    Unknown,
}

/// What a GPU model offers to the request: resolved once for all its GPUs.
pub(super) struct GpuModelContext {
    pub gpu: GpuName,
    /// `Err` = every GPU of this model is skipped with this code and reason.
    pub ready: std::result::Result<Ready, (PlaceSkipCode, String)>,
}

pub(super) struct Ready {
    pub model: Arc<StoredModel>,
    pub table: Arc<GpuProfiles>,
    pub job: u32,
}

/// A Place request with everything it needs captured, so it can run on a blocking thread.
pub(super) struct PlaceWork {
    pub query: PlaceQuery,
    pub contexts: Vec<GpuModelContext>,
    /// Per GPU of the query, the index of its context.
    pub gpu_context: Vec<usize>,
    /// Every GPU's residents, one after another in the query's order.
    pub residents: Vec<Resident>,
    /// Set predictions kept across requests (the service's), if any.
    pub shared: Option<Arc<PlacedSets>>,
}

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
    sum: f64,
    members: Option<Vec<f64>>,
    /// Each member's 80 % interval, where the model carries intervals (a lone job's is its
    /// exclusive throughput, exactly).
    bounds: Option<Vec<(f64, f64)>>,
}

/// Predictions of multisets of one GPU model's workloads, keyed by sorted table positions:
/// this request's, backed by the ones kept across requests.
struct SetCache<'a> {
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
    fn new(ready: &'a Ready, shared: Option<&'a PlacedSets>, estimate: bool) -> Self {
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
    fn prefetch(&mut self, keys: &[Vec<u32>]) {
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

    fn exclusive(&self, index: u32) -> f64 {
        self.ready.table.entries()[index as usize]
            .features
            .exclusive_throughput()
    }

    /// The prediction of the multiset `key` (sorted), each member's throughput the lowest
    /// over the subsets that contain it.
    fn value(&mut self, key: &[u32]) -> Arc<SetValue> {
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

/// A GPU that qualified, before its answer is built.
struct Scored {
    /// Its index in the query's GPUs, and where its residents start in `PlaceWork::residents`.
    gpu: usize,
    residents: usize,
    context: usize,
    gain: f64,
    value_before: f64,
    value_after: f64,
    fits: bool,
    memory: f64,
    limit: f64,
}

/// The table positions of a GPU's residents, into `key` (cleared first); `Err(k)`: the
/// k-th resident has none (unknown, or not profiled on the GPU's model).
fn resident_positions(own: &[Resident], key: &mut Vec<u32>) -> std::result::Result<(), usize> {
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
fn insert_sorted(key: &mut Vec<u32>, job: u32) {
    let at = key.partition_point(|&i| i < job);
    key.insert(at, job);
}

/// The objective's value of a set.
fn objective_value(
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
            .expect("checked: the model predicts members")
            .iter()
            .zip(key)
            .map(|(t, &i)| t / cache.exclusive(i))
            .sum(),
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.0} %", fraction * 100.0)
}

/// Place without an advisor: against `catalog` and the serving model of each GPU model, at
/// once on this thread. For tools that hold their own catalog (benchmarks, tests); the
/// service calls [`super::Advisor::place`].
pub fn place_in(
    catalog: &Catalog,
    models: &std::collections::HashMap<GpuName, Arc<StoredModel>>,
    default_gpu: Option<&GpuName>,
    query: PlaceQuery,
) -> Result<PlaceAnswer> {
    query.validate()?;
    PlaceWork::new(catalog, models, default_gpu, query)?.run()
}

/// [`place_in`], keeping set predictions in `shared` across requests as the service does
/// (answers never depend on it; a tool that asks many times, such as the simulation, is
/// faster with it).
pub fn place_in_keeping(
    catalog: &Catalog,
    models: &std::collections::HashMap<GpuName, Arc<StoredModel>>,
    default_gpu: Option<&GpuName>,
    query: PlaceQuery,
    shared: &Arc<PlacedSets>,
) -> Result<PlaceAnswer> {
    query.validate()?;
    let mut work = PlaceWork::new(catalog, models, default_gpu, query)?;
    work.shared = Some(shared.clone());
    work.run()
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
                            match job_not_placeable(gpu, table, &query.workload) {
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
            for name in &state.residents {
                let name = name.as_str();
                residents.push(match table.and_then(|t| t.position(name)) {
                    Some(i) => Resident::Entry(i as u32),
                    None if table.is_some_and(|t| t.lacks_kernel_metrics(name)) => {
                        Resident::KernelMissing
                    }
                    None if catalog.contains(name) => Resident::NotProfiled,
                    None => Resident::Unknown,
                });
            }
        }
        Ok(Self {
            query,
            contexts,
            gpu_context,
            residents,
            shared: None,
        })
    }

    pub fn is_large(&self) -> bool {
        self.query.gpus.len() > ASYNC_GPUS
    }

    pub fn run(self) -> Result<PlaceAnswer> {
        let Self {
            query,
            contexts,
            gpu_context,
            residents,
            shared,
        } = self;
        let needs_members = query.objective == Objective::NormalizedSum
            || query.min_job_fraction.is_some()
            || query.min_resident_fraction.is_some();
        let mut caches: Vec<Option<SetCache<'_>>> = contexts
            .iter()
            .map(|c| {
                c.ready.as_ref().ok().map(|ready| {
                    let estimate = needs_members && !ready.model.params.kind().predicts_members();
                    SetCache::new(ready, shared.as_deref(), estimate)
                })
            })
            .collect();
        let mut used = vec![false; contexts.len()];
        let mut scored: Vec<Scored> = Vec::new();
        let mut skipped: Vec<SkippedGpu> = Vec::new();
        let mut next_resident = 0usize;
        let mut key: Vec<u32> = Vec::with_capacity(MAX_MEMBERS + 1);

        // The distinct sets of three and more members the GPUs below will ask for (with
        // the job and without it), predicted in one batch per GPU model first.
        let mut wanted: Vec<foldhash::HashSet<Vec<u32>>> = vec![Default::default(); contexts.len()];
        let mut start = 0usize;
        for (gpu, &context_index) in query.gpus.iter().zip(&gpu_context) {
            let own = &residents[start..start + gpu.residents.len()];
            start += gpu.residents.len();
            let Ok(ready) = &contexts[context_index].ready else {
                continue;
            };
            if own.len() < 2 || own.len() + 1 > query.max_jobs_per_gpu {
                continue;
            }
            let mut set: Vec<u32> = Vec::with_capacity(own.len() + 1);
            if resident_positions(own, &mut set).is_err() {
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

        for (gpu_index, (gpu, &context_index)) in query.gpus.iter().zip(&gpu_context).enumerate() {
            let resident_start = next_resident;
            let own = &residents[next_resident..next_resident + gpu.residents.len()];
            next_resident += gpu.residents.len();
            let context = &contexts[context_index];
            let skip =
                |code, reason: String, workload: Option<WorkloadName>, fraction| SkippedGpu {
                    gpu_id: gpu.id.clone(),
                    code,
                    reason,
                    workload,
                    predicted_fraction: fraction,
                };
            let ready = match &context.ready {
                Ok(ready) => ready,
                Err((code, reason)) => {
                    skipped.push(skip(*code, reason.clone(), None, None));
                    continue;
                }
            };
            if gpu.residents.len() + 1 > query.max_jobs_per_gpu {
                skipped.push(skip(
                    PlaceSkipCode::TooManyJobs,
                    format!(
                        "it runs {} jobs already; with this one it would run more than the {} allowed",
                        gpu.residents.len(),
                        query.max_jobs_per_gpu
                    ),
                    None,
                    None,
                ));
                continue;
            }
            if let Err(k) = resident_positions(own, &mut key) {
                let (name, resident) = (&gpu.residents[k], own[k]);
                let workload = WorkloadName::parse("residents", name).ok();
                let gpu_name = context.gpu.as_str();
                skipped.push(match resident {
                    Resident::Unknown => skip(
                        PlaceSkipCode::UnknownWorkload,
                        format!("resident {name} is not a registered workload"),
                        workload,
                        None,
                    ),
                    Resident::KernelMissing => skip(
                        PlaceSkipCode::ResidentNotProfiled,
                        format!(
                            "resident {name} was profiled on GPU model {gpu_name:?} without \
                             kernel metrics; profile it again"
                        ),
                        workload,
                        None,
                    ),
                    _ => skip(
                        PlaceSkipCode::ResidentNotProfiled,
                        format!("resident {name} has no profile on GPU model {gpu_name:?}"),
                        workload,
                        None,
                    ),
                });
                continue;
            }
            let entries = ready.table.entries();
            let job_entry = &entries[ready.job as usize];
            let memory: f64 = job_entry.features.memory_gb()
                + key
                    .iter()
                    .map(|&i| entries[i as usize].features.memory_gb())
                    .sum::<f64>();
            let Some(limit) = gpu.memory_gb.or(ready.table.memory_gb) else {
                skipped.push(skip(
                    PlaceSkipCode::GpuMemoryUnknown,
                    format!(
                        "the memory of GPU model {:?} is unknown; give the GPU's memory_gb or \
                         store a profile that carries it",
                        context.gpu.as_str()
                    ),
                    None,
                    None,
                ));
                continue;
            };
            let fits = memory <= limit;
            if !fits && !query.include_oversubscribed {
                skipped.push(skip(
                    PlaceSkipCode::ExceedsGpuMemory,
                    format!(
                        "with the job it needs {memory:.1} GB, more than the {limit:.1} GB available"
                    ),
                    None,
                    None,
                ));
                continue;
            }

            let cache = caches[context_index].as_mut().expect("ready");
            key.sort_unstable();
            let before = cache.value(&key);
            let value_before = objective_value(query.objective, &before, &key, cache);
            let before_key = key.clone();
            insert_sorted(&mut key, ready.job);
            let after = cache.value(&key);
            let value_after = objective_value(query.objective, &after, &key, cache);

            // Each member's predicted throughput as the caps read it: the point prediction,
            // or with `cautious` the low end of its interval where the model has one.
            let low_ends = if query.cautious {
                after.bounds.as_ref()
            } else {
                None
            };
            let predicted = |index: u32| -> Option<f64> {
                let members = after.members.as_ref()?;
                let position = key.binary_search(&index).expect("a member of the set");
                Some(low_ends.map_or(members[position], |bounds| bounds[position].0))
            };
            let predicted_as = if low_ends.is_some() {
                "predicted (the low end of its 80 % interval)"
            } else {
                "predicted"
            };
            let job_throughput = predicted(ready.job);
            if let (Some(cap), Some(t)) = (query.min_job_fraction, job_throughput) {
                let kept = t / cache.exclusive(ready.job);
                if kept < cap {
                    skipped.push(skip(
                        PlaceSkipCode::JobSlowdown,
                        format!(
                            "{predicted_as} to leave the job {} of its exclusive throughput, {} \
                             points below the {} asked for",
                            percent(kept),
                            ((cap - kept) * 100.0).round(),
                            percent(cap)
                        ),
                        Some(query.workload.clone()),
                        Some(kept),
                    ));
                    continue;
                }
            }
            if let Some(cap) = query.min_resident_fraction {
                let worst = before_key
                    .iter()
                    .filter_map(|&i| predicted(i).map(|t| (i, t / cache.exclusive(i))))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                if let Some((index, kept)) = worst.filter(|w| w.1 < cap) {
                    let name = entries[index as usize].name.clone();
                    skipped.push(skip(
                        PlaceSkipCode::ResidentSlowdown,
                        format!(
                            "{predicted_as} to leave resident {} {} of its exclusive throughput, \
                             {} points below the {} asked for",
                            name.as_str(),
                            percent(kept),
                            ((cap - kept) * 100.0).round(),
                            percent(cap)
                        ),
                        Some(name),
                        Some(kept),
                    ));
                    continue;
                }
            }
            used[context_index] = true;
            // The answer is built for the best top_k only.
            scored.push(Scored {
                gpu: gpu_index,
                residents: resident_start,
                context: context_index,
                gain: value_after - value_before,
                value_before,
                value_after,
                fits,
                memory,
                limit,
            });
        }

        let order = |a: &Scored, b: &Scored| {
            b.gain
                .total_cmp(&a.gain)
                .then_with(|| query.gpus[a.gpu].id.cmp(&query.gpus[b.gpu].id))
        };
        if query.top_k > 0 && query.top_k < scored.len() {
            scored.select_nth_unstable_by(query.top_k - 1, order);
            scored.truncate(query.top_k);
        }
        scored.sort_unstable_by(order);
        let placements: Vec<Placement> = scored
            .iter()
            .map(|s| {
                let gpu = &query.gpus[s.gpu];
                let own = &residents[s.residents..s.residents + gpu.residents.len()];
                let ready = contexts[s.context].ready.as_ref().expect("scored");
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
                let member = |index: u32| {
                    let entry = &entries[index as usize];
                    let position = key.binary_search(&index).expect("a member of the set");
                    MemberPrediction {
                        workload: entry.name.clone(),
                        exclusive_throughput: entry.features.exclusive_throughput(),
                        throughput_unit: entry.throughput_unit.clone(),
                        predicted_throughput: after.members.as_ref().map(|m| m[position]),
                        predicted_interval: after.bounds.as_ref().map(|b| b[position]),
                    }
                };
                let mut members = Vec::with_capacity(own.len() + 1);
                members.push(member(ready.job));
                for resident in own {
                    if let Resident::Entry(i) = resident {
                        members.push(member(*i));
                    }
                }
                Placement {
                    gpu_id: gpu.id.clone(),
                    node: gpu.node.clone(),
                    gpu: contexts[s.context].gpu.clone(),
                    gain: s.gain,
                    value_before: s.value_before,
                    value_after: s.value_after,
                    members,
                    fits_memory: s.fits,
                    memory_gb: s.memory,
                    gpu_memory_gb: s.limit,
                    model_version: ready.model.version,
                }
            })
            .collect();
        let models = contexts
            .iter()
            .zip(&used)
            .filter(|(_, used)| **used)
            .filter_map(|(c, _)| c.ready.as_ref().ok().map(|r| (c, r)))
            .map(|(c, r)| ModelUsed {
                gpu: c.gpu.clone(),
                version: r.model.version,
                kind: r.model.params.kind(),
                members_estimated: needs_members && !r.model.params.kind().predicts_members(),
            })
            .collect();
        Ok(PlaceAnswer {
            placements,
            skipped,
            models,
        })
    }
}

/// Why the job cannot be placed on any GPU of a GPU model, or `None` when it can.
pub(super) fn job_not_placeable(
    gpu: &GpuName,
    table: &GpuProfiles,
    job: &WorkloadName,
) -> Option<(PlaceSkipCode, String)> {
    if table.get(job).is_some() {
        return None;
    }
    let name = job.as_str();
    Some(if table.lacks_kernel_metrics(job) {
        (
            PlaceSkipCode::JobNotProfiled,
            format!(
                "the job {name} was profiled on GPU model {:?} without kernel metrics; profile it again",
                gpu.as_str()
            ),
        )
    } else {
        (
            PlaceSkipCode::JobNotProfiled,
            format!(
                "the job {name} has no profile on GPU model {:?}",
                gpu.as_str()
            ),
        )
    })
}

/// Errors of a Place request as a whole (the job itself unknown).
pub(super) fn unknown_job(job: &WorkloadName) -> Error {
    Error::UnknownPlaceWorkload(job.as_str().to_string())
}

#[cfg(test)]
mod tests {
    //! Properties of Place on the published KACE V100 workloads with the default model
    //! fitted on their measured pairs: adding a resident never raises anyone's predicted
    //! throughput, a GPU whose memory would overflow is never ranked unless asked for, and
    //! every cap is honoured. Expected values come from the profiles, not from Place.

    use std::{
        collections::HashMap,
        path::Path,
        sync::{Arc, OnceLock},
    };

    use proptest::prelude::*;

    use super::*;
    use crate::{
        dataset::KaceDataset,
        domain::{Profile, ProfileSource},
        model::{fit, FitMetrics, TrainingRow},
        store::ModelStatus,
    };

    const V100: &str = "Tesla V100-SXM2-32GB";

    struct Fixture {
        catalog: Catalog,
        models: HashMap<GpuName, Arc<StoredModel>>,
        /// Names and memory (GB) of the workloads, in the catalog's order.
        workloads: Vec<(String, f64)>,
    }

    fn fixture() -> &'static Fixture {
        static FIXTURE: OnceLock<Fixture> = OnceLock::new();
        FIXTURE.get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/kace-v100");
            let dataset = KaceDataset::read(&dir).expect("the KACE data beside the repository");
            let features = dataset.features();
            let rows: Vec<TrainingRow> = dataset
                .pairs
                .iter()
                .filter_map(|p| {
                    Some(TrainingRow {
                        members: vec![*features.get(&p.workload1)?, *features.get(&p.workload2)?],
                        throughputs: vec![p.throughput1, p.throughput2],
                    })
                })
                .collect();
            let (params, metrics): (_, FitMetrics) =
                fit(ModelKind::MemberRidgeGbt, &rows).expect("the KACE data fits");
            let gpu = GpuName::parse("gpu", V100).unwrap();
            let model = Arc::new(StoredModel {
                gpu: gpu.clone(),
                version: 1,
                params,
                metrics,
                created_at_ms: 0,
                status: ModelStatus::Promoted,
                reason: String::new(),
                comparison: None,
                last_observation_id: 0,
                excluded_outliers: 0,
            });
            let mut catalog = Catalog::default();
            let mut workloads = Vec::new();
            for w in &dataset.workloads {
                let profile = Profile {
                    gpu: gpu.clone(),
                    kernel: w.kernel,
                    system: w.system.clone(),
                    source: ProfileSource::Imported,
                    gpu_memory_gb: Some(32.0),
                    measured_at_ms: 0,
                    kernel_missing: false,
                };
                catalog.put_workload(&w.name, &[profile]);
                workloads.push((w.name.to_string(), w.system.memory_gb));
            }
            catalog.set_scoring_model(model.clone());
            Fixture {
                catalog,
                models: HashMap::from([(gpu, model)]),
                workloads,
            }
        })
    }

    fn gpu_state(id: usize, residents: &[usize], memory_gb: Option<f64>) -> GpuState {
        let workloads = &fixture().workloads;
        GpuState {
            id: format!("g{id:03}"),
            node: String::new(),
            gpu: Some(GpuName::parse("gpu", V100).unwrap()),
            memory_gb,
            residents: residents.iter().map(|&r| workloads[r].0.clone()).collect(),
        }
    }

    fn place(query: PlaceQuery) -> PlaceAnswer {
        let f = fixture();
        place_in(&f.catalog, &f.models, None, query).unwrap()
    }

    fn job(index: usize) -> WorkloadName {
        WorkloadName::parse("workload", &fixture().workloads[index].0).unwrap()
    }

    fn workload_index() -> impl Strategy<Value = usize> {
        let n = fixture().workloads.len();
        0..n
    }

    fn predicted(placement: &Placement, name: &str) -> f64 {
        placement
            .members
            .iter()
            .find(|m| m.workload.as_str() == name)
            .and_then(|m| m.predicted_throughput)
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn adding_a_resident_never_raises_the_others_predicted_throughput(
            job_index in workload_index(),
            residents in prop::collection::vec(workload_index(), 0..4),
            extra in workload_index(),
        ) {
            let mut grown = residents.clone();
            grown.push(extra);
            let mut query = PlaceQuery::new(
                job(job_index),
                vec![gpu_state(0, &residents, None), gpu_state(1, &grown, None)],
            );
            query.include_oversubscribed = true;
            query.max_jobs_per_gpu = MAX_JOBS_PER_GPU;
            let answer = place(query);
            prop_assert_eq!(answer.placements.len(), 2);
            let small = answer.placements.iter().find(|p| p.gpu_id == "g000").unwrap();
            let large = answer.placements.iter().find(|p| p.gpu_id == "g001").unwrap();
            for member in &small.members {
                let before = member.predicted_throughput.unwrap();
                let after = predicted(large, member.workload.as_str());
                prop_assert!(after <= before, "{} rose from {before} to {after}", member.workload.as_str());
            }
            // The job never gets more than it does alone, nor a resident more than before.
            for placement in [small, large] {
                let job = &placement.members[0];
                prop_assert!(job.predicted_throughput.unwrap() <= job.exclusive_throughput);
            }
        }

        #[test]
        fn a_gpu_whose_memory_would_overflow_is_never_ranked_unless_asked_for(
            job_index in workload_index(),
            gpus in prop::collection::vec(
                (prop::collection::vec(workload_index(), 0..4), prop::option::of(4.0f64..40.0)),
                1..12,
            ),
            include_oversubscribed in any::<bool>(),
        ) {
            let f = fixture();
            let states: Vec<GpuState> = gpus
                .iter()
                .enumerate()
                .map(|(i, (residents, memory))| gpu_state(i, residents, *memory))
                .collect();
            let mut query = PlaceQuery::new(job(job_index), states);
            query.include_oversubscribed = include_oversubscribed;
            let answer = place(query);
            prop_assert_eq!(answer.placements.len() + answer.skipped.len(), gpus.len());
            for (i, (residents, memory)) in gpus.iter().enumerate() {
                let id = format!("g{i:03}");
                let needed: f64 = f.workloads[job_index].1
                    + residents.iter().map(|&r| f.workloads[r].1).sum::<f64>();
                let limit = memory.unwrap_or(32.0);
                let overflows = needed > limit;
                let placed = answer.placements.iter().find(|p| p.gpu_id == id);
                let skipped = answer.skipped.iter().find(|s| s.gpu_id == id);
                if residents.len() + 1 > DEFAULT_MAX_JOBS_PER_GPU {
                    prop_assert_eq!(skipped.unwrap().code, PlaceSkipCode::TooManyJobs);
                } else if overflows && !include_oversubscribed {
                    prop_assert!(placed.is_none(), "{id} needs {needed} GB of {limit}");
                    prop_assert_eq!(skipped.unwrap().code, PlaceSkipCode::ExceedsGpuMemory);
                } else {
                    let placed = placed.unwrap();
                    prop_assert_eq!(placed.fits_memory, !overflows);
                    prop_assert!((placed.memory_gb - needed).abs() < 1e-9);
                }
            }
        }

        #[test]
        fn every_cap_is_honoured_and_only_broken_caps_skip_a_gpu(
            job_index in workload_index(),
            gpus in prop::collection::vec(prop::collection::vec(workload_index(), 0..5), 1..12),
            job_cap in prop::option::of(0.05f64..1.0),
            resident_cap in prop::option::of(0.05f64..1.0),
            max_jobs in 1usize..=5,
        ) {
            let states: Vec<GpuState> = gpus
                .iter()
                .enumerate()
                .map(|(i, residents)| gpu_state(i, residents, None))
                .collect();
            let mut free = PlaceQuery::new(job(job_index), states.clone());
            free.include_oversubscribed = true;
            free.max_jobs_per_gpu = MAX_JOBS_PER_GPU;
            let free = place(free);
            let mut query = PlaceQuery::new(job(job_index), states);
            query.include_oversubscribed = true;
            query.min_job_fraction = job_cap;
            query.min_resident_fraction = resident_cap;
            query.max_jobs_per_gpu = max_jobs;
            let answer = place(query);
            for placement in &answer.placements {
                prop_assert!(placement.members.len() <= max_jobs);
                let job = &placement.members[0];
                if let Some(cap) = job_cap {
                    prop_assert!(job.predicted_speed_fraction().unwrap() >= cap);
                }
                if let Some(cap) = resident_cap {
                    for resident in &placement.members[1..] {
                        prop_assert!(resident.predicted_speed_fraction().unwrap() >= cap);
                    }
                }
            }
            // A GPU is skipped only for a cap it would break (its uncapped prediction says
            // which), and then names the member and its predicted share.
            for skipped in &answer.skipped {
                let uncapped = free.placements.iter().find(|p| p.gpu_id == skipped.gpu_id).unwrap();
                match skipped.code {
                    PlaceSkipCode::TooManyJobs => prop_assert!(uncapped.members.len() > max_jobs),
                    PlaceSkipCode::JobSlowdown => {
                        let kept = uncapped.members[0].predicted_speed_fraction().unwrap();
                        prop_assert!(kept < job_cap.unwrap());
                        prop_assert_eq!(skipped.predicted_fraction, Some(kept));
                    }
                    PlaceSkipCode::ResidentSlowdown => {
                        let name = skipped.workload.as_ref().unwrap();
                        let member = uncapped.members[1..].iter().find(|m| &m.workload == name).unwrap();
                        let kept = member.predicted_speed_fraction().unwrap();
                        prop_assert!(kept < resident_cap.unwrap());
                        prop_assert_eq!(skipped.predicted_fraction, Some(kept));
                    }
                    other => prop_assert!(false, "unexpected skip {other:?}"),
                }
            }
            prop_assert_eq!(answer.placements.len() + answer.skipped.len(), gpus.len());
        }
    }

    #[test]
    fn gpus_running_the_same_set_get_the_same_answer() {
        // 300 GPUs over 3 distinct resident sets (one predicted once per request, cached).
        let states: Vec<GpuState> = (0..300)
            .map(|i| gpu_state(i, &[[0, 1], [2, 2], [3, 4]][i % 3], None))
            .collect();
        let mut query = PlaceQuery::new(job(5), states);
        query.include_oversubscribed = true;
        let answer = place(query);
        assert_eq!(answer.placements.len(), 300);
        for placement in &answer.placements {
            let twin = answer
                .placements
                .iter()
                .find(|p| p.gpu_id != placement.gpu_id && p.members == placement.members)
                .unwrap();
            assert_eq!(twin.gain, placement.gain);
        }
    }
}
