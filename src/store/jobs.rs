//! The profiling job table: the worker claims one job at a time, and every outcome (done,
//! retry later, failed for good, put back) is one transaction together with the workload's
//! state, so GetWorkload always tells where profiling stands.
//!
//! `claim_holder` names the holder of the job's latest claim while it runs and after it
//! submitted that claim's outcome (so that its repeat is told apart from another agent
//! naming the same claim); it is '' once the claim's lease expired or the job was
//! re-queued at start-up. (The agents migration's comment, "'' when not running", predates
//! this and migrations are never edited.)

use sqlx::{Any, FromRow, Transaction};

use super::{
    workloads::{fetch_workload, put_profile_in},
    Store, StoreError, WorkloadRecord,
};
use crate::domain::{GpuName, LaunchSpec, Profile, WorkloadName};

/// The claim holder of jobs the in-process worker runs. Its jobs have no lease: a crash
/// of the server is a crash of the holder, and the next start re-queues them.
pub const IN_PROCESS_HOLDER: &str = "in-process";

/// A job claimed by the in-process worker or an agent (now RUNNING).
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    pub id: i64,
    /// The claim's token: renewals and submissions must name it.
    pub claim: i64,
    /// Who holds the claim: an agent id, or [`IN_PROCESS_HOLDER`]. Renewals and
    /// submissions are accepted only from the holder.
    pub holder: String,
    pub workload: WorkloadName,
    /// The GPU model the job asks for; `None` = any.
    pub gpu: Option<GpuName>,
    /// Attempts so far, this one included.
    pub attempts: u32,
    pub launch: Option<LaunchSpec>,
    /// When the lease runs out unless renewed; 0 = no lease (the in-process worker).
    pub lease_expires_ms: i64,
}

/// Who claims, for which GPU model, and for how long.
#[derive(Debug, Clone)]
pub struct JobClaimer<'a> {
    /// An agent id, or [`IN_PROCESS_HOLDER`].
    pub holder: &'a str,
    /// Jobs for this GPU model and jobs for any GPU model; `None` = only the latter.
    pub gpu: Option<&'a GpuName>,
    /// Lease length; 0 = no lease.
    pub lease_ms: i64,
    /// Expired leases are swept before the claim: a job whose expired lease used this
    /// many attempts fails instead of going back to the queue.
    pub max_attempts: u32,
}

/// What a submission did: applied now, or the same claim's outcome was recorded before
/// (a retried submission), so nothing changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted<T> {
    Applied(T),
    Duplicate,
}

#[derive(FromRow)]
struct ClaimedRow {
    id: i64,
    claims: i64,
    gpu: String,
    name: String,
    attempts: i64,
    launch: Option<String>,
    lease_expires_ms: i64,
}

#[derive(FromRow)]
struct JobStateRow {
    state: String,
    claims: i64,
    claim_holder: String,
}

/// Why a claim-checked update changed nothing: the job is gone, the claim is another
/// holder's, the same claim finished it before, or another claim holds it now.
async fn claim_miss<T>(
    tx: &mut Transaction<'_, Any>,
    job: &ClaimedJob,
    done_is_duplicate: bool,
) -> Result<Submitted<T>, StoreError> {
    let (job_id, claim) = (job.id, job.claim);
    let row = sqlx::query_as::<_, JobStateRow>(
        "SELECT state, claims, claim_holder FROM profiling_jobs WHERE id = $1",
    )
    .bind(job_id)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Err(StoreError::JobNotFound(job_id));
    };
    // The holder stays recorded after it submitted the claim's outcome, so that its
    // repeat is told apart from another agent naming the same claim; an expired or
    // re-queued claim has none.
    if row.claims == claim && !row.claim_holder.is_empty() && row.claim_holder != job.holder {
        return Err(StoreError::NotClaimHolder {
            job_id,
            claim,
            holder: row.claim_holder,
            sender: job.holder.clone(),
        });
    }
    let duplicate = row.claims == claim
        && !row.claim_holder.is_empty()
        && row.state != "running"
        && (!done_is_duplicate || row.state == "done");
    if duplicate {
        return Ok(Submitted::Duplicate);
    }
    let now = match row.state.as_str() {
        "running" => format!("claim {} of {} holds it", row.claims, row.claim_holder),
        // Its holder stays recorded when it handed the claim back itself; an expired
        // lease leaves none.
        "pending" if row.claims == claim && !row.claim_holder.is_empty() => format!(
            "agent {:?} handed this claim back and the job is back in the queue",
            row.claim_holder
        ),
        "pending" => "the lease expired and the job is back in the queue".to_string(),
        other => format!("the job is {other}"),
    };
    Err(StoreError::ClaimLost { job_id, claim, now })
}

/// The agent holding `job_id` is idle again.
async fn free_agent(tx: &mut Transaction<'_, Any>, job_id: i64) -> Result<(), StoreError> {
    sqlx::query("UPDATE agents SET job_id = NULL WHERE job_id = $1")
        .bind(job_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Running jobs whose lease ran out go back to pending (the attempt counts: the holder
/// may have died of the workload), or fail for good, with their workloads, when that was
/// attempt `max_attempts` (a workload that kills its agent every time would otherwise be
/// re-queued forever); their workloads say so. Returns how many.
async fn expire_leases_in(
    tx: &mut Transaction<'_, Any>,
    max_attempts: u32,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let expired: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, claim_holder, attempts FROM profiling_jobs WHERE state = 'running' \
         AND lease_expires_ms > 0 AND lease_expires_ms <= $1",
    )
    .bind(now_ms)
    .fetch_all(&mut **tx)
    .await?;
    for (job_id, holder, attempts) in &expired {
        let lost = format!(
            "the lease of agent {holder} expired (it stopped renewing: stopped, killed or \
             cut off)"
        );
        let (state, workload_state, why) = if *attempts >= i64::from(max_attempts) {
            (
                "failed",
                "failed",
                format!(
                    "{lost} on attempt {attempts} of {max_attempts}: failed for good (a \
                     workload that takes its agent down every time is not run again)"
                ),
            )
        } else {
            (
                "pending",
                "pending_profile",
                format!("{lost}; the job is back in the queue"),
            )
        };
        // No holder: the expired holder's late submissions are told they lost the claim.
        sqlx::query(
            "UPDATE profiling_jobs SET state = $4, claim_holder = '', lease_expires_ms = 0, \
             last_error = $2, \
             updated_at_ms = $3 WHERE id = $1",
        )
        .bind(job_id)
        .bind(&why)
        .bind(now_ms)
        .bind(state)
        .execute(&mut **tx)
        .await?;
        set_reason(tx, *job_id, Some(workload_state), &why, now_ms).await?;
        free_agent(tx, *job_id).await?;
    }
    Ok(expired.len() as u64)
}

async fn set_reason(
    tx: &mut Transaction<'_, Any>,
    job_id: i64,
    state: Option<&str>,
    reason: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE workloads SET \
           state = CASE WHEN state = 'profiled' THEN state ELSE COALESCE($2, state) END, \
           state_reason = CASE WHEN state = 'profiled' THEN state_reason ELSE $3 END, \
           updated_at_ms = $4 \
         WHERE id = (SELECT workload_id FROM profiling_jobs WHERE id = $1)",
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
    /// every workload waiting for a profile, or only `workload`, that has a pending job no
    /// agent seen at or after `live_since_ms` can run (none of its GPU model, or none at
    /// all for a job of any GPU model) gets `reason`. A workload whose jobs all have a
    /// live agent keeps its reason.
    pub async fn explain_waiting_jobs(
        &self,
        workload: Option<&str>,
        reason: &str,
        live_since_ms: i64,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "UPDATE workloads SET state_reason = $1, updated_at_ms = $2 \
             WHERE state = 'pending_profile' AND ($3 IS NULL OR name = $3) \
             AND id IN (SELECT j.workload_id FROM profiling_jobs j WHERE j.state = 'pending' \
                        AND NOT EXISTS (SELECT 1 FROM agents a WHERE a.last_seen_ms >= $4 \
                                        AND (j.gpu = '' OR a.gpu = j.gpu)))",
        )
        .bind(reason)
        .bind(now_ms)
        .bind(workload)
        .bind(live_since_ms)
        .execute(&self.db.pool)
        .await?;
        Ok(result.rows_affected())
    }

    /// Claims the oldest pending job that may run now for the in-process worker (any GPU
    /// model's job), marking it RUNNING without a lease.
    pub async fn claim_next_job(&self, now_ms: i64) -> Result<Option<ClaimedJob>, StoreError> {
        self.claim_job(
            &JobClaimer {
                holder: IN_PROCESS_HOLDER,
                gpu: None,
                lease_ms: 0,
                max_attempts: u32::MAX,
            },
            now_ms,
        )
        .await
    }

    /// Claims the oldest pending job that may run now and that `claimer` can run (its GPU
    /// model's, or any GPU model's), marking it RUNNING under a lease. Expired leases are
    /// returned to the queue first, in the same transaction.
    pub async fn claim_job(
        &self,
        claimer: &JobClaimer<'_>,
        now_ms: i64,
    ) -> Result<Option<ClaimedJob>, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            expire_leases_in(&mut tx, claimer.max_attempts, now_ms).await?;
            let lease_expires_ms = if claimer.lease_ms > 0 {
                now_ms + claimer.lease_ms
            } else {
                0
            };
            let row = sqlx::query_as::<_, ClaimedRow>(
                "UPDATE profiling_jobs SET state = 'running', attempts = attempts + 1, \
                 claims = claims + 1, claim_holder = $2, lease_expires_ms = $3, progress = '', \
                 updated_at_ms = $1 \
                 WHERE id = (SELECT id FROM profiling_jobs WHERE state = 'pending' \
                             AND not_before_ms <= $1 AND (gpu = '' OR gpu = $4) \
                             ORDER BY id LIMIT 1) \
                 RETURNING id, claims, gpu, attempts, lease_expires_ms, \
                   (SELECT name FROM workloads w WHERE w.id = workload_id) AS name, \
                   (SELECT launch FROM workloads w WHERE w.id = workload_id) AS launch",
            )
            .bind(now_ms)
            .bind(claimer.holder)
            .bind(lease_expires_ms)
            .bind(claimer.gpu.map(GpuName::as_str))
            .fetch_optional(&mut *tx)
            .await?;
            let Some(row) = row else { return Ok(None) };
            let reason = if claimer.holder == IN_PROCESS_HOLDER {
                "profiling".to_string()
            } else {
                format!("profiling on agent {}", claimer.holder)
            };
            set_reason(&mut tx, row.id, None, &reason, now_ms).await?;
            sqlx::query("UPDATE agents SET job_id = $2, last_seen_ms = $3 WHERE id = $1")
                .bind(claimer.holder)
                .bind(row.id)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            Ok(Some(ClaimedJob {
                id: row.id,
                claim: row.claims,
                holder: claimer.holder.to_string(),
                workload: WorkloadName::parse("name", &row.name)
                    .map_err(|e| StoreError::Corrupt(e.message))?,
                gpu: if row.gpu.is_empty() {
                    None
                } else {
                    Some(
                        GpuName::parse("gpu", &row.gpu)
                            .map_err(|e| StoreError::Corrupt(e.message))?,
                    )
                },
                attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
                launch: row
                    .launch
                    .map(|json| serde_json::from_str(&json))
                    .transpose()
                    .map_err(|e| {
                        StoreError::Corrupt(format!("launch spec of {}: {e}", row.name))
                    })?,
                lease_expires_ms: row.lease_expires_ms,
            }))
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Returns running jobs whose lease ran out to the queue, or fails them when that was
    /// attempt `max_attempts`. Returns how many.
    pub async fn expire_leases(&self, max_attempts: u32, now_ms: i64) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = expire_leases_in(&mut tx, max_attempts, now_ms).await;
        self.finish_write(tx, outcome).await
    }

    /// Extends the lease of a running job its claim still holds, and keeps the holder's
    /// progress note. Returns the new expiry (0 = the job has no lease). Only the claim's
    /// holder may renew it.
    pub async fn renew_lease(
        &self,
        job: &ClaimedJob,
        lease_ms: i64,
        progress: &str,
        now_ms: i64,
    ) -> Result<i64, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let (job_id, claim) = (job.id, job.claim);
            let renewed: Option<(i64, String)> = sqlx::query_as(
                "UPDATE profiling_jobs SET \
                   lease_expires_ms = CASE WHEN lease_expires_ms = 0 THEN 0 ELSE $3 + $4 END, \
                   progress = $5, updated_at_ms = $3 \
                 WHERE id = $1 AND claims = $2 AND state = 'running' AND claim_holder = $6 \
                 RETURNING lease_expires_ms, claim_holder",
            )
            .bind(job_id)
            .bind(claim)
            .bind(now_ms)
            .bind(lease_ms)
            .bind(progress)
            .bind(&job.holder)
            .fetch_optional(&mut *tx)
            .await?;
            match renewed {
                Some((expires, holder)) => {
                    sqlx::query("UPDATE agents SET last_seen_ms = $2 WHERE id = $1")
                        .bind(holder)
                        .bind(now_ms)
                        .execute(&mut *tx)
                        .await?;
                    Ok(expires)
                }
                // A finished job cannot be renewed either: the holder is told it lost it.
                None => match claim_miss::<()>(&mut tx, job, true).await? {
                    Submitted::Applied(()) | Submitted::Duplicate => Err(StoreError::ClaimLost {
                        job_id,
                        claim,
                        now: "the job is done".into(),
                    }),
                },
            }
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Jobs the in-process worker held when the server stopped (RUNNING without a lease)
    /// were cut off: they go back to PENDING (the cut-off attempt is not counted). Jobs
    /// agents hold keep running under their leases. Returns how many.
    pub async fn requeue_running_jobs(&self, now_ms: i64) -> Result<u64, StoreError> {
        let result = sqlx::query(
            "UPDATE profiling_jobs SET state = 'pending', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, \
             claim_holder = '', updated_at_ms = $1 \
             WHERE state = 'running' AND lease_expires_ms = 0",
        )
        .bind(now_ms)
        .execute(&self.db.pool)
        .await?;
        Ok(result.rows_affected())
    }

    /// Puts a claimed job back to PENDING without counting the attempt (the backend could
    /// not run, or the holder is stopping); the reason shows on the workload.
    pub async fn release_job(
        &self,
        job: &ClaimedJob,
        reason: &str,
        not_before_ms: i64,
        now_ms: i64,
    ) -> Result<Submitted<()>, StoreError> {
        self.update_job(
            job,
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
        job: &ClaimedJob,
        error: &str,
        reason: &str,
        not_before_ms: i64,
        now_ms: i64,
    ) -> Result<Submitted<()>, StoreError> {
        self.update_job(
            job,
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

    /// Gives up on a job: the job and its workload are FAILED, with the error as reason
    /// (a workload already profiled on another GPU model stays PROFILED).
    pub async fn fail_job(
        &self,
        job: &ClaimedJob,
        error: &str,
        now_ms: i64,
    ) -> Result<Submitted<()>, StoreError> {
        self.update_job(
            job,
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

    /// One state change of a claimed job and of its workload, in one transaction, if the
    /// claim still holds the job.
    async fn update_job(
        &self,
        job: &ClaimedJob,
        update: JobUpdate<'_>,
        now_ms: i64,
    ) -> Result<Submitted<()>, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let changed = sqlx::query(
                "UPDATE profiling_jobs SET state = $2, \
                 attempts = CASE WHEN $3 = 1 AND attempts > 0 THEN attempts - 1 \
                 WHEN $3 = 1 THEN 0 ELSE attempts END, \
                 last_error = COALESCE($4, last_error), \
                 not_before_ms = COALESCE($5, not_before_ms), updated_at_ms = $6, \
                 lease_expires_ms = 0 \
                 WHERE id = $1 AND claims = $7 AND state = 'running' AND claim_holder = $8",
            )
            .bind(job.id)
            .bind(update.state)
            .bind(i64::from(update.uncount_attempt))
            .bind(update.last_error)
            .bind(update.not_before_ms)
            .bind(now_ms)
            .bind(job.claim)
            .bind(&job.holder)
            .execute(&mut *tx)
            .await?;
            if changed.rows_affected() == 0 {
                return claim_miss(&mut tx, job, false).await;
            }
            free_agent(&mut tx, job.id).await?;
            set_reason(
                &mut tx,
                job.id,
                Some(update.workload_state),
                update.reason,
                now_ms,
            )
            .await?;
            Ok(Submitted::Applied(()))
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Stores the measured profile, marks the workload PROFILED (with `reason`, e.g. that
    /// kernel metrics are missing) and the job done, if the claim still holds the job.
    /// Fails with `WorkloadNotFound` when the workload was deleted meanwhile, and with
    /// `WrongGpuForJob` when the profile is of another GPU model than the job asked for.
    pub async fn complete_job(
        &self,
        job: &ClaimedJob,
        profile: &Profile,
        reason: &str,
        now_ms: i64,
    ) -> Result<Submitted<WorkloadRecord>, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let job_gpu: Option<(String, String, String)> = sqlx::query_as(
                "SELECT j.gpu, j.state, j.claim_holder FROM profiling_jobs j \
                 WHERE j.id = $1 AND j.claims = $2",
            )
            .bind(job.id)
            .bind(job.claim)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((job_gpu, state, holder)) = job_gpu else {
                let exists: Option<i64> =
                    sqlx::query_scalar("SELECT id FROM profiling_jobs WHERE id = $1")
                        .bind(job.id)
                        .fetch_optional(&mut *tx)
                        .await?;
                if exists.is_none() {
                    // Deleted with its workload while it was being profiled.
                    return Err(StoreError::WorkloadNotFound(job.workload.to_string()));
                }
                return claim_miss(&mut tx, job, true).await;
            };
            if state != "running" || holder != job.holder {
                return claim_miss(&mut tx, job, true).await;
            }
            if !job_gpu.is_empty() && job_gpu != profile.gpu.as_str() {
                return Err(StoreError::WrongGpuForJob {
                    job_id: job.id,
                    job_gpu,
                    profile_gpu: profile.gpu.as_str().to_string(),
                });
            }
            let mut record =
                put_profile_in(&mut tx, job.workload.as_str(), profile, now_ms).await?;
            sqlx::query(
                "UPDATE profiling_jobs SET state = 'done', lease_expires_ms = 0, \
                 updated_at_ms = $2 WHERE id = $1",
            )
            .bind(job.id)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            free_agent(&mut tx, job.id).await?;
            if !reason.is_empty() {
                sqlx::query(
                    "UPDATE workloads SET state_reason = $2, updated_at_ms = $3 WHERE name = $1",
                )
                .bind(job.workload.as_str())
                .bind(reason)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
                record.state_reason = reason.to_string();
            }
            Ok(Submitted::Applied(record))
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// The workload as it is now (a duplicate submission's answer).
    pub async fn workload_of_job(&self, job: &ClaimedJob) -> Result<WorkloadRecord, StoreError> {
        let mut tx = self.begin_read().await?;
        let outcome = fetch_workload(&mut tx, job.workload.as_str()).await;
        super::finish(tx, outcome)
            .await?
            .ok_or_else(|| StoreError::WorkloadNotFound(job.workload.to_string()))
    }

    /// Jobs by state, for operators and tests: (pending, running, done, failed).
    pub async fn job_counts(&self) -> Result<(i64, i64, i64, i64), StoreError> {
        Ok(sqlx::query_as(
            "SELECT COALESCE(SUM(CASE WHEN state = 'pending' THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN state = 'running' THEN 1 ELSE 0 END), 0), \
             COALESCE(SUM(CASE WHEN state = 'done' THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END), 0) FROM profiling_jobs",
        )
        .fetch_one(&self.db.pool)
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
