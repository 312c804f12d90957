//! The undo RPCs of `coloc.v1.ColocationAdvisor` (DeleteRuns, ForgetGpus, DeleteProfile,
//! ListAudit): their requests validated into domain terms, who asked (the caller's actor,
//! the token's role, the peer address) for the audit trail, and the answers.

use tonic::{Request, Response, Status};

use super::{auth::CallerRole, convert};
use crate::{
    advisor::{Advisor, ForgetTarget, UndoOutcome},
    domain::ValidationError,
    proto as pb,
    store::{AuditEntry, ObservationSource, RunSelection, RunSelector, MAX_RUN_IDS},
};

/// The longest actor a caller may name.
const MAX_ACTOR_LEN: usize = 200;
/// ListAudit's default and largest page.
const AUDIT_DEFAULT: u32 = 100;
const AUDIT_MAX: u32 = 1000;

/// Who made a request, for the audit trail: "alice (operator token, from 127.0.0.1:5000)".
fn who<T>(request: &Request<T>, actor: &str) -> Result<String, ValidationError> {
    if actor.chars().count() > MAX_ACTOR_LEN || actor.chars().any(char::is_control) {
        return Err(ValidationError::new(
            "actor",
            format!("actor must be at most {MAX_ACTOR_LEN} characters without control characters"),
        ));
    }
    let actor = if actor.is_empty() { "unnamed" } else { actor };
    let role = request
        .extensions()
        .get::<CallerRole>()
        .map_or("no token (auth off)", |role| match role.0.as_str() {
            "operator" => "operator token",
            "agent" => "agent token",
            _ => "reader token",
        });
    let peer = request
        .remote_addr()
        .map_or_else(|| "an unknown peer".to_string(), |a| a.to_string());
    Ok(format!("{actor} ({role}, from {peer})"))
}

fn invalid(field: &str, message: impl Into<String>) -> ValidationError {
    ValidationError::new(field, message.into())
}

fn optional_ms(
    field: &str,
    raw: Option<prost_types::Timestamp>,
) -> Result<Option<i64>, ValidationError> {
    raw.map(|t| {
        if !(0..1_000_000_000).contains(&t.nanos) || !(0..=253_402_300_799).contains(&t.seconds) {
            return Err(invalid(
                field,
                format!("{field} is not a time between 1970 and 9999"),
            ));
        }
        Ok(t.seconds * 1000 + i64::from(t.nanos / 1_000_000))
    })
    .transpose()
}

/// DeleteRuns' request as a selection: exactly one selector, each checked.
pub fn run_selection(raw: &pb::DeleteRunsRequest) -> Result<RunSelection, ValidationError> {
    use pb::delete_runs_request::Selector;
    let gpu = convert::optional_gpu("gpu", &raw.gpu)?;
    let selector = match &raw.selector {
        None => {
            return Err(invalid(
                "selector",
                "name which runs to delete: one of ids, source, stored or import_batch",
            ))
        }
        Some(Selector::Ids(ids)) => {
            if ids.ids.is_empty() || ids.ids.len() > MAX_RUN_IDS {
                return Err(invalid(
                    "ids.ids",
                    format!(
                        "ids names 1 to {MAX_RUN_IDS} run ids, got {}",
                        ids.ids.len()
                    ),
                ));
            }
            let parsed = ids
                .ids
                .iter()
                .map(|&id| {
                    i64::try_from(id)
                        .ok()
                        .filter(|&id| id > 0)
                        .ok_or_else(|| invalid("ids.ids", format!("{id} is not a run id")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            RunSelector::Ids(parsed)
        }
        Some(Selector::Source(source)) => {
            RunSelector::Source(ObservationSource::parse(source).ok_or_else(|| {
                invalid(
                    "source",
                    format!("source is reported, imported or calibrated, got {source:?}"),
                )
            })?)
        }
        Some(Selector::Stored(range)) => {
            let from = optional_ms("stored.from", range.from)?;
            let to = optional_ms("stored.to", range.to)?;
            if from.is_none() && to.is_none() {
                return Err(invalid(
                    "stored",
                    "stored needs from, to or both (every run is source or ids' business)",
                ));
            }
            let (from_ms, to_ms) = (from.unwrap_or(i64::MIN), to.unwrap_or(i64::MAX));
            if from_ms >= to_ms {
                return Err(invalid("stored", "stored.from must come before stored.to"));
            }
            RunSelector::Stored { from_ms, to_ms }
        }
        Some(Selector::ImportBatch(batch)) => {
            if *batch <= 0 {
                return Err(invalid(
                    "import_batch",
                    format!("import_batch is the id an import printed, got {batch}"),
                ));
            }
            RunSelector::ImportBatch(*batch)
        }
    };
    Ok(RunSelection { gpu, selector })
}

fn forget_target(raw: &pb::ForgetGpusRequest) -> Result<ForgetTarget, ValidationError> {
    let gpu_id = convert::optional_id("gpu_id", &raw.gpu_id)?;
    let node = convert::optional_id("node", &raw.node)?;
    match (gpu_id, node) {
        (Some(id), None) => Ok(ForgetTarget::Gpu(id.to_string())),
        (None, Some(node)) => Ok(ForgetTarget::Node(node.to_string())),
        _ => Err(invalid(
            "gpu_id",
            "name exactly one of gpu_id (one GPU) and node (every GPU of the node)",
        )),
    }
}

fn undo_to_pb(outcome: UndoOutcome) -> pb::UndoResponse {
    pb::UndoResponse {
        dry_run: outcome.dry_run,
        what: outcome.what,
        rows: outcome.rows,
        audit_id: outcome.audit_id.unwrap_or_default() as u64,
        batches: outcome
            .batches
            .into_iter()
            .map(|(id, gpu, runs)| pb::ImportBatch {
                id,
                gpu: gpu.as_str().to_string(),
                runs,
            })
            .collect(),
        retrained: outcome.retrained,
    }
}

fn audit_to_pb(entry: AuditEntry) -> pb::AuditEntry {
    pb::AuditEntry {
        id: entry.id as u64,
        at: Some(convert::timestamp(entry.at_ms)),
        actor: entry.actor,
        action: entry.action,
        what: entry.what,
        rows: entry.row_count.max(0) as u64,
        retrained: entry.retrained,
    }
}

pub async fn delete_runs(
    advisor: &Advisor,
    request: Request<pb::DeleteRunsRequest>,
) -> Result<Response<pb::UndoResponse>, Status> {
    let actor = who(&request, &request.get_ref().actor)?;
    let raw = request.into_inner();
    let selection = run_selection(&raw)?;
    let outcome = advisor.delete_runs(selection, raw.dry_run, actor).await?;
    Ok(Response::new(undo_to_pb(outcome)))
}

pub async fn forget_gpus(
    advisor: &Advisor,
    request: Request<pb::ForgetGpusRequest>,
) -> Result<Response<pb::UndoResponse>, Status> {
    let actor = who(&request, &request.get_ref().actor)?;
    let raw = request.into_inner();
    let target = forget_target(&raw)?;
    let outcome = advisor.forget_gpus(target, raw.dry_run, actor).await?;
    Ok(Response::new(undo_to_pb(outcome)))
}

pub async fn delete_profile(
    advisor: &Advisor,
    request: Request<pb::DeleteProfileRequest>,
) -> Result<Response<pb::UndoResponse>, Status> {
    let actor = who(&request, &request.get_ref().actor)?;
    let raw = request.into_inner();
    let name = convert::workload_name("name", &raw.name)?;
    let requested = convert::optional_gpu("gpu", &raw.gpu)?;
    let gpu = advisor.resolve_gpu(requested)?;
    let outcome = advisor
        .delete_profile(&name, gpu, raw.dry_run, actor)
        .await?;
    Ok(Response::new(undo_to_pb(outcome)))
}

pub async fn list_audit(
    advisor: &Advisor,
    request: Request<pb::ListAuditRequest>,
) -> Result<Response<pb::ListAuditResponse>, Status> {
    let limit = match request.into_inner().limit {
        0 => AUDIT_DEFAULT,
        n => n.min(AUDIT_MAX),
    };
    let entries = advisor.audit(limit).await?;
    Ok(Response::new(pb::ListAuditResponse {
        entries: entries.into_iter().map(audit_to_pb).collect(),
    }))
}
