//! The observer's input: which pods shared which GPU, from when to when. A [`Timeline`]
//! hands out the segments that closed (a GPU's set of pods, constant from `start_ms` to
//! `end_ms`); the [`Recorder`] keeps one in memory from what it is told: exact changes
//! (`set_gpu`: an event stream, the simulation, tests) or periodic looks at the whole
//! cluster (`look`: the extender's cluster view and the AssignJob occupancy, sampled by
//! the observer). Any later source of the same facts (a merged cluster view, the kubelet's
//! PodResources reports) plugs in as another feed or another `Timeline`.

use std::collections::{BTreeMap, VecDeque};

use crate::{
    cluster::{ClusterView, Source},
    sync::Unpoisoned,
};

/// A pod on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pod {
    /// The pod's `metadata.uid` where the cluster watcher knows it, else its key in the
    /// cluster view (`namespace/name`; a job id where only AssignJob knows it): part of each
    /// run's key, the push endpoint's `pod_uid` and a query's `{pod_uid}`.
    pub uid: String,
    /// The registered workload it runs.
    pub workload: String,
    /// `namespace/name` when known, else "".
    pub name: String,
    /// Its own PromQL template (the pod annotation `coloc.io/throughput-query`), if any.
    pub query: Option<String>,
}

/// A GPU of the cluster: its node and its id there (a UUID, or the scheduler's id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuKey {
    pub node: String,
    pub gpu_id: String,
}

/// A GPU's set of pods, the same from `start_ms` to `end_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub gpu: GpuKey,
    /// The GPU model as the source names it, when it does.
    pub gpu_model: Option<String>,
    /// Sorted by UID.
    pub pods: Vec<Pod>,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// Where segments come from.
pub trait Timeline: Send + Sync {
    /// The segments that closed after `after_end_ms` and at or before `until_ms`, oldest
    /// end first.
    fn closed_segments(&self, after_end_ms: i64, until_ms: i64) -> Vec<Segment>;

    /// The observer formed every segment that closed at or before `end_ms`: a timeline
    /// kept in memory may let them go.
    fn forget_through(&self, _end_ms: i64) {}
}

/// Closed segments kept at most (the oldest go first).
const MAX_CLOSED: usize = 100_000;

#[derive(Debug, Default)]
struct Open {
    gpu_model: Option<String>,
    pods: Vec<Pod>,
    start_ms: i64,
    /// The last look that still saw this set.
    last_seen_ms: i64,
}

#[derive(Debug, Default)]
struct Inner {
    open: BTreeMap<GpuKey, Open>,
    closed: VecDeque<Segment>,
}

impl Inner {
    fn close(&mut self, gpu: &GpuKey, end_ms: i64) {
        if let Some(open) = self.open.remove(gpu) {
            if end_ms > open.start_ms {
                if self.closed.len() == MAX_CLOSED {
                    self.closed.pop_front();
                }
                self.closed.push_back(Segment {
                    gpu: gpu.clone(),
                    gpu_model: open.gpu_model,
                    pods: open.pods,
                    start_ms: open.start_ms,
                    end_ms,
                });
            }
        }
    }

    fn open(&mut self, gpu: GpuKey, gpu_model: Option<String>, pods: Vec<Pod>, at_ms: i64) {
        if !pods.is_empty() {
            self.open.insert(
                gpu,
                Open {
                    gpu_model,
                    pods,
                    start_ms: at_ms,
                    last_seen_ms: at_ms,
                },
            );
        }
    }
}

/// A timeline kept in memory.
#[derive(Debug, Default)]
pub struct Recorder {
    inner: std::sync::Mutex<Inner>,
}

fn sorted(mut pods: Vec<Pod>) -> Vec<Pod> {
    pods.sort();
    pods.dedup_by(|a, b| a.uid == b.uid);
    pods
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    /// An exact change: from `at_ms` on, `gpu` holds `pods` (none = it is free).
    pub fn set_gpu(&self, at_ms: i64, gpu: GpuKey, gpu_model: Option<String>, pods: Vec<Pod>) {
        let pods = sorted(pods);
        let mut inner = self.inner.lock().unpoisoned();
        if inner.open.get(&gpu).is_some_and(|open| open.pods == pods) {
            return;
        }
        inner.close(&gpu, at_ms);
        inner.open(gpu, gpu_model, pods, at_ms);
    }

    /// A look at the whole cluster at `at_ms`: GPUs not listed are free. A set that
    /// changed since the last look closes at the last look that saw it, and the new one
    /// starts now: both edges fall inside the true window.
    pub fn look(&self, at_ms: i64, gpus: Vec<(GpuKey, Option<String>, Vec<Pod>)>) {
        let mut inner = self.inner.lock().unpoisoned();
        let mut seen = BTreeMap::new();
        for (gpu, gpu_model, pods) in gpus {
            seen.insert(gpu, (gpu_model, sorted(pods)));
        }
        let gone: Vec<GpuKey> = inner
            .open
            .keys()
            .filter(|gpu| !seen.contains_key(*gpu))
            .cloned()
            .collect();
        for gpu in gone {
            let last = inner.open[&gpu].last_seen_ms;
            inner.close(&gpu, last);
        }
        for (gpu, (gpu_model, pods)) in seen {
            match inner.open.get_mut(&gpu) {
                Some(open) if open.pods == pods => open.last_seen_ms = at_ms,
                Some(open) => {
                    let last = open.last_seen_ms;
                    inner.close(&gpu, last);
                    inner.open(gpu, gpu_model, pods, at_ms);
                }
                None => inner.open(gpu, gpu_model, pods, at_ms),
            }
        }
    }
}

impl Timeline for Recorder {
    fn closed_segments(&self, after_end_ms: i64, until_ms: i64) -> Vec<Segment> {
        let inner = self.inner.lock().unpoisoned();
        let mut segments: Vec<Segment> = inner
            .closed
            .iter()
            .filter(|s| s.end_ms > after_end_ms && s.end_ms <= until_ms)
            .cloned()
            .collect();
        segments.sort_by_key(|s| s.end_ms);
        segments
    }

    fn forget_through(&self, end_ms: i64) {
        self.inner
            .lock()
            .unpoisoned()
            .closed
            .retain(|s| s.end_ms > end_ms);
    }
}

/// What the cluster runs now, from the one cluster view: every GPU with residents of a
/// known workload, pods (by their `namespace/name` key) and AssignJob's jobs (by job id)
/// alike, each GPU with its model where known.
pub fn current_cluster(cluster: &ClusterView) -> Vec<(GpuKey, Option<String>, Vec<Pod>)> {
    cluster
        .gpus()
        .into_iter()
        .filter_map(|gpu| {
            let pods: Vec<Pod> = gpu
                .residents
                .iter()
                .filter_map(|resident| {
                    let is_pod = resident.source != Source::AssignJob;
                    Some(Pod {
                        // The pod's own UID where the watcher knows it (what a push and a
                        // `{pod_uid}` query name it by), else its cluster-view id.
                        uid: resident.uid.clone().unwrap_or_else(|| resident.id.clone()),
                        workload: resident.workload.clone()?,
                        name: if is_pod {
                            resident.id.clone()
                        } else {
                            String::new()
                        },
                        query: resident.throughput_query.clone(),
                    })
                })
                .collect();
            let key = GpuKey {
                node: gpu.node,
                gpu_id: gpu.id,
            };
            (!pods.is_empty()).then_some((key, gpu.gpu_model, pods))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> Pod {
        Pod {
            uid: uid.into(),
            workload: format!("w-{uid}"),
            name: String::new(),
            query: None,
        }
    }

    fn g(id: &str) -> GpuKey {
        GpuKey {
            node: "n1".into(),
            gpu_id: id.into(),
        }
    }

    #[test]
    fn exact_changes_close_segments_at_the_change() {
        let recorder = Recorder::new();
        recorder.set_gpu(0, g("g0"), None, vec![pod("a")]);
        recorder.set_gpu(10, g("g0"), None, vec![pod("b"), pod("a")]);
        recorder.set_gpu(12, g("g0"), None, vec![pod("a"), pod("b")]);
        recorder.set_gpu(30, g("g0"), None, vec![]);
        let segments = recorder.closed_segments(-1, 100);
        let spans: Vec<(i64, i64, usize)> = segments
            .iter()
            .map(|s| (s.start_ms, s.end_ms, s.pods.len()))
            .collect();
        assert_eq!(spans, [(0, 10, 1), (10, 30, 2)]);
        assert_eq!(recorder.closed_segments(10, 100).len(), 1);
    }

    #[test]
    fn a_watched_pod_is_named_by_its_uid_and_its_query_gets_that_uid() {
        use crate::extender::{pod::GPU_ANNOTATION, watcher};
        // A recorded pod (tests/fixtures/kubernetes/README.md), bound and running.
        let text =
            std::fs::read_to_string("tests/fixtures/kubernetes/pod-kai-time-slicing.json").unwrap();
        let mut raw: serde_json::Value = serde_json::from_str(&text).unwrap();
        raw["spec"]["nodeName"] = "n1".into();
        raw["status"]["phase"] = "Running".into();
        raw["metadata"]["annotations"][GPU_ANNOTATION] = "gpu-0".into();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(raw).unwrap();
        let cluster = ClusterView::new();
        cluster.set_watched_pod(&watcher::pod_key(&pod), watcher::watched_pod(&pod));
        let now = current_cluster(&cluster);
        assert_eq!(now.len(), 1, "{now:?}");
        let seen = &now[0].2[0];
        assert_eq!(seen.uid, "2a6e0c4d-7f1b-4c9e-8d35-61b0f7a2c913");
        assert_eq!(seen.name, "research/notebook-0");
        assert_eq!(
            crate::observer::prometheus::fill(
                r#"rate(steps_total{uid="{pod_uid}", pod="{pod}", namespace="{namespace}"}[1m])"#,
                seen
            ),
            r#"rate(steps_total{uid="2a6e0c4d-7f1b-4c9e-8d35-61b0f7a2c913", pod="notebook-0", namespace="research"}[1m])"#
        );
    }

    #[test]
    fn looks_close_a_set_at_the_last_look_that_saw_it() {
        let recorder = Recorder::new();
        recorder.look(0, vec![(g("g0"), None, vec![pod("a")])]);
        recorder.look(15, vec![(g("g0"), None, vec![pod("a")])]);
        recorder.look(30, vec![(g("g0"), None, vec![pod("a"), pod("b")])]);
        recorder.look(45, vec![]);
        let spans: Vec<(i64, i64)> = recorder
            .closed_segments(-1, 100)
            .iter()
            .map(|s| (s.start_ms, s.end_ms))
            .collect();
        // The first set was last seen at 15, the second only at 30 (a single look: no span
        // but the instant, so nothing closes for it).
        assert_eq!(spans, [(0, 15)]);
    }
}
