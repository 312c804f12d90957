//! The SQLite profile datastore (sqlx). Opens the database with the settings durability
//! needs (WAL, synchronous FULL, foreign keys), runs the embedded migrations, and offers
//! typed operations; every multi-row write is one transaction, and constraint violations
//! come back as domain errors rather than SQL text. Single reported runs go through the
//! observation writer (group commit).

pub mod backup;
mod jobs;
mod lock;
mod models;
mod observation_writer;
mod observations;
mod occupancy;
mod workloads;

use std::{str::FromStr, sync::Arc, time::Duration};

use sqlx::{
    sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    },
    Sqlite, Transaction,
};

pub use jobs::ClaimedJob;
pub use lock::{DatabaseLock, LockError};
pub use models::{Comparison, ModelStatus, NewModel, StoredModel, TrainingRun};
pub use observations::{ObservationSource, Prediction, StoredObservation};
pub use occupancy::{
    AssignOutcome, Assigned, Assignment, ClusterGpu, ClusterJob, Occupancy, OccupancyConflict,
};
pub use workloads::WorkloadRecord;

use observation_writer::ObservationWriter;
use occupancy::OccupancyWriter;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("workload {0:?} not found")]
    WorkloadNotFound(String),
    #[error("workload {0:?} already exists")]
    WorkloadExists(String),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    #[error("invalid database url: {0}")]
    InvalidUrl(#[source] sqlx::Error),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// An assignment the occupancy's rules refuse (nothing was written).
    #[error(transparent)]
    Occupancy(#[from] OccupancyConflict),
    #[error("the store is closed")]
    Closed,
    #[error("the observation writer stopped before answering")]
    WriterStopped,
    /// The transaction a run was batched into failed, so the run was not stored.
    #[error("the batch this run was written in failed")]
    Batch(#[source] Arc<StoreError>),
}

/// True when the error is a UNIQUE constraint violation.
fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|e| e.is_unique_violation())
}

#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
    observation_writer: Arc<ObservationWriter>,
    occupancy_writer: Arc<OccupancyWriter>,
}

impl Store {
    /// Opens (creating if missing) the database at `url`, e.g. `sqlite://./coloc.db`, and
    /// brings its schema up to date.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let options = SqliteConnectOptions::from_str(url)
            .map_err(StoreError::InvalidUrl)?
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5))
            // FULL: an acknowledged write survives a power cut, not only a process crash.
            .synchronous(SqliteSynchronous::Full);
        let options = if in_memory {
            options
        } else {
            options.journal_mode(SqliteJournalMode::Wal)
        };
        // An in-memory database lives in one connection; more would each see an empty one.
        let max_connections = if in_memory { 1 } else { 4 };
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .connect_with(options)
            .await?;
        sqlx::migrate!().run(&pool).await?;
        let observation_writer = Arc::new(ObservationWriter::spawn(pool.clone()));
        let occupancy_writer = Arc::new(OccupancyWriter::spawn(pool.clone()).await?);
        Ok(Self {
            pool,
            observation_writer,
            occupancy_writer,
        })
    }

    /// Stops taking runs, writes the ones already queued, then closes the pool. Runs
    /// offered after this get [`StoreError::Closed`].
    pub async fn close(&self) {
        // Acknowledged reports still queued are written before the pool closes.
        self.observation_writer.stop().await;
        tracing::info!(task = "observation writer", "task exited");
        self.occupancy_writer.stop().await;
        self.pool.close().await;
    }

    /// Records a job on a GPU (or renews its lease); answered once committed.
    pub async fn assign_cluster_job(
        &self,
        assignment: Assignment,
        now_ms: i64,
    ) -> Result<Assigned, StoreError> {
        self.occupancy_writer.assign(assignment, now_ms).await
    }

    /// Forgets a job; false when it was not running (unknown, released or expired).
    pub async fn release_cluster_job(
        &self,
        job_id: String,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.occupancy_writer.release(job_id, now_ms).await
    }

    /// The committed occupancy, from memory. Hold the guard briefly: the writer waits for it
    /// to publish a batch.
    pub fn occupancy(&self) -> std::sync::RwLockReadGuard<'_, Occupancy> {
        self.occupancy_writer.view()
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Bytes the database file holds (pages in use and free).
    pub async fn size_bytes(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar::<_, i64>(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// A write transaction. IMMEDIATE takes the write lock up front, so a writer waits
    /// (busy timeout) instead of failing when it would upgrade a read lock mid-transaction.
    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn begin_read(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin().await?)
    }
}

/// Commits when the work succeeded and rolls back at once when it failed, so a failed
/// transaction never keeps holding the database lock after it is dropped.
async fn finish<T>(
    tx: Transaction<'static, Sqlite>,
    outcome: Result<T, StoreError>,
) -> Result<T, StoreError> {
    match outcome {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => {
            if let Err(rollback) = tx.rollback().await {
                tracing::warn!(error = %rollback, "rollback failed");
            }
            Err(error)
        }
    }
}
