//! Occupancy kept by coloc for schedulers that would rather not send the whole cluster with
//! every Place: AssignJob, ReleaseJob and ListGpus, and the stored view Place falls back to.
//! The rules (a job assigned twice, released twice, a GPU model without a model) are the
//! store's, in `store/occupancy.rs`; here requests are checked against the catalog.
//! ListGpus and the stored view read the one cluster view ([`crate::cluster`]): the
//! assignments, and the pods the watcher and the agents' PodResources reports place, each
//! resident with its source; ReportPodDevices feeds it.

use super::{encode_page_token, Advisor, Error, GpuState, Result, PAGE_TOKEN_TAG};
use crate::{
    cluster::{PodDevices, ViewGpu},
    domain::{now_ms, GpuName, ValidationError, WorkloadName},
    store::{Assigned, Assignment},
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
    /// Whether a GPU of the view passes: its node is listed, and its GPU model is the one
    /// asked for (a node label matches ignoring case and spaces written as dashes).
    fn matches(&self, gpu: &ViewGpu) -> bool {
        (self.nodes.is_empty() || self.nodes.contains(&gpu.node))
            && self.gpu.as_ref().is_none_or(|g| {
                gpu.gpu_model
                    .as_deref()
                    .is_some_and(|m| same_gpu_model(m, g.as_str()))
            })
    }
}

/// Whether a node's GPU model label names `gpu` (GPU feature discovery writes spaces as
/// dashes).
pub fn same_gpu_model(label: &str, gpu: &str) -> bool {
    let normal = |s: &str| s.trim().replace(' ', "-").to_ascii_lowercase();
    normal(label) == normal(gpu)
}

/// A ListGpus page token: the last (GPU id, node) of the page before, as the advisor's
/// tokens are written (ids and nodes need not be workload names).
fn decode_gpu_page_token(token: &str) -> Result<Option<String>> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid = || {
        Error::InvalidRequest(ValidationError::new(
            "page_token",
            "page_token is not one this server issued",
        ))
    };
    if token.len() > PAGE_TOKEN_TAG.len() + 2 * 1024 {
        return Err(invalid());
    }
    let hex_part = token.strip_prefix(PAGE_TOKEN_TAG).ok_or_else(invalid)?;
    let bytes = hex::decode(hex_part).map_err(|_| invalid())?;
    String::from_utf8(bytes).map(Some).map_err(|_| invalid())
}

/// The most pods one ReportPodDevices may list, and GPUs per pod.
pub const MAX_REPORTED_PODS: usize = 10_000;
pub const MAX_GPUS_PER_POD: usize = 16;

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

    /// Records `node`'s PodResources snapshot (ReportPodDevices): the pods it lists hold
    /// those GPUs, and no other pod holds a GPU there by the kubelet's word. Returns the
    /// pods and distinct GPUs recorded.
    pub fn report_pod_devices(&self, node: &str, pods: Vec<PodDevices>) -> (usize, usize) {
        self.cluster.report_pod_devices(node, pods, now_ms())
    }

    /// One page of the cluster view's GPUs by (id, node), each with its live residents
    /// and where each came from.
    pub fn list_gpus(
        &self,
        page_size: u32,
        page_token: &str,
        filter: &GpuFilter,
    ) -> Result<(Vec<ViewGpu>, String)> {
        let limit = match page_size {
            0 => super::DEFAULT_PAGE_SIZE,
            n => n.min(super::MAX_PAGE_SIZE),
        } as usize;
        let after = decode_gpu_page_token(page_token)?;
        let key = |gpu: &ViewGpu| format!("{}\u{1f}{}", gpu.id, gpu.node);
        let mut page: Vec<ViewGpu> = self
            .cluster
            .gpus()
            .into_iter()
            .filter(|g| after.as_deref().is_none_or(|after| key(g).as_str() > after))
            .filter(|g| filter.matches(g))
            .take(limit + 1)
            .collect();
        let next = if page.len() > limit {
            page.truncate(limit);
            page.last()
                .map(|g| encode_page_token(&key(g)))
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok((page, next))
    }

    /// The GPU model a GPU of the view names: one coloc has a model for when a node label
    /// matches it, else the name as it stands (Place then skips it: no model).
    fn known_gpu(&self, label: Option<&str>) -> Option<GpuName> {
        let label = label?;
        self.champions()
            .iter()
            .map(|model| model.gpu.clone())
            .find(|gpu| same_gpu_model(label, gpu.as_str()))
            .or_else(|| GpuName::parse("gpu", label).ok())
    }

    /// The view's GPUs that pass the filter, as Place's candidates (live residents only;
    /// a pod whose workload coloc does not know stays a resident Place cannot judge). A
    /// GPU of a node that names no GPU model is left out.
    pub(super) fn stored_gpus(&self, filter: &GpuFilter) -> Vec<GpuState> {
        self.cluster
            .gpus()
            .into_iter()
            .filter(|g| filter.matches(g))
            .filter_map(|g| {
                let gpu = self.known_gpu(g.gpu_model.as_deref())?;
                Some(GpuState {
                    id: g.id.clone(),
                    node: g.node.clone(),
                    gpu: Some(gpu),
                    memory_gb: None,
                    residents: g.residents.iter().map(|r| r.placement_name()).collect(),
                    resident_floors: g.residents.iter().map(|r| r.min_job_fraction).collect(),
                })
            })
            .collect()
    }
}
