//! Undo, with a trail (docs/operations.md, "Undoing mistakes"): deleting stored runs,
//! forgetting GPUs of the occupancy, removing one profile of a workload. Each change is
//! recorded in the audit table with who asked; a change to training data (runs, or the
//! profiles their members are scored with) retrains every GPU model it touched. A dry run
//! answers what would go and changes nothing. A request that names what does not exist
//! changes nothing and says so.

use super::{Advisor, Error, Result, Trigger};
use crate::{
    domain::{now_ms, GpuName, WorkloadName},
    store::{AuditAction, AuditEntry, MatchedRuns, NewAuditEntry, RunSelection, RunSelector},
};

/// Which GPUs of the occupancy to forget.
#[derive(Debug, Clone, PartialEq)]
pub enum ForgetTarget {
    Gpu(String),
    Node(String),
}

/// What an undo did, or with a dry run would do.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UndoOutcome {
    pub dry_run: bool,
    pub what: String,
    pub rows: u64,
    /// The audit entry; `None` on a dry run or when nothing changed.
    pub audit_id: Option<i64>,
    /// Imported runs matched, per import batch (DeleteRuns): (batch id, GPU model, runs).
    pub batches: Vec<(i64, GpuName, u64)>,
    /// What the retraining of each GPU model whose training data changed did.
    pub retrained: Vec<String>,
}

/// A selection for people: "runs 3, 4", "imported runs of batch 17...", with the GPU model.
fn describe_selection(selection: &RunSelection) -> String {
    let what = match &selection.selector {
        RunSelector::Ids(ids) => format!(
            "runs {}",
            ids.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        RunSelector::Source(source) => format!("{} runs", source.as_str()),
        RunSelector::Stored { from_ms, to_ms } => {
            let end = |ms: i64| {
                chrono::DateTime::from_timestamp_millis(ms)
                    .map_or_else(|| ms.to_string(), |t| t.to_rfc3339())
            };
            match (*from_ms, *to_ms) {
                (i64::MIN, i64::MAX) => "runs stored at any time".to_string(),
                (i64::MIN, to) => format!("runs stored before {}", end(to)),
                (from, i64::MAX) => format!("runs stored from {} on", end(from)),
                (from, to) => format!("runs stored from {} to {}", end(from), end(to)),
            }
        }
        RunSelector::ImportBatch(batch) => format!("runs of import batch {batch}"),
    };
    match &selection.gpu {
        Some(gpu) => format!("{what} on {}", gpu.as_str()),
        None => what,
    }
}

fn describe_matched(matched: &MatchedRuns) -> String {
    if matched.per_gpu.is_empty() {
        return "no run".to_string();
    }
    matched
        .per_gpu
        .iter()
        .map(|(gpu, n)| format!("{n} on {}", gpu.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Advisor {
    /// Retrains `gpu` after an undo changed its training data; what came of it, for people
    /// (a failed fit keeps the champion and is said, not raised: the undo stands).
    async fn retrain_after_undo(&self, gpu: &GpuName) -> String {
        match self.train(gpu, None, Trigger::Undo).await {
            Ok(outcome) => format!(
                "{}: version {} ({}) {}",
                gpu.as_str(),
                outcome.model.version,
                outcome.model.params.kind().as_str(),
                if outcome.promoted {
                    "promoted"
                } else {
                    "rejected; the champion stays"
                }
            ),
            Err(error) => format!("{}: {error}", gpu.as_str()),
        }
    }

    /// Retrains each GPU model and notes the outcomes on audit entry `audit_id`.
    async fn retrain_and_note(&self, gpus: &[GpuName], audit_id: i64) -> Result<Vec<String>> {
        let mut retrained = Vec::new();
        for gpu in gpus {
            retrained.push(self.retrain_after_undo(gpu).await);
        }
        self.store
            .set_audit_retrained(audit_id, &retrained.join("; "))
            .await?;
        Ok(retrained)
    }

    /// Deletes the runs `selection` matches; with `dry_run`, only says which. Ids that are
    /// not stored are NOT_FOUND and nothing is deleted.
    pub async fn delete_runs(
        &self,
        selection: RunSelection,
        dry_run: bool,
        actor: String,
    ) -> Result<UndoOutcome> {
        let entry = NewAuditEntry {
            at_ms: now_ms(),
            actor,
            action: AuditAction::DeleteRuns,
            what: describe_selection(&selection),
        };
        let (matched, audit_id) = if dry_run {
            (self.store.match_runs(&selection).await?, None)
        } else {
            self.store.delete_runs(&selection, &entry).await?
        };
        if !matched.missing_ids.is_empty() {
            return Err(Error::UnknownRuns(matched.missing_ids));
        }
        let mut outcome = UndoOutcome {
            dry_run,
            what: format!("{}: {}", entry.what, describe_matched(&matched)),
            rows: matched.total(),
            audit_id,
            batches: matched.batches.clone(),
            retrained: Vec::new(),
        };
        if let Some(audit_id) = audit_id {
            let gpus: Vec<GpuName> = matched.per_gpu.iter().map(|(g, _)| g.clone()).collect();
            outcome.retrained = self.retrain_and_note(&gpus, audit_id).await?;
        }
        Ok(outcome)
    }

    /// Forgets one GPU of the occupancy, or every GPU of a node, with their jobs. An
    /// unknown GPU or a node with no GPU is NOT_FOUND.
    pub async fn forget_gpus(
        &self,
        target: ForgetTarget,
        dry_run: bool,
        actor: String,
    ) -> Result<UndoOutcome> {
        let (ids, jobs, what) = {
            let occupancy = self.store.occupancy();
            let chosen: Vec<_> = occupancy
                .gpus()
                .filter(|g| match &target {
                    ForgetTarget::Gpu(id) => &*g.id == id,
                    ForgetTarget::Node(node) => &*g.node == node,
                })
                .collect();
            let ids: Vec<String> = chosen.iter().map(|g| g.id.to_string()).collect();
            let jobs: usize = chosen.iter().map(|g| g.jobs.len()).sum();
            let what = match &target {
                ForgetTarget::Gpu(id) => format!("GPU {id:?}"),
                ForgetTarget::Node(node) => format!("the GPUs of node {node:?}"),
            };
            (ids, jobs as u64, what)
        };
        if ids.is_empty() {
            return Err(match target {
                ForgetTarget::Gpu(id) => Error::UnknownClusterGpu(id),
                ForgetTarget::Node(node) => Error::UnknownNode(node),
            });
        }
        let listed = format!("{what}: {} ({jobs} jobs)", ids.join(", "));
        if dry_run {
            return Ok(UndoOutcome {
                dry_run,
                what: listed,
                rows: ids.len() as u64 + jobs,
                ..UndoOutcome::default()
            });
        }
        let now = now_ms();
        let (gpus, jobs) = self.store.forget_cluster_gpus(ids.clone(), now).await?;
        let what = format!("{what}: {} ({jobs} jobs)", ids.join(", "));
        let entry = NewAuditEntry {
            at_ms: now,
            actor,
            action: AuditAction::ForgetGpus,
            what: what.clone(),
        };
        let audit_id = self.store.record_audit(&entry, gpus + jobs).await?;
        Ok(UndoOutcome {
            dry_run,
            what,
            rows: gpus + jobs,
            audit_id: Some(audit_id),
            ..UndoOutcome::default()
        })
    }

    /// Removes `name`'s profile on `gpu` and retrains `gpu` (its runs with that workload
    /// can no longer be scored). NOT_FOUND when the workload or the profile is not there.
    pub async fn delete_profile(
        &self,
        name: &WorkloadName,
        gpu: GpuName,
        dry_run: bool,
        actor: String,
    ) -> Result<UndoOutcome> {
        let what = format!("the profile of {} on {}", name.as_str(), gpu.as_str());
        let unknown = || Error::UnknownProfile {
            workload: name.as_str().to_string(),
            gpu: gpu.clone(),
        };
        if dry_run {
            return match self.store.has_profile(name.as_str(), &gpu).await? {
                None => Err(Error::UnknownWorkload(name.as_str().to_string())),
                Some(false) => Err(unknown()),
                Some(true) => Ok(UndoOutcome {
                    dry_run,
                    what,
                    rows: 1,
                    ..UndoOutcome::default()
                }),
            };
        }
        let entry = NewAuditEntry {
            at_ms: now_ms(),
            actor,
            action: AuditAction::DeleteProfile,
            what: what.clone(),
        };
        let removed = {
            let _writer = self.catalog_writer.lock().await;
            let Some(removed) = self
                .store
                .delete_profile(name.as_str(), &gpu, &entry)
                .await?
            else {
                return Err(match self.store.get_workload(name.as_str()).await? {
                    None => Error::UnknownWorkload(name.as_str().to_string()),
                    Some(_) => unknown(),
                });
            };
            self.write_catalog()
                .put_workload(&removed.record.name, &removed.record.profiles);
            removed
        };
        let retrained = self
            .retrain_and_note(std::slice::from_ref(&gpu), removed.audit_id)
            .await?;
        Ok(UndoOutcome {
            dry_run,
            what,
            rows: 1,
            audit_id: Some(removed.audit_id),
            batches: Vec::new(),
            retrained,
        })
    }

    /// The newest `limit` audit entries, newest first.
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>> {
        Ok(self.store.audit_entries(limit).await?)
    }
}
