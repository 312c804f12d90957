//! kube-scheduler's extender wire format (`k8s.io/kube-scheduler/extender/v1`, types.go).
//! The Go types carry no json tags, so Go's encoder writes the field names as declared
//! (PascalCase) and its decoder matches them ignoring case; nil pointers and maps travel as
//! `null`. The embedded Pod and Node objects are the API's own (k8s-openapi), which decode
//! with or without `apiVersion`/`kind` (the scheduler's cached objects carry neither).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    List,
};
use serde::{Deserialize, Serialize};

/// Scores an extender may give (`MinExtenderPriority`, `MaxExtenderPriority`).
pub const MIN_EXTENDER_PRIORITY: i64 = 0;
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// `ExtenderArgs`: the body of both the filter and the prioritize call. `Nodes` is set when
/// the extender is not `nodeCacheCapable`, `NodeNames` when it is.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<List<Node>>,
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        alias = "nodeNames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

/// `FailedNodesMap`: node name -> why it was filtered out.
pub type FailedNodesMap = BTreeMap<String, String>;

/// `ExtenderFilterResult`: the filter call's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<List<Node>>,
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes", default)]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that preemption would not help; coloc never uses it (a node that does not fit
    /// now may fit once a resident ends).
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// Non-empty fails the pod's whole scheduling cycle; coloc leaves it empty.
    #[serde(rename = "Error", default)]
    pub error: String,
}

/// `HostPriority`: one node's score; the prioritize call answers a `HostPriorityList`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host")]
    pub host: String,
    #[serde(rename = "Score")]
    pub score: i64,
}

pub type HostPriorityList = Vec<HostPriority>;
