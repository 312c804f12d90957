//! Colocated runs: the models' training data.

use std::collections::HashMap;

use sqlx::{Any, Transaction};

use super::{Store, StoreError};
use crate::domain::{GpuName, Observation, SharingMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObservationSource {
    Reported,
    Imported,
    /// Measured by `coloc calibrate` on the profiling GPU.
    Calibrated,
}

impl ObservationSource {
    /// The source named as stored ("reported", "imported", "calibrated").
    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Reported, Self::Imported, Self::Calibrated]
            .into_iter()
            .find(|source| source.as_str() == raw)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Imported => "imported",
            Self::Calibrated => "calibrated",
        }
    }
}

/// A stored run: each member's workload name and colocated throughput, in report order,
/// and how the GPU was shared.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredObservation {
    pub id: i64,
    pub members: Vec<(String, f64)>,
    pub sharing_mode: SharingMode,
}

/// A reported run with the prediction the serving model made for it.
#[derive(Debug, Clone, PartialEq)]
pub struct PredictedRun {
    pub id: i64,
    pub observed_at_ms: i64,
    pub recorded_at_ms: i64,
    pub predicted_sum: f64,
    pub observed_sum: f64,
    pub predicted_by_version: u64,
}

/// What the model in use predicted for a reported set: (sum, model version).
pub type Prediction = (f64, u64);

/// Inserts one run into `tx`, or finds the stored copy by its fingerprint (a copy inserted
/// earlier in the same transaction included): (id, created).
pub(super) async fn insert_one(
    tx: &mut Transaction<'_, Any>,
    observation: &Observation,
    source: ObservationSource,
    prediction: Option<Prediction>,
    now_ms: i64,
) -> Result<(i64, bool), StoreError> {
    let fingerprint = observation.fingerprint();
    let inserted = sqlx::query_scalar::<_, i64>(
        "INSERT INTO observations (gpu, observed_at_ms, recorded_at_ms, source, fingerprint, \
         predicted_sum, predicted_by_version, gpu_id, sharing_mode) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (fingerprint) DO NOTHING RETURNING id",
    )
    .bind(observation.gpu.as_str())
    .bind(observation.observed_at_ms)
    .bind(now_ms)
    .bind(source.as_str())
    .bind(&fingerprint)
    .bind(super::engine::OptF64(prediction.map(|p| p.0)))
    .bind(prediction.map(|p| p.1 as i64))
    .bind(&observation.gpu_id)
    .bind(observation.sharing_mode.as_str())
    .fetch_optional(&mut **tx)
    .await?;
    let Some(id) = inserted else {
        let existing =
            sqlx::query_scalar::<_, i64>("SELECT id FROM observations WHERE fingerprint = $1")
                .bind(&fingerprint)
                .fetch_one(&mut **tx)
                .await?;
        return Ok((existing, false));
    };
    // One statement for all members: each statement is a round trip to the connection's
    // thread, which is most of what a run costs the observation writer.
    let rows = (0..observation.members.len())
        .map(|i| {
            let n = 5 * i;
            format!(
                "(${}, ${}, ${}, ${}, ${})",
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                n + 5
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut insert_members = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO observation_members (observation_id, position, workload, throughput, job_id) \
         VALUES {rows}"
    )));
    for (position, member) in observation.members.iter().enumerate() {
        insert_members = insert_members
            .bind(id)
            .bind(position as i64)
            .bind(member.workload.as_str())
            .bind(member.throughput)
            .bind(&member.job_id);
    }
    insert_members.execute(&mut **tx).await?;
    Ok((id, true))
}

impl Store {
    /// Stores a run; returns its id and whether it is new (a repeated run is not stored
    /// twice). The run is committed (durably) before this returns, in one transaction with
    /// the other runs queued at the same time (group commit; see `observation_writer`).
    pub async fn insert_observation(
        &self,
        observation: &Observation,
        source: ObservationSource,
        prediction: Option<Prediction>,
        now_ms: i64,
    ) -> Result<(i64, bool), StoreError> {
        self.observation_writer
            .write(observation.clone(), source, prediction, now_ms)
            .await
    }

    /// Stores many runs in one transaction; returns how many were new.
    pub async fn insert_observations(
        &self,
        observations: &[Observation],
        source: ObservationSource,
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            let mut created = 0;
            for observation in observations {
                if insert_one(&mut tx, observation, source, None, now_ms)
                    .await?
                    .1
                {
                    created += 1;
                }
            }
            Ok(created)
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// Marks exactly these runs of `gpu` as outliers (with why) and clears the others from
    /// run `from_id` on (the runs a training looked at).
    pub async fn set_outliers(
        &self,
        gpu: &GpuName,
        from_id: i64,
        flagged: &[(i64, String)],
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = async {
            sqlx::query(
                "UPDATE observations SET outlier_reason = NULL \
                 WHERE gpu = $1 AND id >= $2 AND outlier_reason IS NOT NULL",
            )
            .bind(gpu.as_str())
            .bind(from_id)
            .execute(&mut *tx)
            .await?;
            for (id, reason) in flagged {
                sqlx::query("UPDATE observations SET outlier_reason = $2 WHERE id = $1")
                    .bind(id)
                    .bind(reason)
                    .execute(&mut *tx)
                    .await?;
            }
            Ok(())
        }
        .await;
        self.finish_write(tx, outcome).await
    }

    /// GPU models that have stored runs.
    pub async fn observation_gpus(&self) -> Result<Vec<GpuName>, StoreError> {
        let names =
            sqlx::query_scalar::<_, String>("SELECT DISTINCT gpu FROM observations ORDER BY gpu")
                .fetch_all(&self.db.pool)
                .await?;
        names
            .iter()
            .map(|n| GpuName::parse("gpu", n).map_err(|e| StoreError::Corrupt(e.message)))
            .collect()
    }

    /// How many runs of `gpu` have an id above `after_id`.
    pub async fn observations_after(
        &self,
        gpu: &GpuName,
        after_id: i64,
    ) -> Result<u64, StoreError> {
        let count = sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM observations WHERE gpu = $1 AND id > $2",
        )
        .bind(gpu.as_str())
        .bind(after_id)
        .fetch_one(&self.db.pool)
        .await?;
        Ok(count as u64)
    }

    /// The relative errors |predicted - actual| / actual of the newest `window` runs of
    /// `gpu` that model `version` predicted when they were reported, newest first.
    pub async fn prediction_errors(
        &self,
        gpu: &GpuName,
        version: u64,
        window: usize,
    ) -> Result<Vec<f64>, StoreError> {
        Ok(sqlx::query_scalar::<_, f64>(
            // Newest first through observations_by_prediction; each run's total from its
            // own members, so only the runs read are summed.
            "SELECT ABS(predicted_sum - total) / total FROM \
               (SELECT o.id, o.predicted_sum, \
                  (SELECT SUM(m.throughput) FROM observation_members m \
                   WHERE m.observation_id = o.id) AS total \
                FROM observations o WHERE o.gpu = $1 AND o.predicted_by_version = $2) AS runs \
             WHERE total > 0 ORDER BY id DESC LIMIT $3",
        )
        .bind(gpu.as_str())
        .bind(version as i64)
        .bind(window as i64)
        .fetch_all(&self.db.pool)
        .await?)
    }

    /// The newest `limit` runs of `gpu` that a model predicted when they were reported,
    /// oldest first, each with its observed throughput sum.
    pub async fn predicted_runs(
        &self,
        gpu: &GpuName,
        limit: usize,
    ) -> Result<Vec<PredictedRun>, StoreError> {
        let rows = sqlx::query_as::<_, (i64, i64, i64, f64, f64, i64)>(
            "SELECT o.id, o.observed_at_ms, o.recorded_at_ms, o.predicted_sum, \
               COALESCE((SELECT SUM(m.throughput) FROM observation_members m \
                         WHERE m.observation_id = o.id), 0.0), \
               o.predicted_by_version \
             FROM observations o \
             WHERE o.gpu = $1 AND o.predicted_sum IS NOT NULL \
               AND o.predicted_by_version IS NOT NULL \
             ORDER BY o.id DESC LIMIT $2",
        )
        .bind(gpu.as_str())
        .bind(limit as i64)
        .fetch_all(&self.db.pool)
        .await?;
        let mut runs: Vec<PredictedRun> = rows
            .into_iter()
            .map(
                |(id, observed_at_ms, recorded_at_ms, predicted_sum, observed_sum, version)| {
                    PredictedRun {
                        id,
                        observed_at_ms,
                        recorded_at_ms,
                        predicted_sum,
                        observed_sum,
                        predicted_by_version: version as u64,
                    }
                },
            )
            .collect();
        runs.reverse();
        Ok(runs)
    }

    /// The newest `limit` stored runs on `gpu` (all for 0), oldest first.
    pub async fn observations(
        &self,
        gpu: &GpuName,
        limit: usize,
    ) -> Result<Vec<StoredObservation>, StoreError> {
        let mut connection = self.db.pool.acquire().await?;
        runs_on_gpu(&mut connection, gpu, limit).await
    }
}

/// The newest `limit` stored runs on `gpu` (all for 0), oldest first (by id: the order
/// they were stored), each with its members in report order. Read through the caller's
/// connection (the pool's, or a read-only snapshot's transaction, `snapshot.rs`).
pub(super) async fn runs_on_gpu(
    connection: &mut sqlx::AnyConnection,
    gpu: &GpuName,
    limit: usize,
) -> Result<Vec<StoredObservation>, StoreError> {
    // No limit is the largest one (SQLite's -1 is no LIMIT PostgreSQL accepts).
    let limit = if limit == 0 { i64::MAX } else { limit as i64 };
    let rows = sqlx::query_as::<_, (i64, String, f64, String)>(
        "SELECT m.observation_id, m.workload, m.throughput, o.sharing_mode \
         FROM observation_members m JOIN observations o ON o.id = m.observation_id \
         WHERE m.observation_id IN \
           (SELECT id FROM observations WHERE gpu = $1 ORDER BY id DESC LIMIT $2) \
         ORDER BY m.observation_id, m.position",
    )
    .bind(gpu.as_str())
    .bind(limit)
    .fetch_all(connection)
    .await?;
    let mut observations: Vec<StoredObservation> = Vec::new();
    let mut index: HashMap<i64, usize> = HashMap::new();
    for (id, workload, throughput, mode) in rows {
        let slot = *index.entry(id).or_insert_with(|| {
            observations.push(StoredObservation {
                id,
                members: Vec::new(),
                // The column's CHECK admits only the modes the domain knows.
                sharing_mode: SharingMode::parse("sharing_mode", &mode).unwrap_or_default(),
            });
            observations.len() - 1
        });
        observations[slot].members.push((workload, throughput));
    }
    Ok(observations)
}
