//! The undo commands of the operator CLI: `coloc runs delete`, `coloc gpus forget`, `coloc
//! workloads delete-profile` and `coloc audit list` (docs/operations.md, "Undoing
//! mistakes"). Each prints what went (or with --dry-run what would), its audit entry and
//! the retraining that followed.

use anyhow::{bail, Context};

use coloc::proto as pb;

use super::{print_canonical, print_table, status_error};
use crate::args::{AuditCommand, Connection, DeleteRunsArgs, RunsCommand, UndoArgs};

/// An RFC 3339 time as a protobuf timestamp.
fn rfc3339(flag: &str, raw: &str) -> anyhow::Result<prost_types::Timestamp> {
    let time = chrono::DateTime::parse_from_rfc3339(raw).with_context(|| {
        format!("{flag} {raw:?} is not an RFC 3339 time like 2026-11-27T10:00:00Z")
    })?;
    Ok(prost_types::Timestamp {
        seconds: time.timestamp(),
        nanos: time.timestamp_subsec_nanos() as i32,
    })
}

fn selector(args: &DeleteRunsArgs) -> anyhow::Result<pb::delete_runs_request::Selector> {
    use pb::delete_runs_request::Selector;
    Ok(if !args.ids.is_empty() {
        Selector::Ids(pb::RunIds {
            ids: args.ids.clone(),
        })
    } else if let Some(source) = &args.source {
        Selector::Source(source.clone())
    } else if let Some(batch) = args.import_batch {
        Selector::ImportBatch(batch)
    } else if args.since.is_some() || args.until.is_some() {
        Selector::Stored(pb::TimeRange {
            from: args
                .since
                .as_deref()
                .map(|t| rfc3339("--since", t))
                .transpose()?,
            to: args
                .until
                .as_deref()
                .map(|t| rfc3339("--until", t))
                .transpose()?,
        })
    } else {
        bail!("name which runs to delete: --id, --source, --since/--until or --import-batch")
    })
}

/// Prints an undo's answer.
fn print_undo(connection: &Connection, answer: &pb::UndoResponse) -> anyhow::Result<()> {
    if connection.json {
        return print_canonical(answer, "coloc.v1.UndoResponse");
    }
    if answer.dry_run {
        println!(
            "dry run, nothing changed: would delete {} rows",
            answer.rows
        );
    } else {
        println!(
            "deleted {} rows (audit entry {})",
            answer.rows, answer.audit_id
        );
    }
    println!("{}", answer.what);
    for batch in &answer.batches {
        println!(
            "  import batch {}: {} runs on {}",
            batch.id, batch.runs, batch.gpu
        );
    }
    for line in &answer.retrained {
        println!("retrained {line}");
    }
    Ok(())
}

/// `coloc runs delete`.
pub async fn runs(connection: &Connection, command: RunsCommand) -> anyhow::Result<()> {
    let RunsCommand::Delete(args) = command;
    let request = pb::DeleteRunsRequest {
        gpu: args.gpu.clone(),
        dry_run: args.undo.dry_run,
        actor: args.undo.actor(),
        selector: Some(selector(&args)?),
    };
    let mut client = connection.client().await?;
    let answer = client
        .delete_runs(request)
        .await
        .map_err(status_error)?
        .into_inner();
    print_undo(connection, &answer)
}

/// `coloc gpus forget`.
pub async fn forget_gpus(
    connection: &Connection,
    gpu_id: Option<String>,
    node: Option<String>,
    undo: UndoArgs,
) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let answer = client
        .forget_gpus(pb::ForgetGpusRequest {
            gpu_id: gpu_id.unwrap_or_default(),
            node: node.unwrap_or_default(),
            dry_run: undo.dry_run,
            actor: undo.actor(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    print_undo(connection, &answer)
}

/// `coloc workloads delete-profile`.
pub async fn delete_profile(
    connection: &Connection,
    name: String,
    gpu: String,
    undo: UndoArgs,
) -> anyhow::Result<()> {
    let mut client = connection.client().await?;
    let answer = client
        .delete_profile(pb::DeleteProfileRequest {
            name,
            gpu,
            dry_run: undo.dry_run,
            actor: undo.actor(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    print_undo(connection, &answer)
}

/// `coloc audit list`.
pub async fn audit(connection: &Connection, command: AuditCommand) -> anyhow::Result<()> {
    let AuditCommand::List { limit } = command;
    let mut client = connection.client().await?;
    let answer = client
        .list_audit(pb::ListAuditRequest { limit })
        .await
        .map_err(status_error)?
        .into_inner();
    if connection.json {
        return print_canonical(&answer, "coloc.v1.ListAuditResponse");
    }
    let rows: Vec<Vec<String>> = answer
        .entries
        .iter()
        .map(|e| {
            let at =
                e.at.as_ref()
                    .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos as u32))
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default();
            vec![
                e.id.to_string(),
                at,
                e.actor.clone(),
                e.action.clone(),
                e.rows.to_string(),
                e.what.clone(),
                e.retrained.clone(),
            ]
        })
        .collect();
    print_table(
        &["ID", "AT", "WHO", "ACTION", "ROWS", "WHAT", "RETRAINED"],
        &rows,
    );
    Ok(())
}
