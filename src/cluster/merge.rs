//! The view's sources merged into residents per GPU, by the precedence the module header
//! states: HAMi's annotation, then a fresh PodResources report, then `coloc.io/gpu`, then
//! AssignJob for ids no source above places.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Inner, Resident, Source, WatchedPod};
use crate::store::{ClusterJob, Occupancy as Assignments};

/// Which nodes a merge covers.
pub(super) enum Nodes<'a> {
    All,
    Some(&'a HashSet<&'a str>),
}

impl Nodes<'_> {
    fn wanted(&self, node: &str) -> bool {
        match self {
            Self::All => true,
            Self::Some(set) => set.contains(node),
        }
    }

    /// The entries of `map` for the wanted nodes: looked up one by one when they are few,
    /// else the whole map filtered.
    fn entries<'m, V>(&self, map: &'m HashMap<String, V>) -> Vec<(&'m String, &'m V)> {
        match self {
            Self::Some(set) if set.len() < map.len() => set
                .iter()
                .filter_map(|node| map.get_key_value(*node))
                .collect(),
            _ => map.iter().filter(|(node, _)| self.wanted(node)).collect(),
        }
    }
}

/// One GPU of the view, for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewGpu {
    pub id: String,
    pub node: String,
    /// The GPU model: the store's for a GPU AssignJob named, else the node's label.
    pub gpu_model: Option<String>,
    /// Pods by key, then jobs by id; empty for a GPU the store knows with nobody on it.
    pub residents: Vec<Resident>,
}

struct Sources<'a> {
    inner: &'a Inner,
    now_ms: i64,
    stale_after_ms: i64,
}

impl Sources<'_> {
    fn fresh_report(&self, node: &str) -> bool {
        self.inner
            .reports
            .get(node)
            .is_some_and(|report| self.now_ms - report.at_ms <= self.stale_after_ms)
    }

    /// Whether a fresh PodResources report lists the pod (on any node).
    fn reported(&self, key: &str) -> bool {
        self.inner
            .reported_on
            .get(key)
            .is_some_and(|node| self.fresh_report(node))
    }

    /// Whether the watcher's annotation places the pod (it names GPUs, and no fresh
    /// report overrides it).
    fn annotated(&self, pod: &WatchedPod, key: &str) -> bool {
        !pod.gpus.is_empty() && (pod.gpu_source == Source::HamiAnnotation || !self.reported(key))
    }

    /// Whether a source above AssignJob places the pod `key`.
    fn placed(&self, key: &str) -> bool {
        let watched = self.inner.watched.get(key);
        watched.is_some_and(|pod| self.annotated(pod, key))
            || (self.reported(key)
                && !watched.is_some_and(|pod| {
                    pod.gpu_source == Source::HamiAnnotation && !pod.gpus.is_empty()
                }))
    }
}

/// A resident as the merge finds it, borrowed from the view's sources (a
/// [`Resident`] without the copies).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidentRef<'a> {
    pub id: &'a str,
    pub workload: Option<&'a str>,
    pub uid: Option<&'a str>,
    pub min_job_fraction: Option<f64>,
    pub throughput_query: Option<&'a str>,
    pub source: Source,
    pub assigned_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
}

impl<'a> ResidentRef<'a> {
    /// [`Resident::placement_name`], borrowed for a known workload.
    pub fn placement_name(&self) -> std::borrow::Cow<'a, str> {
        match self.workload {
            Some(workload) => std::borrow::Cow::Borrowed(workload),
            None => std::borrow::Cow::Owned(Resident::unknown_name(self.id)),
        }
    }

    pub fn to_resident(&self) -> Resident {
        Resident {
            id: self.id.to_string(),
            workload: self.workload.map(str::to_string),
            uid: self.uid.map(str::to_string),
            min_job_fraction: self.min_job_fraction,
            throughput_query: self.throughput_query.map(str::to_string),
            source: self.source,
            assigned_at_ms: self.assigned_at_ms,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// node -> GPU id -> its residents, sorted by id, borrowed from the sources.
pub type OccupiedRefs<'a> = HashMap<&'a str, BTreeMap<&'a str, Vec<ResidentRef<'a>>>>;

fn push<'a>(
    by_node: &mut OccupiedRefs<'a>,
    node: &'a str,
    gpu: &'a str,
    resident: ResidentRef<'a>,
) {
    by_node
        .entry(node)
        .or_default()
        .entry(gpu)
        .or_default()
        .push(resident);
}

fn pod_resident<'a>(
    key: &'a str,
    pod: Option<&'a WatchedPod>,
    source: Source,
    jobs: &HashMap<&'a str, &'a ClusterJob>,
) -> ResidentRef<'a> {
    ResidentRef {
        id: key,
        workload: pod
            .and_then(|p| p.workload.as_deref())
            .or_else(|| jobs.get(key).map(|j| j.workload.as_str())),
        uid: pod.and_then(|p| p.uid.as_deref()),
        min_job_fraction: pod.and_then(|p| p.min_job_fraction),
        throughput_query: pod.and_then(|p| p.throughput_query.as_deref()),
        source,
        assigned_at_ms: None,
        expires_at_ms: None,
    }
}

/// Each wanted node's occupied GPUs with their residents (sorted by id).
pub(super) fn occupied(
    inner: &Inner,
    assignments: Option<&Assignments>,
    nodes: Nodes<'_>,
    now_ms: i64,
    stale_after_ms: i64,
) -> HashMap<String, Vec<(String, Vec<Resident>)>> {
    occupied_refs(inner, assignments, nodes, now_ms, stale_after_ms)
        .into_iter()
        .map(|(node, gpus)| {
            let gpus = gpus
                .into_iter()
                .map(|(gpu, residents)| {
                    let residents = residents.iter().map(ResidentRef::to_resident).collect();
                    (gpu.to_string(), residents)
                })
                .collect();
            (node.to_string(), gpus)
        })
        .collect()
}

/// [`occupied`], borrowed from the sources: no resident copied.
pub(super) fn occupied_refs<'a>(
    inner: &'a Inner,
    assignments: Option<&'a Assignments>,
    nodes: Nodes<'_>,
    now_ms: i64,
    stale_after_ms: i64,
) -> OccupiedRefs<'a> {
    let sources = Sources {
        inner,
        now_ms,
        stale_after_ms,
    };
    let live_jobs: HashMap<&str, &ClusterJob> = assignments
        .into_iter()
        .flat_map(|a| a.gpus())
        .flat_map(|gpu| &gpu.jobs)
        .filter(|job| job.is_live(now_ms))
        .map(|job| (&*job.job_id, job))
        .collect();
    let mut by_node = OccupiedRefs::new();
    for (node, keys) in nodes.entries(&inner.watched_on) {
        for key in keys {
            let pod = &inner.watched[key];
            if !sources.annotated(pod, key) {
                continue;
            }
            for gpu in &pod.gpus {
                let resident = pod_resident(key, Some(pod), pod.gpu_source, &live_jobs);
                push(&mut by_node, node, gpu, resident);
            }
        }
    }
    for (node, report) in nodes.entries(&inner.reports) {
        if !sources.fresh_report(node) {
            continue;
        }
        for (key, gpus) in &report.pods {
            let pod = inner.watched.get(key);
            if pod.is_some_and(|p| p.gpu_source == Source::HamiAnnotation && !p.gpus.is_empty()) {
                continue;
            }
            for gpu in gpus {
                let resident = pod_resident(key, pod, Source::PodResources, &live_jobs);
                push(&mut by_node, node, gpu, resident);
            }
        }
    }
    for gpu in assignments.into_iter().flat_map(|a| a.gpus()) {
        if !nodes.wanted(&gpu.node) {
            continue;
        }
        for job in gpu.jobs.iter().filter(|job| job.is_live(now_ms)) {
            if sources.placed(&job.job_id) {
                continue;
            }
            let resident = ResidentRef {
                id: &job.job_id,
                workload: Some(job.workload.as_str()),
                uid: None,
                min_job_fraction: inner
                    .watched
                    .get(&*job.job_id)
                    .and_then(|p| p.min_job_fraction),
                throughput_query: None,
                source: Source::AssignJob,
                assigned_at_ms: Some(job.assigned_at_ms),
                expires_at_ms: job.expires_at_ms,
            };
            push(&mut by_node, &gpu.node, &gpu.id, resident);
        }
    }
    for gpus in by_node.values_mut() {
        for residents in gpus.values_mut() {
            residents.sort_by(|a, b| a.id.cmp(b.id));
        }
    }
    by_node
}

/// Every GPU of the view, sorted by (id, node): occupied ones and the store's empty ones.
pub(super) fn all_gpus(
    inner: &Inner,
    assignments: Option<&Assignments>,
    now_ms: i64,
    stale_after_ms: i64,
) -> Vec<ViewGpu> {
    let mut gpus: BTreeMap<(String, String), ViewGpu> = BTreeMap::new();
    for gpu in assignments.into_iter().flat_map(|a| a.gpus()) {
        gpus.insert(
            (gpu.id.to_string(), gpu.node.to_string()),
            ViewGpu {
                id: gpu.id.to_string(),
                node: gpu.node.to_string(),
                gpu_model: Some(gpu.gpu.as_str().to_string()),
                residents: Vec::new(),
            },
        );
    }
    let occupied = occupied(inner, assignments, Nodes::All, now_ms, stale_after_ms);
    for (node, node_gpus) in occupied {
        let label = inner.nodes.get(&node).and_then(|n| n.gpu_model.clone());
        for (id, residents) in node_gpus {
            gpus.entry((id.clone(), node.clone()))
                .or_insert_with(|| ViewGpu {
                    id,
                    node: node.clone(),
                    gpu_model: label.clone(),
                    residents: Vec::new(),
                })
                .residents = residents;
        }
    }
    gpus.into_values().collect()
}
