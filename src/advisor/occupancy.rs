//! Occupancy kept by coloc for schedulers that would rather not send the whole cluster with
//! every Place: AssignJob, ReleaseJob and ListGpus, and the stored view Place falls back to.
//! The rules (a job assigned twice, released twice, a GPU model without a model) are the
//! store's, in `store/occupancy.rs`; here requests are checked against the catalog.

use super::{decode_page_token, encode_page_token, Advisor, Error, GpuState, Result};
use crate::{
    domain::{now_ms, GpuName, ValidationError, WorkloadName},
    store::{Assigned, Assignment, ClusterGpu},
};

/// The longest lease accepted: a year.
pub const MAX_LEASE_SECS: u64 = 366 * 24 * 3600;

/// AssignJob in domain terms.
#[derive(Debug, Clone, PartialEq)]
pub struct JobAssignment {
    pub job_id: String,
    pub gpu_id: String,
    pub node: String,
    /// `None` = the default GPU model.
    pub gpu: Option<GpuName>,
    pub workload: WorkloadName,
    /// 0 = no lease.
    pub lease_secs: u64,
}

impl JobAssignment {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.lease_secs > MAX_LEASE_SECS {
            return Err(ValidationError::new(
                "lease_secs",
                format!(
                    "lease_secs must be at most {MAX_LEASE_SECS} (a year; 0 = no lease), got {}",
                    self.lease_secs
                ),
            ));
        }
        Ok(())
    }
}

/// Which stored GPUs a listing (or Place against the stored view) covers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuFilter {
    /// Empty = every node.
    pub nodes: Vec<String>,
    pub gpu: Option<GpuName>,
}

impl GpuFilter {
    fn matches(&self, gpu: &ClusterGpu) -> bool {
        (self.nodes.is_empty() || self.nodes.iter().any(|n| **n == *gpu.node))
            && self.gpu.as_ref().is_none_or(|g| *g == gpu.gpu)
    }
}

impl Advisor {
    /// Records that a job runs on a GPU (renewing its lease when it is the same job again);
    /// acknowledged once committed.
    pub async fn assign_job(&self, assignment: JobAssignment) -> Result<Assigned> {
        assignment.validate()?;
        if !self.read_catalog().contains(&assignment.workload) {
            return Err(Error::UnknownWorkload(
                assignment.workload.as_str().to_string(),
            ));
        }
        let gpu = self.resolve_gpu(assignment.gpu)?;
        let lease_ms = (assignment.lease_secs > 0).then_some(assignment.lease_secs as i64 * 1000);
        Ok(self
            .store
            .assign_cluster_job(
                Assignment {
                    job_id: assignment.job_id,
                    gpu_id: assignment.gpu_id,
                    node: assignment.node,
                    gpu,
                    workload: assignment.workload,
                    lease_ms,
                },
                now_ms(),
            )
            .await?)
    }

    /// Forgets a job; `false` when it was not running (never assigned, released already or
    /// expired): a retried release is not an error.
    pub async fn release_job(&self, job_id: String) -> Result<bool> {
        Ok(self.store.release_cluster_job(job_id, now_ms()).await?)
    }

    /// The GPU model of a reported run: a GPU of the occupancy fixes it (naming another is
    /// refused); otherwise the one named, else the default.
    pub fn gpu_of_run(&self, requested: Option<GpuName>, gpu_id: Option<&str>) -> Result<GpuName> {
        let known = gpu_id.and_then(|id| {
            self.store
                .occupancy()
                .gpu(id)
                .map(|g| (g.gpu.clone(), g.node.to_string()))
        });
        match (requested, known) {
            (Some(requested), Some((known, node))) if requested != known => Err(Error::Occupancy(
                crate::store::OccupancyConflict::GpuMismatch {
                    gpu_id: gpu_id.unwrap_or_default().to_string(),
                    known_gpu: known.to_string(),
                    known_node: node.clone(),
                    gpu: requested.to_string(),
                    node,
                },
            )),
            (_, Some((known, _))) => Ok(known),
            (requested, None) => self.resolve_gpu(requested),
        }
    }

    /// One page of the stored GPUs by id, each with its live jobs.
    pub fn list_gpus(
        &self,
        page_size: u32,
        page_token: &str,
        filter: &GpuFilter,
    ) -> Result<(Vec<ClusterGpu>, String)> {
        let limit = match page_size {
            0 => super::DEFAULT_PAGE_SIZE,
            n => n.min(super::MAX_PAGE_SIZE),
        } as usize;
        let after = decode_page_token(page_token)?;
        let now = now_ms();
        let occupancy = self.store.occupancy();
        let mut page: Vec<ClusterGpu> = occupancy
            .gpus_after(after.as_deref())
            .filter(|g| filter.matches(g))
            .take(limit + 1)
            .map(|g| ClusterGpu {
                jobs: g.jobs.iter().filter(|j| j.is_live(now)).cloned().collect(),
                ..g.clone()
            })
            .collect();
        let next = if page.len() > limit {
            page.truncate(limit);
            page.last()
                .map(|g| encode_page_token(&g.id))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((page, next))
    }

    /// The stored GPUs that pass the filter, as Place's candidates (live jobs only).
    pub(super) fn stored_gpus(&self, filter: &GpuFilter) -> Vec<GpuState> {
        let now = now_ms();
        self.store
            .occupancy()
            .gpus()
            .filter(|g| filter.matches(g))
            .map(|g| GpuState {
                id: g.id.to_string(),
                node: g.node.to_string(),
                gpu: Some(g.gpu.clone()),
                memory_gb: None,
                residents: g
                    .jobs
                    .iter()
                    .filter(|j| j.is_live(now))
                    .map(|j| j.workload.as_str().to_string())
                    .collect(),
                resident_floors: Vec::new(),
            })
            .collect()
    }
}
