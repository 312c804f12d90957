//! The service's [`Placer`]: the advisor's Place, in-process. A node names its GPU model as
//! GPU feature discovery writes it (spaces as dashes); it is matched against the GPU models
//! coloc has a model for, ignoring case and the space/dash difference.
//!
//! One Place query per call, over the distinct GPUs the extender collected, with Place's
//! defaults (THROUGHPUT_SUM, at most 4 jobs per GPU, nobody sped up by a co-runner) and the
//! pod's `min_job_fraction`; each resident's own `min_job_fraction` is then checked on the
//! members Place predicts (Place's `min_resident_fraction` is one figure for every
//! resident, and residents differ). What Place skips for a cause the job's placement decides
//! (memory, a cap, too many jobs) refuses the GPU; what it skips because coloc cannot judge
//! the GPU (no model, a resident without a profile or unknown, memory unknown) leaves it
//! unscored.

use std::sync::Arc;

use super::{
    decide::{PlaceFuture, PlacementAsk, PlacementError, Placer, SlotOutcome},
    pod::MIN_JOB_FRACTION_ANNOTATION,
};
use crate::{
    advisor::{Advisor, Error, GpuState, MemberPrediction, PlaceQuery, PlaceSkipCode},
    domain::{GpuName, WorkloadName},
};

pub struct AdvisorPlacer {
    advisor: Arc<Advisor>,
}

impl AdvisorPlacer {
    pub fn new(advisor: Arc<Advisor>) -> Self {
        Self { advisor }
    }

    /// The GPU model a node's label means; `Err` = coloc has no model for it.
    fn gpu_model(&self, label: Option<&str>) -> Result<Option<GpuName>, String> {
        let Some(label) = label else {
            return Ok(None);
        };
        let wanted = normalized(label);
        self.advisor
            .champions()
            .iter()
            .map(|model| model.gpu.clone())
            .find(|gpu| normalized(gpu.as_str()) == wanted)
            .map(Some)
            .ok_or_else(|| format!("coloc has no model for GPU model {label:?}"))
    }
}

/// A GPU Place admits fits only if each resident keeps its own `min_job_fraction` on the
/// point prediction, as the new job's floor is read (`members`: the job first, then the
/// residents in the order the slot gave them). A floor the answer cannot check (a model
/// that predicts only sums, with no cap asked of the job) leaves the GPU unscored.
fn residents_keep_their_floors(
    members: &[MemberPrediction],
    floors: &[Option<f64>],
    gain: f64,
) -> SlotOutcome {
    for (member, floor) in members.iter().skip(1).zip(floors) {
        let Some(floor) = *floor else { continue };
        match member.predicted_speed_fraction() {
            Some(kept) if kept < floor => {
                return SlotOutcome::DoesNotFit {
                    reason: format!(
                        "predicted to leave resident {} {:.0} % of its exclusive throughput, \
                         below its {MIN_JOB_FRACTION_ANNOTATION} of {:.0} %",
                        member.workload,
                        kept * 100.0,
                        floor * 100.0
                    ),
                }
            }
            Some(_) => {}
            None => {
                return SlotOutcome::Unscored {
                    reason: format!(
                        "the model predicts no share for resident {}, whose \
                         {MIN_JOB_FRACTION_ANNOTATION} cannot be checked",
                        member.workload
                    ),
                }
            }
        }
    }
    SlotOutcome::Fits { gain }
}

fn normalized(name: &str) -> String {
    name.trim().replace(' ', "-").to_ascii_lowercase()
}

/// Whether a skip is about the job's placement (the node may be filtered out) or about
/// what coloc cannot judge (neutral).
fn refuses(code: PlaceSkipCode) -> bool {
    match code {
        PlaceSkipCode::ExceedsGpuMemory
        | PlaceSkipCode::JobSlowdown
        | PlaceSkipCode::ResidentSlowdown
        | PlaceSkipCode::TooManyJobs => true,
        PlaceSkipCode::UnknownWorkload
        | PlaceSkipCode::NoModel
        | PlaceSkipCode::JobNotProfiled
        | PlaceSkipCode::ResidentNotProfiled
        | PlaceSkipCode::GpuMemoryUnknown => false,
    }
}

impl Placer for AdvisorPlacer {
    fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a> {
        Box::pin(async move {
            let job = WorkloadName::parse("workload", &ask.workload)
                .map_err(|_| PlacementError::UnknownWorkload(ask.workload.clone()))?;
            let mut outcomes: Vec<Option<SlotOutcome>> = vec![None; ask.slots.len()];
            let mut gpus = Vec::with_capacity(ask.slots.len());
            for (i, slot) in ask.slots.iter().enumerate() {
                match self.gpu_model(slot.gpu_model.as_deref()) {
                    Ok(gpu) => gpus.push(GpuState {
                        id: i.to_string(),
                        node: String::new(),
                        gpu,
                        memory_gb: slot.memory_gb,
                        residents: slot.residents.clone(),
                    }),
                    Err(reason) => outcomes[i] = Some(SlotOutcome::Unscored { reason }),
                }
            }
            if !gpus.is_empty() {
                let mut query = PlaceQuery::new(job, gpus);
                query.min_job_fraction = ask.min_job_fraction;
                let answer = self
                    .advisor
                    .place(query)
                    .await
                    .map_err(|error| match error {
                        Error::UnknownWorkload(name) | Error::UnknownTarget(name) => {
                            PlacementError::UnknownWorkload(name)
                        }
                        other => PlacementError::Unavailable(other.to_string()),
                    })?;
                let slots = outcomes.len();
                let slot_of = |id: &str| id.parse::<usize>().ok().filter(|i| *i < slots);
                for placement in answer.placements {
                    if let Some(i) = slot_of(&placement.gpu_id) {
                        outcomes[i] = Some(residents_keep_their_floors(
                            &placement.members,
                            &ask.slots[i].resident_floors,
                            placement.gain,
                        ));
                    }
                }
                for skipped in answer.skipped {
                    if let Some(i) = slot_of(&skipped.gpu_id) {
                        outcomes[i] = Some(if refuses(skipped.code) {
                            SlotOutcome::DoesNotFit {
                                reason: skipped.reason,
                            }
                        } else {
                            SlotOutcome::Unscored {
                                reason: skipped.reason,
                            }
                        });
                    }
                }
            }
            Ok(outcomes
                .into_iter()
                .map(|outcome| {
                    outcome.unwrap_or(SlotOutcome::Unscored {
                        reason: "Place did not answer for this GPU".into(),
                    })
                })
                .collect())
        })
    }
}
