//! The cluster watcher (kube-rs): keeps the [`ClusterView`] in step with the API server.
//! Every pod bound to a node and not finished that names a workload (`coloc.io/workload`)
//! or holds GPUs by annotation (`coloc.io/gpu`, HAMi's allocation) is recorded under its
//! `namespace/name` (the key the kubelet's PodResources reports use too): with its GPUs
//! when an annotation names them, else waiting for its node's report; it is released
//! when it finishes or is deleted. Nodes give their GPU inventory (for `nodeCacheCapable`
//! calls, which send names only). Each watch starts with
//! a full list that replaces what was known (a restart resyncs), and kube-rs relists by
//! itself when a watch is dropped or expires (410 Gone), with backoff between failures.
//! Off unless `extender.watch_cluster` is on.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    runtime::{
        watcher::{self, Event},
        WatchStreamExt,
    },
    Api, Client,
};
use tokio_util::sync::CancellationToken;

use super::{
    cluster::{ClusterView, Source, WatchedPod},
    node::{node_gpus, NodeGpus},
    pod::{
        gpu_ids, GPU_ANNOTATION, HAMI_ALLOCATED_ANNOTATION, MIN_JOB_FRACTION_ANNOTATION,
        THROUGHPUT_QUERY_ANNOTATION, WORKLOAD_ANNOTATION,
    },
};

/// Watches pods (in one namespace, or all) and nodes into a [`ClusterView`].
pub struct ClusterWatcher {
    client: Client,
    namespace: Option<String>,
    cluster: Arc<ClusterView>,
}

/// The pod's key in the view: `namespace/name`, as the kubelet names it.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|value| value.trim())
        .filter(|value| !value.is_empty())
}

/// What the view records of a pod: bound to a node, not finished (Pending-but-bound or
/// Running) nor being deleted, and either naming a workload or holding GPUs by
/// annotation. A malformed `coloc.io/min-job-fraction` counts as none.
pub fn watched_pod(pod: &Pod) -> Option<WatchedPod> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.as_deref()?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !matches!(phase, Some("Running") | Some("Pending")) {
        return None;
    }
    let workload = annotation(pod, WORKLOAD_ANNOTATION).map(str::to_string);
    let gpus = gpu_ids(pod);
    if workload.is_none() && gpus.is_empty() {
        return None;
    }
    let gpu_source = if annotation(pod, GPU_ANNOTATION).is_some() {
        Source::GpuAnnotation
    } else {
        Source::HamiAnnotation
    };
    Some(WatchedPod {
        node: node.to_string(),
        gpus,
        gpu_source,
        workload,
        uid: pod.metadata.uid.clone().filter(|uid| !uid.is_empty()),
        min_job_fraction: annotation(pod, MIN_JOB_FRACTION_ANNOTATION)
            .and_then(|raw| raw.parse::<f64>().ok())
            .filter(|f| *f > 0.0 && *f <= 1.0),
        throughput_query: annotation(pod, THROUGHPUT_QUERY_ANNOTATION).map(str::to_string),
        hami_allocated: annotation(pod, HAMI_ALLOCATED_ANNOTATION)
            .map(crate::extender::binding::hami::allocations)
            .unwrap_or_default(),
    })
}

/// Applies one pod event; `relist` buffers a list until it is complete.
pub fn apply_pod_event(
    cluster: &ClusterView,
    relist: &mut Option<Vec<(String, WatchedPod)>>,
    event: Event<Pod>,
) {
    match event {
        Event::Init => *relist = Some(Vec::new()),
        Event::InitApply(pod) => {
            if let (Some(buffer), Some(resident)) = (relist.as_mut(), watched_pod(&pod)) {
                buffer.push((pod_key(&pod), resident));
            }
        }
        Event::InitDone => {
            let pods = relist.take().unwrap_or_default();
            tracing::info!(pods = pods.len(), "cluster watcher: pods listed");
            cluster.replace_watched_pods(pods);
        }
        Event::Apply(pod) => cluster.set_watched_pod(&pod_key(&pod), watched_pod(&pod)),
        Event::Delete(pod) => cluster.set_watched_pod(&pod_key(&pod), None),
    }
}

/// Applies one node event; `relist` buffers a list until it is complete.
pub fn apply_node_event(
    cluster: &ClusterView,
    relist: &mut Option<Vec<(String, NodeGpus)>>,
    event: Event<Node>,
) {
    let name = |node: &Node| node.metadata.name.clone().unwrap_or_default();
    match event {
        Event::Init => *relist = Some(Vec::new()),
        Event::InitApply(node) => {
            if let (Some(buffer), Some(gpus)) = (relist.as_mut(), node_gpus(&node)) {
                buffer.push((name(&node), gpus));
            }
        }
        Event::InitDone => {
            let nodes = relist.take().unwrap_or_default();
            tracing::info!(gpu_nodes = nodes.len(), "cluster watcher: nodes listed");
            cluster.replace_nodes(nodes);
        }
        Event::Apply(node) => cluster.set_node(&name(&node), node_gpus(&node)),
        Event::Delete(node) => cluster.set_node(&name(&node), None),
    }
}

impl ClusterWatcher {
    pub fn new(client: Client, namespace: Option<String>, cluster: Arc<ClusterView>) -> Self {
        Self {
            client,
            namespace,
            cluster,
        }
    }

    /// The pod event stream, with kube-rs's backoff between failed attempts.
    pub fn pod_events(&self) -> impl Stream<Item = Result<Event<Pod>, watcher::Error>> + Send {
        let api: Api<Pod> = match &self.namespace {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        };
        watcher::watcher(api, watcher::Config::default()).default_backoff()
    }

    pub fn node_events(&self) -> impl Stream<Item = Result<Event<Node>, watcher::Error>> + Send {
        let api: Api<Node> = Api::all(self.client.clone());
        watcher::watcher(api, watcher::Config::default()).default_backoff()
    }

    /// Runs until `shutdown` (or both streams end).
    pub async fn run(self, shutdown: CancellationToken) {
        let pods = self.pod_events();
        let nodes = self.node_events();
        tokio::pin!(pods);
        tokio::pin!(nodes);
        let (mut pod_relist, mut node_relist) = (None, None);
        let (mut pods_open, mut nodes_open) = (true, true);
        while pods_open || nodes_open {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                event = pods.next(), if pods_open => match event {
                    Some(Ok(event)) => apply_pod_event(&self.cluster, &mut pod_relist, event),
                    Some(Err(error)) => tracing::warn!(%error, "cluster watcher: pod watch failed; retrying"),
                    None => pods_open = false,
                },
                event = nodes.next(), if nodes_open => match event {
                    Some(Ok(event)) => apply_node_event(&self.cluster, &mut node_relist, event),
                    Some(Err(error)) => tracing::warn!(%error, "cluster watcher: node watch failed; retrying"),
                    None => nodes_open = false,
                },
            }
        }
    }
}
