//! Whether the store can write, as its writes find out: every write transaction reports its
//! outcome here. A storage fault (disk full, read-only or vanished file, I/O error) marks the
//! store failing until a real write succeeds again: the probe's row, or a batch of reports
//! that stored a new run (a transaction that changed nothing proves nothing: on a read-only
//! connection it commits too). While the store fails, the probe task writes one tiny row
//! every [`PROBE_INTERVAL`] so that recovery is noticed even when no client writes. Health
//! (the advisor's gRPC health status) and metrics read this state.
//!
//! The pool asks [`WriteHealth::keep_connection`] before it lends or takes back a
//! connection: while writes fail, and afterwards for the connections opened since the last
//! write that succeeded before the fault, the connection is closed rather than kept. SQLite
//! opens a file it may not write (made immutable, a read-only remount) read-only instead of
//! failing, and such a connection would refuse every write long after the fault is gone.
//!
//! Failures of the request itself (a constraint, a missing workload) say nothing about the
//! storage and leave the state as it is.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{engine::Db, StoreError};
use crate::sync::Unpoisoned;

/// How often a failing store tries a write of its own.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// The store's write health and its counts.
#[derive(Debug)]
pub struct WriteHealth {
    failing: watch::Sender<bool>,
    failures: AtomicU64,
    times: Mutex<FaultTimes>,
}

/// When writes last succeeded, and the last fault's span: connections opened within it
/// may be read-only.
#[derive(Debug)]
struct FaultTimes {
    last_success: Instant,
    /// From the last success before the fault to the first success after it.
    fault: Option<(Instant, Instant)>,
}

impl Default for WriteHealth {
    fn default() -> Self {
        Self {
            failing: watch::Sender::new(false),
            failures: AtomicU64::new(0),
            times: Mutex::new(FaultTimes {
                last_success: Instant::now(),
                fault: None,
            }),
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

    /// Records the failure of a write transaction that may have written nothing: its
    /// success says nothing (see the module header), a storage fault marks the store
    /// failing.
    pub(super) fn record_failure<T>(&self, outcome: &Result<T, StoreError>) {
        if let Err(error) = outcome {
            if error.is_storage_fault() {
                self.failed(error);
            }
        }
    }

    /// A write that stored a row committed: the store writes.
    pub(super) fn succeeded(&self) {
        let now = Instant::now();
        let mut times = self.times.lock().unpoisoned();
        self.failing.send_if_modified(|failing| {
            if *failing {
                tracing::info!("store writes succeed again");
                times.fault = Some((times.last_success, now));
            }
            std::mem::replace(failing, false)
        });
        times.last_success = now;
    }

    /// Whether the pool may keep (or lend) a connection opened `age` ago: not while writes
    /// fail, nor one opened during the last fault.
    pub fn keep_connection(&self, age: Duration) -> bool {
        if self.failing() {
            return false;
        }
        let times = self.times.lock().unpoisoned();
        let Some((began, ended)) = times.fault else {
            return true;
        };
        let opened = Instant::now().checked_sub(age);
        !opened.is_some_and(|opened| opened >= began && opened <= ended)
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
pub(super) async fn probe(db: Db, health: Arc<WriteHealth>, stop: CancellationToken) {
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
            match write_probe(&db).await {
                Ok(()) => health.succeeded(),
                Err(error) => health.record_failure::<()>(&Err(error)),
            }
        }
    }
}

async fn write_probe(db: &Db) -> Result<(), StoreError> {
    let mut tx = db.begin_write().await?;
    sqlx::query(
        "INSERT INTO write_probe (id, written_at_ms) VALUES (1, $1)
         ON CONFLICT (id) DO UPDATE SET written_at_ms = excluded.written_at_ms",
    )
    .bind(crate::domain::now_ms())
    .execute(&mut *tx)
    .await?;
    db.commit(tx).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_dropped_while_writes_fail_and_those_opened_during_the_fault_after() {
        let health = WriteHealth::default();
        assert!(health.keep_connection(Duration::ZERO));
        assert!(health.keep_connection(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(20));
        health.failed(&StoreError::WriterStopped);
        assert!(!health.keep_connection(Duration::ZERO));
        assert!(!health.keep_connection(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(20));
        health.succeeded();
        assert!(!health.failing());
        // Opened during the fault (10 ms ago): closed; opened before the last success
        // before it (an hour ago) or after the recovery: kept.
        assert!(!health.keep_connection(Duration::from_millis(10)));
        assert!(health.keep_connection(Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(5));
        assert!(health.keep_connection(Duration::ZERO));
    }

    #[test]
    fn a_write_transaction_that_commits_does_not_mark_a_failing_store_healthy() {
        let health = WriteHealth::default();
        health.failed(&StoreError::WriterStopped);
        health.record_failure::<()>(&Ok(()));
        assert!(
            health.failing(),
            "a commit that wrote nothing proves nothing"
        );
        health.record_failure::<()>(&Err(StoreError::Closed));
        assert_eq!(health.failures(), 1, "not a storage fault");
        health.succeeded();
        assert!(!health.failing());
    }
}
