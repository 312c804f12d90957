//! The service's [`Placer`]: the advisor's Place, in-process. A node names its GPU model as
//! GPU feature discovery writes it (spaces as dashes); it is matched against the GPU models
//! coloc has a model for, ignoring case and the space/dash difference.
//!
//! One Place query per call, over the distinct GPUs the extender collected, with Place's
//! defaults (THROUGHPUT_SUM, at most 4 jobs per GPU, nobody sped up by a co-runner) and the
//! pod's `min_job_fraction`. What Place skips for a cause the job's placement decides
//! (memory, a cap, too many jobs) refuses the GPU; what it skips because coloc cannot judge
//! the GPU (no model, a resident without a profile or unknown, memory unknown) leaves it
//! unscored.

use std::sync::Arc;

use super::decide::{PlaceFuture, PlacementAsk, PlacementError, Placer, SlotOutcome};
use crate::{
    advisor::{Advisor, Error, GpuState, PlaceQuery, PlaceSkipCode},
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
                        outcomes[i] = Some(SlotOutcome::Fits {
                            gain: placement.gain,
                        });
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
