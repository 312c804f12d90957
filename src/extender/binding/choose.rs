//! The webhook's decision: which GPUs of the whole cluster a pod should go to, best first,
//! and the hold on the first. Each GPU of the [`Inventory`] is offered to the same
//! [`Placer`] the filter asks (the advisor's Place with the server's policy), with its
//! residents from the [`ClusterView`] plus the live holds of the reservations table under
//! the GPU's current resident-set version; GPUs with the same model, memory and residents
//! are asked about once. The acceptable ones (Place's placements) come back ordered by gain,
//! ties by node and id; the first is claimed in the store, and when another decider got that
//! slot first the decision is taken again with its hold in view.

use std::{collections::HashMap, sync::Arc, time::Duration};

use super::inventory::{Device, Inventory};
use crate::{
    extender::{
        cluster::ClusterView,
        decide::{GpuSlot, PlacementAsk, PlacementError, Placer, SlotOutcome},
    },
    store::reservations::{Reservation, ReservationError, Reservations},
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
}

/// A GPU's residents: each workload with its own floor.
type Residents = Vec<(String, Option<f64>)>;

/// One GPU of the decision: its device, residents (the view's plus live holds) and version.
struct Candidate {
    device: Device,
    version: String,
    holds: i64,
    slot: usize,
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
            let live = self.reservations.live(now).await?;
            let (placement, candidates) = self.candidates(ask, &devices, &live);
            let outcomes = self.placer.place(&placement).await?;
            if outcomes.len() != placement.slots.len() {
                return Err(NoChoice::PlacementMismatch {
                    asked: placement.slots.len(),
                    answered: outcomes.len(),
                });
            }
            let mut acceptable: Vec<(f64, &Candidate)> = candidates
                .iter()
                .filter_map(|c| match outcomes[c.slot] {
                    SlotOutcome::Fits { gain } if gain.is_finite() => Some((gain, c)),
                    _ => None,
                })
                .collect();
            // Best gain first; ties keep the inventory's order (node, id).
            acceptable.sort_by(|a, b| b.0.total_cmp(&a.0));
            acceptable.truncate(self.gpus);
            let Some((_, first)) = acceptable.first() else {
                return Err(NoChoice::NoneAcceptable(ask.workload.clone()));
            };
            let hold = Reservation {
                node: first.device.node.clone(),
                gpu_id: first.device.id.clone(),
                resident_version: first.version.clone(),
                ordinal: first.holds,
                holder: ask.holder.clone(),
                workload: ask.workload.clone(),
                reserved_at_ms: now,
                expires_at_ms: now + self.ttl.as_millis() as i64,
            };
            if self.reservations.claim(&hold).await? {
                if let Err(error) = self
                    .reservations
                    .sweep(now - self.ttl.as_millis() as i64)
                    .await
                {
                    tracing::warn!(%error, "binding: expired holds not swept");
                }
                return Ok(Choice {
                    gains: acceptable.iter().map(|(g, _)| *g).collect(),
                    gpus: acceptable
                        .into_iter()
                        .map(|(_, c)| c.device.clone())
                        .collect(),
                });
            }
            tracing::debug!(gpu = %hold.gpu_id, holder = %ask.holder, "binding: slot taken by another decider; deciding again");
        }
        Err(NoChoice::Contended(CLAIM_ATTEMPTS))
    }

    /// The Place ask over every GPU, and each GPU's slot in it.
    fn candidates(
        &self,
        ask: &Ask,
        devices: &[Device],
        live: &[Reservation],
    ) -> (PlacementAsk, Vec<Candidate>) {
        let mut residents: HashMap<(&str, &str), Residents> = HashMap::new();
        let mut node_model: HashMap<&str, (Option<String>, Option<f64>)> = HashMap::new();
        let mut known: HashMap<&str, HashMap<&str, &Device>> = HashMap::new();
        for device in devices {
            known
                .entry(device.node.as_str())
                .or_default()
                .insert(device.id.as_str(), device);
        }
        for device in devices {
            let node = device.node.as_str();
            if !node_model.contains_key(node) {
                let gpus = self.cluster.node(node);
                node_model.insert(
                    node,
                    (
                        gpus.as_ref().and_then(|g| g.gpu_model.clone()),
                        gpus.as_ref().and_then(|g| g.memory_gb),
                    ),
                );
                self.cluster.with_occupied_gpus(node, |gpu, on_gpu| {
                    if let Some(device) = known.get(node).and_then(|ids| ids.get(gpu)) {
                        residents.insert(
                            (device.node.as_str(), device.id.as_str()),
                            on_gpu
                                .into_iter()
                                .map(|(w, f)| (w.to_string(), f))
                                .collect(),
                        );
                    }
                });
            }
        }
        let mut placement = PlacementAsk {
            workload: ask.workload.clone(),
            min_job_fraction: ask.min_job_fraction,
            sharing_mode: ask.sharing_mode,
            slots: Vec::new(),
        };
        let mut index: HashMap<String, usize> = HashMap::new();
        // The live holds by GPU (a few per GPU at most; looked up once per GPU).
        let mut holds_on: HashMap<(&str, &str), Vec<&Reservation>> = HashMap::new();
        for hold in live {
            holds_on
                .entry((hold.node.as_str(), hold.gpu_id.as_str()))
                .or_default()
                .push(hold);
        }
        let candidates = devices
            .iter()
            .map(|device| {
                let seen = residents
                    .get(&(device.node.as_str(), device.id.as_str()))
                    .cloned()
                    .unwrap_or_default();
                let version = resident_version(&seen);
                let held: Vec<&Reservation> = holds_on
                    .get(&(device.node.as_str(), device.id.as_str()))
                    .into_iter()
                    .flatten()
                    .filter(|r| r.resident_version == version && r.holder != ask.holder)
                    .copied()
                    .collect();
                // The next ordinal after the other holders' (a retried decision of the same
                // holder asks for its own key again and keeps it).
                let holds = held.iter().map(|r| r.ordinal + 1).max().unwrap_or(0);
                let mut all: Vec<(String, Option<f64>)> = seen;
                all.extend(held.iter().map(|r| (r.workload.clone(), None)));
                all.sort_by(|a, b| a.0.cmp(&b.0));
                let (label_model, label_memory) = node_model
                    .get(device.node.as_str())
                    .cloned()
                    .unwrap_or((None, None));
                let slot = GpuSlot {
                    gpu_model: label_model.or_else(|| device.model.clone()),
                    memory_gb: label_memory.or(device.memory_gb),
                    residents: all.iter().map(|(w, _)| w.clone()).collect(),
                    resident_floors: all.iter().map(|(_, f)| *f).collect(),
                };
                let key = format!("{slot:?}");
                let slot = *index.entry(key).or_insert_with(|| {
                    placement.slots.push(slot);
                    placement.slots.len() - 1
                });
                Candidate {
                    device: device.clone(),
                    version,
                    holds,
                    slot,
                }
            })
            .collect();
        (placement, candidates)
    }
}
