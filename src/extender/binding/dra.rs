//! Where a DRA pod runs: a `resource.k8s.io/v1` ResourceClaim, once the scheduler has
//! allocated it, names its devices in `status.allocation.devices.results` (driver, pool,
//! device: the DRA plugin's structured allocator writes them, kubernetes
//! staging/src/k8s.io/dynamic-resource-allocation/structured) and the pod using it in
//! `status.reservedFor` (resource `pods`). Resolved through the NVIDIA driver's
//! ResourceSlices (the [`Inventory`]) to GPU UUIDs, that is the pod's residency, for the
//! cluster view ([`Source::DraAllocation`]). The workload is the claim's
//! `coloc.io/workload`, written into it from its ResourceClaimTemplate.

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::inventory::{Inventory, NVIDIA_DRA_DRIVER};
use crate::{
    cluster::{Source, WatchedPod},
    extender::pod::WORKLOAD_ANNOTATION,
};

/// Where an allocated claim places the pods it is reserved for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimPlacement {
    /// Each pod of `status.reservedFor` (`namespace/name`, the view's key) with where it
    /// runs; empty while the claim is unallocated or reserved for no pod, or when none of
    /// its devices is a GPU the inventory knows.
    pub pods: Vec<(String, WatchedPod)>,
    /// The claim is reserved for a pod, but a device of the NVIDIA driver its allocation
    /// names is not in the inventory (its ResourceSlice not seen yet): read it again once
    /// the inventory changes.
    pub unresolved: bool,
}

/// Where an allocated claim places every pod it is reserved for (several share a claim
/// the same way: on its devices).
pub fn claim_placement(claim: &ResourceClaim, inventory: &Inventory) -> ClaimPlacement {
    let Some(status) = claim.status.as_ref() else {
        return ClaimPlacement::default();
    };
    let pods: Vec<_> = status
        .reserved_for
        .iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .collect();
    let results = status
        .allocation
        .as_ref()
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    let (Some(results), false) = (results, pods.is_empty()) else {
        return ClaimPlacement::default();
    };
    let mut node = None;
    let mut gpus: Vec<String> = Vec::new();
    let mut unresolved = false;
    for result in results {
        let Some(device) = inventory.dra_device(&result.driver, &result.pool, &result.device)
        else {
            unresolved |= result.driver == NVIDIA_DRA_DRIVER;
            continue;
        };
        node.get_or_insert(device.node);
        if !gpus.contains(&device.id) {
            gpus.push(device.id);
        }
    }
    let Some(node) = node else {
        return ClaimPlacement {
            pods: Vec::new(),
            unresolved,
        };
    };
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let workload = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WORKLOAD_ANNOTATION))
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty());
    let pods = pods
        .into_iter()
        .map(|pod| {
            let placed = WatchedPod {
                node: node.clone(),
                gpus: gpus.clone(),
                gpu_source: Source::DraAllocation,
                workload: workload.clone(),
                uid: Some(pod.uid.clone()).filter(|uid| !uid.is_empty()),
                min_job_fraction: None,
                throughput_query: None,
                hami_allocated: Vec::new(),
            };
            (format!("{namespace}/{}", pod.name), placed)
        })
        .collect();
    ClaimPlacement { pods, unresolved }
}

/// The first pod an allocated claim is reserved for, and where it runs
/// ([`claim_placement`]); `None` while the claim is unallocated or reserved for no pod, or
/// when none of its devices is a GPU the inventory knows.
pub fn claim_residency(
    claim: &ResourceClaim,
    inventory: &Inventory,
) -> Option<(String, WatchedPod)> {
    claim_placement(claim, inventory).pods.into_iter().next()
}

/// The pod a claim the resource claim controller made belongs to: its controller owner of
/// kind Pod (`namespace/name`), as the claim's holder of a reservation, so that the hold
/// ends when the view sees that pod land.
pub fn owner_pod(claim: &serde_json::Value) -> Option<String> {
    let namespace = claim.pointer("/metadata/namespace")?.as_str()?;
    claim
        .pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| {
            o.get("kind").and_then(|k| k.as_str()) == Some("Pod")
                && o.get("controller").and_then(|c| c.as_bool()) == Some(true)
        })
        .and_then(|o| o.get("name")?.as_str())
        .map(|name| format!("{namespace}/{name}"))
}
