//! The service's [`Placer`]: the advisor, in-process. A node names its GPU model as GPU
//! feature discovery writes it (spaces as dashes); it is matched against the GPU models
//! coloc has a model for, ignoring case and the space/dash difference.
//!
//! Each distinct GPU (model, memory, residents) is judged once, with the objective
//! THROUGHPUT_SUM: the gain is the set's predicted throughput with the job minus without
//! it (an empty GPU gains the job's exclusive throughput); the job must keep
//! `min_job_fraction` of its exclusive throughput; a GPU whose set would not fit its memory
//! or would exceed the largest set coloc predicts is refused.

use std::sync::Arc;

use super::decide::{GpuSlot, PlaceFuture, PlacementAsk, PlacementError, Placer, SlotOutcome};
use crate::{
    advisor::{Advisor, Error, PredictQuery, PredictResult},
    domain::{GpuName, WorkloadName},
};

/// Jobs one GPU may run, the job included (Place's default `max_jobs_per_gpu`).
pub const MAX_JOBS_PER_GPU: usize = 4;

pub struct AdvisorPlacer {
    advisor: Arc<Advisor>,
}

impl AdvisorPlacer {
    pub fn new(advisor: Arc<Advisor>) -> Self {
        Self { advisor }
    }
}

fn normalized(name: &str) -> String {
    name.trim().replace(' ', "-").to_ascii_lowercase()
}

impl AdvisorPlacer {
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

    async fn predict(
        &self,
        workloads: Vec<WorkloadName>,
        gpu: &Option<GpuName>,
        memory_gb: Option<f64>,
    ) -> Result<PredictResult, Error> {
        self.advisor
            .predict(PredictQuery {
                workloads,
                gpu: gpu.clone(),
                gpu_memory_gb: memory_gb,
            })
            .await
    }

    async fn judge(
        &self,
        job: &WorkloadName,
        ask: &PlacementAsk,
        slot: &GpuSlot,
    ) -> Result<SlotOutcome, PlacementError> {
        let gpu = match self.gpu_model(slot.gpu_model.as_deref()) {
            Ok(gpu) => gpu,
            Err(reason) => return Ok(SlotOutcome::Unscored { reason }),
        };
        if slot.residents.len() + 1 > MAX_JOBS_PER_GPU {
            return Ok(SlotOutcome::DoesNotFit {
                reason: format!(
                    "the GPU already runs {} jobs; at most {MAX_JOBS_PER_GPU} may share one",
                    slot.residents.len()
                ),
            });
        }
        let mut residents = Vec::with_capacity(slot.residents.len());
        for name in &slot.residents {
            match WorkloadName::parse("residents", name) {
                Ok(name) => residents.push(name),
                Err(_) => {
                    return Ok(SlotOutcome::Unscored {
                        reason: format!("resident {name:?} is not a workload name"),
                    })
                }
            }
        }
        // With the job: a copy of it stands in for the set when the GPU is empty.
        let mut with_job = residents.clone();
        with_job.push(job.clone());
        if residents.is_empty() {
            with_job.push(job.clone());
        }
        let after = match self.predict(with_job, &gpu, slot.memory_gb).await {
            Ok(after) => after,
            Err(error) => return outcome_of(error, &ask.workload),
        };
        let job_member = after.members.last().expect("the job is a member");
        if residents.is_empty() {
            return Ok(SlotOutcome::Fits {
                gain: job_member.exclusive_throughput,
            });
        }
        if !after.fits_memory {
            return Ok(SlotOutcome::DoesNotFit {
                reason: format!(
                    "with {} the GPU would need {:.1} GB, more than it has",
                    ask.workload, after.memory_gb
                ),
            });
        }
        if let (Some(fraction), Some(kept)) =
            (ask.min_job_fraction, job_member.predicted_slowdown())
        {
            if kept < fraction {
                return Ok(SlotOutcome::DoesNotFit {
                    reason: format!(
                        "{} would keep {:.0} % of its exclusive throughput beside {}, below the {:.0} % it asks",
                        ask.workload,
                        kept * 100.0,
                        slot.residents.join("+"),
                        fraction * 100.0
                    ),
                });
            }
        }
        let before = if residents.len() == 1 {
            after.members[0].exclusive_throughput
        } else {
            match self.predict(residents, &gpu, slot.memory_gb).await {
                Ok(before) => before.predicted_throughput_sum,
                Err(error) => return outcome_of(error, &ask.workload),
            }
        };
        Ok(SlotOutcome::Fits {
            gain: after.predicted_throughput_sum - before,
        })
    }
}

/// A prediction's failure: the job unknown fails the whole ask; what concerns one GPU
/// (its GPU model, a resident) leaves that GPU unscored.
fn outcome_of(error: Error, job: &str) -> Result<SlotOutcome, PlacementError> {
    match error {
        Error::UnknownWorkload(name) if name == job => Err(PlacementError::UnknownWorkload(name)),
        Error::Internal(cause) => Err(PlacementError::Unavailable(format!("{cause:#}"))),
        other => Ok(SlotOutcome::Unscored {
            reason: other.to_string(),
        }),
    }
}

impl Placer for AdvisorPlacer {
    fn place<'a>(&'a self, ask: &'a PlacementAsk) -> PlaceFuture<'a> {
        Box::pin(async move {
            let job = WorkloadName::parse("workload", &ask.workload)
                .map_err(|_| PlacementError::UnknownWorkload(ask.workload.clone()))?;
            let mut outcomes = Vec::with_capacity(ask.slots.len());
            for slot in &ask.slots {
                outcomes.push(self.judge(&job, ask, slot).await?);
            }
            Ok(outcomes)
        })
    }
}
