//! The extender's decisions: which candidate nodes pass filter and how prioritize scores
//! them, from coloc's placement answer for the pod's workload on each node's GPUs.
//!
//! Each node offers its occupied GPUs (residents from the [`ClusterView`]) and, when it
//! has free ones, one empty GPU; GPUs with the same model, memory and residents are asked
//! about once (a cluster repeats the same sets on many GPUs). A node passes filter when a
//! GPU fits, or when coloc cannot judge it (no GPUs known, no model for its GPU model, a
//! resident without a profile): coloc never blocks what it does not know. A node whose
//! every GPU is refused (memory, a throughput cap, too many jobs) goes to `FailedNodes`
//! with the reasons. Its score follows `extender.prefer` ([`Prefer`]): by default (`gain`)
//! its best GPU's gain, mapped within the request to 1..10, so an empty GPU (a whole job's
//! work gained) usually beats a shared one; `pack` ranks every node with an acceptable
//! occupied GPU above those with only an empty one (6..10 by the occupied GPU's gain,
//! then 1..5), `spread` the reverse; the placement rule and floors decide what is
//! acceptable either way. Nodes that cannot be judged score 0. A pod without
//! `coloc.io/workload`, an unknown workload, a malformed annotation or any failure of
//! coloc answers neutrally (every node passes, every score 0) and is logged, and counted
//! by reason when metrics are on: kube-scheduler fails the pod's whole cycle on a filter
//! error.

use std::{borrow::Cow, collections::HashSet, future::Future, pin::Pin, sync::Arc};

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    List,
};

use super::{
    cluster::{ClusterView, ResidentRef},
    node::{node_gpus, NodeGpus},
    pod::{pod_ask, PodAsk},
    wire::{
        ExtenderArgs, ExtenderFilterResult, HostPriority, HostPriorityList, MAX_EXTENDER_PRIORITY,
        MIN_EXTENDER_PRIORITY,
    },
};
use crate::metrics::ExtenderMetrics;

/// Which acceptable GPU a node's score favours (`extender.prefer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefer {
    /// The largest predicted gain (an empty GPU gains a whole job's work): today's default.
    #[default]
    Gain,
    /// An acceptable occupied GPU before any empty one (bin packing).
    Pack,
    /// An acceptable empty GPU before any occupied one.
    Spread,
}

/// One GPU to place the job on: its model (as the node names it), memory when the node
/// says, and the workloads already running there (sorted; repeats are copies) with each
/// one's `coloc.io/min-job-fraction` (`resident_floors[i]` is `residents[i]`'s).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSlot {
    pub gpu_model: Option<String>,
    pub memory_gb: Option<f64>,
    pub residents: Vec<String>,
    pub resident_floors: Vec<Option<f64>>,
}

/// The question put to coloc: where would this job go best, among these GPUs?
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementAsk {
    pub workload: String,
    pub min_job_fraction: Option<f64>,
    /// The pod's sharing mode; `None`: the server's default.
    pub sharing_mode: Option<crate::domain::SharingMode>,
    pub slots: Vec<GpuSlot>,
}

/// Coloc's answer for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotOutcome {
    /// The job fits; the set's predicted objective rises by `gain`.
    Fits { gain: f64 },
    /// The job does not fit (memory, a cap, too many jobs): the node may be filtered out.
    DoesNotFit { reason: String },
    /// Coloc cannot judge this GPU (no model for its GPU model, a resident without a
    /// profile): neutral.
    Unscored { reason: String },
}

/// Why no GPU could be judged at all: every node is answered neutrally.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("workload {0:?} is not registered with coloc")]
    UnknownWorkload(String),
    #[error("coloc cannot place now: {0}")]
    Unavailable(String),
    /// No GPU of the call has a model with runs of the pod's sharing mode.
    #[error("{0}")]
    UnmeasuredMode(String),
}

pub type PlaceFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<SlotOutcome>, PlacementError>> + Send + 'a>>;

/// What the extender needs of coloc: one outcome per slot, in the slots' order. The
/// service's implementation calls the advisor's Place in-process.
pub trait Placer: Send + Sync + 'static {
    fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a>;

    /// The policy this placer applies to `ask`, in words (`Policy::describe`), which the
    /// extender's answers and logs echo as Rank's and Place's answers do; `None` where it
    /// has none to say.
    fn policy(&self, _ask: &PlacementAsk) -> Option<String> {
        None
    }

    /// A number that moves on whenever this placer's answer to the same ask could change
    /// (a new model, a changed profile): a caller may keep an outcome for a slot while the
    /// number it read **before** asking is still current. `None`: keep nothing.
    fn answers_generation(&self) -> Option<u64> {
        None
    }
}

/// A node's verdict for the pod.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Coloc cannot judge the node: it passes, score 0.
    Neutral,
    Fits {
        best_gain: f64,
        /// The best gain on a GPU that already runs a job, and on an empty one.
        best_occupied: Option<f64>,
        best_empty: Option<f64>,
    },
    DoesNotFit {
        reason: String,
    },
}

/// Answers kube-scheduler's filter and prioritize calls.
pub struct Extender {
    placer: Arc<dyn Placer>,
    cluster: Arc<ClusterView>,
    prefer: Prefer,
    metrics: Option<Arc<ExtenderMetrics>>,
}

/// The candidates of a call, in the order they came.
struct Candidates {
    names: Vec<String>,
    gpus: Vec<Option<NodeGpus>>,
}

impl Extender {
    pub fn new(placer: Arc<dyn Placer>, cluster: Arc<ClusterView>) -> Self {
        Self {
            placer,
            cluster,
            prefer: Prefer::default(),
            metrics: None,
        }
    }

    /// Scores nodes as `prefer` says.
    pub fn with_prefer(mut self, prefer: Prefer) -> Self {
        self.prefer = prefer;
        self
    }

    /// Counts calls, latencies and neutral answers in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<ExtenderMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn metrics(&self) -> Option<&Arc<ExtenderMetrics>> {
        self.metrics.as_ref()
    }

    fn neutral(&self, verb: &str, reason: &str) {
        if let Some(metrics) = &self.metrics {
            metrics.neutral(verb, reason);
        }
    }

    pub fn cluster(&self) -> &Arc<ClusterView> {
        &self.cluster
    }

    fn candidates(&self, args: &ExtenderArgs) -> Candidates {
        match (&args.nodes, &args.node_names) {
            (Some(list), _) => {
                let names: Vec<String> = list
                    .items
                    .iter()
                    .map(|n| n.metadata.name.clone().unwrap_or_default())
                    .collect();
                let gpus = list
                    .items
                    .iter()
                    .zip(&names)
                    .map(|(node, name)| node_gpus(node).or_else(|| self.cluster.node(name)))
                    .collect();
                Candidates { names, gpus }
            }
            (None, Some(names)) => Candidates {
                gpus: names.iter().map(|name| self.cluster.node(name)).collect(),
                names: names.clone(),
            },
            (None, None) => Candidates {
                names: Vec::new(),
                gpus: Vec::new(),
            },
        }
    }

    /// Each candidate's verdict; `None` = answer neutrally for all (logged and counted
    /// here, for the call `verb`).
    async fn verdicts(
        &self,
        verb: &str,
        pod: Option<&Pod>,
        candidates: &Candidates,
    ) -> Option<Vec<Verdict>> {
        let pod_name = pod
            .and_then(|p| p.metadata.name.as_deref())
            .unwrap_or("")
            .to_string();
        let ask = match pod.map(pod_ask) {
            None => {
                self.neutral(verb, "no_pod");
                return None;
            }
            Some(Ok(None)) => {
                self.neutral(verb, "no_workload");
                return None;
            }
            Some(Ok(Some(ask))) => ask,
            Some(Err(reason)) => {
                tracing::warn!(pod = %pod_name, %reason, "extender: neutral answer");
                self.neutral(verb, "malformed_annotation");
                return None;
            }
        };
        let (placement, node_slots) = self.slots(&ask, candidates);
        if placement.slots.is_empty() {
            self.neutral(verb, "no_gpus_known");
            return Some(vec![Verdict::Neutral; candidates.names.len()]);
        }
        let outcomes = match self.placer.place(&placement).await {
            Ok(outcomes) if outcomes.len() == placement.slots.len() => outcomes,
            Ok(outcomes) => {
                tracing::error!(pod = %pod_name, asked = placement.slots.len(), answered = outcomes.len(),
                    "extender: placement answered a different number of GPUs; neutral answer");
                self.neutral(verb, "placement_mismatch");
                return None;
            }
            Err(error) => {
                tracing::warn!(pod = %pod_name, workload = %ask.workload, %error, "extender: neutral answer");
                self.neutral(
                    verb,
                    match error {
                        PlacementError::UnknownWorkload(_) => "unknown_workload",
                        PlacementError::Unavailable(_) => "coloc_unavailable",
                        PlacementError::UnmeasuredMode(_) => "unmeasured_sharing_mode",
                    },
                );
                return None;
            }
        };
        Some(
            node_slots
                .iter()
                .map(|slots| {
                    verdict(
                        slots
                            .iter()
                            .map(|&i| (&outcomes[i], !placement.slots[i].residents.is_empty())),
                    )
                })
                .collect(),
        )
    }

    /// The distinct GPUs of all candidates, and which of them each node offers.
    fn slots(&self, ask: &PodAsk, candidates: &Candidates) -> (PlacementAsk, Vec<Vec<usize>>) {
        let mut placement = PlacementAsk {
            workload: ask.workload.clone(),
            min_job_fraction: ask.min_job_fraction,
            sharing_mode: ask.sharing_mode,
            slots: Vec::new(),
        };
        let mut index: foldhash::HashMap<String, usize> = Default::default();
        let mut slot_of = |gpus: &NodeGpus,
                           mut residents: Vec<(&str, Option<f64>)>,
                           placement: &mut PlacementAsk| {
            residents.sort_unstable_by(|a, b| {
                a.0.cmp(b.0)
                    .then(a.1.map(f64::to_bits).cmp(&b.1.map(f64::to_bits)))
            });
            let mut key = String::with_capacity(64);
            key.push_str(gpus.gpu_model.as_deref().unwrap_or(""));
            key.push('\u{1f}');
            if let Some(memory) = gpus.memory_gb {
                key.push_str(&memory.to_bits().to_string());
            }
            for (resident, floor) in &residents {
                key.push('\u{1f}');
                key.push_str(resident);
                if let Some(floor) = floor {
                    key.push('\u{1e}');
                    key.push_str(&floor.to_bits().to_string());
                }
            }
            *index.entry(key).or_insert_with(|| {
                placement.slots.push(GpuSlot {
                    gpu_model: gpus.gpu_model.clone(),
                    memory_gb: gpus.memory_gb,
                    residents: residents.iter().map(|(w, _)| w.to_string()).collect(),
                    resident_floors: residents.iter().map(|(_, f)| *f).collect(),
                });
                placement.slots.len() - 1
            })
        };
        let wanted: HashSet<&str> = candidates
            .names
            .iter()
            .zip(&candidates.gpus)
            .filter(|(_, gpus)| gpus.is_some())
            .map(|(name, _)| name.as_str())
            .collect();
        let node_slots = self.cluster.with_occupied_by_node(&wanted, |by_node| {
            candidates
                .names
                .iter()
                .zip(&candidates.gpus)
                .map(|(name, gpus)| {
                    let Some(gpus) = gpus else {
                        return Vec::new();
                    };
                    let mut slots = Vec::new();
                    let mut occupied = 0u32;
                    for residents in by_node
                        .get(name.as_str())
                        .into_iter()
                        .flat_map(|g| g.values())
                    {
                        occupied += 1;
                        let names: Vec<Cow<'_, str>> =
                            residents.iter().map(ResidentRef::placement_name).collect();
                        let residents = names
                            .iter()
                            .zip(residents)
                            .map(|(name, r)| (name.as_ref(), r.min_job_fraction))
                            .collect();
                        slots.push(slot_of(gpus, residents, &mut placement));
                    }
                    if gpus.count > occupied {
                        slots.push(slot_of(gpus, Vec::new(), &mut placement));
                    }
                    slots
                })
                .collect()
        });
        (placement, node_slots)
    }

    /// The policy a filter or prioritize call for `pod` is judged by, in words; `None` for
    /// a pod coloc does not judge (answered neutrally).
    pub fn policy_for(&self, pod: Option<&Pod>) -> Option<String> {
        let ask = pod.map(pod_ask)?.ok()??;
        self.placer.policy(&PlacementAsk {
            workload: ask.workload,
            min_job_fraction: ask.min_job_fraction,
            sharing_mode: ask.sharing_mode,
            slots: Vec::new(),
        })
    }

    /// kube-scheduler's filter call.
    pub async fn filter(&self, args: ExtenderArgs) -> ExtenderFilterResult {
        let candidates = self.candidates(&args);
        let verdicts = self
            .verdicts("filter", args.pod.as_ref(), &candidates)
            .await;
        let passes: Vec<bool> = match &verdicts {
            None => vec![true; candidates.names.len()],
            Some(verdicts) => verdicts
                .iter()
                .map(|v| !matches!(v, Verdict::DoesNotFit { .. }))
                .collect(),
        };
        let mut result = ExtenderFilterResult::default();
        if let Some(verdicts) = &verdicts {
            for (name, verdict) in candidates.names.iter().zip(verdicts) {
                if let Verdict::DoesNotFit { reason } = verdict {
                    result.failed_nodes.insert(name.clone(), reason.clone());
                }
            }
        }
        if let Some(list) = args.nodes {
            result.nodes = Some(List {
                items: list
                    .items
                    .into_iter()
                    .zip(&passes)
                    .filter(|(_, pass)| **pass)
                    .map(|(node, _)| node)
                    .collect::<Vec<Node>>(),
                metadata: list.metadata,
            });
        }
        if args.node_names.is_some() {
            result.node_names = Some(
                candidates
                    .names
                    .into_iter()
                    .zip(&passes)
                    .filter(|(_, pass)| **pass)
                    .map(|(name, _)| name)
                    .collect(),
            );
        }
        result
    }

    /// kube-scheduler's prioritize call.
    pub async fn prioritize(&self, args: ExtenderArgs) -> HostPriorityList {
        let candidates = self.candidates(&args);
        let verdicts = self
            .verdicts("prioritize", args.pod.as_ref(), &candidates)
            .await
            .unwrap_or_else(|| vec![Verdict::Neutral; candidates.names.len()]);
        candidates
            .names
            .into_iter()
            .zip(preferred_scores(self.prefer, &verdicts))
            .map(|(host, score)| HostPriority { host, score })
            .collect()
    }
}

/// A node's verdict from its GPUs' outcomes, each with whether the GPU is occupied.
fn verdict<'a>(outcomes: impl Iterator<Item = (&'a SlotOutcome, bool)>) -> Verdict {
    let mut best: Option<f64> = None;
    let (mut best_occupied, mut best_empty): (Option<f64>, Option<f64>) = (None, None);
    let mut unscored = false;
    let mut reasons: Vec<&str> = Vec::new();
    let max = |best: Option<f64>, gain: f64| Some(best.map_or(gain, |b| b.max(gain)));
    for (outcome, occupied) in outcomes {
        match outcome {
            SlotOutcome::Fits { gain } => {
                best = max(best, *gain);
                if occupied {
                    best_occupied = max(best_occupied, *gain);
                } else {
                    best_empty = max(best_empty, *gain);
                }
            }
            SlotOutcome::Unscored { .. } => unscored = true,
            SlotOutcome::DoesNotFit { reason } => reasons.push(reason),
        }
    }
    match (best, unscored, reasons.is_empty()) {
        (Some(best_gain), _, _) => Verdict::Fits {
            best_gain,
            best_occupied,
            best_empty,
        },
        (None, true, _) | (None, false, true) => Verdict::Neutral,
        (None, false, false) => {
            reasons.sort_unstable();
            reasons.dedup();
            Verdict::DoesNotFit {
                reason: format!("coloc: no GPU on this node fits: {}", reasons.join("; ")),
            }
        }
    }
}

/// The nodes' scores as `prefer` says: `gain` maps the best gain to 1..10 ([`scores`]);
/// `pack` gives the nodes with an acceptable occupied GPU 6..10 (by that GPU's gain) and
/// those with only an acceptable empty GPU 1..5; `spread` the reverse. Neutral and
/// refused nodes score 0.
fn preferred_scores(prefer: Prefer, verdicts: &[Verdict]) -> Vec<i64> {
    let fits = |v: &Verdict| match v {
        Verdict::Fits {
            best_gain,
            best_occupied,
            best_empty,
        } => Some((*best_gain, *best_occupied, *best_empty)),
        _ => None,
    };
    let (first, second): (Vec<Option<f64>>, Vec<Option<f64>>) = match prefer {
        Prefer::Gain => {
            let gains: Vec<Option<f64>> = verdicts.iter().map(|v| fits(v).map(|f| f.0)).collect();
            return scores(&gains);
        }
        Prefer::Pack => verdicts
            .iter()
            .map(|v| match fits(v) {
                Some((_, Some(occupied), _)) => (Some(occupied), None),
                Some((_, None, empty)) => (None, empty),
                None => (None, None),
            })
            .unzip(),
        Prefer::Spread => verdicts
            .iter()
            .map(|v| match fits(v) {
                Some((_, _, Some(empty))) => (Some(empty), None),
                Some((_, occupied, None)) => (None, occupied),
                None => (None, None),
            })
            .unzip(),
    };
    let (upper, lower) = (band_scores(&first, 6, 10), band_scores(&second, 1, 5));
    upper
        .into_iter()
        .zip(lower)
        .map(|(u, l)| u.or(l).unwrap_or(MIN_EXTENDER_PRIORITY))
        .collect()
}

/// Gains mapped linearly to `low..=high` within the request (all `high` when they tie).
fn band_scores(gains: &[Option<f64>], low: i64, high: i64) -> Vec<Option<i64>> {
    let finite = gains.iter().flatten().filter(|g| g.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), g| {
        (lo.min(*g), hi.max(*g))
    });
    gains
        .iter()
        .map(|gain| match gain {
            Some(g) if g.is_finite() => Some(if hi > lo {
                low + ((g - lo) / (hi - lo) * (high - low) as f64).round() as i64
            } else {
                high
            }),
            _ => None,
        })
        .collect()
}

/// Gains mapped to scores within one request: the nodes that fit get 1..10, linear in
/// their best GPU's gain (all 10 when they tie); nodes that cannot be judged get 0.
pub fn scores(gains: &[Option<f64>]) -> Vec<i64> {
    let finite = gains.iter().flatten().filter(|g| g.is_finite());
    let (low, high) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), g| {
        (lo.min(*g), hi.max(*g))
    });
    let steps = (MAX_EXTENDER_PRIORITY - MIN_EXTENDER_PRIORITY - 1) as f64;
    gains
        .iter()
        .map(|gain| match gain {
            Some(g) if g.is_finite() => {
                if high > low {
                    MIN_EXTENDER_PRIORITY + 1 + ((g - low) / (high - low) * steps).round() as i64
                } else {
                    MAX_EXTENDER_PRIORITY
                }
            }
            _ => MIN_EXTENDER_PRIORITY,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A coloc that fails every placement (the store or the model broken).
    struct Failing;

    impl Placer for Failing {
        fn place<'a>(&'a self, _: &'a PlacementAsk) -> PlaceFuture<'a> {
            Box::pin(async {
                Err(PlacementError::Unavailable(
                    "the model cannot be read".into(),
                ))
            })
        }
    }

    #[tokio::test]
    async fn a_failing_coloc_passes_every_node_with_neutral_scores() {
        let cluster = Arc::new(ClusterView::new());
        for node in ["a", "b"] {
            cluster.set_node(
                node,
                Some(NodeGpus {
                    count: 2,
                    gpu_model: None,
                    memory_gb: None,
                }),
            );
        }
        let extender = Extender::new(Arc::new(Failing), cluster);
        let args: ExtenderArgs = serde_json::from_value(serde_json::json!({
            "Pod": {"metadata": {"name": "p", "annotations": {"coloc.io/workload": "w"}}},
            "Nodes": null,
            "NodeNames": ["a", "b"],
        }))
        .unwrap();
        let filtered = extender.filter(args.clone()).await;
        assert_eq!(filtered.node_names, Some(vec!["a".into(), "b".into()]));
        assert!(filtered.failed_nodes.is_empty() && filtered.error.is_empty());
        let scores = extender.prioritize(args).await;
        assert_eq!(
            scores.iter().map(|p| p.score).collect::<Vec<_>>(),
            [0, 0],
            "{scores:?}"
        );
    }

    /// A coloc that records what it was asked and cannot judge any GPU.
    struct Recording(std::sync::Mutex<Vec<PlacementAsk>>);

    impl Placer for Recording {
        fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a> {
            self.0.lock().unwrap().push(ask.clone());
            let outcomes = ask
                .slots
                .iter()
                .map(|_| SlotOutcome::Unscored {
                    reason: "recorded".into(),
                })
                .collect();
            Box::pin(async move { Ok(outcomes) })
        }
    }

    #[tokio::test]
    async fn a_pod_coloc_did_not_place_occupies_its_gpu_and_no_empty_one_is_offered() {
        let cluster = Arc::new(ClusterView::new());
        cluster.set_node(
            "a",
            Some(NodeGpus {
                count: 1,
                gpu_model: None,
                memory_gb: None,
            }),
        );
        cluster.report_pod_devices(
            "a",
            vec![crate::cluster::PodDevices {
                pod: "web/cuda".into(),
                gpus: vec!["GPU-x".into()],
            }],
            crate::domain::now_ms(),
        );
        let placer = Arc::new(Recording(Default::default()));
        let extender = Extender::new(placer.clone(), cluster);
        let args: ExtenderArgs = serde_json::from_value(serde_json::json!({
            "Pod": {"metadata": {"name": "p", "annotations": {"coloc.io/workload": "w"}}},
            "Nodes": null,
            "NodeNames": ["a"],
        }))
        .unwrap();
        let scores = extender.prioritize(args).await;
        assert_eq!(scores[0].score, 0, "unscored: neutral");
        let asked = placer.0.lock().unwrap();
        let residents: Vec<&Vec<String>> = asked[0].slots.iter().map(|s| &s.residents).collect();
        assert_eq!(residents, [&vec!["unknown pod web/cuda".to_string()]]);
    }

    #[test]
    fn scores_are_monotone_in_the_gain_and_span_one_to_ten() {
        let gains = [Some(3.0), None, Some(-1.0), Some(7.0), Some(5.0)];
        assert_eq!(scores(&gains), [6, 0, 1, 10, 8]);
        assert_eq!(scores(&[Some(2.0), Some(2.0)]), [10, 10]);
        assert_eq!(scores(&[None, None]), [0, 0]);
    }

    #[test]
    fn a_node_fails_only_when_every_gpu_is_refused() {
        let refused = SlotOutcome::DoesNotFit {
            reason: "memory".into(),
        };
        let unscored = SlotOutcome::Unscored {
            reason: "no model".into(),
        };
        let fits = SlotOutcome::Fits { gain: 2.0 };
        assert_eq!(
            verdict([(&refused, true), (&fits, false)].into_iter()),
            Verdict::Fits {
                best_gain: 2.0,
                best_occupied: None,
                best_empty: Some(2.0)
            }
        );
        assert_eq!(
            verdict([(&refused, true), (&unscored, false)].into_iter()),
            Verdict::Neutral
        );
        assert!(matches!(
            verdict([(&refused, true), (&refused, false)].into_iter()),
            Verdict::DoesNotFit { reason } if reason == "coloc: no GPU on this node fits: memory"
        ));
        assert_eq!(verdict(std::iter::empty()), Verdict::Neutral);
    }

    fn fits(occupied: Option<f64>, empty: Option<f64>) -> Verdict {
        Verdict::Fits {
            best_gain: occupied.into_iter().chain(empty).fold(f64::MIN, f64::max),
            best_occupied: occupied,
            best_empty: empty,
        }
    }

    #[test]
    fn pack_puts_an_acceptable_occupied_gpu_above_any_empty_one_and_spread_the_reverse() {
        // Node a: only an empty GPU (gain 1.0); b: a shared GPU (0.2) and an empty one;
        // c: a shared GPU only (0.1); d: refused.
        let verdicts = [
            fits(None, Some(1.0)),
            fits(Some(0.2), Some(1.0)),
            fits(Some(0.1), None),
            Verdict::DoesNotFit {
                reason: "memory".into(),
            },
        ];
        assert_eq!(preferred_scores(Prefer::Gain, &verdicts), [10, 10, 1, 0]);
        assert_eq!(preferred_scores(Prefer::Pack, &verdicts), [5, 10, 6, 0]);
        assert_eq!(preferred_scores(Prefer::Spread, &verdicts), [10, 10, 5, 0]);
    }
}
