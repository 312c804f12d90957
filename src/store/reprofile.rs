//! Re-profiles of suspect profiles: when stored runs contradict a profile's exclusive
//! throughput (`advisor::runs`), the advisor asks here for the workload to be profiled again
//! on that GPU model. Queued once per suspect profile (the `reprofile_requests` row of its
//! `measured_at_ms`), never on every run or retraining that finds it suspect again, and only
//! where a profiler can run it: the workload has a launch spec. Portable SQL (SQLite and
//! PostgreSQL).

use super::{Store, StoreError};
use crate::domain::GpuName;

/// What asking for a re-profile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reprofile {
    /// A profiling job for the workload on the GPU model is pending now.
    Queued,
    /// This profile's re-profile was queued before (pending, running or over): nothing done.
    AlreadyAsked,
    /// The workload has no launch spec (an imported profile, say): no profiler can run it.
    NoLaunch,
    /// No such workload, or no profile of it on the GPU model.
    NoProfile,
}

impl Store {
    /// Queues a re-profile of `workload` on `gpu` once for its current profile there (see
    /// the module header). The job is the workload's job for that GPU model, back to
    /// pending with its attempts reset where it was done or failed, new where there was none;
    /// a job already pending or running is left as it is.
    pub async fn queue_reprofile(
        &self,
        workload: &str,
        gpu: &GpuName,
        now_ms: i64,
    ) -> Result<Reprofile, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let row: Option<(i64, Option<String>, i64)> = sqlx::query_as(
                "SELECT w.id, w.launch, p.measured_at_ms FROM workloads w \
                 JOIN profiles p ON p.workload_id = w.id AND p.gpu = $2 WHERE w.name = $1",
            )
            .bind(workload)
            .bind(gpu.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            let Some((workload_id, launch, measured_at_ms)) = row else {
                return Ok(Reprofile::NoProfile);
            };
            if launch.is_none() {
                return Ok(Reprofile::NoLaunch);
            }
            let asked = sqlx::query(
                "INSERT INTO reprofile_requests (workload_id, gpu, profile_measured_at_ms, \
                 requested_at_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(workload_id)
            .bind(gpu.as_str())
            .bind(measured_at_ms)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if asked == 0 {
                return Ok(Reprofile::AlreadyAsked);
            }
            sqlx::query(
                "INSERT INTO profiling_jobs (workload_id, gpu, state, created_at_ms, \
                 updated_at_ms) VALUES ($1, $2, 'pending', $3, $3) \
                 ON CONFLICT (workload_id, gpu) DO UPDATE SET state = 'pending', attempts = 0, \
                 last_error = '', not_before_ms = 0, claim_holder = '', lease_expires_ms = 0, \
                 progress = '', updated_at_ms = $3 \
                 WHERE profiling_jobs.state IN ('done', 'failed')",
            )
            .bind(workload_id)
            .bind(gpu.as_str())
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            Ok(Reprofile::Queued)
        }
        .await;
        self.finish_write(tx, outcome).await
    }
}
