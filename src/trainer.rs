//! The retraining task inside `coloc serve`: every `trainer.interval_secs` it looks at each
//! GPU model with stored runs and retrains when enough new runs arrived since the last
//! training, or at once when the champion's rolling error shows drift. The judging and
//! promotion are the advisor's (the same path as the Train RPC).

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    advisor::{Advisor, TrainOutcome, Trigger},
    domain::GpuName,
    store::Store,
};

/// What one turn did for one GPU model.
#[derive(Debug)]
pub enum TrainerOutcome {
    Trained {
        gpu: GpuName,
        trigger: Trigger,
        outcome: TrainOutcome,
    },
    Failed {
        gpu: GpuName,
        trigger: Trigger,
        error: String,
    },
}

#[derive(Clone)]
pub struct Trainer {
    advisor: Arc<Advisor>,
    /// Which GPU models have runs.
    store: Store,
    interval: Duration,
}

impl Trainer {
    pub fn new(advisor: Arc<Advisor>, store: Store, interval: Duration) -> Self {
        Self {
            advisor,
            store,
            interval,
        }
    }

    /// Retrains every GPU model whose retraining is due; GPU models with nothing due are
    /// left out of the answer.
    pub async fn run_once(&self) -> anyhow::Result<Vec<TrainerOutcome>> {
        let mut outcomes = Vec::new();
        for gpu in self.store.observation_gpus().await? {
            let Some((trigger, result)) = self.advisor.train_if_due(&gpu).await? else {
                continue;
            };
            outcomes.push(match result {
                Ok(outcome) => TrainerOutcome::Trained {
                    gpu,
                    trigger,
                    outcome,
                },
                Err(error) => TrainerOutcome::Failed {
                    gpu,
                    trigger,
                    error: error.to_string(),
                },
            });
        }
        Ok(outcomes)
    }

    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(
            interval_secs = self.interval.as_secs(),
            "retraining task started"
        );
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.interval) => {}
                _ = self.advisor.drift_detected() => tracing::info!("drift detected: retraining early"),
            }
            if let Err(error) = self.run_once().await {
                tracing::error!(error = format!("{error:#}"), "retraining task error");
            }
        }
        tracing::info!("retraining task stopped");
    }
}
