//! Every GPU of the cluster by its id, for the webhook, which decides before any node is a
//! candidate: under HAMi from each node's `hami.io/node-nvidia-register` annotation (a JSON
//! list of devices, `id` the GPU's UUID, `count`, `devmem` and `devcore` its split count,
//! memory and cores, as HAMi's device plugin writes it: `MarshalNodeDevices` in
//! Project-HAMi/HAMi pkg/device/devices.go), under DRA from the
//! NVIDIA DRA driver's ResourceSlices (driver `gpu.nvidia.com`, attribute `uuid` and
//! `productName`, as its cmd/gpu-kubelet-plugin publishes them). Kept by a small watcher of
//! its own (`run`), beside the extender's cluster watcher.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
};

use futures::StreamExt;
use k8s_openapi::api::{core::v1::Node, resource::v1::ResourceSlice};
use kube::{
    runtime::{
        watcher::{self, Event},
        WatchStreamExt,
    },
    Api, Client,
};
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::hami::Capacity;
use crate::sync::Unpoisoned;

pub const HAMI_REGISTER_ANNOTATION: &str = "hami.io/node-nvidia-register";
/// The NVIDIA DRA driver's name, and the domain of its device attributes.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// One GPU the cluster has.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub node: String,
    /// The GPU's UUID (`GPU-...`).
    pub id: String,
    /// As the inventory names the model (HAMi's `type`, the DRA driver's `productName`).
    pub model: Option<String>,
    pub memory_gb: Option<f64>,
    /// HAMi's split count, memory and cores of the device (`None` under DRA).
    pub hami: Option<Capacity>,
    /// The device as the DRA driver's ResourceSlice names it (`None` under HAMi).
    pub dra: Option<DraName>,
}

/// A DRA device's identity in its ResourceSlice: what a claim's allocation result names.
#[derive(Debug, Clone, PartialEq)]
pub struct DraName {
    pub pool: String,
    pub device: String,
    /// `allowMultipleAllocations`: the device may be allocated to several claims at once.
    /// Otherwise the scheduler's allocator gives it to one claim at a time (`deviceInUse`
    /// in kubernetes staging/src/k8s.io/dynamic-resource-allocation/structured).
    pub shared: bool,
}

/// HAMi's `DeviceInfo` as its register annotation carries it (the fields coloc reads).
#[derive(Debug, Deserialize)]
struct HamiDevice {
    id: String,
    #[serde(default)]
    count: u32,
    #[serde(default)]
    devmem: i64,
    #[serde(default)]
    devcore: i64,
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default = "healthy")]
    health: bool,
}

fn healthy() -> bool {
    true
}

/// The healthy GPUs a node's HAMi register annotation lists; `Err` when it is not HAMi's JSON.
pub fn hami_devices(node: &Node) -> Result<Vec<Device>, String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let Some(raw) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HAMI_REGISTER_ANNOTATION))
    else {
        return Ok(Vec::new());
    };
    let devices: Vec<HamiDevice> = serde_json::from_str(raw)
        .map_err(|e| format!("node {name}: {HAMI_REGISTER_ANNOTATION} is not HAMi's JSON: {e}"))?;
    Ok(devices
        .into_iter()
        .filter(|d| d.health && !d.id.is_empty())
        .map(|d| Device {
            node: name.clone(),
            id: d.id,
            // HAMi's device plugin writes "NVIDIA-" before NVML's product name.
            model: Some(
                d.kind
                    .strip_prefix("NVIDIA-")
                    .unwrap_or(&d.kind)
                    .to_string(),
            )
            .filter(|k| !k.is_empty()),
            memory_gb: (d.devmem > 0).then_some(d.devmem as f64 / 1024.0),
            hami: Some(Capacity {
                count: d.count,
                mem_mib: d.devmem,
                cores: d.devcore,
            }),
            dra: None,
        })
        .collect())
}

/// The GPUs an NVIDIA DRA driver ResourceSlice publishes (other drivers' slices: none).
pub fn dra_devices(slice: &ResourceSlice) -> Vec<Device> {
    let spec = &slice.spec;
    let Some(node) = spec
        .node_name
        .as_ref()
        .filter(|_| spec.driver == NVIDIA_DRA_DRIVER)
    else {
        return Vec::new();
    };
    let string = |device: &k8s_openapi::api::resource::v1::Device, key: &str| {
        let attributes = device.attributes.as_ref()?;
        attributes
            .get(key)
            .or_else(|| attributes.get(&format!("{NVIDIA_DRA_DRIVER}/{key}")))?
            .string
            .clone()
    };
    spec.devices
        .iter()
        .flatten()
        .filter(|device| string(device, "type").is_none_or(|t| t == "gpu"))
        .filter_map(|device| {
            Some(Device {
                node: node.clone(),
                id: string(device, "uuid")?,
                model: string(device, "productName"),
                memory_gb: device
                    .capacity
                    .as_ref()
                    .and_then(|c| c.get("memory"))
                    .and_then(|m| quantity_gib(&m.value.0)),
                hami: None,
                dra: Some(DraName {
                    pool: spec.pool.name.clone(),
                    device: device.name.clone(),
                    shared: device.allow_multiple_allocations == Some(true),
                }),
            })
        })
        .collect()
}

/// A memory quantity ("80Gi", "81559Mi", bytes) in GiB; `None` for forms coloc does not read.
fn quantity_gib(raw: &str) -> Option<f64> {
    let (number, factor) = [
        ("Ki", 1024f64.powi(-2)),
        ("Mi", 1.0 / 1024.0),
        ("Gi", 1.0),
        ("Ti", 1024.0),
    ]
    .into_iter()
    .find_map(|(suffix, factor)| raw.strip_suffix(suffix).map(|n| (n, factor)))
    .unwrap_or((raw, 1024f64.powi(-3)));
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * factor)
        .filter(|g| *g > 0.0)
}

/// The cluster's GPUs, by source and node.
#[derive(Debug)]
pub struct Inventory {
    inner: RwLock<Inner>,
    /// Counts the changes of the DRA driver's GPUs, for the claim watcher, which reads
    /// again the claims it could not resolve ([`Inventory::dra_changes`]).
    dra_changes: watch::Sender<u64>,
}

impl Default for Inventory {
    fn default() -> Self {
        Self {
            inner: RwLock::default(),
            dra_changes: watch::Sender::new(0),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// node -> its GPUs, from HAMi's annotation.
    hami: HashMap<String, Vec<Device>>,
    /// slice name -> its GPUs, from the DRA driver.
    dra: HashMap<String, Vec<Device>>,
    /// Every GPU sorted, made on the first read after a change (the webhook reads it for
    /// every pod; the inventory changes when nodes do).
    sorted: Option<Arc<Vec<Device>>>,
}

impl Inner {
    fn sorted(&self) -> Vec<Device> {
        let mut by_id: BTreeMap<(&str, &str), &Device> = BTreeMap::new();
        for device in self.hami.values().chain(self.dra.values()).flatten() {
            by_id
                .entry((device.node.as_str(), device.id.as_str()))
                .or_insert(device);
        }
        by_id.into_values().cloned().collect()
    }
}

impl Inventory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or with no devices, forgets) a node's GPUs as HAMi registers them.
    pub fn set_node(&self, node: &str, devices: Vec<Device>) {
        let mut inner = self.inner.write().unpoisoned();
        inner.sorted = None;
        if devices.is_empty() {
            inner.hami.remove(node);
        } else {
            inner.hami.insert(node.to_string(), devices);
        }
    }

    /// Sets (or with no devices, forgets) one ResourceSlice's GPUs.
    pub fn set_slice(&self, slice: &str, devices: Vec<Device>) {
        let mut inner = self.inner.write().unpoisoned();
        if inner
            .dra
            .get(slice)
            .map_or(devices.is_empty(), |d| *d == devices)
        {
            return;
        }
        inner.sorted = None;
        if devices.is_empty() {
            inner.dra.remove(slice);
        } else {
            inner.dra.insert(slice.to_string(), devices);
        }
        drop(inner);
        self.dra_changes.send_modify(|changes| *changes += 1);
    }

    /// Tells when the DRA driver's GPUs change (a ResourceSlice's devices added, changed
    /// or gone).
    pub fn dra_changes(&self) -> watch::Receiver<u64> {
        self.dra_changes.subscribe()
    }

    /// Every GPU, each id once, sorted by node and id (a stable order for ties).
    pub fn devices(&self) -> Arc<Vec<Device>> {
        if let Some(sorted) = &self.inner.read().unpoisoned().sorted {
            return sorted.clone();
        }
        let mut inner = self.inner.write().unpoisoned();
        if let Some(sorted) = &inner.sorted {
            return sorted.clone();
        }
        let sorted = Arc::new(inner.sorted());
        inner.sorted = Some(sorted.clone());
        sorted
    }

    /// The GPU a DRA allocation result names: the NVIDIA driver's device `device` of
    /// pool `pool`.
    pub fn dra_device(&self, driver: &str, pool: &str, device: &str) -> Option<Device> {
        if driver != NVIDIA_DRA_DRIVER {
            return None;
        }
        let inner = self.inner.read().unpoisoned();
        inner
            .dra
            .values()
            .flatten()
            .find(|d| {
                d.dra
                    .as_ref()
                    .is_some_and(|n| n.pool == pool && n.device == device)
            })
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.devices().len()
    }

    pub fn is_empty(&self) -> bool {
        let inner = self.inner.read().unpoisoned();
        inner.hami.is_empty() && inner.dra.is_empty()
    }

    /// Applies one node event (HAMi's annotation).
    pub fn apply_node(&self, node: &Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        match hami_devices(node) {
            Ok(devices) => self.set_node(&name, devices),
            Err(reason) => {
                tracing::warn!(%reason, "binding inventory: node skipped");
                self.set_node(&name, Vec::new());
            }
        }
    }

    pub fn apply_slice(&self, slice: &ResourceSlice) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.set_slice(&name, dra_devices(slice));
    }

    /// Watches nodes (HAMi) or ResourceSlices (DRA) until `shutdown`.
    pub async fn run(self: Arc<Self>, client: Client, dra: bool, shutdown: CancellationToken) {
        if dra {
            let api: Api<ResourceSlice> = Api::all(client);
            let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
            self.follow(
                events,
                shutdown,
                |me, s| me.apply_slice(s),
                |me, s| me.set_slice(&s.metadata.name.clone().unwrap_or_default(), Vec::new()),
            )
            .await;
        } else {
            let api: Api<Node> = Api::all(client);
            let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
            self.follow(
                events,
                shutdown,
                |me, n| me.apply_node(n),
                |me, n| me.set_node(&n.metadata.name.clone().unwrap_or_default(), Vec::new()),
            )
            .await;
        }
    }

    async fn follow<K>(
        &self,
        events: impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send,
        shutdown: CancellationToken,
        apply: impl Fn(&Self, &K),
        delete: impl Fn(&Self, &K),
    ) {
        tokio::pin!(events);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                event = events.next() => match event {
                    None => break,
                    Some(Ok(Event::Apply(object) | Event::InitApply(object))) => apply(self, &object),
                    Some(Ok(Event::Delete(object))) => delete(self, &object),
                    Some(Ok(Event::Init | Event::InitDone)) => {}
                    Some(Err(error)) => tracing::warn!(%error, "binding inventory: watch failed; retrying"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_quantities_read_in_gib() {
        assert_eq!(quantity_gib("80Gi"), Some(80.0));
        assert_eq!(quantity_gib("32768Mi"), Some(32.0));
        assert_eq!(quantity_gib("1073741824"), Some(1.0));
        assert_eq!(quantity_gib("lots"), None);
    }
}
