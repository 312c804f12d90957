//! Whether the store can write, as its writes find out: every write transaction reports its
//! outcome here. A storage fault (disk full, read-only or vanished file, I/O error) marks the
//! store failing until a write succeeds again; while it fails, a probe task writes one tiny
//! row every [`PROBE_INTERVAL`] so that recovery is noticed even when no client writes.
//! Health (the advisor's gRPC health status) and metrics read this state.
//!
//! Failures of the request itself (a constraint, a missing workload) say nothing about the
//! storage and leave the state as it is.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use sqlx::SqlitePool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::StoreError;

/// How often a failing store tries a write of its own.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The store's write health and its counts.
#[derive(Debug)]
pub struct WriteHealth {
    failing: watch::Sender<bool>,
    failures: AtomicU64,
}

impl Default for WriteHealth {
    fn default() -> Self {
        Self {
            failing: watch::Sender::new(false),
            failures: AtomicU64::new(0),
        }
    }
}

impl WriteHealth {
    /// True while the last write attempt failed on a storage fault.
    pub fn failing(&self) -> bool {
        *self.failing.borrow()
    }

    /// Write transactions that failed on a storage fault since the store opened.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Changes of [`failing`](Self::failing), for health.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.failing.subscribe()
    }

    /// Records a write's outcome.
    pub(super) fn record<T>(&self, outcome: &Result<T, StoreError>) {
        match outcome {
            Ok(_) => self.succeeded(),
            Err(error) if error.is_storage_fault() => self.failed(error),
            Err(_) => {}
        }
    }

    pub(super) fn succeeded(&self) {
        self.failing.send_if_modified(|failing| {
            if *failing {
                tracing::info!("store writes succeed again");
            }
            std::mem::replace(failing, false)
        });
    }

    pub(super) fn failed(&self, error: &StoreError) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.failing.send_if_modified(|failing| {
            if !*failing {
                tracing::error!(error = %error.chain(), "store writes fail; retrying until they succeed");
            }
            !std::mem::replace(failing, true)
        });
    }
}

/// Writes the probe row while the store fails, until `stop`.
pub(super) async fn probe(pool: SqlitePool, health: Arc<WriteHealth>, stop: CancellationToken) {
    let mut changes = health.subscribe();
    loop {
        // Sleeps until writes fail.
        tokio::select! {
            _ = stop.cancelled() => return,
            failing = changes.wait_for(|failing| *failing) => if failing.is_err() { return },
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_INTERVAL) => {}
        }
        if health.failing() {
            let outcome = write_probe(&pool).await;
            health.record(&outcome);
        }
    }
}

async fn write_probe(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(
        "INSERT INTO write_probe (id, written_at_ms) VALUES (1, ?1)
         ON CONFLICT (id) DO UPDATE SET written_at_ms = excluded.written_at_ms",
    )
    .bind(crate::domain::now_ms())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}
