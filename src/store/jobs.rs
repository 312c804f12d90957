//! The profiling job table: the worker claims one job at a time, and every outcome (done,
//! retry later, failed for good, put back) is one transaction together with the workload's
//! state, so GetWorkload always tells where profiling stands.

use sqlx::{FromRow, Sqlite, Transaction};

use super::{workloads::put_profile_in, Store, StoreError, WorkloadRecord};
use crate::domain::{LaunchSpec, Profile, WorkloadName};

/// A job the worker has claimed (now RUNNING).
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: i64,
    pub workload: WorkloadName,
    /// Attempts so far, this one included.
    pub attempts: u32,
    pub launch: Option<LaunchSpec>,
}

#[derive(FromRow)]
struct ClaimedRow {
    id: i64,
    name: String,
    attempts: i64,
    launch: Option<String>,
}

async fn set_reason(
    tx: &mut Transaction<'_, Sqlite>,
    job_id: i64,
    state: Option<&str>,
    reason: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE workloads SET state = COALESCE(?2, state), state_reason = ?3, updated_at_ms = ?4 \
         WHERE id = (SELECT workload_id FROM profiling_jobs WHERE id = ?1)",
    )
    .bind(job_id)
    .bind(state)
    .bind(reason)
    .bind(now_ms)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// Says why pending jobs wait when nothing will run them (`profiler.backend = "off"`):
    /// every workload waiting for a profile, or only `workload`, gets `reason`.
    pub async fn explain_waiting_jobs(
        &self,
        workload: Option<&str>,
        reason: &str,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "UPDATE workloads SET state_reason = ?1, updated_at_ms = ?2 \
             WHERE state = 'pending_profile' AND (?3 IS NULL OR name = ?3) \
             AND id IN (SELECT workload_id FROM profiling_jobs WHERE state = 'pending')",
        )
        .bind(reason)
        .bind(now_ms)
        .bind(workload)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected())
    }

    /// Claims the oldest pending job that may run now, marking it RUNNING.
    pub async fn claim_next_job(&self, now_ms: i64) -> Result<Option<ClaimedJob>, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let row = sqlx::query_as::<_, ClaimedRow>(
                "UPDATE profiling_jobs SET state = 'running', attempts = attempts + 1, \
                 updated_at_ms = ?1 \
                 WHERE id = (SELECT id FROM profiling_jobs WHERE state = 'pending' \
                             AND not_before_ms <= ?1 ORDER BY id LIMIT 1) \
                 RETURNING id, attempts, \
                   (SELECT name FROM workloads w WHERE w.id = workload_id) AS name, \
                   (SELECT launch FROM workloads w WHERE w.id = workload_id) AS launch",
            )
            .bind(now_ms)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else { return Ok(None) };
            set_reason(&mut tx, row.id, None, "profiling", now_ms).await?;
            Ok(Some(ClaimedJob {
                id: row.id,
                workload: WorkloadName::parse("name", &row.name)
                    .map_err(|e| StoreError::Corrupt(e.message))?,
                attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
                launch: row
                    .launch
                    .map(|json| serde_json::from_str(&json))
                    .transpose()
                    .map_err(|e| {
                        StoreError::Corrupt(format!("launch spec of {}: {e}", row.name))
                    })?,
            }))
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Jobs found RUNNING at startup were cut off by a crash: they go back to PENDING
    /// (the cut-off attempt is not counted). Returns how many.
    pub async fn requeue_running_jobs(&self, now_ms: i64) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "UPDATE profiling_jobs SET state = 'pending', attempts = MAX(attempts - 1, 0), \
             updated_at_ms = ?1 WHERE state = 'running'",
        )
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(result.rows_affected())
    }

    /// Puts a claimed job back to PENDING without counting the attempt (the backend could
    /// not run, or the server is stopping); the reason shows on the workload.
    pub async fn release_job(
        &self,
        job_id: i64,
        reason: &str,
        not_before_ms: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.update_job(
            job_id,
            JobUpdate {
                state: "pending",
                uncount_attempt: true,
                last_error: None,
                not_before_ms: Some(not_before_ms),
                workload_state: "pending_profile",
                reason,
            },
            now_ms,
        )
        .await
    }

    /// Records a failed attempt that will be retried after `not_before_ms`.
    pub async fn retry_job(
        &self,
        job_id: i64,
        error: &str,
        reason: &str,
        not_before_ms: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.update_job(
            job_id,
            JobUpdate {
                state: "pending",
                uncount_attempt: false,
                last_error: Some(error),
                not_before_ms: Some(not_before_ms),
                workload_state: "pending_profile",
                reason,
            },
            now_ms,
        )
        .await
    }

    /// Gives up on a job: the job and its workload are FAILED, with the error as reason.
    pub async fn fail_job(&self, job_id: i64, error: &str, now_ms: i64) -> Result<(), StoreError> {
        self.update_job(
            job_id,
            JobUpdate {
                state: "failed",
                uncount_attempt: false,
                last_error: Some(error),
                not_before_ms: None,
                workload_state: "failed",
                reason: error,
            },
            now_ms,
        )
        .await
    }

    /// One state change of a claimed job and of its workload, in one transaction.
    async fn update_job(
        &self,
        job_id: i64,
        update: JobUpdate<'_>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            sqlx::query(
                "UPDATE profiling_jobs SET state = ?2, \
                 attempts = CASE WHEN ?3 THEN MAX(attempts - 1, 0) ELSE attempts END, \
                 last_error = COALESCE(?4, last_error), \
                 not_before_ms = COALESCE(?5, not_before_ms), updated_at_ms = ?6 WHERE id = ?1",
            )
            .bind(job_id)
            .bind(update.state)
            .bind(update.uncount_attempt)
            .bind(update.last_error)
            .bind(update.not_before_ms)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            set_reason(
                &mut tx,
                job_id,
                Some(update.workload_state),
                update.reason,
                now_ms,
            )
            .await
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Stores the measured profile, marks the workload PROFILED (with `reason`, e.g. that
    /// kernel metrics are missing) and the job done. Fails with `WorkloadNotFound` when
    /// the workload was deleted meanwhile.
    pub async fn complete_job(
        &self,
        job_id: i64,
        workload: &WorkloadName,
        profile: &Profile,
        reason: &str,
        now_ms: i64,
    ) -> Result<WorkloadRecord, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let mut record = put_profile_in(&mut tx, workload.as_str(), profile, now_ms).await?;
            sqlx::query(
                "UPDATE profiling_jobs SET state = 'done', updated_at_ms = ?2 WHERE id = ?1",
            )
            .bind(job_id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            if !reason.is_empty() {
                set_reason(&mut tx, job_id, None, reason, now_ms).await?;
                record.state_reason = reason.to_string();
            }
            Ok(record)
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Jobs by state, for operators and tests: (pending, running, done, failed).
    pub async fn job_counts(&self) -> Result<(i64, i64, i64, i64), StoreError> {
        Ok(sqlx::query_as(
            "SELECT COALESCE(SUM(state = 'pending'), 0), COALESCE(SUM(state = 'running'), 0), \
             COALESCE(SUM(state = 'done'), 0), COALESCE(SUM(state = 'failed'), 0) FROM profiling_jobs",
        )
        .fetch_one(&self.pool)
        .await?)
    }
}

/// What [`Store::update_job`] changes.
struct JobUpdate<'a> {
    /// The job's new state.
    state: &'static str,
    /// A release: the claim's attempt does not count.
    uncount_attempt: bool,
    /// Kept as it was when `None`.
    last_error: Option<&'a str>,
    /// Kept as it was when `None`.
    not_before_ms: Option<i64>,
    /// The workload's new state and its reason.
    workload_state: &'static str,
    reason: &'a str,
}
