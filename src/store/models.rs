//! Fitted models, every version kept with its verdict; operator pins; and the log of every
//! training attempt.

use sqlx::FromRow;

use super::engine::OptF64;

use super::{Store, StoreError};
use crate::{
    domain::GpuName,
    model::{FitMetrics, ModelParams},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelStatus {
    Promoted,
    Rejected,
}

impl ModelStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Promoted => "promoted",
            Self::Rejected => "rejected",
        }
    }
}

/// Cross-validated figures of a challenger's procedure and the champion's, on the same folds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    pub score: f64,
    pub mse: f64,
    pub champion_score: f64,
    pub champion_mse: f64,
}

#[derive(Debug, Clone)]
pub struct StoredModel {
    pub gpu: GpuName,
    pub version: u64,
    pub params: ModelParams,
    pub metrics: FitMetrics,
    pub created_at_ms: i64,
    pub status: ModelStatus,
    pub reason: String,
    pub comparison: Option<Comparison>,
    /// The training set: runs with ids up to this one, outliers excluded.
    pub last_observation_id: i64,
    pub excluded_outliers: u64,
}

impl StoredModel {
    /// A model fitted in process and never stored (tools, benchmarks, tests): version 1,
    /// promoted, no training set on record.
    pub fn fitted_in_process(
        gpu: GpuName,
        params: ModelParams,
        metrics: FitMetrics,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            gpu,
            version: 1,
            params,
            metrics,
            created_at_ms: 0,
            status: ModelStatus::Promoted,
            reason: reason.into(),
            comparison: None,
            last_observation_id: 0,
            excluded_outliers: 0,
        }
    }
}

/// A fitted model to store, with its verdict.
#[derive(Debug, Clone)]
pub struct NewModel {
    pub params: ModelParams,
    pub metrics: FitMetrics,
    pub status: ModelStatus,
    pub reason: String,
    pub comparison: Option<Comparison>,
    pub last_observation_id: i64,
    pub excluded_outliers: u64,
}

/// One training attempt, as logged.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct TrainingRun {
    pub kind: String,
    pub trigger: String,
    pub outcome: String,
    pub version: Option<i64>,
    pub reason: String,
    pub started_at_ms: i64,
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
    status: String,
    reason: String,
    cv_score: Option<f64>,
    cv_mse: Option<f64>,
    champion_cv_score: Option<f64>,
    champion_cv_mse: Option<f64>,
    last_observation_id: i64,
    excluded_outliers: i64,
}

macro_rules! select_models {
    ($($tail:literal),*) => {
        concat!(
            "SELECT m.gpu, m.version, m.parameters, m.observations, m.r2, m.mse, ",
            "m.created_at_ms, m.status, m.reason, m.cv_score, m.cv_mse, m.champion_cv_score, ",
            "m.champion_cv_mse, m.last_observation_id, m.excluded_outliers FROM models m ",
            $($tail),*
        )
    };
}

/// Champions: the pinned version of each GPU model, else its newest promoted one; `$tail`
/// narrows the selection.
macro_rules! select_champions {
    ($tail:literal) => {
        select_models!(
            "WHERE m.version = COALESCE( ",
            "(SELECT p.version FROM model_pins p WHERE p.gpu = m.gpu), ",
            "(SELECT MAX(version) FROM models WHERE gpu = m.gpu AND status = 'promoted')) ",
            $tail
        )
    };
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
        let status = match self.status.as_str() {
            "promoted" => ModelStatus::Promoted,
            "rejected" => ModelStatus::Rejected,
            other => return Err(corrupt(format!("model status {other:?}"))),
        };
        let comparison = match (
            self.cv_score,
            self.cv_mse,
            self.champion_cv_score,
            self.champion_cv_mse,
        ) {
            (Some(score), Some(mse), Some(champion_score), Some(champion_mse)) => {
                Some(Comparison {
                    score,
                    mse,
                    champion_score,
                    champion_mse,
                })
            }
            _ => None,
        };
        Ok(StoredModel {
            gpu: GpuName::parse("gpu", &self.gpu).map_err(|e| corrupt(e.message))?,
            version: self.version as u64,
            params,
            metrics: FitMetrics {
                observations: self.observations as usize,
                r2: self.r2,
                mse: self.mse,
            },
            created_at_ms: self.created_at_ms,
            status,
            reason: self.reason,
            comparison,
            last_observation_id: self.last_observation_id,
            excluded_outliers: self.excluded_outliers as u64,
        })
    }
}

fn version_param(version: u64) -> i64 {
    i64::try_from(version).unwrap_or(i64::MAX)
}

impl Store {
    /// Stores a fitted model as the next version for its GPU model (one statement, so two
    /// concurrent trainings cannot take the same version).
    pub async fn insert_model(
        &self,
        gpu: &GpuName,
        model: &NewModel,
        now_ms: i64,
    ) -> Result<StoredModel, StoreError> {
        let parameters = serde_json::to_string(&model.params).expect("model parameters serialize");
        let comparison = model.comparison;
        // A write transaction, so that a leader's training is fenced (`lease.rs`).
        let mut tx = self.begin_write().await?;
        let inserted = sqlx::query_scalar::<_, i64>(
            "INSERT INTO models (gpu, version, kind, parameters, observations, r2, mse, \
             created_at_ms, status, reason, cv_score, cv_mse, champion_cv_score, champion_cv_mse, \
             last_observation_id, excluded_outliers) \
             VALUES ($1, (SELECT COALESCE(MAX(version), 0) + 1 FROM models WHERE gpu = $1), \
             $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING version",
        )
        .bind(gpu.as_str())
        .bind(model.params.kind().as_str())
        .bind(parameters)
        .bind(model.metrics.observations as i64)
        .bind(model.metrics.r2)
        .bind(model.metrics.mse)
        .bind(now_ms)
        .bind(model.status.as_str())
        .bind(&model.reason)
        .bind(OptF64(comparison.map(|c| c.score)))
        .bind(OptF64(comparison.map(|c| c.mse)))
        .bind(OptF64(comparison.map(|c| c.champion_score)))
        .bind(OptF64(comparison.map(|c| c.champion_mse)))
        .bind(model.last_observation_id)
        .bind(model.excluded_outliers as i64)
        .fetch_one(&mut *tx)
        .await
        .map_err(StoreError::from);
        let version = self.finish_write(tx, inserted).await?;
        Ok(StoredModel {
            gpu: gpu.clone(),
            version: version as u64,
            params: model.params.clone(),
            metrics: model.metrics,
            created_at_ms: now_ms,
            status: model.status,
            reason: model.reason.clone(),
            comparison,
            last_observation_id: model.last_observation_id,
            excluded_outliers: model.excluded_outliers,
        })
    }

    /// One stored version.
    pub async fn model(
        &self,
        gpu: &GpuName,
        version: u64,
    ) -> Result<Option<StoredModel>, StoreError> {
        let row =
            sqlx::query_as::<_, ModelRow>(select_models!("WHERE m.gpu = $1 AND m.version = $2"))
                .bind(gpu.as_str())
                .bind(version_param(version))
                .fetch_optional(&self.db.pool)
                .await?;
        row.map(ModelRow::into_model).transpose()
    }

    /// A GPU model's versions, newest first, at most `limit`.
    pub async fn models(&self, gpu: &GpuName, limit: u32) -> Result<Vec<StoredModel>, StoreError> {
        let rows = sqlx::query_as::<_, ModelRow>(select_models!(
            "WHERE m.gpu = $1 ORDER BY m.version DESC LIMIT $2"
        ))
        .bind(gpu.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.db.pool)
        .await?;
        rows.into_iter().map(ModelRow::into_model).collect()
    }

    /// The champion of every GPU model: its pinned version, else its newest promoted one.
    pub async fn champions(&self) -> Result<Vec<StoredModel>, StoreError> {
        let rows = sqlx::query_as::<_, ModelRow>(select_champions!(""))
            .fetch_all(&self.db.pool)
            .await?;
        rows.into_iter().map(ModelRow::into_model).collect()
    }

    /// The champion of one GPU model, if it has a model.
    pub async fn champion(&self, gpu: &GpuName) -> Result<Option<StoredModel>, StoreError> {
        let row = sqlx::query_as::<_, ModelRow>(select_champions!("AND m.gpu = $1"))
            .bind(gpu.as_str())
            .fetch_optional(&self.db.pool)
            .await?;
        row.map(ModelRow::into_model).transpose()
    }

    pub async fn pinned_version(&self, gpu: &GpuName) -> Result<Option<u64>, StoreError> {
        let version = sqlx::query_scalar::<_, i64>("SELECT version FROM model_pins WHERE gpu = $1")
            .bind(gpu.as_str())
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(version.map(|v| v as u64))
    }

    /// Pins a stored version; false when the GPU model has no such version.
    pub async fn pin_model(&self, gpu: &GpuName, version: u64) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "INSERT INTO model_pins (gpu, version) \
             SELECT gpu, version FROM models WHERE gpu = $1 AND version = $2 \
             ON CONFLICT (gpu) DO UPDATE SET version = excluded.version",
        )
        .bind(gpu.as_str())
        .bind(version_param(version))
        .execute(&self.db.pool)
        .await?;
        Ok(result.rows_affected() > 0)
    }

    /// Removes the pin; false when there was none.
    pub async fn unpin_model(&self, gpu: &GpuName) -> Result<bool, StoreError> {
        let result = sqlx::query("DELETE FROM model_pins WHERE gpu = $1")
            .bind(gpu.as_str())
            .execute(&self.db.pool)
            .await?;
        Ok(result.rows_affected() > 0)
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn record_training_run(
        &self,
        gpu: &GpuName,
        kind: &str,
        trigger: &str,
        outcome: &str,
        version: Option<u64>,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let inserted = sqlx::query(
            "INSERT INTO training_runs (gpu, kind, trigger, outcome, version, reason, started_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(gpu.as_str())
        .bind(kind)
        .bind(trigger)
        .bind(outcome)
        .bind(version.map(version_param))
        .bind(reason)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map(|_| ())
        .map_err(StoreError::from);
        self.finish_write(tx, inserted).await
    }

    /// The newest training run of each GPU model (its id): what a replica compares to know
    /// that a training, here or on another server, read the runs anew.
    pub async fn latest_training_runs(&self) -> Result<Vec<(GpuName, i64)>, StoreError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT gpu, MAX(id) FROM training_runs GROUP BY gpu")
                .fetch_all(&self.db.pool)
                .await?;
        rows.into_iter()
            .map(|(gpu, id)| {
                let gpu =
                    GpuName::parse("gpu", &gpu).map_err(|e| StoreError::Corrupt(e.message))?;
                Ok((gpu, id))
            })
            .collect()
    }

    /// The newest run id any model of `gpu` was trained up to (0 = never trained).
    pub async fn last_trained_observation_id(&self, gpu: &GpuName) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar::<_, i64>(
            "SELECT COALESCE(MAX(last_observation_id), 0) FROM models WHERE gpu = $1",
        )
        .bind(gpu.as_str())
        .fetch_one(&self.db.pool)
        .await?)
    }

    /// A GPU model's training attempts, newest first.
    pub async fn training_runs(
        &self,
        gpu: &GpuName,
        limit: u32,
    ) -> Result<Vec<TrainingRun>, StoreError> {
        Ok(sqlx::query_as::<_, TrainingRun>(
            "SELECT kind, trigger, outcome, version, reason, started_at_ms FROM training_runs \
             WHERE gpu = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(gpu.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.db.pool)
        .await?)
    }
}
