//! The cluster as the extender sees it: each node's GPUs and the pods resident on each
//! GPU. The pod watcher keeps it (or an embedder, or a test); the filter and prioritize
//! calls read it. Readers never wait on the API server: every change is applied under a
//! short write lock, and a relist (watch restart, 410 Gone) replaces the pods at once.

use std::{
    collections::{BTreeMap, HashMap},
    sync::RwLock,
};

use super::{node::NodeGpus, pod::Residency};
use crate::sync::Unpoisoned;

/// The residents of one GPU: (node, GPU id) -> workloads, a name once per pod.
pub type Occupancy = BTreeMap<(String, String), Vec<String>>;

/// One occupied GPU: (node, GPU id, the node's GPU model, its residents).
pub type OccupiedGpu = (String, String, Option<String>, Vec<ResidentPod>);

/// A resident as the observer reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidentPod {
    pub uid: String,
    pub workload: String,
    /// `namespace/name`.
    pub name: String,
    /// Its `coloc.io/throughput-query`.
    pub throughput_query: Option<String>,
}

#[derive(Debug, Default)]
pub struct ClusterView {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    nodes: HashMap<String, NodeGpus>,
    /// Resident pods by uid.
    pods: HashMap<String, Residency>,
    /// node -> GPU id -> its resident pods, kept in step with `pods`.
    by_node: HashMap<String, BTreeMap<String, Vec<Resident>>>,
}

/// A pod on one GPU.
#[derive(Debug)]
struct Resident {
    uid: String,
    workload: String,
    min_job_fraction: Option<f64>,
    pod_name: String,
    throughput_query: Option<String>,
}

impl Inner {
    fn remove_pod(&mut self, uid: &str) {
        let Some(old) = self.pods.remove(uid) else {
            return;
        };
        if let Some(gpus) = self.by_node.get_mut(&old.node) {
            for gpu in &old.gpus {
                if let Some(residents) = gpus.get_mut(gpu) {
                    residents.retain(|resident| resident.uid != uid);
                    if residents.is_empty() {
                        gpus.remove(gpu);
                    }
                }
            }
            if gpus.is_empty() {
                self.by_node.remove(&old.node);
            }
        }
    }

    fn insert_pod(&mut self, uid: &str, residency: Residency) {
        let gpus = self.by_node.entry(residency.node.clone()).or_default();
        for gpu in &residency.gpus {
            gpus.entry(gpu.clone()).or_default().push(Resident {
                uid: uid.to_string(),
                workload: residency.workload.clone(),
                min_job_fraction: residency.min_job_fraction,
                pod_name: residency.pod_name.clone(),
                throughput_query: residency.throughput_query.clone(),
            });
        }
        self.pods.insert(uid.to_string(), residency);
    }
}

impl ClusterView {
    pub fn new() -> Self {
        Self::default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic under the lock leaves consistent data (each change is whole): go on.
        self.inner.write().unpoisoned()
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

    /// Records where a pod runs now: `Some` makes it a resident (moving it if it was one
    /// elsewhere), `None` releases whatever it held.
    pub fn set_pod(&self, uid: &str, residency: Option<Residency>) {
        let mut inner = self.write();
        inner.remove_pod(uid);
        if let Some(residency) = residency {
            inner.insert_pod(uid, residency);
        }
    }

    /// Replaces every resident (after a pod relist): pods not listed are released.
    pub fn replace_pods(&self, pods: impl IntoIterator<Item = (String, Residency)>) {
        let mut fresh = Inner::default();
        for (uid, residency) in pods {
            fresh.insert_pod(&uid, residency);
        }
        let mut inner = self.write();
        inner.pods = fresh.pods;
        inner.by_node = fresh.by_node;
    }

    pub fn node(&self, name: &str) -> Option<NodeGpus> {
        self.read().nodes.get(name).cloned()
    }

    /// Calls `visit` with each occupied GPU of `node` and its residents (workload and
    /// `min_job_fraction`), under one read lock.
    pub fn with_occupied_gpus(
        &self,
        node: &str,
        mut visit: impl FnMut(&str, Vec<(&str, Option<f64>)>),
    ) {
        let inner = self.read();
        if let Some(gpus) = inner.by_node.get(node) {
            for (gpu, residents) in gpus {
                visit(
                    gpu,
                    residents
                        .iter()
                        .map(|r| (r.workload.as_str(), r.min_job_fraction))
                        .collect(),
                );
            }
        }
    }

    /// Every occupied GPU with its residents' workloads, sorted (for tests and operators).
    pub fn occupancy(&self) -> Occupancy {
        let inner = self.read();
        let mut occupancy = Occupancy::new();
        for (node, gpus) in &inner.by_node {
            for (gpu, residents) in gpus {
                let mut workloads: Vec<String> =
                    residents.iter().map(|r| r.workload.clone()).collect();
                workloads.sort();
                occupancy.insert((node.clone(), gpu.clone()), workloads);
            }
        }
        occupancy
    }

    /// Every occupied GPU: (node, GPU id, the node's GPU model, its residents), for the
    /// observer's timeline.
    pub fn residents(&self) -> Vec<OccupiedGpu> {
        let inner = self.read();
        let mut all = Vec::new();
        for (node, gpus) in &inner.by_node {
            let model = inner.nodes.get(node).and_then(|n| n.gpu_model.clone());
            for (gpu, residents) in gpus {
                let pods = residents
                    .iter()
                    .map(|r| ResidentPod {
                        uid: r.uid.clone(),
                        workload: r.workload.clone(),
                        name: r.pod_name.clone(),
                        throughput_query: r.throughput_query.clone(),
                    })
                    .collect();
                all.push((node.clone(), gpu.clone(), model.clone(), pods));
            }
        }
        all
    }

    pub fn node_count(&self) -> usize {
        self.read().nodes.len()
    }

    pub fn resident_pods(&self) -> usize {
        self.read().pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(node: &str, gpu: &str, workload: &str) -> Residency {
        Residency {
            node: node.into(),
            gpus: vec![gpu.into()],
            workload: workload.into(),
            min_job_fraction: None,
            pod_name: String::new(),
            throughput_query: None,
        }
    }

    #[test]
    fn a_moved_pod_leaves_its_old_gpu_and_a_relist_drops_the_unlisted() {
        let view = ClusterView::new();
        view.set_pod("a", Some(at("n1", "g0", "resnet")));
        view.set_pod("b", Some(at("n1", "g0", "bert")));
        view.set_pod("a", Some(at("n2", "g1", "resnet")));
        let occupancy = view.occupancy();
        assert_eq!(occupancy[&("n1".into(), "g0".into())], ["bert"]);
        assert_eq!(occupancy[&("n2".into(), "g1".into())], ["resnet"]);
        view.replace_pods([("c".to_string(), at("n3", "g2", "lstm"))]);
        assert_eq!(
            view.occupancy().into_keys().collect::<Vec<_>>(),
            [("n3".to_string(), "g2".to_string())]
        );
        view.set_pod("c", None);
        assert!(view.occupancy().is_empty());
    }
}
