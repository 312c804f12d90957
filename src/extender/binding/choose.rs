//! The webhook's decision: which GPUs of the whole cluster a pod should go to, best first,
//! and the hold on the first. Each GPU of the [`Inventory`] is offered to the same
//! [`Placer`] the filter asks (the advisor's Place with the server's policy), with its
//! residents from the [`ClusterView`] plus the live holds of the reservations table under
//! the GPU's current resident-set version. The GPUs are indexed by resident set first (one
//! pass over the view; each distinct set's version made once; the index is kept until the
//! view or the inventory changes, a second at most), and GPUs with the same
//! model, memory, set and holds are one slot of the ask. Under HAMi, a GPU HAMi's own
//! accounting would refuse the pod (`hami`: its registered capacity less what bound pods'
//! allocations and the live holds take) is not offered at all; nor, under DRA, is a device
//! without `allowMultipleAllocations` that a resident or another pod's hold has (the
//! scheduler's allocator gives such a device to one claim at a time). A hold whose pod the view
//! has seen bound is done (ignored, and deleted with the next claim). The acceptable ones
//! (Place's placements) come back ordered by gain, ties by node and id; the first is
//! claimed in the store (one small durable write), and when another decider got that slot
//! first the decision is taken again with its hold in view.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use super::{
    hami::{self, Request, Use},
    inventory::{Device, Inventory},
};
use crate::{
    extender::{
        cluster::ClusterView,
        decide::{GpuSlot, PlacementAsk, PlacementError, Placer, SlotOutcome},
    },
    store::reservations::{Reservation, ReservationError, Reservations},
    sync::Unpoisoned,
};

/// How many times a decision is taken again after losing its slot to another decider.
const CLAIM_ATTEMPTS: usize = 4;

/// What the webhook needs decided for one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub workload: String,
    pub min_job_fraction: Option<f64>,
    /// The sharing mode (the pod's KAI annotation, the claim's GpuConfig); `None`: the
    /// server's default.
    pub sharing_mode: Option<crate::domain::SharingMode>,
    /// Who the hold is for (namespace/name, or the admission request's uid).
    pub holder: String,
    /// What HAMi will allocate the pod, one request per GPU a container asks for
    /// (`hami::requests`); empty: no capacity to check (DRA, or no HAMi resources).
    pub hami: Vec<Request>,
}

/// The GPUs chosen, best first; the first is held for the pod.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub gpus: Vec<Device>,
    pub gains: Vec<f64>,
}

/// Why no choice was made: the webhook answers neutrally (and counts the reason).
#[derive(Debug, thiserror::Error)]
pub enum NoChoice {
    #[error("coloc knows no GPU of the cluster (no inventory yet)")]
    NoInventory,
    #[error("no GPU is acceptable for workload {0:?}")]
    NoneAcceptable(String),
    #[error("no GPU has room for the pod as HAMi accounts it ({0} refused)")]
    NoHamiRoom(usize),
    #[error("every DRA device is allocated to another claim ({0} taken)")]
    NoFreeDevice(usize),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("placement answered {answered} outcomes for {asked} GPUs")]
    PlacementMismatch { asked: usize, answered: usize },
    #[error(transparent)]
    Reservations(#[from] ReservationError),
    #[error("every acceptable slot was taken by other deciders {0} times in a row")]
    Contended(usize),
}

impl NoChoice {
    /// The reason's short name, for logs and counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoInventory => "no_inventory",
            Self::NoneAcceptable(_) => "none_acceptable",
            Self::NoHamiRoom(_) => "no_hami_room",
            Self::NoFreeDevice(_) => "no_free_device",
            Self::Placement(PlacementError::UnknownWorkload(_)) => "unknown_workload",
            Self::Placement(PlacementError::Unavailable(_)) => "placement_unavailable",
            Self::Placement(PlacementError::UnmeasuredMode(_)) => "unmeasured_sharing_mode",
            Self::PlacementMismatch { .. } => "placement_mismatch",
            Self::Reservations(_) => "store",
            Self::Contended(_) => "contended",
        }
    }
}

pub struct Chooser {
    placer: Arc<dyn Placer>,
    cluster: Arc<ClusterView>,
    inventory: Arc<Inventory>,
    reservations: Reservations,
    ttl: Duration,
    gpus: usize,
    /// When expired holds were last swept (at most once a second: a hold counts only
    /// while it has not expired, so the sweep only keeps the table small).
    swept_at_ms: AtomicI64,
    /// The view indexed for decisions, kept while neither the view nor the inventory
    /// changes, and for a second at most when some of the view's sources change with time
    /// (PodResources reports, AssignJob's occupancy).
    indexed: Mutex<Option<Arc<Indexed>>>,
}

/// How long an [`Indexed`] view is used without a change, when the view changes with time.
const INDEX_MAX_AGE_MS: i64 = 1_000;

/// The view as decisions read it, and what it was made from.
struct Indexed {
    devices: Arc<Vec<Device>>,
    generation: u64,
    built_at_ms: i64,
    /// Resident sets by id, members sorted, each with its version; id 0 is the empty set.
    sets: Vec<(Residents, String)>,
    /// The GPU models and memories GPUs are offered with (a node's labels, else the
    /// inventory's), each once.
    kinds: Vec<(Option<String>, Option<f64>)>,
    /// Per device, in the inventory's order: what a decision reads of it.
    facts: Vec<DeviceFacts>,
    /// node -> GPU id -> the device's index in the inventory (the live holds' GPUs).
    device_at: HashMap<String, HashMap<String, usize>>,
}

/// One device as decisions read it.
#[derive(Debug, Clone, Copy)]
struct DeviceFacts {
    /// Its resident set (an index into [`Indexed::sets`]).
    set: usize,
    /// Its GPU model and memory (an index into [`Indexed::kinds`]).
    kind: usize,
    /// What bound pods' HAMi allocations take on it.
    used: Use,
}

/// A GPU's residents: each workload with its own floor.
type Residents = Vec<(String, Option<f64>)>;

/// The view's GPUs indexed by resident set: each distinct set once, with its version.
struct ResidentIndex {
    /// Sets by id, members sorted; id 0 is the empty set.
    sets: Vec<(Residents, String)>,
    /// node -> GPU id -> set id, for occupied GPUs.
    on: HashMap<String, HashMap<String, usize>>,
}

impl ResidentIndex {
    fn set_of(&self, device: &Device) -> usize {
        self.on
            .get(device.node.as_str())
            .and_then(|gpus| gpus.get(device.id.as_str()))
            .copied()
            .unwrap_or(0)
    }
}

/// What HAMi's annotations take on each GPU: node -> GPU id -> use.
type HamiUse = HashMap<String, HashMap<String, Use>>;

/// One GPU of the decision: its device (index in the inventory), set, holds and slot.
struct Candidate {
    device: usize,
    set: usize,
    holds: i64,
    slot: usize,
}

/// The Place ask over the acceptable GPUs, each GPU's slot in it, and how many GPUs HAMi's
/// accounting ruled out.
struct Decision {
    placement: PlacementAsk,
    candidates: Vec<Candidate>,
    refused: usize,
    /// Exclusive DRA devices ruled out because another claim has them.
    taken: usize,
}

/// The version of a GPU's resident set: the same on every replica that sees the same set.
pub fn resident_version(residents: &[(String, Option<f64>)]) -> String {
    let mut sorted: Vec<String> = residents
        .iter()
        .map(|(w, f)| format!("{w}\u{1e}{}", f.map(|f| f.to_bits()).unwrap_or(0)))
        .collect();
    sorted.sort_unstable();
    // FNV-1a, 64 bits: stable across builds and machines (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in sorted.join("\u{1f}").bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{}-{hash:016x}", sorted.len())
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Chooser {
    pub fn new(
        placer: Arc<dyn Placer>,
        cluster: Arc<ClusterView>,
        inventory: Arc<Inventory>,
        reservations: Reservations,
        ttl: Duration,
        gpus: usize,
    ) -> Self {
        Self {
            placer,
            cluster,
            inventory,
            reservations,
            ttl,
            gpus: gpus.max(1),
            swept_at_ms: AtomicI64::new(0),
            indexed: Mutex::new(None),
        }
    }

    pub fn inventory(&self) -> &Arc<Inventory> {
        &self.inventory
    }

    /// Chooses GPUs for `ask` and holds the first.
    pub async fn choose(&self, ask: &Ask) -> Result<Choice, NoChoice> {
        let devices = self.inventory.devices();
        if devices.is_empty() {
            return Err(NoChoice::NoInventory);
        }
        for _ in 0..CLAIM_ATTEMPTS {
            let now = now_ms();
            let mut live = self.reservations.live(now).await?;
            // A hold whose pod is bound is done: the view has the pod as a resident (and
            // HAMi's allocation), and the claim below deletes the hold. The view is indexed
            // after this is asked, so that a pod seen bound here is in the index too (its
            // hold is not dropped before its allocation counts).
            let mut landed: Vec<String> = Vec::new();
            live.retain(|hold| {
                let bound = self.cluster.is_bound(&hold.holder);
                if bound && !landed.contains(&hold.holder) {
                    landed.push(hold.holder.clone());
                }
                !bound
            });
            let indexed = self.indexed(&devices);
            let decision = self.candidates(ask, &indexed, &live);
            if decision.candidates.is_empty() {
                return Err(match (decision.refused, decision.taken) {
                    (0, 0) => NoChoice::NoneAcceptable(ask.workload.clone()),
                    (0, taken) => NoChoice::NoFreeDevice(taken),
                    (refused, _) => NoChoice::NoHamiRoom(refused),
                });
            }
            let outcomes = self.placer.place(&decision.placement).await?;
            if outcomes.len() != decision.placement.slots.len() {
                return Err(NoChoice::PlacementMismatch {
                    asked: decision.placement.slots.len(),
                    answered: outcomes.len(),
                });
            }
            // Best gain first; ties keep the inventory's order (node, id).
            let acceptable: Vec<(f64, &Candidate)> = best_k(
                decision
                    .candidates
                    .iter()
                    .filter_map(|c| match outcomes[c.slot] {
                        SlotOutcome::Fits { gain } if gain.is_finite() => Some((gain, c)),
                        _ => None,
                    }),
                self.gpus,
            );
            let Some((_, first)) = acceptable.first() else {
                return Err(NoChoice::NoneAcceptable(ask.workload.clone()));
            };
            let device = &devices[first.device];
            let memory = device.hami.map(|c| c.mem_mib).unwrap_or(0);
            let hold = Reservation {
                node: device.node.clone(),
                gpu_id: device.id.clone(),
                resident_version: indexed.sets[first.set].1.clone(),
                ordinal: first.holds,
                holder: ask.holder.clone(),
                workload: ask.workload.clone(),
                reserved_at_ms: now,
                expires_at_ms: now + self.ttl.as_millis() as i64,
                mem_mib: ask.hami.iter().map(|r| r.mem_on(memory)).sum(),
                cores: ask.hami.iter().map(|r| r.cores.min(100)).sum(),
            };
            let landed: Vec<&str> = landed.iter().map(String::as_str).collect();
            if self.reservations.claim_releasing(&hold, &landed).await? {
                self.sweep(now).await;
                return Ok(Choice {
                    gains: acceptable.iter().map(|(g, _)| *g).collect(),
                    gpus: acceptable
                        .into_iter()
                        .map(|(_, c)| devices[c.device].clone())
                        .collect(),
                });
            }
            tracing::debug!(gpu = %hold.gpu_id, holder = %ask.holder, "binding: slot taken by another decider; deciding again");
        }
        Err(NoChoice::Contended(CLAIM_ATTEMPTS))
    }

    /// Deletes holds that expired a TTL ago, at most once a second.
    async fn sweep(&self, now: i64) {
        let last = self.swept_at_ms.load(Ordering::Relaxed);
        if now - last < 1_000
            || self
                .swept_at_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        if let Err(error) = self
            .reservations
            .sweep(now - self.ttl.as_millis() as i64)
            .await
        {
            tracing::warn!(%error, "binding: expired holds not swept");
        }
    }

    /// The view indexed for decisions: the kept one while it is current, else made anew.
    fn indexed(&self, devices: &Arc<Vec<Device>>) -> Arc<Indexed> {
        let now = now_ms();
        let generation = self.cluster.generation();
        let timed = self.cluster.changes_with_time();
        let mut kept = self.indexed.lock().unpoisoned();
        if let Some(indexed) = kept.as_ref().filter(|i| {
            i.generation == generation
                && Arc::ptr_eq(&i.devices, devices)
                && (!timed || now - i.built_at_ms < INDEX_MAX_AGE_MS)
        }) {
            return indexed.clone();
        }
        let (generation, residents) = self.resident_index();
        let used = self.hami_use();
        let mut node_model: HashMap<&str, (Option<String>, Option<f64>)> = HashMap::new();
        let mut kind_ids: HashMap<(Option<String>, Option<u64>), usize> = HashMap::new();
        let mut kinds = Vec::new();
        let mut facts = Vec::with_capacity(devices.len());
        let mut device_at: HashMap<String, HashMap<String, usize>> = HashMap::new();
        for (at, device) in devices.iter().enumerate() {
            let (label_model, label_memory) =
                node_model.entry(device.node.as_str()).or_insert_with(|| {
                    let gpus = self.cluster.node(&device.node);
                    (
                        gpus.as_ref().and_then(|g| g.gpu_model.clone()),
                        gpus.as_ref().and_then(|g| g.memory_gb),
                    )
                });
            let model = label_model.clone().or_else(|| device.model.clone());
            let memory_gb = label_memory.or(device.memory_gb);
            let kind = *kind_ids
                .entry((model.clone(), memory_gb.map(f64::to_bits)))
                .or_insert_with(|| {
                    kinds.push((model, memory_gb));
                    kinds.len() - 1
                });
            facts.push(DeviceFacts {
                set: residents.set_of(device),
                kind,
                used: used
                    .get(device.node.as_str())
                    .and_then(|gpus| gpus.get(device.id.as_str()))
                    .copied()
                    .unwrap_or_default(),
            });
            device_at
                .entry(device.node.clone())
                .or_default()
                .insert(device.id.clone(), at);
        }
        let indexed = Arc::new(Indexed {
            devices: devices.clone(),
            generation,
            built_at_ms: now,
            sets: residents.sets,
            kinds,
            facts,
            device_at,
        });
        *kept = Some(indexed.clone());
        indexed
    }

    /// The view's occupied GPUs by resident set, in one pass, and the view's generation.
    fn resident_index(&self) -> (u64, ResidentIndex) {
        let mut sets: Vec<(Residents, String)> = vec![(Vec::new(), resident_version(&[]))];
        // A set's members (name, floor's bits), sorted: the same set, the same key.
        let mut ids: HashMap<Vec<(String, Option<u64>)>, usize> = HashMap::new();
        let mut on: HashMap<String, HashMap<String, usize>> = HashMap::new();
        let (generation, occupied) = self.cluster.occupied_everywhere();
        for (node, gpus) in occupied {
            let by_gpu = on.entry(node).or_default();
            for (gpu, residents) in gpus {
                let mut key: Vec<(String, Option<u64>)> = residents
                    .into_iter()
                    .map(|r| {
                        let bits = r.min_job_fraction.map(f64::to_bits);
                        (r.into_placement_name(), bits)
                    })
                    .collect();
                key.sort_unstable();
                let id = match ids.get(&key) {
                    Some(id) => *id,
                    None => {
                        let members: Residents = key
                            .iter()
                            .map(|(w, bits)| (w.clone(), bits.map(f64::from_bits)))
                            .collect();
                        let version = resident_version(&members);
                        sets.push((members, version));
                        ids.insert(key, sets.len() - 1);
                        sets.len() - 1
                    }
                };
                by_gpu.insert(gpu, id);
            }
        }
        (generation, ResidentIndex { sets, on })
    }

    /// What bound pods' HAMi allocations take on each GPU.
    fn hami_use(&self) -> HamiUse {
        let mut used = HamiUse::new();
        self.cluster.with_hami_allocations(|node, allocation| {
            let gpus = used.entry(node.to_string()).or_default();
            match gpus.get_mut(allocation.gpu.as_str()) {
                Some(on) => on.add(allocation.mem_mib, allocation.cores),
                None => {
                    let mut on = Use::default();
                    on.add(allocation.mem_mib, allocation.cores);
                    gpus.insert(allocation.gpu.clone(), on);
                }
            }
        });
        used
    }

    /// The Place ask over every GPU HAMi would take the pod on, and each GPU's slot in it.
    /// GPUs with the same set, GPU model, memory and holds share a slot, numbered in the
    /// inventory's order.
    fn candidates(&self, ask: &Ask, indexed: &Indexed, live: &[Reservation]) -> Decision {
        // The live holds by device (a few per GPU at most); holds on GPUs the inventory
        // does not list count nowhere.
        let mut holds_on: HashMap<usize, Vec<&Reservation>> = HashMap::new();
        for hold in live.iter().filter(|r| r.holder != ask.holder) {
            if let Some(&at) = indexed
                .device_at
                .get(hold.node.as_str())
                .and_then(|gpus| gpus.get(hold.gpu_id.as_str()))
            {
                holds_on.entry(at).or_default().push(hold);
            }
        }
        let mut placement = PlacementAsk {
            workload: ask.workload.clone(),
            min_job_fraction: ask.min_job_fraction,
            sharing_mode: ask.sharing_mode,
            slots: Vec::new(),
        };
        // Slots by (set, kind), and by (set, kind, held workloads) for GPUs with holds.
        let mut plain: foldhash::HashMap<(usize, usize), usize> = Default::default();
        let mut with_holds: HashMap<(usize, usize, Vec<&str>), usize> = HashMap::new();
        let mut candidates = Vec::with_capacity(indexed.devices.len());
        let mut refused = 0;
        let mut taken = 0;
        for (at, (device, facts)) in indexed.devices.iter().zip(&indexed.facts).enumerate() {
            let set = facts.set;
            let (residents, version) = &indexed.sets[set];
            let mut held: Vec<&Reservation> = match holds_on.get(&at) {
                None => Vec::new(),
                Some(holds) => holds
                    .iter()
                    .filter(|r| r.resident_version == *version)
                    .copied()
                    .collect(),
            };
            // A DRA device the allocator gives one claim at a time is taken while it has a
            // resident or another pod's hold.
            if device.dra.as_ref().is_some_and(|d| !d.shared) && (set != 0 || !held.is_empty()) {
                taken += 1;
                continue;
            }
            if let (Some(capacity), false) = (device.hami, ask.hami.is_empty()) {
                let mut on = facts.used;
                for hold in &held {
                    on.add(hold.mem_mib, hold.cores);
                }
                if hami::fits_all(capacity, on, &ask.hami).is_err() {
                    refused += 1;
                    continue;
                }
            }
            // The next ordinal after the other holders' (a retried decision of the same
            // holder asks for its own key again and keeps it).
            let holds = held.iter().map(|r| r.ordinal + 1).max().unwrap_or(0);
            let kind = &indexed.kinds[facts.kind];
            let slot = if held.is_empty() {
                *plain
                    .entry((set, facts.kind))
                    .or_insert_with(|| push_slot(&mut placement, residents, &held, kind))
            } else {
                held.sort_by(|a, b| a.workload.cmp(&b.workload));
                let key = (
                    set,
                    facts.kind,
                    held.iter().map(|r| r.workload.as_str()).collect(),
                );
                *with_holds
                    .entry(key)
                    .or_insert_with(|| push_slot(&mut placement, residents, &held, kind))
            };
            candidates.push(Candidate {
                device: at,
                set,
                holds,
                slot,
            });
        }
        Decision {
            placement,
            candidates,
            refused,
            taken,
        }
    }
}

/// A new slot of `placement`: the GPU model and memory of `kind`, the set's residents and
/// the held workloads (without floors), sorted by workload. Its index.
fn push_slot(
    placement: &mut PlacementAsk,
    residents: &Residents,
    held: &[&Reservation],
    kind: &(Option<String>, Option<f64>),
) -> usize {
    let mut all: Residents = residents.clone();
    all.extend(held.iter().map(|r| (r.workload.clone(), None)));
    all.sort_by(|a, b| a.0.cmp(&b.0));
    placement.slots.push(GpuSlot {
        gpu_model: kind.0.clone(),
        memory_gb: kind.1,
        residents: all.iter().map(|(w, _)| w.clone()).collect(),
        resident_floors: all.iter().map(|(_, f)| *f).collect(),
    });
    placement.slots.len() - 1
}

/// The best `k` of `gains` (in candidates' order), best gain first, ties in the order they
/// came: what a stable sort by gain, descending, then the first `k`, gives, without sorting
/// them all.
fn best_k<T>(gains: impl Iterator<Item = (f64, T)>, k: usize) -> Vec<(f64, T)> {
    let mut best: Vec<(f64, T)> = Vec::with_capacity(k + 1);
    for (gain, item) in gains {
        if best.len() == k
            && best
                .last()
                .is_some_and(|(last, _)| last.total_cmp(&gain).is_ge())
        {
            continue;
        }
        let at = best.partition_point(|(g, _)| g.total_cmp(&gain).is_ge());
        best.insert(at, (gain, item));
        best.truncate(k);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::best_k;

    #[test]
    fn best_k_is_the_first_k_of_a_stable_sort_by_gain_descending() {
        let gains = [
            1.0, 3.0, 2.0, 3.0, -0.0, 0.0, 2.0, 5.0, 1.0, 3.0, 0.0, -1.0, 5.0,
        ];
        for k in 1..=gains.len() + 1 {
            let mut sorted: Vec<(f64, usize)> = gains.iter().copied().zip(0..).collect();
            sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
            sorted.truncate(k);
            let picked = best_k(gains.iter().copied().zip(0..), k);
            assert_eq!(
                picked
                    .iter()
                    .map(|p| (p.0.to_bits(), p.1))
                    .collect::<Vec<_>>(),
                sorted
                    .iter()
                    .map(|p| (p.0.to_bits(), p.1))
                    .collect::<Vec<_>>(),
                "k = {k}"
            );
        }
        assert_eq!(picked_indices(&[2.0, 2.0, 2.0], 2), [0, 1]);
    }

    fn picked_indices(gains: &[f64], k: usize) -> Vec<usize> {
        best_k(gains.iter().copied().zip(0..), k)
            .into_iter()
            .map(|p| p.1)
            .collect()
    }
}
