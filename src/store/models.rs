//! Fitted models, every version kept.

use sqlx::FromRow;

use super::{Store, StoreError};
use crate::{
    domain::GpuName,
    model::{FitMetrics, ModelParams},
};

#[derive(Debug, Clone)]
pub struct StoredModel {
    pub gpu: GpuName,
    pub version: u64,
    pub params: ModelParams,
    pub metrics: FitMetrics,
    pub created_at_ms: i64,
}

#[derive(FromRow)]
struct ModelRow {
    gpu: String,
    version: i64,
    parameters: String,
    observations: i64,
    r2: f64,
    mse: f64,
    created_at_ms: i64,
}

impl ModelRow {
    fn into_model(self) -> Result<StoredModel, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(what);
        let params: ModelParams = serde_json::from_str(&self.parameters).map_err(|e| {
            corrupt(format!(
                "parameters of model {} v{}: {e}",
                self.gpu, self.version
            ))
        })?;
        if !params.is_servable() {
            return Err(corrupt(format!(
                "model {} v{} has unusable parameters",
                self.gpu, self.version
            )));
        }
        Ok(StoredModel {
            gpu: GpuName::parse("gpu", &self.gpu).map_err(|e| corrupt(e.0))?,
            version: self.version as u64,
            params,
            metrics: FitMetrics {
                observations: self.observations as usize,
                r2: self.r2,
                mse: self.mse,
            },
            created_at_ms: self.created_at_ms,
        })
    }
}

impl Store {
    /// Stores a fitted model as the next version for its GPU model. One transaction, so two
    /// concurrent trainings cannot take the same version.
    /// (A single statement is its own transaction.)
    pub async fn insert_model(
        &self,
        gpu: &GpuName,
        params: &ModelParams,
        metrics: &FitMetrics,
        now_ms: i64,
    ) -> Result<StoredModel, StoreError> {
        let parameters = serde_json::to_string(params).expect("model parameters serialize");
        let version = sqlx::query_scalar::<_, i64>(
            "INSERT INTO models (gpu, version, kind, parameters, observations, r2, mse, created_at_ms) \
             VALUES (?1, (SELECT COALESCE(MAX(version), 0) + 1 FROM models WHERE gpu = ?1), \
             ?2, ?3, ?4, ?5, ?6, ?7) RETURNING version",
        )
        .bind(gpu.as_str())
        .bind(params.kind().as_str())
        .bind(parameters)
        .bind(metrics.observations as i64)
        .bind(metrics.r2)
        .bind(metrics.mse)
        .bind(now_ms)
        .fetch_one(&self.pool)
        .await?;
        Ok(StoredModel {
            gpu: gpu.clone(),
            version: version as u64,
            params: params.clone(),
            metrics: *metrics,
            created_at_ms: now_ms,
        })
    }

    /// One stored version.
    pub async fn model(
        &self,
        gpu: &GpuName,
        version: u64,
    ) -> Result<Option<StoredModel>, StoreError> {
        let row = sqlx::query_as::<_, ModelRow>(
            "SELECT gpu, version, parameters, observations, r2, mse, created_at_ms FROM models \
             WHERE gpu = ?1 AND version = ?2",
        )
        .bind(gpu.as_str())
        .bind(i64::try_from(version).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await?;
        row.map(ModelRow::into_model).transpose()
    }

    /// The newest model of every GPU model.
    pub async fn latest_models(&self) -> Result<Vec<StoredModel>, StoreError> {
        let rows = sqlx::query_as::<_, ModelRow>(
            "SELECT gpu, version, parameters, observations, r2, mse, created_at_ms FROM models m \
             WHERE version = (SELECT MAX(version) FROM models WHERE gpu = m.gpu)",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(ModelRow::into_model).collect()
    }
}
