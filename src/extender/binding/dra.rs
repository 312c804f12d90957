//! Where a DRA pod runs: a `resource.k8s.io/v1` ResourceClaim, once the scheduler has
//! allocated it, names its devices in `status.allocation.devices.results` (driver, pool,
//! device: the DRA plugin's structured allocator writes them, kubernetes
//! staging/src/k8s.io/dynamic-resource-allocation/structured) and the pod using it in
//! `status.reservedFor` (resource `pods`). Resolved through the NVIDIA driver's
//! ResourceSlices (the [`Inventory`]) to GPU UUIDs, that is the pod's residency, for the
//! cluster view ([`Source::DraAllocation`]). The workload is the claim's
//! `coloc.io/workload`, written into it from its ResourceClaimTemplate.

use k8s_openapi::api::resource::v1::ResourceClaim;

use super::inventory::Inventory;
use crate::{
    cluster::{Source, WatchedPod},
    extender::pod::WORKLOAD_ANNOTATION,
};

/// The pod an allocated claim is reserved for (`namespace/name`, the view's key), and
/// where it runs; `None` while the claim is unallocated or reserved for no pod, or when
/// none of its devices is a GPU the inventory knows.
pub fn claim_residency(
    claim: &ResourceClaim,
    inventory: &Inventory,
) -> Option<(String, WatchedPod)> {
    let status = claim.status.as_ref()?;
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let pod =
        status.reserved_for.iter().flatten().find(|r| {
            r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty()
        })?;
    let results = status
        .allocation
        .as_ref()?
        .devices
        .as_ref()?
        .results
        .as_ref()?;
    let mut node = None;
    let mut gpus: Vec<String> = Vec::new();
    for result in results {
        let Some(device) = inventory.dra_device(&result.driver, &result.pool, &result.device)
        else {
            continue;
        };
        node.get_or_insert(device.node);
        if !gpus.contains(&device.id) {
            gpus.push(device.id);
        }
    }
    let workload = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(WORKLOAD_ANNOTATION))
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty());
    Some((
        format!("{namespace}/{}", pod.name),
        WatchedPod {
            node: node?,
            gpus,
            gpu_source: Source::DraAllocation,
            workload,
            uid: Some(pod.uid.clone()).filter(|uid| !uid.is_empty()),
            min_job_fraction: None,
            throughput_query: None,
            hami_allocated: Vec::new(),
        },
    ))
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
