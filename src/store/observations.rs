//! Colocated runs: the models' training data.

use std::collections::HashMap;

use sqlx::{Sqlite, Transaction};

use super::{finish, Store, StoreError};
use crate::domain::{GpuName, Observation};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObservationSource {
    Reported,
    Imported,
    /// Measured by `coloc calibrate` on the profiling GPU.
    Calibrated,
}

impl ObservationSource {
    fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Imported => "imported",
            Self::Calibrated => "calibrated",
        }
    }
}

/// A stored run: each member's workload name and colocated throughput, in report order.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredObservation {
    pub id: i64,
    pub members: Vec<(String, f64)>,
}

async fn insert_one(
    tx: &mut Transaction<'_, Sqlite>,
    observation: &Observation,
    source: ObservationSource,
    now_ms: i64,
) -> Result<(i64, bool), StoreError> {
    let fingerprint = observation.fingerprint();
    let inserted = sqlx::query_scalar::<_, i64>(
        "INSERT INTO observations (gpu, observed_at_ms, recorded_at_ms, source, fingerprint) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (fingerprint) DO NOTHING RETURNING id",
    )
    .bind(observation.gpu.as_str())
    .bind(observation.observed_at_ms)
    .bind(now_ms)
    .bind(source.as_str())
    .bind(&fingerprint)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(id) = inserted else {
        let existing =
            sqlx::query_scalar::<_, i64>("SELECT id FROM observations WHERE fingerprint = ?1")
                .bind(&fingerprint)
                .fetch_one(&mut **tx)
                .await?;
        return Ok((existing, false));
    };
    for (position, member) in observation.members.iter().enumerate() {
        sqlx::query(
            "INSERT INTO observation_members (observation_id, position, workload, throughput, job_id) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(id)
        .bind(position as i64)
        .bind(member.workload.as_str())
        .bind(member.throughput)
        .bind(&member.job_id)
        .execute(&mut **tx)
        .await?;
    }
    Ok((id, true))
}

impl Store {
    /// Stores a run; returns its id and whether it is new (a repeated run is not stored
    /// twice). One transaction.
    pub async fn insert_observation(
        &self,
        observation: &Observation,
        source: ObservationSource,
        now_ms: i64,
    ) -> Result<(i64, bool), StoreError> {
        let mut tx = self.begin_write().await?;
        let outcome = insert_one(&mut tx, observation, source, now_ms).await;
        finish(tx, outcome).await
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
                if insert_one(&mut tx, observation, source, now_ms).await?.1 {
                    created += 1;
                }
            }
            Ok(created)
        }
        .await;
        finish(tx, outcome).await
    }

    /// Every stored run on `gpu`, oldest first.
    pub async fn observations(&self, gpu: &GpuName) -> Result<Vec<StoredObservation>, StoreError> {
        let rows = sqlx::query_as::<_, (i64, String, f64)>(
            "SELECT m.observation_id, m.workload, m.throughput FROM observation_members m \
             JOIN observations o ON o.id = m.observation_id WHERE o.gpu = ?1 \
             ORDER BY m.observation_id, m.position",
        )
        .bind(gpu.as_str())
        .fetch_all(&self.pool)
        .await?;
        let mut observations: Vec<StoredObservation> = Vec::new();
        let mut index: HashMap<i64, usize> = HashMap::new();
        for (id, workload, throughput) in rows {
            let slot = *index.entry(id).or_insert_with(|| {
                observations.push(StoredObservation {
                    id,
                    members: Vec::new(),
                });
                observations.len() - 1
            });
            observations[slot].members.push((workload, throughput));
        }
        Ok(observations)
    }
}
