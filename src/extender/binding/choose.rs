//! The webhook's decision: which GPUs of the whole cluster a pod should go to, best first,
//! and the hold on the first. Each GPU of the [`Inventory`] is offered to the same
//! [`Placer`] the filter asks (the advisor's Place with the server's policy), with its
//! residents from the [`ClusterView`] plus the live holds of the reservations table under
//! the GPU's current resident-set version. The GPUs are indexed by resident set first (one
//! pass over the view; each distinct set's version made once; the index is kept until the
//! view or the inventory changes, a second at most), and GPUs with the same
//! model, memory, set and holds are one slot of the ask. A slot without holds whose
//! outcome Place gave for the same ask is not asked again while the placer's answers
//! generation holds (`kept.rs`: sets keep their ids while the view changes around them).
//! Under HAMi, a GPU HAMi's own
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
    kept::{members_of, AskKey, Interner, Known, Residents, SetKey, Verdicts},
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
    /// Ids of resident sets and GPU kinds, kept across indexes.
    interner: Mutex<Interner>,
    /// Place's outcomes on plain slots, kept across decisions.
    verdicts: Mutex<Verdicts>,
}

/// How long an [`Indexed`] view is used without a change, when the view changes with time.
const INDEX_MAX_AGE_MS: i64 = 1_000;

/// The view as decisions read it, and what it was made from.
struct Indexed {
    devices: Arc<Vec<Device>>,
    generation: u64,
    built_at_ms: i64,
    /// The interner's epoch the ids below are of.
    epoch: u64,
    /// Distinct resident sets of the view's GPUs.
    distinct_sets: usize,
    /// Resident sets by id, members sorted, each with its version; id 0 is the empty set
    /// (the interner's: ids of sets no GPU has now included).
    sets: Arc<Vec<(Residents, String)>>,
    /// The GPU models and memories GPUs are offered with (a node's labels, else the
    /// inventory's), by id.
    kinds: Arc<Vec<(Option<String>, Option<f64>)>>,
    /// Per device, in the inventory's order: what a decision reads of it.
    facts: Vec<DeviceFacts>,
    /// node -> GPU id -> the device's index in the inventory (the live holds' GPUs): made
    /// once per inventory.
    device_at: Arc<DeviceAt>,
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

/// node -> GPU id -> a number (an index, a set id).
type DeviceAt = foldhash::HashMap<String, foldhash::HashMap<String, usize>>;

/// The view's occupied GPUs by resident set id (the interner's).
struct ResidentIndex {
    /// node -> GPU id -> set id, for occupied GPUs.
    on: DeviceAt,
    /// Distinct sets among them.
    distinct: usize,
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
type HamiUse = foldhash::HashMap<String, foldhash::HashMap<String, Use>>;

/// One GPU of the decision: its device (index in the inventory), set, holds and slot.
struct Candidate {
    device: usize,
    set: usize,
    holds: i64,
    slot: usize,
}

/// Where a slot's outcome comes from.
enum SlotAnswer<'k> {
    /// Kept from an earlier decision of the same ask.
    Known(&'k SlotOutcome),
    /// The slot of this index in the Place ask.
    Asked(usize),
}

/// The Place ask over the acceptable GPUs whose outcome is not kept, each GPU's slot, and
/// how many GPUs HAMi's accounting ruled out.
struct Decision<'k> {
    placement: PlacementAsk,
    slots: Vec<SlotAnswer<'k>>,
    /// Plain slots asked: (set, kind) and the slot's index in the Place ask.
    plain_asked: Vec<((usize, usize), usize)>,
    candidates: Vec<Candidate>,
    refused: usize,
    /// Exclusive DRA devices ruled out because another claim has them.
    taken: usize,
}

impl Decision<'_> {
    fn outcome<'a>(&'a self, slot: usize, asked: &'a [SlotOutcome]) -> &'a SlotOutcome {
        match self.slots[slot] {
            SlotAnswer::Known(outcome) => outcome,
            SlotAnswer::Asked(i) => &asked[i],
        }
    }
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
            interner: Mutex::new(Interner::new()),
            verdicts: Mutex::new(Verdicts::default()),
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
        let key = AskKey::of(ask);
        for _ in 0..CLAIM_ATTEMPTS {
            // Read before Place reads anything (see `Placer::answers_generation`).
            let answers = self.placer.answers_generation();
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
            let at = answers.map(|generation| (indexed.epoch, generation));
            let known = at.and_then(|at| self.verdicts.lock().unpoisoned().known(&key, at));
            let mut decision = self.candidates(ask, &indexed, &live, known.as_deref());
            if decision.candidates.is_empty() {
                return Err(match (decision.refused, decision.taken) {
                    (0, 0) => NoChoice::NoneAcceptable(ask.workload.clone()),
                    (0, taken) => NoChoice::NoFreeDevice(taken),
                    (refused, _) => NoChoice::NoHamiRoom(refused),
                });
            }
            let outcomes = match self.ask_placer(&decision).await {
                // Every slot asked is of a sharing mode without runs, but kept ones may
                // not be: what the whole ask answers decides.
                Err(NoChoice::Placement(PlacementError::UnmeasuredMode(_)))
                    if decision.slots.len() > decision.placement.slots.len() =>
                {
                    decision = self.candidates(ask, &indexed, &live, None);
                    self.ask_placer(&decision).await?
                }
                outcomes => outcomes?,
            };
            if let Some(at) = at {
                self.verdicts.lock().unpoisoned().learn(
                    key.clone(),
                    at,
                    decision
                        .plain_asked
                        .iter()
                        .map(|(slot, i)| (*slot, outcomes[*i].clone())),
                );
            }
            // Best gain first; ties keep the inventory's order (node, id).
            let acceptable: Vec<(f64, &Candidate)> = best_k(
                decision.candidates.iter().filter_map(|c| {
                    match decision.outcome(c.slot, &outcomes) {
                        SlotOutcome::Fits { gain } if gain.is_finite() => Some((*gain, c)),
                        _ => None,
                    }
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

    /// Place's outcomes for the slots `decision` asks about (none asked: no call).
    async fn ask_placer(&self, decision: &Decision<'_>) -> Result<Vec<SlotOutcome>, NoChoice> {
        if decision.placement.slots.is_empty() {
            return Ok(Vec::new());
        }
        let outcomes = self.placer.place(&decision.placement).await?;
        if outcomes.len() != decision.placement.slots.len() {
            return Err(NoChoice::PlacementMismatch {
                asked: decision.placement.slots.len(),
                answered: outcomes.len(),
            });
        }
        Ok(outcomes)
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
        let mut interner = self.interner.lock().unpoisoned();
        if let Some(last) = kept.as_ref() {
            interner.trim(last.distinct_sets);
        }
        let (generation, residents) = self.resident_index(&mut interner);
        let used = self.hami_use();
        let device_at = match kept.as_ref().filter(|i| Arc::ptr_eq(&i.devices, devices)) {
            Some(last) => last.device_at.clone(),
            None => Arc::new(device_index(devices)),
        };
        let mut facts = Vec::with_capacity(devices.len());
        // The previous device's kind: devices of one node come together, and a node's
        // labels are the same for all of them.
        let mut last: Option<(&Device, usize)> = None;
        for device in devices.iter() {
            let kind = match last {
                Some((before, kind))
                    if before.node == device.node
                        && before.model == device.model
                        && before.memory_gb.map(f64::to_bits)
                            == device.memory_gb.map(f64::to_bits) =>
                {
                    kind
                }
                _ => {
                    let gpus = self.cluster.node(&device.node);
                    let label_model = gpus.as_ref().and_then(|g| g.gpu_model.clone());
                    let label_memory = gpus.as_ref().and_then(|g| g.memory_gb);
                    let model = label_model.or_else(|| device.model.clone());
                    interner.kind_id(model, label_memory.or(device.memory_gb))
                }
            };
            last = Some((device, kind));
            facts.push(DeviceFacts {
                set: residents.set_of(device),
                kind,
                used: used
                    .get(device.node.as_str())
                    .and_then(|gpus| gpus.get(device.id.as_str()))
                    .copied()
                    .unwrap_or_default(),
            });
        }
        let indexed = Arc::new(Indexed {
            devices: devices.clone(),
            generation,
            built_at_ms: now,
            epoch: interner.epoch,
            sets: interner.sets.clone(),
            kinds: interner.kinds.clone(),
            distinct_sets: residents.distinct,
            facts,
            device_at,
        });
        *kept = Some(indexed.clone());
        indexed
    }

    /// The view's occupied GPUs by resident set, in one pass, and the view's generation.
    fn resident_index(&self, interner: &mut Interner) -> (u64, ResidentIndex) {
        let mut on = DeviceAt::default();
        let mut distinct: foldhash::HashSet<usize> = Default::default();
        let (generation, occupied) = self.cluster.occupied_everywhere();
        for (node, gpus) in occupied {
            let by_gpu = on.entry(node).or_default();
            for (gpu, residents) in gpus {
                // The same set, the same key: members (name, floor's bits), sorted.
                let mut key: SetKey = residents
                    .into_iter()
                    .map(|r| {
                        let bits = r.min_job_fraction.map(f64::to_bits);
                        (r.into_placement_name(), bits)
                    })
                    .collect();
                key.sort_unstable();
                let id = interner.set_id(key);
                distinct.insert(id);
                by_gpu.insert(gpu, id);
            }
        }
        let distinct = distinct.len();
        (generation, ResidentIndex { on, distinct })
    }

    /// What bound pods' HAMi allocations take on each GPU.
    fn hami_use(&self) -> HamiUse {
        let mut used = HamiUse::default();
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
    /// A plain slot whose outcome `known` holds is not asked again.
    fn candidates<'k>(
        &self,
        ask: &Ask,
        indexed: &Indexed,
        live: &[Reservation],
        known: Option<&'k Known>,
    ) -> Decision<'k> {
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
        let mut book = SlotBook {
            known,
            placement: PlacementAsk {
                workload: ask.workload.clone(),
                min_job_fraction: ask.min_job_fraction,
                sharing_mode: ask.sharing_mode,
                slots: Vec::new(),
            },
            slots: Vec::new(),
            plain_asked: Vec::new(),
            by_set: Default::default(),
        };
        // GPUs with holds: by (set, kind, held workloads), the slot of the set with the held
        // workloads among its residents (an id of the interner's, unless it started over
        // since the index was made: then a slot of their own, not kept).
        let mut with_holds: HashMap<(usize, usize, Vec<&str>), usize> = HashMap::new();
        let mut interner = None;
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
                book.slot(set, facts.kind, residents, kind)
            } else {
                held.sort_by(|a, b| a.workload.cmp(&b.workload));
                let key = (
                    set,
                    facts.kind,
                    held.iter().map(|r| r.workload.as_str()).collect(),
                );
                *with_holds.entry(key).or_insert_with(|| {
                    let mut members: SetKey = residents
                        .iter()
                        .map(|(w, f)| (w.clone(), f.map(f64::to_bits)))
                        .collect();
                    members.extend(held.iter().map(|r| (r.workload.clone(), None)));
                    members.sort_unstable();
                    let interner =
                        interner.get_or_insert_with(|| self.interner.lock().unpoisoned());
                    if interner.epoch != indexed.epoch {
                        return book.unkept(&members, kind);
                    }
                    let with = interner.set_id(members);
                    book.slot(with, facts.kind, &interner.sets[with].0, kind)
                })
            };
            candidates.push(Candidate {
                device: at,
                set,
                holds,
                slot,
            });
        }
        Decision {
            placement: book.placement,
            slots: book.slots,
            plain_asked: book.plain_asked,
            candidates,
            refused,
            taken,
        }
    }
}

/// The slots of one decision: each (set, kind) once, answered from the kept outcomes where
/// they hold one, else asked.
struct SlotBook<'k> {
    known: Option<&'k Known>,
    placement: PlacementAsk,
    slots: Vec<SlotAnswer<'k>>,
    plain_asked: Vec<((usize, usize), usize)>,
    by_set: foldhash::HashMap<(usize, usize), usize>,
}

impl<'k> SlotBook<'k> {
    /// The slot of the set `set` (its members `members`) on the GPU kind `kind`.
    fn slot(
        &mut self,
        set: usize,
        kind_id: usize,
        members: &Residents,
        kind: &(Option<String>, Option<f64>),
    ) -> usize {
        if let Some(&slot) = self.by_set.get(&(set, kind_id)) {
            return slot;
        }
        match self.known.and_then(|k| k.get(&(set, kind_id))) {
            Some(outcome) => self.slots.push(SlotAnswer::Known(outcome)),
            None => {
                let asked = push_slot(&mut self.placement, members, kind);
                self.plain_asked.push(((set, kind_id), asked));
                self.slots.push(SlotAnswer::Asked(asked));
            }
        }
        self.by_set.insert((set, kind_id), self.slots.len() - 1);
        self.slots.len() - 1
    }

    /// A slot asked and not kept: members (name, floor's bits), sorted.
    fn unkept(&mut self, members: &SetKey, kind: &(Option<String>, Option<f64>)) -> usize {
        let asked = push_slot(&mut self.placement, &members_of(members), kind);
        self.slots.push(SlotAnswer::Asked(asked));
        self.slots.len() - 1
    }
}

/// Each device's index in the inventory, by node and id.
fn device_index(devices: &[Device]) -> DeviceAt {
    let mut device_at = DeviceAt::default();
    for (at, device) in devices.iter().enumerate() {
        device_at
            .entry(device.node.clone())
            .or_default()
            .insert(device.id.clone(), at);
    }
    device_at
}

/// A new slot of `placement`: the GPU model and memory of `kind` and the members, sorted
/// by workload. Its index.
fn push_slot(
    placement: &mut PlacementAsk,
    members: &Residents,
    kind: &(Option<String>, Option<f64>),
) -> usize {
    placement.slots.push(GpuSlot {
        gpu_model: kind.0.clone(),
        memory_gb: kind.1,
        residents: members.iter().map(|(w, _)| w.clone()).collect(),
        resident_floors: members.iter().map(|(_, f)| *f).collect(),
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
    use std::sync::{atomic::AtomicU64, Arc, Mutex};

    use super::*;
    use crate::extender::{decide::PlaceFuture, node::NodeGpus, pod::Residency};

    /// A placer whose gains depend on the slot's members and on its answers generation,
    /// and that records how many slots each call asked about.
    struct Counting {
        asked: Mutex<Vec<usize>>,
        generation: AtomicU64,
        keeps: bool,
    }

    impl Placer for Counting {
        fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a> {
            self.asked.lock().unwrap().push(ask.slots.len());
            let later = self.generation.load(Ordering::SeqCst) > 0;
            let outcomes = ask
                .slots
                .iter()
                .map(|slot| {
                    let gain = match slot.residents.as_slice() {
                        [] => 1.0,
                        [a] if a == "a" => {
                            if later {
                                0.2
                            } else {
                                2.0
                            }
                        }
                        [b] if b == "b" => 0.5,
                        _ => 0.1,
                    };
                    SlotOutcome::Fits { gain }
                })
                .collect();
            Box::pin(async move { Ok(outcomes) })
        }

        fn answers_generation(&self) -> Option<u64> {
            self.keeps.then(|| self.generation.load(Ordering::SeqCst))
        }
    }

    /// g0 empty, g1, g2 and g4 run `a` (one set), g3 runs `b`; one node, in that order.
    async fn chooser(keeps: bool) -> (tempfile::TempDir, Arc<Counting>, Chooser) {
        let dir = tempfile::TempDir::new().unwrap();
        let url = format!("sqlite://{}", dir.path().join("coloc.db").display());
        let store = crate::store::Store::open(&url).await.unwrap();
        let view = Arc::new(ClusterView::new());
        view.set_node(
            "n",
            Some(NodeGpus {
                count: 5,
                gpu_model: None,
                memory_gb: None,
            }),
        );
        for (pod, gpu, workload) in [
            ("p1", "g1", "a"),
            ("p2", "g2", "a"),
            ("p3", "g3", "b"),
            ("p4", "g4", "a"),
        ] {
            view.set_pod(
                pod,
                Some(Residency {
                    node: "n".into(),
                    gpus: vec![gpu.into()],
                    workload: workload.into(),
                    min_job_fraction: None,
                }),
            );
        }
        let inventory = Arc::new(Inventory::new());
        inventory.set_node(
            "n",
            (0..5)
                .map(|g| Device {
                    node: "n".into(),
                    id: format!("g{g}"),
                    model: None,
                    memory_gb: None,
                    hami: None,
                    dra: None,
                })
                .collect(),
        );
        let placer = Arc::new(Counting {
            asked: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            keeps,
        });
        let chooser = Chooser::new(
            placer.clone(),
            view,
            inventory,
            Reservations::Store(store.pool().clone()),
            Duration::from_secs(600),
            1,
        );
        (dir, placer, chooser)
    }

    fn ask(holder: &str) -> Ask {
        Ask {
            workload: "job".into(),
            min_job_fraction: None,
            sharing_mode: None,
            holder: holder.into(),
            hami: Vec::new(),
        }
    }

    fn picked(choice: &Choice) -> (&str, f64) {
        (choice.gpus[0].id.as_str(), choice.gains[0])
    }

    #[tokio::test]
    async fn kept_outcomes_answer_as_place_would_until_the_answers_generation_moves() {
        let (_keeping_dir, keeping, kept) = chooser(true).await;
        let (_asking_dir, _, asked) = chooser(false).await;
        for (pod, expected) in [("pod-1", ("g1", 2.0)), ("pod-2", ("g2", 2.0))] {
            let with = kept.choose(&ask(pod)).await.unwrap();
            let without = asked.choose(&ask(pod)).await.unwrap();
            assert_eq!(picked(&with), expected);
            assert_eq!(with, without);
        }
        // The first call asked about the three plain slots (empty, {a}, {b}); the second
        // only about g1 with pod-1's hold ({a, job}).
        assert_eq!(*keeping.asked.lock().unwrap(), [3, 1]);
        // A new generation: {a} now gains 0.2, and the 2.0 kept for g4's set is not read.
        keeping.generation.store(1, Ordering::SeqCst);
        let choice = kept.choose(&ask("pod-3")).await.unwrap();
        assert_eq!(picked(&choice), ("g0", 1.0));
        assert_eq!(keeping.asked.lock().unwrap()[2], 4);
    }

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
