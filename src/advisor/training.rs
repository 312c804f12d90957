//! Training and the model lifecycle: a challenger is fitted off the async threads on every
//! usable run (outliers flagged and left out), judged against the champion by k-fold
//! cross-validation of both procedures on the same runs, and promoted only if it is not
//! worse. Every version is kept with its verdict, every attempt logged; an operator's pin
//! overrides the verdicts; the champion's errors on newly reported runs are watched for
//! drift.

use crate::sync::Unpoisoned;
use std::{collections::VecDeque, sync::Arc};

use super::{Advisor, Error, ModelMap, Result};
use crate::{
    domain::{now_ms, GpuName, WorkloadName},
    model::{
        self,
        validation::{self, LabelledRow, Procedure},
        ModelKind, TrainingRow, MIN_TRAINING_ROWS,
    },
    store::{Comparison, ModelStatus, NewModel, PredictedRun, StoredModel},
};

/// What started a training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The Train RPC.
    Request,
    /// Enough new runs since the last training.
    Schedule,
    /// The champion's rolling error passed trainer.drift_threshold.
    Drift,
    /// `coloc import`.
    Import,
    /// An operator's undo changed the training data (DeleteRuns, DeleteProfile).
    Undo,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::Schedule => "schedule",
            Self::Drift => "drift",
            Self::Import => "import",
            Self::Undo => "undo",
        }
    }
}

/// The outcome of a training that produced a model.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// The new version, promoted or rejected.
    pub model: Arc<StoredModel>,
    pub promoted: bool,
    /// Stored runs on that GPU model left out because a member has no profile there.
    pub unusable_observations: usize,
}

/// The mean of the errors without their highest and lowest tenth (at least one each from
/// three errors on): one absurd run cannot move the rolling error, nor hide drift. Errors
/// that are not finite are left out.
pub fn trimmed_mean(errors: &VecDeque<f64>) -> f64 {
    let mut sorted: Vec<f64> = errors.iter().copied().filter(|e| e.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let trim = if sorted.len() >= 3 {
        (sorted.len() / 10).max(1)
    } else {
        0
    };
    let kept = &sorted[trim..sorted.len() - trim];
    kept.iter().sum::<f64>() / kept.len() as f64
}

/// The runs a training fits on, with what was left out.
struct TrainingRuns {
    rows: Vec<LabelledRow>,
    /// Stored runs with a member not profiled on the GPU model.
    unusable: usize,
    /// Runs flagged as outliers.
    outliers: usize,
    /// The newest run fitted on.
    last_id: i64,
}

/// A fitted challenger (params and metrics) and, where a champion serves, the comparison.
type Judged = (
    (model::ModelParams, model::FitMetrics),
    Option<Option<(validation::Evaluation, validation::Evaluation)>>,
);

/// The champion's recent relative errors on reported runs.
#[derive(Debug, Clone, Default)]
pub(super) struct RollingError {
    version: u64,
    errors: VecDeque<f64>,
}

impl Advisor {
    /// Fits a challenger of `kind` (default: `model.kind`) on the usable runs of the GPU
    /// model (the newest `trainer.max_training_runs`), judges it against the champion and promotes it if it is not worse. A failed
    /// fit keeps the champion; it is logged and answered as FAILED_PRECONDITION.
    pub async fn train(
        &self,
        gpu: &GpuName,
        kind: Option<ModelKind>,
        trigger: Trigger,
    ) -> Result<TrainOutcome> {
        let _trainer = self.trainer.lock().await;
        self.train_locked(gpu, kind, trigger).await
    }

    /// The retraining task's step: trains `gpu` when a retrain is due, deciding so under
    /// the trainer's lock, so that a Train call that just trained on the same runs (here,
    /// or on another replica: the store says what was trained up to) is not repeated.
    /// Returns what was due and how its training ended; an error deciding is the outer one.
    pub async fn train_if_due(
        &self,
        gpu: &GpuName,
    ) -> Result<Option<(Trigger, Result<TrainOutcome>)>> {
        let _trainer = self.trainer.lock().await;
        let Some(trigger) = self.training_due(gpu).await? else {
            return Ok(None);
        };
        let span = tracing::info_span!("retrain", gpu = %gpu, trigger = trigger.as_str());
        let outcome =
            tracing::Instrument::instrument(self.train_locked(gpu, None, trigger), span).await;
        Ok(Some((trigger, outcome)))
    }

    async fn train_locked(
        &self,
        gpu: &GpuName,
        kind: Option<ModelKind>,
        trigger: Trigger,
    ) -> Result<TrainOutcome> {
        let kind = kind.unwrap_or(self.default_kind);
        let runs = self.training_runs(gpu).await?;
        let champion = self.models.load().get(gpu).cloned();
        let (unusable, outliers, last_id) = (runs.unusable, runs.outliers, runs.last_id);
        let judged = self
            .fit_and_compare(kind, runs, champion.as_deref())
            .await?;
        let ((params, metrics), comparison) = match judged {
            Ok(judged) => judged,
            Err(error) => {
                let reason = format!(
                    "cannot train a {} model for GPU model {:?}: {error} ({unusable} stored runs \
                     have members without a profile on it, {outliers} are outliers); the champion stays",
                    kind.as_str(),
                    gpu.as_str(),
                );
                self.store
                    .record_training_run(
                        gpu,
                        kind.as_str(),
                        trigger.as_str(),
                        "failed",
                        None,
                        &reason,
                        now_ms(),
                    )
                    .await?;
                self.stats.training(super::TrainingOutcome::Failed);
                tracing::warn!(gpu = %gpu, kind = kind.as_str(), %reason, "training failed");
                return Err(Error::TrainingFailed(reason));
            }
        };
        let (status, reason, comparison) = self.verdict(champion.as_deref(), comparison.flatten());
        let model = NewModel {
            params,
            metrics,
            status,
            reason,
            comparison,
            last_observation_id: last_id,
            excluded_outliers: outliers as u64,
        };
        let (stored, promoted) = self.keep_trained(gpu, kind, trigger, model).await?;
        Ok(TrainOutcome {
            model: stored,
            promoted,
            unusable_observations: unusable,
        })
    }

    /// Queues a re-profile of each suspect profile of `gpu` where a profiler can run it,
    /// once per profile (`store::Reprofile`); a store that cannot write leaves it for the
    /// next training.
    async fn queue_reprofiles(&self, gpu: &GpuName) {
        for suspect in self.suspect_profiles(gpu) {
            match self
                .store
                .queue_reprofile(&suspect.workload, gpu, now_ms())
                .await
            {
                Ok(crate::store::Reprofile::Queued) => tracing::info!(
                    workload = %suspect.workload,
                    gpu = %gpu,
                    runs_above = suspect.runs_above,
                    runs = suspect.runs,
                    "suspect profile: re-profile queued"
                ),
                Ok(outcome) => tracing::debug!(
                    workload = %suspect.workload,
                    gpu = %gpu,
                    ?outcome,
                    "suspect profile: no re-profile queued"
                ),
                Err(error) => tracing::warn!(
                    workload = %suspect.workload,
                    gpu = %gpu,
                    error = %error,
                    "suspect profile: queueing its re-profile failed"
                ),
            }
        }
    }

    /// Step one of a training: the GPU model's usable runs (the newest
    /// `trainer.max_training_runs`, members profiled on it), outliers flagged in the store
    /// and left out.
    async fn training_runs(&self, gpu: &GpuName) -> Result<TrainingRuns> {
        let observations = self
            .store
            .observations(gpu, self.lifecycle.max_training_runs)
            .await?;
        let first_id = observations.first().map_or(0, |o| o.id);
        self.refresh_runs(gpu, &observations);
        self.queue_reprofiles(gpu).await;
        let table = self.read_catalog().gpu(gpu).unwrap_or_default();
        let total = observations.len();
        let rows: Vec<LabelledRow> = observations
            .into_iter()
            .filter_map(|observation| {
                let mut names = Vec::with_capacity(observation.members.len());
                let mut members = Vec::with_capacity(observation.members.len());
                let mut throughputs = Vec::with_capacity(observation.members.len());
                for (name, throughput) in observation.members {
                    let parsed = WorkloadName::parse("workload", &name).ok()?;
                    // A member profiled by NVML alone makes the run unusable, for the
                    // model and its NVML-only twin alike (the twin learns the same runs).
                    members.push(table.get(&parsed).filter(|e| !e.nvml_only)?.features);
                    names.push(name);
                    throughputs.push(throughput);
                }
                Some(LabelledRow {
                    id: observation.id,
                    members: names,
                    row: TrainingRow {
                        members,
                        throughputs,
                    },
                })
            })
            .collect();
        let unusable = total - rows.len();

        let flagged = validation::outliers(&rows, self.lifecycle.outlier_threshold);
        let flagged_ids: Vec<(i64, String)> = flagged
            .iter()
            .map(|(i, why)| (rows[*i].id, why.clone()))
            .collect();
        self.store.set_outliers(gpu, first_id, &flagged_ids).await?;
        let excluded: std::collections::HashSet<usize> = flagged.iter().map(|(i, _)| *i).collect();
        let rows: Vec<LabelledRow> = rows
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !excluded.contains(i))
            .map(|(_, r)| r)
            .collect();
        Ok(TrainingRuns {
            last_id: rows.iter().map(|r| r.id).max().unwrap_or(0),
            rows,
            unusable,
            outliers: excluded.len(),
        })
    }

    /// Step two: fits the challenger on every run and, where a champion serves, compares
    /// both procedures on a bounded sample, off the async threads.
    async fn fit_and_compare(
        &self,
        kind: ModelKind,
        runs: TrainingRuns,
        champion: Option<&StoredModel>,
    ) -> Result<std::result::Result<Judged, model::FitError>> {
        let TrainingRuns { rows, last_id, .. } = runs;
        let folds = self.lifecycle.cv_folds;
        let champion_procedure = champion.map(|c| Procedure {
            kind: c.params.kind(),
            last_id: c.last_observation_id,
        });
        let threads = self.lifecycle.training_threads;
        // The caller's span (the Train RPC, or the retraining task's) follows the fit.
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            // The comparison is made on a bounded sample; the model is fitted on every run
            // (moved, not copied: on a large store the rows are most of the memory).
            let compared = champion_procedure
                .map(|champion| (champion, validation::comparison_sample(&rows, folds)));
            let training: Vec<TrainingRow> = rows.into_iter().map(|r| r.row).collect();
            let job = || {
                let (fitted, comparison) = rayon::join(
                    || model::fit(kind, &training),
                    || {
                        compared.as_ref().map(|(champion, sample)| {
                            let challenger = Procedure { kind, last_id };
                            validation::compare(sample, folds, challenger, *champion)
                        })
                    },
                );
                Ok::<_, model::FitError>((fitted?, comparison))
            };
            match rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("coloc-train-{i}"))
                .build()
            {
                Ok(pool) => pool.install(job),
                Err(error) => {
                    tracing::warn!(%error, "no threads for training; fitting on one");
                    job()
                }
            }
        })
        .await
        .map_err(|e| Error::Internal(anyhow::Error::new(e).context("model fit panicked")))
    }

    /// Step three: stores the judged model and the attempt, and serves it if it was
    /// promoted and no version is pinned. Returns it and whether it was promoted.
    async fn keep_trained(
        &self,
        gpu: &GpuName,
        kind: ModelKind,
        trigger: Trigger,
        model: NewModel,
    ) -> Result<(Arc<StoredModel>, bool)> {
        let (status, reason) = (model.status, model.reason.clone());
        let (observations, outliers) = (model.metrics.observations, model.excluded_outliers);
        let stored = Arc::new(self.store.insert_model(gpu, &model, now_ms()).await?);
        self.store
            .record_training_run(
                gpu,
                kind.as_str(),
                trigger.as_str(),
                status.as_str(),
                Some(stored.version),
                &reason,
                now_ms(),
            )
            .await?;
        let promoted = status == ModelStatus::Promoted;
        self.stats.training(if promoted {
            super::TrainingOutcome::Promoted
        } else {
            super::TrainingOutcome::Rejected
        });
        if promoted && self.store.pinned_version(gpu).await?.is_none() {
            self.publish(gpu, stored.clone());
        }
        tracing::info!(
            gpu = %gpu, version = stored.version, kind = kind.as_str(), trigger = trigger.as_str(),
            status = status.as_str(), observations, outliers, %reason, "model trained"
        );
        Ok((stored, promoted))
    }

    /// Promote or reject, and why.
    fn verdict(
        &self,
        champion: Option<&StoredModel>,
        evaluated: Option<(validation::Evaluation, validation::Evaluation)>,
    ) -> (ModelStatus, String, Option<Comparison>) {
        let Some(champion) = champion else {
            return (
                ModelStatus::Promoted,
                "the first model of this GPU model".into(),
                None,
            );
        };
        let Some((challenger, incumbent)) = evaluated else {
            return (
                ModelStatus::Rejected,
                format!(
                    "too few runs to compare it fairly with the champion (version {})",
                    champion.version
                ),
                None,
            );
        };
        let comparison = Comparison {
            score: challenger.score,
            mse: challenger.mse,
            champion_score: incumbent.score,
            champion_mse: incumbent.mse,
        };
        let figures = format!(
            "cross-validated rank score {:.4} vs {:.4} and MSE {:.3} vs {:.3} for the champion's \
             procedure (version {})",
            challenger.score, incumbent.score, challenger.mse, incumbent.mse, champion.version
        );
        let score_ok = challenger.score >= incumbent.score - self.lifecycle.score_tolerance;
        let mse_ok = challenger.mse <= incumbent.mse * (1.0 + self.lifecycle.mse_tolerance);
        if score_ok && mse_ok {
            (
                ModelStatus::Promoted,
                format!("not worse than the champion: {figures}"),
                Some(comparison),
            )
        } else {
            (
                ModelStatus::Rejected,
                format!("worse than the champion: {figures}"),
                Some(comparison),
            )
        }
    }

    /// Serves `model` for its GPU model from now on; its rolling error starts afresh.
    pub(super) fn publish(&self, gpu: &GpuName, model: Arc<StoredModel>) {
        let mut publications = self.publications.lock().unpoisoned();
        *publications += 1;
        self.publish_held(gpu, model);
    }

    /// [`Self::publish`] for a caller that holds `publications`.
    pub(super) fn publish_held(&self, gpu: &GpuName, model: Arc<StoredModel>) {
        self.rolling_errors.lock().unpoisoned().insert(
            gpu.clone(),
            RollingError {
                version: model.version,
                errors: VecDeque::new(),
            },
        );
        self.write_catalog().set_scoring_model(model.clone());
        self.models.rcu(|current| {
            let mut next = ModelMap::clone(current);
            next.insert(gpu.clone(), model.clone());
            next
        });
        // After the swap: the catalog write above moved it before Place could read the
        // new model.
        self.answers_changed();
    }

    /// A stored version of a GPU model's model (the one serving for `None`).
    pub async fn model_version(
        &self,
        gpu: &GpuName,
        version: Option<u64>,
    ) -> Result<Arc<StoredModel>> {
        let Some(version) = version else {
            return self.current_model(gpu);
        };
        self.store
            .model(gpu, version)
            .await?
            .map(Arc::new)
            .ok_or_else(|| Error::UnknownModelVersion {
                gpu: gpu.clone(),
                version,
            })
    }

    /// A GPU model's versions, newest first.
    pub async fn models(&self, gpu: &GpuName, limit: u32) -> Result<Vec<StoredModel>> {
        Ok(self.store.models(gpu, limit).await?)
    }

    /// How the models did on reported runs: the newest `limit` runs a model predicted
    /// (oldest first) and every version (oldest first, at most 1000).
    pub async fn model_report(
        &self,
        gpu: &GpuName,
        limit: usize,
    ) -> Result<(Vec<PredictedRun>, Vec<StoredModel>)> {
        let runs = self.store.predicted_runs(gpu, limit).await?;
        let mut models = self.store.models(gpu, 1000).await?;
        models.reverse();
        Ok((runs, models))
    }

    /// Serves a stored version whatever training decides, until unpinned.
    pub async fn pin(&self, gpu: &GpuName, version: u64) -> Result<Arc<StoredModel>> {
        let model =
            self.store
                .model(gpu, version)
                .await?
                .ok_or_else(|| Error::UnknownModelVersion {
                    gpu: gpu.clone(),
                    version,
                })?;
        self.store.pin_model(gpu, version).await?;
        let model = Arc::new(model);
        self.publish(gpu, model.clone());
        tracing::info!(gpu = %gpu, version, "model pinned");
        Ok(model)
    }

    /// Removes the pin: the newest promoted version serves again.
    pub async fn unpin(&self, gpu: &GpuName) -> Result<Arc<StoredModel>> {
        if !self.store.unpin_model(gpu).await? {
            return Err(Error::NothingPinned(gpu.clone()));
        }
        let champion = self.store.champion(gpu).await?.ok_or_else(|| {
            Error::Internal(anyhow::anyhow!("a pinned GPU model lost its models"))
        })?;
        let champion = Arc::new(champion);
        self.publish(gpu, champion.clone());
        tracing::info!(gpu = %gpu, version = champion.version, "model unpinned");
        Ok(champion)
    }

    pub async fn pinned_version(&self, gpu: &GpuName) -> Result<Option<u64>> {
        Ok(self.store.pinned_version(gpu).await?)
    }

    /// Records the champion's relative error on a newly reported run.
    pub(super) fn record_prediction_error(&self, gpu: &GpuName, version: u64, error: f64) {
        let mut all = self.rolling_errors.lock().unpoisoned();
        let rolling = all.entry(gpu.clone()).or_default();
        if rolling.version != version {
            *rolling = RollingError {
                version,
                errors: VecDeque::new(),
            };
        }
        if !error.is_finite() {
            // Bounded throughputs keep errors finite; a NaN would switch drift off for good.
            return;
        }
        rolling.errors.push_back(error);
        while rolling.errors.len() > self.lifecycle.drift_window {
            rolling.errors.pop_front();
        }
        let mean = trimmed_mean(&rolling.errors);
        if rolling.errors.len() >= self.lifecycle.drift_window
            && mean > self.lifecycle.drift_threshold
        {
            self.drift.notify_one();
        }
    }

    /// Resolves when a champion's rolling error has passed the drift threshold.
    pub async fn drift_detected(&self) {
        self.drift.notified().await
    }

    /// The champion's mean relative error over its last reported runs, and how many.
    pub fn rolling_error(&self, gpu: &GpuName) -> Option<(f64, usize)> {
        let all = self.rolling_errors.lock().unpoisoned();
        let rolling = all.get(gpu)?;
        if rolling.errors.is_empty() {
            return None;
        }
        Some((trimmed_mean(&rolling.errors), rolling.errors.len()))
    }

    /// Reloads the champions' rolling errors from the stored predictions (at startup).
    pub(super) async fn load_rolling_errors(&self) -> Result<()> {
        let champions: Vec<Arc<StoredModel>> = self.models.load().values().cloned().collect();
        for champion in champions {
            let mut errors = self
                .store
                .prediction_errors(&champion.gpu, champion.version, self.lifecycle.drift_window)
                .await?;
            errors.reverse();
            self.rolling_errors.lock().unpoisoned().insert(
                champion.gpu.clone(),
                RollingError {
                    version: champion.version,
                    errors: errors.into(),
                },
            );
        }
        Ok(())
    }

    /// Whether a retrain of `gpu` is due, and why.
    pub async fn training_due(&self, gpu: &GpuName) -> Result<Option<Trigger>> {
        let trained_up_to = self.store.last_trained_observation_id(gpu).await?;
        let new = self.store.observations_after(gpu, trained_up_to).await?;
        if new == 0 {
            return Ok(None);
        }
        let has_champion = self.models.load().contains_key(gpu);
        if new >= self.lifecycle.min_new_observations
            || (!has_champion && new >= MIN_TRAINING_ROWS as u64)
        {
            return Ok(Some(Trigger::Schedule));
        }
        // Drift retrains need a window's worth of new runs too: when a drift retrain is
        // rejected, the champion's error stays high, and each further report must not start
        // another retrain on nearly the same runs.
        let window = self.lifecycle.drift_window;
        if let Some((error, samples)) = self.rolling_error(gpu) {
            if samples >= window && new >= window as u64 && error > self.lifecycle.drift_threshold {
                return Ok(Some(Trigger::Drift));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_outlier_moves_neither_the_rolling_error_nor_drift() {
        let mut errors: VecDeque<f64> = std::iter::repeat_n(0.1, 19).collect();
        errors.push_back(1e300);
        assert!((trimmed_mean(&errors) - 0.1).abs() < 1e-12);
        errors.push_back(f64::NAN);
        assert!((trimmed_mean(&errors) - 0.1).abs() < 1e-12);
        // A real drift (every run off) still shows.
        let drifted: VecDeque<f64> = std::iter::repeat_n(0.6, 20).collect();
        assert!((trimmed_mean(&drifted) - 0.6).abs() < 1e-12);
        assert!((trimmed_mean(&VecDeque::from([0.2, 0.4])) - 0.3).abs() < 1e-12);
    }
}
