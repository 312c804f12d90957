//! The ResourceClaim watcher (`extender.binding = "dra"`): where DRA pods run. Every
//! `resource.k8s.io/v1` ResourceClaim of the cluster is followed (kube-rs's watcher: a full
//! list that replaces what was known, then watch events, a relist after 410 Gone, backoff
//! between failures); an allocated claim reserved for pods places each of them on its
//! devices ([`dra::claim_placement`] through the [`Inventory`]), recorded in the cluster
//! view as [`Source::DraAllocation`] (`ClusterView::set_claim_residency`: the pod is then
//! bound, so a hold the webhook took for it ends). A claim deallocated, no longer reserved
//! for a pod, or deleted releases the pods it placed: the [`ClaimBook`] keeps which pods
//! each claim placed, so a delete needs nothing of the deleted object but its name.
//!
//! A claim allocated before the inventory has its ResourceSlice is kept as it was last
//! seen and read again each time the DRA driver's GPUs change
//! ([`Inventory::dra_changes`]), until every NVIDIA device it names resolves; what resolves
//! meanwhile is recorded already. Devices the inventory never lists (another driver's, a
//! MIG device) are left out, as [`dra::claim_placement`] leaves them.
//!
//! [`Source::DraAllocation`]: crate::cluster::Source::DraAllocation

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{
    runtime::{
        watcher::{self, Event},
        WatchStreamExt,
    },
    Api, Client,
};
use tokio_util::sync::CancellationToken;

use super::{dra, inventory::Inventory};
use crate::cluster::{ClusterView, WatchedPod};

/// One claim as the book knows it.
#[derive(Debug)]
struct Claim {
    /// The pods it places, each with where.
    pods: Vec<(String, WatchedPod)>,
    /// The claim as last seen, while a device it names is not in the inventory yet.
    unresolved: Option<ResourceClaim>,
}

/// Which pods each claim places, and so where each pod runs by its claims.
#[derive(Debug, Default)]
pub struct ClaimBook {
    /// claim (`namespace/name`) -> what it places.
    claims: HashMap<String, Claim>,
    /// pod (`namespace/name`) -> the claims that place it.
    by_pod: HashMap<String, BTreeSet<String>>,
    /// The claims of a relist under way.
    relist: Option<Vec<ResourceClaim>>,
}

/// A claim's key: `namespace/name`.
pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

impl ClaimBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one watch event to the book and the pods it changes to `cluster`.
    pub fn apply_event(
        &mut self,
        event: Event<ResourceClaim>,
        inventory: &Inventory,
        cluster: &ClusterView,
    ) {
        match event {
            Event::Init => self.relist = Some(Vec::new()),
            Event::InitApply(claim) => self.relist.get_or_insert_with(Vec::new).push(claim),
            Event::InitDone => {
                let claims = self.relist.take().unwrap_or_default();
                tracing::info!(claims = claims.len(), "claim watcher: claims listed");
                cluster.replace_claim_residencies(self.replace(claims, inventory));
            }
            Event::Apply(claim) => {
                for (pod, placed) in self.set(&claim, inventory) {
                    cluster.set_claim_residency(&pod, placed);
                }
            }
            Event::Delete(claim) => {
                for (pod, placed) in self.remove(&claim_key(&claim)) {
                    cluster.set_claim_residency(&pod, placed);
                }
            }
        }
    }

    /// Records `claim` as it is now; the pods whose residency changed, each with it now.
    pub fn set(
        &mut self,
        claim: &ResourceClaim,
        inventory: &Inventory,
    ) -> Vec<(String, Option<WatchedPod>)> {
        let key = claim_key(claim);
        let mut touched = self.forget(&key);
        let placement = dra::claim_placement(claim, inventory);
        if !placement.pods.is_empty() || placement.unresolved {
            for (pod, _) in &placement.pods {
                self.by_pod
                    .entry(pod.clone())
                    .or_default()
                    .insert(key.clone());
                touched.insert(pod.clone());
            }
            let unresolved = placement.unresolved.then(|| claim.clone());
            self.claims.insert(
                key,
                Claim {
                    pods: placement.pods,
                    unresolved,
                },
            );
        }
        self.residencies(touched)
    }

    /// Forgets the claim `key` (deleted); the pods it placed, each with its residency now.
    pub fn remove(&mut self, key: &str) -> Vec<(String, Option<WatchedPod>)> {
        let touched = self.forget(key);
        self.residencies(touched)
    }

    /// Reads again the claims whose devices the inventory did not have (call it when the
    /// inventory changed); the pods whose residency changed, each with it now.
    pub fn resolve(&mut self, inventory: &Inventory) -> Vec<(String, Option<WatchedPod>)> {
        let waiting: Vec<ResourceClaim> = self
            .claims
            .values()
            .filter_map(|claim| claim.unresolved.clone())
            .collect();
        let mut changed = Vec::new();
        for claim in waiting {
            changed.extend(self.set(&claim, inventory));
        }
        changed
    }

    /// Replaces every claim (a relist); where each pod the claims place runs.
    pub fn replace(
        &mut self,
        claims: Vec<ResourceClaim>,
        inventory: &Inventory,
    ) -> Vec<(String, WatchedPod)> {
        self.claims.clear();
        self.by_pod.clear();
        for claim in &claims {
            self.set(claim, inventory);
        }
        let pods: Vec<String> = self.by_pod.keys().cloned().collect();
        self.residencies(pods)
            .into_iter()
            .filter_map(|(pod, placed)| Some((pod, placed?)))
            .collect()
    }

    /// The claims waiting for the inventory.
    pub fn unresolved(&self) -> usize {
        self.claims
            .values()
            .filter(|c| c.unresolved.is_some())
            .count()
    }

    /// Drops the claim `key`; the pods it placed.
    fn forget(&mut self, key: &str) -> BTreeSet<String> {
        let Some(old) = self.claims.remove(key) else {
            return BTreeSet::new();
        };
        let mut touched = BTreeSet::new();
        for (pod, _) in old.pods {
            if let Some(claims) = self.by_pod.get_mut(&pod) {
                claims.remove(key);
                if claims.is_empty() {
                    self.by_pod.remove(&pod);
                }
            }
            touched.insert(pod);
        }
        touched
    }

    /// Where each of `pods` runs by its claims now: on the first claim's node (by claim
    /// key), on every GPU of its claims there; the first workload and uid a claim gives.
    fn residencies(
        &self,
        pods: impl IntoIterator<Item = String>,
    ) -> Vec<(String, Option<WatchedPod>)> {
        pods.into_iter()
            .map(|pod| {
                let mut placed: Option<WatchedPod> = None;
                for key in self.by_pod.get(&pod).into_iter().flatten() {
                    let claim = self.claims[key].pods.iter().filter(|(p, _)| *p == pod);
                    for (_, by_claim) in claim {
                        match placed.as_mut() {
                            None => placed = Some(by_claim.clone()),
                            Some(placed) if placed.node == by_claim.node => {
                                for gpu in &by_claim.gpus {
                                    if !placed.gpus.contains(gpu) {
                                        placed.gpus.push(gpu.clone());
                                    }
                                }
                                placed.workload =
                                    placed.workload.take().or(by_claim.workload.clone());
                                placed.uid = placed.uid.take().or(by_claim.uid.clone());
                            }
                            // A pod runs on one node: a claim elsewhere is stale.
                            Some(_) => {}
                        }
                    }
                }
                (pod, placed)
            })
            .collect()
    }
}

/// Watches every ResourceClaim into the cluster view.
pub struct ClaimWatcher {
    client: Client,
    inventory: Arc<Inventory>,
    cluster: Arc<ClusterView>,
}

impl ClaimWatcher {
    pub fn new(client: Client, inventory: Arc<Inventory>, cluster: Arc<ClusterView>) -> Self {
        Self {
            client,
            inventory,
            cluster,
        }
    }

    /// Runs until `shutdown` (or the watch ends).
    pub async fn run(self, shutdown: CancellationToken) {
        let mut dra_changes = self.inventory.dra_changes();
        let api: Api<ResourceClaim> = Api::all(self.client);
        let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
        tokio::pin!(events);
        let mut book = ClaimBook::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                // The sender lives in the inventory this task holds: never closed.
                Ok(()) = dra_changes.changed() => {
                    let waiting = book.unresolved();
                    for (pod, placed) in book.resolve(&self.inventory) {
                        self.cluster.set_claim_residency(&pod, placed);
                    }
                    tracing::debug!(waiting, still = book.unresolved(), "claim watcher: inventory changed");
                }
                event = events.next() => match event {
                    None => break,
                    Some(Ok(event)) => book.apply_event(event, &self.inventory, &self.cluster),
                    Some(Err(error)) => tracing::warn!(%error, "claim watcher: claim watch failed; retrying"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use serde_json::json;

    use super::*;

    const GPU_0: &str = "GPU-4dc50575-f241-9f14-1e6e-ecb4a93c3299";
    const GPU_1: &str = "GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4";

    /// The NVIDIA driver's recorded slice: gpu-0 and gpu-1 of pool gpu-node-2.
    fn inventory_with_slice() -> Inventory {
        let inventory = Inventory::new();
        inventory.apply_slice(&recorded_slice());
        inventory
    }

    fn recorded_slice() -> ResourceSlice {
        serde_json::from_str(include_str!(
            "../../../tests/fixtures/kubernetes/resourceslice-nvidia.json"
        ))
        .unwrap()
    }

    /// A claim of namespace `ml` allocated `devices` of pool gpu-node-2, reserved for `pods`.
    fn claim(name: &str, devices: &[&str], pods: &[&str]) -> ResourceClaim {
        let results: Vec<_> = devices
            .iter()
            .map(|d| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-node-2", "device": d}))
            .collect();
        let reserved: Vec<_> = pods
            .iter()
            .map(|p| json!({"resource": "pods", "name": p, "uid": format!("uid-{p}")}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml",
                         "annotations": {"coloc.io/workload": "w03"}},
            "spec": {"devices": {"requests": [{"name": "gpu",
                     "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
        }))
        .unwrap()
    }

    /// (pod, GPUs) of each change; `None` for a pod released.
    fn gpus(changes: Vec<(String, Option<WatchedPod>)>) -> Vec<(String, Option<Vec<String>>)> {
        changes
            .into_iter()
            .map(|(pod, placed)| (pod, placed.map(|p| p.gpus)))
            .collect()
    }

    fn placed(pod: &str, gpus: &[&str]) -> (String, Option<Vec<String>>) {
        (
            pod.to_string(),
            Some(gpus.iter().map(|g| g.to_string()).collect()),
        )
    }

    fn released(pod: &str) -> (String, Option<Vec<String>>) {
        (pod.to_string(), None)
    }

    #[test]
    fn two_claims_of_one_pod_place_it_on_both_gpus_and_a_delete_releases_by_the_claims_name() {
        let inventory = inventory_with_slice();
        let mut book = ClaimBook::new();
        assert_eq!(
            gpus(book.set(&claim("p-a", &["gpu-0"], &["p"]), &inventory)),
            [placed("ml/p", &[GPU_0])]
        );
        assert_eq!(
            gpus(book.set(&claim("p-b", &["gpu-1"], &["p"]), &inventory)),
            [placed("ml/p", &[GPU_0, GPU_1])]
        );
        assert_eq!(gpus(book.remove("ml/p-a")), [placed("ml/p", &[GPU_1])]);
        assert_eq!(gpus(book.remove("ml/p-b")), [released("ml/p")]);
        assert!(book.remove("ml/p-b").is_empty(), "already gone");
    }

    #[test]
    fn a_claim_deallocated_or_no_longer_reserved_releases_its_pods() {
        let inventory = inventory_with_slice();
        let mut book = ClaimBook::new();
        let shared = book.set(&claim("shared", &["gpu-1"], &["p", "q"]), &inventory);
        assert_eq!(
            gpus(shared),
            [placed("ml/p", &[GPU_1]), placed("ml/q", &[GPU_1])]
        );
        assert_eq!(
            gpus(book.set(&claim("shared", &["gpu-1"], &["q"]), &inventory)),
            [released("ml/p"), placed("ml/q", &[GPU_1])]
        );
        let mut deallocated = claim("shared", &[], &[]);
        deallocated.status = None;
        assert_eq!(gpus(book.set(&deallocated, &inventory)), [released("ml/q")]);
    }

    #[test]
    fn a_claim_allocated_before_its_slice_is_known_is_placed_once_the_slice_comes() {
        let inventory = Inventory::new();
        let mut book = ClaimBook::new();
        assert!(book
            .set(&claim("early", &["gpu-1"], &["p"]), &inventory)
            .is_empty());
        assert_eq!(book.unresolved(), 1);
        assert!(book.resolve(&inventory).is_empty(), "nothing new yet");
        inventory.apply_slice(&recorded_slice());
        assert_eq!(gpus(book.resolve(&inventory)), [placed("ml/p", &[GPU_1])]);
        assert_eq!(book.unresolved(), 0);
        assert!(book.resolve(&inventory).is_empty());
        assert_eq!(gpus(book.remove("ml/early")), [released("ml/p")]);
    }

    #[test]
    fn a_relist_replaces_every_claim_known() {
        let inventory = inventory_with_slice();
        let mut book = ClaimBook::new();
        book.set(&claim("old", &["gpu-0"], &["p"]), &inventory);
        let listed = book.replace(vec![claim("new", &["gpu-1"], &["q"])], &inventory);
        let listed: Vec<_> = listed
            .into_iter()
            .map(|(pod, placed)| (pod, placed.node, placed.gpus, placed.workload))
            .collect();
        assert_eq!(
            listed,
            [(
                "ml/q".to_string(),
                "gpu-node-2".to_string(),
                vec![GPU_1.to_string()],
                Some("w03".to_string())
            )]
        );
        assert!(book.remove("ml/old").is_empty(), "forgotten by the relist");
    }

    #[test]
    fn the_inventory_tells_only_when_the_drivers_gpus_change() {
        let inventory = Inventory::new();
        let changes = inventory.dra_changes();
        inventory.apply_slice(&recorded_slice());
        assert!(changes.has_changed().unwrap());
        let changes = inventory.dra_changes();
        inventory.apply_slice(&recorded_slice());
        assert!(!changes.has_changed().unwrap(), "the same slice again");
        inventory.set_slice("gpu-node-2-gpu.nvidia.com-8xl6c", Vec::new());
        assert!(changes.has_changed().unwrap());
        assert!(inventory.is_empty());
    }
}
