//! The one cluster view: which GPUs each node has, and who runs on each GPU, whoever
//! placed them. Every source feeds it and every reader reads it: the kube-scheduler
//! extender (and the admission webhook beside it), Place against the stored view, ListGpus
//! and `coloc gpus list`.
//!
//! Sources, each resident saying which one placed it ([`Source`]):
//! - the cluster watcher (`extender::watcher`): nodes' GPUs from their labels, and pods
//!   with their workload (`coloc.io/workload`), floor (`coloc.io/min-job-fraction`) and,
//!   when an annotation names them, their GPUs (`coloc.io/gpu`, HAMi's
//!   `hami.io/vgpu-devices-allocated`);
//! - `coloc agent` on each node (ReportPodDevices): the kubelet's PodResources `List`, a
//!   full snapshot of which pod holds which GPU UUIDs on that node;
//! - AssignJob / ReleaseJob: the occupancy the store keeps (`store::occupancy`).
//!
//! A pod on a GPU coloc did not choose is still a resident: a pod whose workload coloc
//! does not know occupies its GPU all the same (the extender then leaves that GPU
//! unscored). Precedence when sources disagree about where a pod runs (decision 023):
//! 1. HAMi's allocation annotation: HAMi's device plugin mounts the devices it names,
//!    whatever device ids the kubelet handed it;
//! 2. the kubelet's PodResources report of the node (what the device plugin was given), while
//!    it is fresh (`agents.pod_devices_stale_secs`); a pod it lists runs there, not where an
//!    annotation says;
//! 3. a DRA claim's allocation (the claim watcher, `extender::binding::claims`: what the
//!    scheduler allocated, so over a `coloc.io/gpu` of the same pod), and the `coloc.io/gpu`
//!    annotation (the operator's own tooling);
//! 4. AssignJob: a job whose id is a pod's `namespace/name` is that pod, and counts only
//!    while no source above places the pod; other jobs stand as they are.
//!
//! The workload and floor come from the pod's annotations (the watcher), else (the
//! workload) from its DRA claim's `coloc.io/workload`, else from the assignment of the same
//! id; without any the resident's workload is unknown.
//!
//! The public API, for the extender and the webhook:
//! - writers: [`ClusterView::set_node`] / [`ClusterView::replace_nodes`],
//!   [`ClusterView::set_watched_pod`] / [`ClusterView::replace_watched_pods`] (and their
//!   older forms for pods with a known workload and GPU, [`ClusterView::set_pod`] /
//!   [`ClusterView::replace_pods`]), [`ClusterView::set_claim_residency`] /
//!   [`ClusterView::replace_claim_residencies`] (where DRA claims place pods, kept apart
//!   from the pod watcher's record of the same pods and merged with it, decision 033),
//!   [`ClusterView::report_pod_devices`];
//! - readers: [`ClusterView::node`], [`ClusterView::occupied_gpus`] (one node's occupied
//!   GPUs with their [`Resident`]s), [`ClusterView::occupied_by_node`] (the same for many
//!   nodes in one pass; [`ClusterView::occupied_everywhere`] for all;
//!   [`ClusterView::with_occupied_by_node`] borrowed, without copies),
//!   [`ClusterView::with_occupied_gpus`] (workload names and floors,
//!   for the placement ask), [`ClusterView::gpus`] (every GPU known, for listings),
//!   [`ClusterView::occupancy`] (a sorted summary for tests and operators) and
//!   [`ClusterView::with_hami_allocations`] (what HAMi's annotations allocate, for the
//!   binding webhook's capacity check) and [`ClusterView::is_bound`] (whether a held pod
//!   has landed).
//!
//! Readers never wait on the API server or the database: writes take a short write lock,
//! and the store's occupancy is read from its in-memory copy.

mod merge;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::{
        atomic::{AtomicI64, Ordering},
        RwLock,
    },
};

use crate::{domain::now_ms, store::Store, sync::Unpoisoned};

pub use merge::{OccupiedRefs, ResidentRef, ViewGpu};

/// How long a node's PodResources report counts without a newer one, unless set.
pub const DEFAULT_STALE_AFTER_MS: i64 = 120_000;

/// How long a pod that was bound and left is remembered as landed (a hold for it is done),
/// well past any reservation's TTL.
pub const DEPARTED_KEPT_MS: i64 = 3_600_000;
/// The departed pods remembered before the old ones are swept.
const DEPARTED_PRUNE_AT: usize = 4_096;

/// Who says a resident runs on a GPU, in the order of precedence (first wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// HAMi's `hami.io/vgpu-devices-allocated` pod annotation.
    HamiAnnotation,
    /// The kubelet's PodResources API, reported by `coloc agent`.
    PodResources,
    /// A DRA ResourceClaim's allocation: the devices the scheduler allocated the pod's
    /// claim (counts as `coloc.io/gpu` does: a fresh PodResources report wins).
    DraAllocation,
    /// The `coloc.io/gpu` pod annotation.
    GpuAnnotation,
    /// AssignJob.
    AssignJob,
}

impl Source {
    /// The name operators see (`coloc gpus list`, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HamiAnnotation => "hami-annotation",
            Self::PodResources => "pod-resources",
            Self::GpuAnnotation => "gpu-annotation",
            Self::DraAllocation => "dra-allocation",
            Self::AssignJob => "assign-job",
        }
    }
}

/// The GPUs of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeGpus {
    pub count: u32,
    /// As the node names it (GFD writes spaces as dashes); the placer matches it against
    /// the GPU models coloc knows.
    pub gpu_model: Option<String>,
    pub memory_gb: Option<f64>,
}

/// A pod with a known workload holding GPUs named by `coloc.io/gpu` on a node (the older
/// form of [`WatchedPod`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Residency {
    pub node: String,
    /// GPU ids on that node (UUIDs under HAMi, whatever `coloc.io/gpu` says otherwise).
    pub gpus: Vec<String>,
    pub workload: String,
    /// Its `coloc.io/min-job-fraction`: no pod placed beside it may leave it less. A
    /// malformed one counts as none (the pod was answered neutrally when it was placed).
    pub min_job_fraction: Option<f64>,
}

/// What the cluster watcher knows of a live pod bound to a node.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchedPod {
    pub node: String,
    /// The GPUs an annotation names; empty when only the kubelet can tell.
    pub gpus: Vec<String>,
    /// Which annotation named them ([`Source::GpuAnnotation`] or
    /// [`Source::HamiAnnotation`]), or [`Source::DraAllocation`] for a DRA claim's
    /// allocation; ignored when `gpus` is empty.
    pub gpu_source: Source,
    /// `coloc.io/workload`; `None` for a pod coloc was not told about.
    pub workload: Option<String>,
    /// The pod's `metadata.uid` (what a pushing workload and a `{pod_uid}` query name it
    /// by); `None` where the watcher was not told it.
    pub uid: Option<String>,
    pub min_job_fraction: Option<f64>,
    /// Its `coloc.io/throughput-query`: the PromQL template of its throughput, read by the
    /// observer.
    pub throughput_query: Option<String>,
    /// What HAMi's `hami.io/vgpu-devices-allocated` allocates it on each device (HAMi's
    /// own accounting, read by the binding webhook); empty without the annotation.
    pub hami_allocated: Vec<HamiAllocation>,
}

/// One device of a pod's HAMi allocation: memory (MiB) and cores (percent) taken.
#[derive(Debug, Clone, PartialEq)]
pub struct HamiAllocation {
    pub gpu: String,
    pub mem_mib: i64,
    pub cores: i64,
}

impl From<Residency> for WatchedPod {
    fn from(residency: Residency) -> Self {
        Self {
            node: residency.node,
            gpus: residency.gpus,
            gpu_source: Source::GpuAnnotation,
            workload: Some(residency.workload),
            uid: None,
            min_job_fraction: residency.min_job_fraction,
            throughput_query: None,
            hami_allocated: Vec::new(),
        }
    }
}

/// One pod of a node's PodResources report.
#[derive(Debug, Clone, PartialEq)]
pub struct PodDevices {
    /// `namespace/name`, the watcher's key of the same pod.
    pub pod: String,
    /// GPU UUIDs.
    pub gpus: Vec<String>,
}

/// A pod or job on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Resident {
    /// The pod's `namespace/name` (the watcher's key), or the AssignJob job id.
    pub id: String,
    /// `None`: coloc does not know what it runs.
    pub workload: Option<String>,
    /// The pod's `metadata.uid` where the watcher knows it; `None` for jobs.
    pub uid: Option<String>,
    pub min_job_fraction: Option<f64>,
    /// The pod's `coloc.io/throughput-query` (the observer); `None` for jobs.
    pub throughput_query: Option<String>,
    pub source: Source,
    /// AssignJob's times; `None` for pods.
    pub assigned_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
}

impl Resident {
    /// The name a placement is asked with: the workload, or for an unknown one a name no
    /// workload can have (Place then leaves the GPU unscored).
    pub fn placement_name(&self) -> String {
        match &self.workload {
            Some(workload) => workload.clone(),
            None => Self::unknown_name(&self.id),
        }
    }

    /// The name an unknown workload's resident `id` is asked with.
    pub(crate) fn unknown_name(id: &str) -> String {
        format!("unknown pod {id}")
    }

    /// [`Self::placement_name`], taking the resident (no copy of a known workload).
    pub fn into_placement_name(self) -> String {
        match self.workload {
            Some(workload) => workload,
            None => Self::unknown_name(&self.id),
        }
    }
}

/// The residents of one GPU: (node, GPU id) -> workloads, a name once per pod (an unknown
/// workload as [`Resident::placement_name`] writes it).
pub type Occupancy = BTreeMap<(String, String), Vec<String>>;

/// node -> its occupied GPUs, by id, each with its residents.
pub type OccupiedByNode = HashMap<String, Vec<(String, Vec<Resident>)>>;

/// A node's last PodResources report.
#[derive(Debug, Clone)]
struct NodeReport {
    at_ms: i64,
    pods: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Default)]
struct Inner {
    nodes: HashMap<String, NodeGpus>,
    /// Every pod the view places, by key: the pod watcher's record, with where a DRA
    /// claim's allocation puts it ([`resident_pod`]); what the readers read.
    watched: HashMap<String, WatchedPod>,
    /// The pod watcher's pods by key, as it recorded them.
    from_pods: HashMap<String, WatchedPod>,
    /// Where DRA claims place pods, by pod key (the claim watcher's).
    from_claims: HashMap<String, WatchedPod>,
    /// node -> the watched pods bound to it.
    watched_on: HashMap<String, BTreeSet<String>>,
    /// node -> its last PodResources report.
    reports: HashMap<String, NodeReport>,
    /// pod key -> the node whose report lists it.
    reported_on: HashMap<String, String>,
    /// Counts the writes: readers that keep something derived from the view know when to
    /// derive it again.
    generation: u64,
    /// Pods seen bound that have since left, with when they left.
    departed: HashMap<String, i64>,
}

impl Inner {
    fn unwatch(&mut self, key: &str) {
        if let Some(old) = self.watched.remove(key) {
            if let Some(keys) = self.watched_on.get_mut(&old.node) {
                keys.remove(key);
                if keys.is_empty() {
                    self.watched_on.remove(&old.node);
                }
            }
        }
    }

    /// Remembers that the bound pod `key` left at `at_ms`, forgetting pods that left more
    /// than [`DEPARTED_KEPT_MS`] before.
    fn depart(&mut self, key: String, at_ms: i64) {
        if self.departed.len() >= DEPARTED_PRUNE_AT {
            self.departed
                .retain(|_, left| at_ms - *left < DEPARTED_KEPT_MS);
        }
        self.departed.insert(key, at_ms);
    }

    fn watch(&mut self, key: String, pod: WatchedPod) {
        self.watched_on
            .entry(pod.node.clone())
            .or_default()
            .insert(key.clone());
        self.watched.insert(key, pod);
    }

    /// Places the pod `key` anew from what the pod watcher and the claims say of it,
    /// remembering it departed (at `now`) when it was placed and no longer is.
    fn refresh(&mut self, key: &str, now: i64) {
        let was = self.watched.contains_key(key);
        self.unwatch(key);
        match resident_pod(self.from_pods.get(key), self.from_claims.get(key)) {
            Some(pod) => {
                self.departed.remove(key);
                self.watch(key.to_string(), pod);
            }
            None if was => self.depart(key.to_string(), now),
            None => {}
        }
    }
}

/// The pod as the view places it (decision 033): the pod watcher's record (workload,
/// floor, throughput query, HAMi's allocation) on the node and GPUs a DRA claim's
/// allocation names, unless HAMi's annotation places it; either alone as it is. The
/// claim's workload and uid count where the pod's annotations give none.
fn resident_pod(watched: Option<&WatchedPod>, claimed: Option<&WatchedPod>) -> Option<WatchedPod> {
    match (watched, claimed) {
        (pod, None) => pod.cloned(),
        (None, Some(claimed)) => Some(claimed.clone()),
        (Some(pod), Some(_))
            if pod.gpu_source == Source::HamiAnnotation && !pod.gpus.is_empty() =>
        {
            Some(pod.clone())
        }
        (Some(pod), Some(claimed)) => Some(WatchedPod {
            node: claimed.node.clone(),
            gpus: claimed.gpus.clone(),
            gpu_source: Source::DraAllocation,
            workload: pod.workload.clone().or_else(|| claimed.workload.clone()),
            uid: pod.uid.clone().or_else(|| claimed.uid.clone()),
            ..pod.clone()
        }),
    }
}

/// Replaces `layer` with `fresh` and places anew every pod either names.
fn replace_layer(
    inner: &mut Inner,
    layer: fn(&mut Inner) -> &mut HashMap<String, WatchedPod>,
    fresh: HashMap<String, WatchedPod>,
) {
    let old = std::mem::replace(layer(inner), fresh);
    let mut keys: HashSet<String> = old.into_keys().collect();
    keys.extend(layer(inner).keys().cloned());
    let now = now_ms();
    for key in keys {
        inner.refresh(&key, now);
    }
}

/// The one cluster view (module header: sources, precedence, API).
#[derive(Debug)]
pub struct ClusterView {
    inner: RwLock<Inner>,
    /// AssignJob's occupancy; `None` for a view without a store (tests, benches).
    assignments: Option<Store>,
    stale_after_ms: AtomicI64,
}

impl Default for ClusterView {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterView {
    /// A view fed by the watcher and agents only.
    pub fn new() -> Self {
        Self {
            inner: RwLock::default(),
            assignments: None,
            stale_after_ms: AtomicI64::new(DEFAULT_STALE_AFTER_MS),
        }
    }

    /// A view that also reads `store`'s AssignJob occupancy.
    pub fn with_assignments(store: Store) -> Self {
        Self {
            assignments: Some(store),
            ..Self::new()
        }
    }

    /// Counts a node's PodResources report for `ms` after it came (a node whose agent
    /// stopped reporting then falls back to the other sources).
    pub fn set_stale_after_ms(&self, ms: i64) {
        self.stale_after_ms.store(ms, Ordering::Relaxed);
    }

    fn stale_after_ms(&self) -> i64 {
        self.stale_after_ms.load(Ordering::Relaxed)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic under the lock leaves consistent data (each change is whole): go on.
        let mut inner = self.inner.write().unpoisoned();
        inner.generation += 1;
        inner
    }

    /// Changes with every write (not with time: a PodResources report going stale and
    /// AssignJob's occupancy change what readers see without one).
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Whether what readers see can change without a write: a PodResources report (it goes
    /// stale) or AssignJob's occupancy (the store's, with its expiries) feeds the view.
    pub fn changes_with_time(&self) -> bool {
        self.assignments.is_some() || !self.read().reports.is_empty()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unpoisoned()
    }

    /// Sets (or, with `None`, forgets) a node's GPUs.
    pub fn set_node(&self, name: &str, gpus: Option<NodeGpus>) {
        let mut inner = self.write();
        match gpus {
            Some(gpus) => {
                inner.nodes.insert(name.to_string(), gpus);
            }
            None => {
                inner.nodes.remove(name);
            }
        }
    }

    /// Replaces every node (after a node relist).
    pub fn replace_nodes(&self, nodes: impl IntoIterator<Item = (String, NodeGpus)>) {
        let nodes = nodes.into_iter().collect();
        self.write().nodes = nodes;
    }

    /// Records what the watcher knows of a pod now: `Some` (moving it if it was known
    /// elsewhere), or `None` when it finished or was deleted.
    pub fn set_watched_pod(&self, key: &str, pod: Option<WatchedPod>) {
        let mut inner = self.write();
        match pod {
            Some(pod) => inner.from_pods.insert(key.to_string(), pod),
            None => inner.from_pods.remove(key),
        };
        inner.refresh(key, now_ms());
    }

    /// Replaces every watched pod (after a pod relist): pods not listed are gone.
    pub fn replace_watched_pods(&self, pods: impl IntoIterator<Item = (String, WatchedPod)>) {
        let fresh = pods.into_iter().collect();
        replace_layer(&mut self.write(), |inner| &mut inner.from_pods, fresh);
    }

    /// Records where DRA claims place the pod `key` now (their devices' node and GPUs,
    /// [`Source::DraAllocation`]), or with `None` that no claim places it any more. The
    /// pod watcher's record of the same pod keeps its workload and floor.
    pub fn set_claim_residency(&self, key: &str, pod: Option<WatchedPod>) {
        let mut inner = self.write();
        match pod {
            Some(pod) => inner.from_claims.insert(key.to_string(), pod),
            None => inner.from_claims.remove(key),
        };
        inner.refresh(key, now_ms());
    }

    /// Replaces every claim's residency (after a claim relist): pods not listed are placed
    /// by no claim.
    pub fn replace_claim_residencies(&self, pods: impl IntoIterator<Item = (String, WatchedPod)>) {
        let fresh = pods.into_iter().collect();
        replace_layer(&mut self.write(), |inner| &mut inner.from_claims, fresh);
    }

    /// [`Self::set_watched_pod`] for a pod with a known workload on GPUs `coloc.io/gpu`
    /// names.
    pub fn set_pod(&self, key: &str, residency: Option<Residency>) {
        self.set_watched_pod(key, residency.map(WatchedPod::from));
    }

    /// [`Self::replace_watched_pods`] for pods with known workloads on GPUs
    /// `coloc.io/gpu` names.
    pub fn replace_pods(&self, pods: impl IntoIterator<Item = (String, Residency)>) {
        self.replace_watched_pods(pods.into_iter().map(|(k, r)| (k, WatchedPod::from(r))));
    }

    /// Replaces `node`'s PodResources report with `pods` (a full snapshot: pods it does
    /// not list hold no GPU there any more), received at `at_ms`. Returns the pods and
    /// distinct GPUs recorded. The same snapshot again changes nothing but its time.
    pub fn report_pod_devices(
        &self,
        node: &str,
        pods: Vec<PodDevices>,
        at_ms: i64,
    ) -> (usize, usize) {
        let mut snapshot: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pod in pods {
            let gpus = snapshot.entry(pod.pod).or_default();
            for gpu in pod.gpus {
                if !gpus.contains(&gpu) {
                    gpus.push(gpu);
                }
            }
        }
        snapshot.retain(|_, gpus| !gpus.is_empty());
        let distinct: HashSet<&String> = snapshot.values().flatten().collect();
        let counts = (snapshot.len(), distinct.len());
        let mut inner = self.write();
        if let Some(old) = inner.reports.remove(node) {
            for key in old.pods.keys() {
                if inner.reported_on.get(key).is_some_and(|n| n == node) {
                    inner.reported_on.remove(key);
                }
            }
        }
        for key in snapshot.keys() {
            inner.reported_on.insert(key.clone(), node.to_string());
        }
        inner.reports.insert(
            node.to_string(),
            NodeReport {
                at_ms,
                pods: snapshot,
            },
        );
        counts
    }

    pub fn node(&self, name: &str) -> Option<NodeGpus> {
        self.read().nodes.get(name).cloned()
    }

    /// `node`'s occupied GPUs, by id, each with its residents (pods by key, then jobs).
    pub fn occupied_gpus(&self, node: &str) -> Vec<(String, Vec<Resident>)> {
        let wanted = HashSet::from([node]);
        self.occupied_by_node(&wanted)
            .remove(node)
            .unwrap_or_default()
    }

    /// [`Self::occupied_gpus`] of each of `nodes`, in one pass over the sources (nodes
    /// with no occupied GPU are left out).
    pub fn occupied_by_node(
        &self,
        nodes: &HashSet<&str>,
    ) -> HashMap<String, Vec<(String, Vec<Resident>)>> {
        let now = now_ms();
        let inner = self.read();
        let occupancy = self.assignments.as_ref().map(|store| store.occupancy());
        merge::occupied(
            &inner,
            occupancy.as_deref(),
            merge::Nodes::Some(nodes),
            now,
            self.stale_after_ms(),
        )
    }

    /// [`Self::occupied_by_node`], borrowed: `visit` reads each wanted node's occupied GPUs
    /// (residents sorted by id) under the view's read lock, nothing copied. For readers that
    /// only derive from the residents (the extender's slots).
    pub fn with_occupied_by_node<R>(
        &self,
        nodes: &HashSet<&str>,
        visit: impl FnOnce(&OccupiedRefs<'_>) -> R,
    ) -> R {
        let now = now_ms();
        let inner = self.read();
        let occupancy = self.assignments.as_ref().map(|store| store.occupancy());
        let occupied = merge::occupied_refs(
            &inner,
            occupancy.as_deref(),
            merge::Nodes::Some(nodes),
            now,
            self.stale_after_ms(),
        );
        visit(&occupied)
    }

    /// [`Self::occupied_gpus`] of every node, in one pass (the webhook decides over all),
    /// with the [`Self::generation`] it was read at.
    pub fn occupied_everywhere(&self) -> (u64, OccupiedByNode) {
        let now = now_ms();
        let inner = self.read();
        let occupancy = self.assignments.as_ref().map(|store| store.occupancy());
        let occupied = merge::occupied(
            &inner,
            occupancy.as_deref(),
            merge::Nodes::All,
            now,
            self.stale_after_ms(),
        );
        (inner.generation, occupied)
    }

    /// Calls `visit` with each occupied GPU of `node` and its residents (the name Place
    /// is asked with, [`Resident::placement_name`], and `min_job_fraction`).
    pub fn with_occupied_gpus(
        &self,
        node: &str,
        mut visit: impl FnMut(&str, Vec<(&str, Option<f64>)>),
    ) {
        for (gpu, residents) in self.occupied_gpus(node) {
            let names: Vec<String> = residents.iter().map(Resident::placement_name).collect();
            visit(
                &gpu,
                names
                    .iter()
                    .zip(&residents)
                    .map(|(name, r)| (name.as_str(), r.min_job_fraction))
                    .collect(),
            );
        }
    }

    /// Every GPU known, by (id, node): the store's (empty ones too) and every GPU a pod
    /// holds, with their residents and GPU model where known.
    pub fn gpus(&self) -> Vec<ViewGpu> {
        let now = now_ms();
        let inner = self.read();
        let occupancy = self.assignments.as_ref().map(|store| store.occupancy());
        merge::all_gpus(&inner, occupancy.as_deref(), now, self.stale_after_ms())
    }

    /// Every occupied GPU with its residents' names, sorted (for tests and operators).
    pub fn occupancy(&self) -> Occupancy {
        let now = now_ms();
        let inner = self.read();
        let occupancy = self.assignments.as_ref().map(|store| store.occupancy());
        let mut summary = Occupancy::new();
        let by_node = merge::occupied(
            &inner,
            occupancy.as_deref(),
            merge::Nodes::All,
            now,
            self.stale_after_ms(),
        );
        for (node, gpus) in by_node {
            for (gpu, residents) in gpus {
                let mut names: Vec<String> =
                    residents.iter().map(Resident::placement_name).collect();
                names.sort();
                summary.insert((node.clone(), gpu), names);
            }
        }
        summary
    }

    /// Calls `visit` with each bound pod's HAMi allocations (node, device and what it takes),
    /// whatever the pod runs: HAMi counts them all.
    pub fn with_hami_allocations(&self, mut visit: impl FnMut(&str, &HamiAllocation)) {
        let inner = self.read();
        for pod in inner.watched.values() {
            for allocation in &pod.hami_allocated {
                visit(&pod.node, allocation);
            }
        }
    }

    /// Whether the watcher knows the pod `key` (`namespace/name`) bound to a node, or saw
    /// it bound and then leave (within [`DEPARTED_KEPT_MS`]): either way a hold taken for it
    /// is done.
    pub fn is_bound(&self, key: &str) -> bool {
        let inner = self.read();
        inner.watched.contains_key(key) || inner.departed.contains_key(key)
    }

    pub fn node_count(&self) -> usize {
        self.read().nodes.len()
    }

    /// Pods the watcher knows on nodes.
    pub fn resident_pods(&self) -> usize {
        self.read().watched.len()
    }
}

#[cfg(test)]
mod tests;
