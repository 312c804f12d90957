//! Undo, with a trail: deleting stored runs (by id, source, time stored or import batch),
//! removing one profile of a workload, and the audit table every such change is recorded
//! in (who, when, what, how many rows). Forgetting GPUs of the occupancy goes through the
//! occupancy writer (`occupancy.rs`), which keeps the readers' copy; its audit entry is
//! written here.
//!
//! The SQL is portable (no SQLite-only functions; every value a bind parameter, numbered
//! `?N`, which PostgreSQL spells `$N`) so that a PostgreSQL twin of this file is a
//! translation of placeholders only.

use sqlx::{Any, Transaction};

use super::{finish, workloads::WorkloadRecord, ObservationSource, Store, StoreError};
use crate::domain::{GpuName, WorkloadState};

/// The most run ids one DeleteRuns may name.
pub const MAX_RUN_IDS: usize = 10_000;

/// Which stored runs to delete.
#[derive(Debug, Clone, PartialEq)]
pub enum RunSelector {
    /// These run ids (at most [`MAX_RUN_IDS`]).
    Ids(Vec<i64>),
    Source(ObservationSource),
    /// Runs stored at `from_ms` or later and before `to_ms`.
    Stored {
        from_ms: i64,
        to_ms: i64,
    },
    /// The runs of one import: imported runs stored at this time (an import stores all its
    /// runs with one time).
    ImportBatch(i64),
}

/// A selector, optionally narrowed to one GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSelection {
    pub gpu: Option<GpuName>,
    pub selector: RunSelector,
}

/// What a selection matches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MatchedRuns {
    /// Runs per GPU model, by name.
    pub per_gpu: Vec<(GpuName, u64)>,
    /// Imported runs per import batch: (batch id, GPU model, runs).
    pub batches: Vec<(i64, GpuName, u64)>,
    /// Ids the selector named that are not stored (an id selector only).
    pub missing_ids: Vec<i64>,
}

impl MatchedRuns {
    pub fn total(&self) -> u64 {
        self.per_gpu.iter().map(|(_, n)| n).sum()
    }
}

/// The undo actions the audit table knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    DeleteRuns,
    ForgetGpus,
    DeleteProfile,
}

impl AuditAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeleteRuns => "delete_runs",
            Self::ForgetGpus => "forget_gpus",
            Self::DeleteProfile => "delete_profile",
        }
    }
}

/// An entry to record: the row count is the change's own.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuditEntry {
    pub at_ms: i64,
    pub actor: String,
    pub action: AuditAction,
    pub what: String,
}

/// A recorded entry.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AuditEntry {
    pub id: i64,
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    pub what: String,
    pub row_count: i64,
    pub retrained: String,
}

/// A bound value of a WHERE clause.
enum Bind {
    Int(i64),
    Text(String),
}

/// The WHERE clause of a selection over `observations`, its parameters numbered from 1.
fn where_clause(selection: &RunSelection) -> (String, Vec<Bind>) {
    let mut binds = Vec::new();
    let mut clause = match &selection.selector {
        RunSelector::Ids(ids) => {
            let start = binds.len();
            binds.extend(ids.iter().map(|&id| Bind::Int(id)));
            let marks: Vec<String> = (start + 1..=binds.len()).map(|n| format!("${n}")).collect();
            format!("id IN ({})", marks.join(", "))
        }
        RunSelector::Source(source) => {
            binds.push(Bind::Text(source.as_str().to_string()));
            format!("source = ${}", binds.len())
        }
        RunSelector::Stored { from_ms, to_ms } => {
            binds.push(Bind::Int(*from_ms));
            binds.push(Bind::Int(*to_ms));
            format!(
                "recorded_at_ms >= ${} AND recorded_at_ms < ${}",
                binds.len() - 1,
                binds.len()
            )
        }
        RunSelector::ImportBatch(batch) => {
            binds.push(Bind::Text(ObservationSource::Imported.as_str().to_string()));
            binds.push(Bind::Int(*batch));
            format!(
                "source = ${} AND recorded_at_ms = ${}",
                binds.len() - 1,
                binds.len()
            )
        }
    };
    if let Some(gpu) = &selection.gpu {
        binds.push(Bind::Text(gpu.as_str().to_string()));
        clause = format!("({clause}) AND gpu = ${}", binds.len());
    }
    (clause, binds)
}

type Query<'q> = sqlx::query::Query<'q, Any, sqlx::any::AnyArguments>;
type QueryAs<'q, T> = sqlx::query::QueryAs<'q, Any, T, sqlx::any::AnyArguments>;

fn bind_all<'q>(mut query: Query<'q>, binds: &[Bind]) -> Query<'q> {
    for bind in binds {
        query = match bind {
            Bind::Int(value) => query.bind(*value),
            Bind::Text(value) => query.bind(value.clone()),
        };
    }
    query
}

fn bind_all_as<'q, T>(mut query: QueryAs<'q, T>, binds: &[Bind]) -> QueryAs<'q, T> {
    for bind in binds {
        query = match bind {
            Bind::Int(value) => query.bind(*value),
            Bind::Text(value) => query.bind(value.clone()),
        };
    }
    query
}

fn gpu_name(raw: &str) -> Result<GpuName, StoreError> {
    GpuName::parse("gpu", raw).map_err(|e| StoreError::Corrupt(e.message))
}

/// What `selection` matches, read in `tx`.
async fn match_runs(
    tx: &mut Transaction<'static, Any>,
    selection: &RunSelection,
) -> Result<MatchedRuns, StoreError> {
    let (clause, binds) = where_clause(selection);
    let per_gpu: Vec<(String, i64)> = bind_all_as(
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT gpu, COUNT(*) FROM observations WHERE {clause} GROUP BY gpu ORDER BY gpu"
        ))),
        &binds,
    )
    .fetch_all(&mut **tx)
    .await?;
    let batches: Vec<(i64, String, i64)> = bind_all_as(
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT recorded_at_ms, gpu, COUNT(*) FROM observations WHERE ({clause}) \
             AND source = 'imported' GROUP BY recorded_at_ms, gpu ORDER BY recorded_at_ms, gpu"
        ))),
        &binds,
    )
    .fetch_all(&mut **tx)
    .await?;
    let missing_ids = match &selection.selector {
        RunSelector::Ids(ids) => {
            let (all, all_binds) = where_clause(&RunSelection {
                gpu: None,
                selector: selection.selector.clone(),
            });
            let found: Vec<(i64,)> = bind_all_as(
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT id FROM observations WHERE {all}"
                ))),
                &all_binds,
            )
            .fetch_all(&mut **tx)
            .await?;
            let found: Vec<i64> = found.into_iter().map(|(id,)| id).collect();
            let mut missing: Vec<i64> = ids
                .iter()
                .copied()
                .filter(|id| !found.contains(id))
                .collect();
            missing.sort_unstable();
            missing.dedup();
            missing
        }
        _ => Vec::new(),
    };
    Ok(MatchedRuns {
        per_gpu: per_gpu
            .into_iter()
            .map(|(gpu, n)| Ok((gpu_name(&gpu)?, n as u64)))
            .collect::<Result<_, StoreError>>()?,
        batches: batches
            .into_iter()
            .map(|(batch, gpu, n)| Ok((batch, gpu_name(&gpu)?, n as u64)))
            .collect::<Result<_, StoreError>>()?,
        missing_ids,
    })
}

async fn insert_audit(
    tx: &mut Transaction<'static, Any>,
    entry: &NewAuditEntry,
    rows: u64,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(
        "INSERT INTO audit (at_ms, actor, action, what, row_count) VALUES ($1, $2, $3, $4, $5) \
         RETURNING id",
    )
    .bind(entry.at_ms)
    .bind(&entry.actor)
    .bind(entry.action.as_str())
    .bind(&entry.what)
    .bind(rows as i64)
    .fetch_one(&mut **tx)
    .await?)
}

/// The outcome of a profile removal: the workload as it is now, and its audit entry.
#[derive(Debug, Clone)]
pub struct ProfileRemoved {
    pub record: WorkloadRecord,
    pub audit_id: i64,
}

impl Store {
    /// What `selection` matches, changing nothing (a dry run).
    pub async fn match_runs(&self, selection: &RunSelection) -> Result<MatchedRuns, StoreError> {
        let mut tx = self.begin_read().await?;
        let outcome = match_runs(&mut tx, selection).await;
        finish(tx, outcome).await
    }

    /// Deletes the runs `selection` matches (their members with them) and records `entry`
    /// with the count, in one transaction. An id selector naming an id that is not stored
    /// deletes nothing: the answer's `missing_ids` say which, and no entry is recorded.
    /// Answers what matched and the audit entry's id (`None` when nothing was deleted).
    pub async fn delete_runs(
        &self,
        selection: &RunSelection,
        entry: &NewAuditEntry,
    ) -> Result<(MatchedRuns, Option<i64>), StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let matched = match_runs(&mut tx, selection).await?;
            if !matched.missing_ids.is_empty() || matched.total() == 0 {
                return Ok((matched, None));
            }
            let (clause, binds) = where_clause(selection);
            let deleted = bind_all(
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DELETE FROM observations WHERE {clause}"
                ))),
                &binds,
            )
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let audit_id = insert_audit(&mut tx, entry, deleted).await?;
            Ok((matched, Some(audit_id)))
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Whether `workload` has a profile on `gpu`; `None` when the workload is not registered.
    pub async fn has_profile(
        &self,
        workload: &str,
        gpu: &GpuName,
    ) -> Result<Option<bool>, StoreError> {
        let Some(record) = self.get_workload(workload).await? else {
            return Ok(None);
        };
        Ok(Some(record.profiles.iter().any(|p| &p.gpu == gpu)))
    }

    /// Removes `workload`'s profile on `gpu` and records `entry`, in one transaction. A
    /// workload left with no profile waits for one again (PENDING_PROFILE, with why).
    /// `None` when the workload has no profile there (nothing changed, nothing recorded).
    pub async fn delete_profile(
        &self,
        workload: &str,
        gpu: &GpuName,
        entry: &NewAuditEntry,
    ) -> Result<Option<ProfileRemoved>, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let deleted = sqlx::query(
                "DELETE FROM profiles WHERE gpu = $2 AND workload_id = \
                 (SELECT id FROM workloads WHERE name = $1)",
            )
            .bind(workload)
            .bind(gpu.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if deleted == 0 {
                return Ok(None);
            }
            sqlx::query(
                "UPDATE workloads SET state = $2, state_reason = $3, updated_at_ms = $4 \
                 WHERE name = $1 AND NOT EXISTS \
                 (SELECT 1 FROM profiles p WHERE p.workload_id = workloads.id)",
            )
            .bind(workload)
            .bind(WorkloadState::PendingProfile.as_str())
            .bind(format!(
                "its profile on {} was removed (DeleteProfile); store one with PutProfile or \
                 `coloc workloads register --ncu`",
                gpu.as_str()
            ))
            .bind(entry.at_ms)
            .execute(&mut *tx)
            .await?;
            let audit_id = insert_audit(&mut tx, entry, deleted).await?;
            Ok(Some(audit_id))
        }
        .await;
        let Some(audit_id) = self.finish_write(tx, outcome).await? else {
            return Ok(None);
        };
        let record = self
            .get_workload(workload)
            .await?
            .ok_or_else(|| StoreError::WorkloadNotFound(workload.to_string()))?;
        Ok(Some(ProfileRemoved { record, audit_id }))
    }

    /// Records `entry` with `rows` on its own (a change the occupancy writer committed).
    pub async fn record_audit(&self, entry: &NewAuditEntry, rows: u64) -> Result<i64, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = insert_audit(&mut tx, entry, rows).await;
        self.finish_write(tx, outcome).await
    }

    /// Notes on entry `id` what the retraining that followed it did.
    pub async fn set_audit_retrained(&self, id: i64, retrained: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = sqlx::query("UPDATE audit SET retrained = $2 WHERE id = $1")
            .bind(id)
            .bind(retrained)
            .execute(&mut *tx)
            .await
            .map(|_| ())
            .map_err(StoreError::from);
        self.finish_write(tx, outcome).await
    }

    /// The newest `limit` audit entries, newest first.
    pub async fn audit_entries(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, at_ms, actor, action, what, row_count, retrained FROM audit \
             ORDER BY id DESC LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.db.pool)
        .await?)
    }
}
