//! The profile datastore (sqlx), on SQLite or PostgreSQL as the database URL says
//! (`engine`: the engines' differences, where transactions begin and commit). Opens the
//! database with the settings durability needs (SQLite: WAL, synchronous FULL, foreign
//! keys), runs the engine's embedded migrations, and offers
//! typed operations; every multi-row write is one transaction, and constraint violations
//! come back as domain errors rather than SQL text. Single reported runs go through the
//! observation writer (group commit). Tools that only read a database, beside a running
//! service or not, go through `snapshot` (read-only: no migration, no lock, no write).

mod agents;
pub mod backup;
pub mod engine;
pub mod fault;
mod group_commit;
pub mod health;
mod jobs;
pub mod lease;
mod lock;
mod models;
mod observation_writer;
mod observations;
mod observer;
mod occupancy;
pub mod reservations;
mod reprofile;
pub mod snapshot;
mod undo;
mod workloads;

use std::{str::FromStr, sync::Arc};

use sqlx::{sqlite::SqliteConnectOptions, Any, AnyPool, Transaction};

pub use agents::{AgentRecord, NewAgent};
pub use jobs::{ClaimedJob, JobClaimer, Submitted, IN_PROCESS_HOLDER};
pub use lock::{DatabaseLock, LockError};
pub use models::{Comparison, ModelStatus, NewModel, StoredModel, TrainingRun};
pub use observations::{ObservationSource, PredictedRun, Prediction, StoredObservation};
pub use observer::{NewObservedWindow, ObservedWindow};
pub use occupancy::{
    AssignOutcome, Assigned, Assignment, ClusterGpu, ClusterJob, Occupancy, OccupancyConflict,
};
pub use reprofile::Reprofile;
pub use undo::{
    AuditAction, AuditEntry, MatchedRuns, NewAuditEntry, ProfileRemoved, RunSelection, RunSelector,
    MAX_RUN_IDS,
};
pub use workloads::WorkloadRecord;

use engine::{Db, Engine};
use fault::FaultSwitch;
use health::WriteHealth;
use observation_writer::ObservationWriter;
use occupancy::OccupancyWriter;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("workload {0:?} not found")]
    WorkloadNotFound(String),
    #[error("workload {0:?} already exists")]
    WorkloadExists(String),
    /// A job named by a claim no longer exists (its workload was deleted).
    #[error("profiling job {0} not found (its workload was deleted?)")]
    JobNotFound(i64),
    /// A renewal or submission names a claim that is no longer the job's current one:
    /// its lease expired and the job went back to the queue (or was claimed again).
    #[error("profiling job {job_id}: claim {claim} is no longer held ({now})")]
    ClaimLost {
        job_id: i64,
        claim: i64,
        /// What became of the job, for the holder.
        now: String,
    },
    /// A renewal or submission naming a claim another holder took: only the agent that
    /// claimed the job may renew it or submit its outcome.
    #[error("profiling job {job_id}: claim {claim} is held by {holder:?}, not by {sender:?}")]
    NotClaimHolder {
        job_id: i64,
        claim: i64,
        holder: String,
        sender: String,
    },
    /// A submitted profile was measured on another GPU model than the job asked for.
    #[error("profiling job {job_id} is for GPU model {job_gpu:?}, but the profile was measured on {profile_gpu:?}")]
    WrongGpuForJob {
        job_id: i64,
        job_gpu: String,
        profile_gpu: String,
    },
    /// An agent that never announced itself (or announced with another id).
    #[error("agent {0:?} is not known; announce it first")]
    AgentNotFound(String),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    /// The database file exists but holds nothing, and no write-ahead log either: not a
    /// store, most likely a failed copy or restore. Opening it would start an empty store
    /// over it.
    #[error(
        "the database file {0} is empty (0 bytes) and has no write-ahead log: it is no coloc \
         store (a failed copy or restore?). Restore a backup over it, or delete it to start \
         an empty store"
    )]
    EmptyFile(std::path::PathBuf),
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
    /// A leader-only write of a server whose lease is gone (another server leads now, or
    /// the lease ran out): refused, nothing written (`lease.rs`).
    #[error("leader {holder:?} (fencing token {token}) no longer holds the lease: {now}")]
    NotLeader {
        holder: String,
        token: i64,
        /// Who leads now, or how long ago the lease ran out.
        now: String,
    },
    #[error("the observation writer stopped before answering")]
    WriterStopped,
    /// The transaction a run was batched into failed, so the run was not stored.
    #[error("the batch this run was written in failed")]
    Batch(#[source] Arc<StoreError>),
}

/// SQLite result codes (extended codes carry the primary code in their low byte) of a
/// storage that failed for now: BUSY and LOCKED (the lock held past the busy timeout),
/// NOMEM, READONLY (a file made read-only), IOERR, FULL (a full disk), CANTOPEN (a
/// vanished file or folder), PROTOCOL (a WAL lock race); and CONSTRAINT_COMMITHOOK, a
/// COMMIT the fault switch (`fault.rs`) turned into a rollback as a failed disk write.
fn is_transient_sqlite_code(code: i32) -> bool {
    code == fault::COMMIT_HOOK_CODE || matches!(code & 0xff, 5 | 6 | 7 | 8 | 10 | 13 | 14 | 15)
}

impl StoreError {
    /// True when the storage failed (disk full, read-only or vanished file, I/O error, the
    /// lock held past the busy timeout, a connection lost), not the request: the same
    /// write may succeed later. Constraint violations, missing rows, SQL errors and a
    /// damaged file are not faults that waiting mends.
    pub fn is_storage_fault(&self) -> bool {
        match self {
            Self::Database(error) => match error {
                sqlx::Error::Database(db) => is_transient_database_error(db.as_ref()),
                sqlx::Error::Io(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::InvalidSavePointStatement
                | sqlx::Error::BeginFailed
                | sqlx::Error::Protocol(_) => true,
                _ => false,
            },
            Self::Batch(inner) => inner.is_storage_fault(),
            Self::WriterStopped => true,
            _ => false,
        }
    }

    /// The error and its causes on one line, for the log.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
    }
}

/// PostgreSQL SQLSTATEs of a server or storage that failed for now: connection exceptions
/// (class 08), insufficient resources (53: a full disk, out of memory, too many
/// connections), operator intervention (57: a query cancelled on timeout, a server shutting
/// down or starting), system errors (58: I/O), a lock not obtained in time (55P03), a
/// serialization failure or deadlock (40001, 40P01) and a read-only transaction (25006: a
/// standby).
fn is_transient_postgres_code(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "53" | "57" | "58"))
        || matches!(code, "55P03" | "40001" | "40P01" | "25006")
}

/// Whether a database error is a storage fault, by its engine's codes.
fn is_transient_database_error(error: &dyn sqlx::error::DatabaseError) -> bool {
    let Some(code) = error.code() else {
        return false;
    };
    if error
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        return is_transient_postgres_code(&code);
    }
    code.parse::<i32>().is_ok_and(is_transient_sqlite_code)
}

/// True when the error is a UNIQUE constraint violation.
fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|e| e.is_unique_violation())
}

#[derive(Clone, Debug)]
pub struct Store {
    db: Db,
    observation_writer: Arc<ObservationWriter>,
    occupancy_writer: Arc<OccupancyWriter>,
    health: Arc<WriteHealth>,
    /// Stops the write probe (store/health.rs) when the store closes.
    probe_stop: CancellationToken,
}

impl Store {
    /// Opens the database at `url` and brings its schema up to date: SQLite
    /// (`sqlite://./coloc.db`, created if missing; `sqlite::memory:`) or PostgreSQL
    /// (`postgres://user@host/db`, the database already created).
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let engine = Engine::of_url(url);
        let in_memory =
            engine == Engine::Sqlite && (url.contains(":memory:") || url.contains("mode=memory"));
        if engine == Engine::Sqlite && !in_memory {
            let options = SqliteConnectOptions::from_str(url).map_err(StoreError::InvalidUrl)?;
            refuse_empty_file(options.get_filename())?;
        }
        let health = Arc::new(WriteHealth::default());
        // While writes fail, the store's connections are closed after each use and opened
        // afresh (store/health.rs); an in-memory database would be lost.
        let keep_health = health.clone();
        let keep = move |age| in_memory || keep_health.keep_connection(age);
        let pool = engine::connect(url, engine, keep)
            .await
            .map_err(|error| match error {
                sqlx::Error::Configuration(_) => StoreError::InvalidUrl(error),
                other => StoreError::Database(other),
            })?;
        match engine {
            Engine::Sqlite => sqlx::migrate!().run(&pool).await?,
            Engine::Postgres => sqlx::migrate!("./migrations/postgres").run(&pool).await?,
        }
        let db = Db {
            pool,
            engine,
            faults: FaultSwitch::default(),
        };
        let observation_writer = Arc::new(ObservationWriter::spawn(db.clone(), health.clone()));
        let occupancy_writer = Arc::new(OccupancyWriter::spawn(db.clone()).await?);
        let probe_stop = CancellationToken::new();
        tokio::spawn(health::probe(
            db.clone(),
            health.clone(),
            probe_stop.clone(),
        ));
        Ok(Self {
            db,
            observation_writer,
            occupancy_writer,
            health,
            probe_stop,
        })
    }

    /// The engine this store runs on.
    pub fn engine(&self) -> Engine {
        self.db.engine
    }

    /// Whether writes currently succeed, and how often they failed.
    pub fn write_health(&self) -> &WriteHealth {
        &self.health
    }

    /// The switch that makes commits fail on purpose (chaos tests; see store/fault.rs).
    pub fn faults(&self) -> &FaultSwitch {
        &self.db.faults
    }

    /// Stops taking runs, writes the ones already queued, then closes the pool. Runs
    /// offered after this get [`StoreError::Closed`].
    pub async fn close(&self) {
        // Acknowledged reports still queued are written before the pool closes.
        self.observation_writer.stop().await;
        self.occupancy_writer.stop().await;
        self.probe_stop.cancel();
        self.db.pool.close().await;
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

    /// Forgets the known GPUs among `gpu_ids` with all their jobs; (GPUs, jobs) forgotten.
    pub async fn forget_cluster_gpus(
        &self,
        gpu_ids: Vec<String>,
        now_ms: i64,
    ) -> Result<(u64, u64), StoreError> {
        self.occupancy_writer.forget(gpu_ids, now_ms).await
    }

    /// The committed occupancy, from memory. Hold the guard briefly: the writer waits for it
    /// to publish a batch.
    pub fn occupancy(&self) -> std::sync::RwLockReadGuard<'_, Occupancy> {
        self.occupancy_writer.view()
    }

    pub fn pool(&self) -> &AnyPool {
        &self.db.pool
    }

    /// Bytes the database holds (SQLite: the file's pages, in use and free; PostgreSQL:
    /// the database's size on disk).
    pub async fn size_bytes(&self) -> Result<i64, StoreError> {
        let sql = match self.db.engine {
            Engine::Sqlite => {
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
            }
            Engine::Postgres => "SELECT pg_database_size(current_database())",
        };
        Ok(sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.db.pool)
            .await?)
    }

    /// A write transaction, holding the database's write lock from the start
    /// (`engine::Db::begin_write`), so a writer waits instead of failing when it would
    /// upgrade a read lock mid-transaction.
    async fn begin_write(&self) -> Result<Transaction<'static, Any>, StoreError> {
        let begun = self.db.begin_fenced_write().await;
        if let Err(error) = &begun {
            if error.is_storage_fault() {
                self.health.failed(error);
            }
        }
        begun
    }

    /// [`finish`] for a write transaction: a storage fault, commit included, tells
    /// [`WriteHealth`] that the store cannot write (only a real write says it can again).
    async fn finish_write<T>(
        &self,
        tx: Transaction<'static, Any>,
        outcome: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let finished = match outcome {
            Ok(value) => self
                .db
                .commit(tx)
                .await
                .map(|()| value)
                .map_err(StoreError::from),
            Err(error) => Err(roll_back(tx, error).await),
        };
        self.health.record_failure(&finished);
        finished
    }

    async fn begin_read(&self) -> Result<Transaction<'static, Any>, StoreError> {
        Ok(self.db.begin_read().await?)
    }
}

/// A zero-length database file with no (non-empty) write-ahead log beside it holds no
/// data: refused rather than silently opened as an empty store. A new file (absent) is
/// fine, and so is a 0-byte file whose data still sits in its `-wal`.
fn refuse_empty_file(path: &std::path::Path) -> Result<(), StoreError> {
    let Ok(metadata) = std::fs::metadata(path) else {
        return Ok(());
    };
    if !metadata.is_file() || metadata.len() > 0 {
        return Ok(());
    }
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
        return Ok(());
    }
    Err(StoreError::EmptyFile(path.to_path_buf()))
}

/// True when `error` (or a cause of it) says the database file is damaged: SQLite's
/// "malformed" or "not a database", or a stored value that no longer decodes.
pub fn is_corruption(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        if let Some(StoreError::Corrupt(_)) = cause.downcast_ref::<StoreError>() {
            return true;
        }
        match cause.downcast_ref::<sqlx::Error>() {
            Some(sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => true,
            Some(sqlx::Error::Database(db)) => {
                matches!(db.code().as_deref(), Some("11" | "26"))
                    || db.message().contains("malformed")
                    || db.message().contains("not a database")
            }
            _ => false,
        }
    })
}

/// Ends a read transaction: commits when the work succeeded and rolls back at once when it
/// failed (write transactions end in [`Store::finish_write`]).
async fn finish<T>(
    tx: Transaction<'static, Any>,
    outcome: Result<T, StoreError>,
) -> Result<T, StoreError> {
    match outcome {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => Err(roll_back(tx, error).await),
    }
}

/// Rolls a failed transaction back at once, so that it never keeps holding the database's
/// write lock after it is dropped; answers the work's own error.
async fn roll_back(tx: Transaction<'static, Any>, error: StoreError) -> StoreError {
    if let Err(rollback) = tx.rollback().await {
        tracing::warn!(error = %rollback, "rollback failed");
    }
    error
}

#[cfg(test)]
mod tests {
    use sqlx::{sqlite::SqliteConnectOptions, Connection, Executor, SqliteConnection};

    use super::StoreError;

    async fn connect(path: &std::path::Path) -> SqliteConnection {
        SqliteConnection::connect_with(
            &SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .busy_timeout(std::time::Duration::ZERO),
        )
        .await
        .unwrap()
    }

    /// Real SQLite errors: a held write lock and a read-only file are faults a later try
    /// may get past; a SQL mistake, a constraint and a missing table are not.
    #[tokio::test]
    async fn only_failures_of_the_storage_are_storage_faults() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("t.db");
        let mut holder = connect(&path).await;
        holder
            .execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .await
            .unwrap();
        holder.execute("INSERT INTO t VALUES (1)").await.unwrap();
        let mut other = connect(&path).await;
        let fault = |error: sqlx::Error| StoreError::Database(error).is_storage_fault();

        holder.execute("BEGIN IMMEDIATE").await.unwrap();
        let locked = other.execute("INSERT INTO t VALUES (2)").await.unwrap_err();
        assert!(fault(locked), "a held write lock");
        holder.execute("COMMIT").await.unwrap();

        let duplicate = other.execute("INSERT INTO t VALUES (1)").await.unwrap_err();
        assert!(!fault(duplicate), "a unique constraint");
        let typo = other
            .execute("INSERT INTO nowhere VALUES (1)")
            .await
            .unwrap_err();
        assert!(!fault(typo), "a missing table");
        let syntax = other.execute("INSERT INTO t VALUE (3)").await.unwrap_err();
        assert!(!fault(syntax), "a syntax error");

        let mut read_only = SqliteConnection::connect_with(
            &SqliteConnectOptions::new().filename(&path).read_only(true),
        )
        .await
        .unwrap();
        let refused = read_only
            .execute("INSERT INTO t VALUES (4)")
            .await
            .unwrap_err();
        assert!(fault(refused), "a read-only file");
    }
}
