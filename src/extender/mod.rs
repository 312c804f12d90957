//! Kubernetes: a kube-scheduler extender fed by a cluster watcher. kube-scheduler posts
//! each pod's candidate nodes to `<prefix>/filter` and `<prefix>/prioritize` (its HTTP
//! extender protocol, `wire`); coloc answers from its placement predictions for the pod's
//! workload on each node's GPUs (`decide`), with the GPUs' residents read from the one
//! cluster view (`cluster`, [`crate::cluster`]), which the watcher (`watcher`) feeds from
//! pod and node annotations (`pod`, `node`), the agents from the kubelet's PodResources
//! API, and AssignJob from the store. Served over
//! HTTP by `http`, started and stopped by `startup` like the metrics endpoint; off unless
//! `extender.listen` is set. deploy/kubernetes/overlays/scheduler-extender wires it into a
//! second scheduler. `binding` makes the choice bind (HAMi, DRA) through an admission webhook.

pub mod binding;
pub mod cluster;
pub mod decide;
pub mod http;
pub mod node;
pub mod placer;
pub mod pod;
pub mod watcher;
pub mod wire;

pub use cluster::ClusterView;
pub use decide::{Extender, GpuSlot, PlacementAsk, PlacementError, Placer, Prefer, SlotOutcome};
pub use watcher::ClusterWatcher;
