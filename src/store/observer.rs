//! The observer's windows (`observer_runs`): which windows of the cluster's timeline were
//! already turned into runs, keyed by GPU, pod UIDs and window, so that a restart or a
//! second replica never stores one twice; and the exclusive throughputs measured on solo
//! windows. Portable SQL (SQLite and PostgreSQL).

use sqlx::Row;

use super::{Store, StoreError};

/// What a window became.
#[derive(Debug, Clone, PartialEq)]
pub enum ObservedWindow {
    /// A colocated run, stored as this observation.
    Colocated { observation_id: i64 },
    /// A workload alone on its GPU: its mean throughput.
    Solo { workload: String, throughput: f64 },
}

/// One window to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewObservedWindow {
    pub key: String,
    pub gpu: String,
    pub gpu_id: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub outcome: ObservedWindow,
}

impl Store {
    /// Whether the window with this key was already recorded.
    pub async fn observed_window_known(&self, key: &str) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT 1 FROM observer_runs WHERE run_key = $1")
            .bind(key)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.is_some())
    }

    /// Records a window once; returns false when its key was already there (nothing
    /// changes then). A leader's write: inside the observer's fenced task it is refused
    /// once the lease moved on.
    pub async fn record_observed_window(
        &self,
        window: &NewObservedWindow,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let (kind, observation_id, workload, throughput) = match &window.outcome {
            ObservedWindow::Colocated { observation_id } => {
                ("colocated", Some(*observation_id), None, None)
            }
            ObservedWindow::Solo {
                workload,
                throughput,
            } => ("solo", None, Some(workload.as_str()), Some(*throughput)),
        };
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(
            "INSERT INTO observer_runs (run_key, kind, gpu, gpu_id, window_start_ms, \
             window_end_ms, observation_id, workload, throughput, recorded_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (run_key) DO NOTHING",
        )
        .bind(&window.key)
        .bind(kind)
        .bind(&window.gpu)
        .bind(&window.gpu_id)
        .bind(window.start_ms)
        .bind(window.end_ms)
        .bind(observation_id)
        .bind(workload)
        .bind(throughput)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map(|done| done.rows_affected() == 1)
        .map_err(StoreError::from);
        self.finish_write(tx, done).await
    }

    /// The latest exclusive throughput a solo window measured for each (GPU model,
    /// workload).
    pub async fn latest_solo_throughputs(&self) -> Result<Vec<(String, String, f64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT r.gpu, r.workload, r.throughput FROM observer_runs r \
             WHERE r.kind = 'solo' AND r.window_end_ms = (SELECT MAX(l.window_end_ms) \
             FROM observer_runs l WHERE l.kind = 'solo' AND l.gpu = r.gpu \
             AND l.workload = r.workload) ORDER BY r.gpu, r.workload",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect()
    }
}
